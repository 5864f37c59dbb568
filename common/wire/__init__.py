"""Wire protocol v1: what crosses the diode (normative spec: docs/protocol.md).

Sans-IO: :class:`Encoder` turns records and control messages into datagrams, :class:`Decoder`
turns datagrams into events; neither reads a clock, a socket or a file. Import everything from
here.
"""

from common.errors import RecordTooLarge
from common.wire.config import WireConfig, fragment_capacity
from common.wire.decoder import Decoder
from common.wire.encoder import Encoder, OutgoingDatagram, SequenceExhaustedError
from common.wire.envelope import coalesced_segment, message_goes_on
from common.wire.events import (
    Dropped,
    DropReason,
    Event,
    Heartbeat,
    Record,
    RecordBatch,
    RecordGroup,
    ResendMarker,
    Withheld,
)
from common.wire.keyring import Key, KeyRing, derive_key, format_key_id, key_id_for

__all__ = [
    "Decoder",
    "DropReason",
    "Dropped",
    "Encoder",
    "Event",
    "Heartbeat",
    "Key",
    "KeyRing",
    "OutgoingDatagram",
    "Record",
    "RecordBatch",
    "RecordGroup",
    "RecordTooLarge",
    "ResendMarker",
    "SequenceExhaustedError",
    "WireConfig",
    "Withheld",
    "coalesced_segment",
    "derive_key",
    "format_key_id",
    "fragment_capacity",
    "key_id_for",
    "message_goes_on",
]
