"""Wire protocol v1: what crosses the diode (normative spec: docs/protocol.md).

Sans-IO: :class:`Encoder` turns records and control messages into datagrams, :class:`Decoder`
turns datagrams into events; neither reads a clock, a socket or a file. Import everything from
here.

``Decoder`` is imported on first use (PEP 562): its batch decoder needs numpy, and a sender, which
only encodes, would otherwise pay that import (~0.15 s) at every start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.errors import RecordTooLarge
from common.wire.config import WireConfig, fragment_capacity
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

if TYPE_CHECKING:
    from common.wire.decoder import Decoder

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


def __getattr__(name: str) -> Any:
    if name == "Decoder":
        from common.wire.decoder import Decoder  # noqa: PLC0415  see the module doc

        return Decoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
