"""The raw topic's record layout (docs/topics.md): the one contract between receiver and dedup.

The receiver writes it, the dedup (its Spark SQL and its writer), the verifier and the tests read
it; all of them take it from here. Guarantee: every decoded source record maps to exactly one raw
record whose key is ``<topic>:<partition>:<offset>``, whose value is the source value byte for
byte (null stays null), and whose headers are the source headers in order followed by exactly the
four ``PROVENANCE_HEADERS``. A heartbeat maps to one control record per ``(topic, partition,
high_offset)``, its JSON value also carrying that partition's ``low_offset``, with the single
header ``diode.control: heartbeat``. A withheld message maps to one control record per range,
keyed by the range's first offset, its JSON value carrying the ``last``, with the single header
``diode.control: withheld``; ``kafka-diode dedup reset`` writes ``diode.control: reset``.
Changing anything here is a protocol version change.

This is layout v1. The receiver now writes layout v2 (``common/raw_run.py``: one raw record per
run); the dedup reads both, and ``common.raw_run.expand_run`` turns a run back into the v1
records described here (pinned by ``tests/unit/test_raw_topic.py::
test_the_sinks_runs_expand_to_the_v1_layout``). ``dedup.classify_sql`` evaluates
:func:`parse_raw_key` (canonical decimals, no regex) and :func:`restore` (``TIMESTAMP_PATTERN``)
in SQL (pinned by ``tests/integration/test_dedup.py``'s malformed-record cases).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final, overload

from common.wire.events import Heartbeat, Record, Withheld

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: As confluent-kafka takes them (it also accepts str values; we only ever put bytes or None).
Headers = list[tuple[str, str | bytes | None]]
Header = tuple[str, bytes | None]

PROVENANCE_HEADERS = ("diode.key", "diode.timestamp", "diode.timestamp-type", "diode.session")
CONTROL_HEADER = "diode.control"
HEARTBEAT = b"heartbeat"
RESET = b"reset"
WITHHELD = b"withheld"
#: Written by the dedup to its own control topic when no micro-batch ran for a gap-scan interval,
#: so that Spark runs one (its processing-time timeouts, the gap scans, run only in batches);
#: dropped by the dedup's classifier, never a raw topic's record.
TICK = b"tick"
HEARTBEAT_HEADERS: Headers = [(CONTROL_HEADER, HEARTBEAT)]
RESET_HEADERS: Headers = [(CONTROL_HEADER, RESET)]
WITHHELD_HEADERS: Headers = [(CONTROL_HEADER, WITHHELD)]
TICK_HEADERS: Headers = [(CONTROL_HEADER, TICK)]
TIMESTAMP_TYPES = (b"0", b"1", b"2")
#: Fields of a heartbeat control record's JSON value that the dedup reads (by these names).
HEARTBEAT_LOW_OFFSET = "low_offset"
HEARTBEAT_STARTED_AT = "started_at_ms"
#: Fields of a heartbeat control record's JSON value naming the sender's chain (docs/sender.md
#: "Chains"), copied from the heartbeat counters of the same names; absent when not chained.
CHAIN_INDEX, CHAIN_COUNT, CHAIN_SHARE = "chain_index", "chain_count", "chain_share"
HEARTBEAT_CHAIN_FIELDS = (CHAIN_INDEX, CHAIN_COUNT, CHAIN_SHARE)
#: Field of a withheld control record's JSON value: the range's last offset (the key has the first).
WITHHELD_LAST = "last"
#: Most share chains of one source (docs/sender.md "Chains"): a sender's ``chain = "I/N"`` has
#: ``N <= MAX_CHAINS``, a run key's stride is at most this (``common.raw_run``), and the dedup
#: keeps one high offset per chain and partition.
MAX_CHAINS: Final = 64
#: The placeholder of a topic-name template (the receiver's RAW_TOPIC, the dedup's CLEAN_TOPIC):
#: replaced by the source topic's name.
TOPIC_FIELD: Final = "{topic}"

#: ``diode.timestamp``: the whole value is ASCII decimal (no sign but ``-``, no blanks, no
#: newline) and fits a signed 64-bit integer. Unanchored: Java and Python anchor differently
#: (both ``$`` accept a trailing newline), so each side matches it against the whole value.
TIMESTAMP_PATTERN = r"-?[0-9]{1,19}"
_TIMESTAMP_RE = re.compile(TIMESTAMP_PATTERN.encode())
_MAX_PARTITION = 2**31 - 1
_MAX_OFFSET = 2**63 - 1


# -- placement (the receiver writes by it, the dedup's direct layout relies on it) -------------


@overload
def raw_partition_of(partition: int, partitions: int) -> int: ...
@overload
def raw_partition_of(
    partition: npt.NDArray[np.int64], partitions: int
) -> npt.NDArray[np.int64]: ...
def raw_partition_of(
    partition: int | npt.NDArray[np.int64], partitions: int
) -> int | npt.NDArray[np.int64]:
    """The raw partition of source partition ``partition`` in a raw topic of ``partitions``.

    Source partition p lands in raw partition p mod N, and only there: the receiver writes every
    record and control record of a source partition by this rule, and the dedup's direct layout
    keeps a source partition's detector in the state of that one raw partition (a record
    elsewhere would start a second detector). Vectorised over a numpy array of partitions too.
    """
    return partition % partitions


def fill_topic(template: str, source_topic: str) -> str:
    """The topic that ``template`` (a name, or a template with ``{topic}``) names for
    ``source_topic``: the receiver's raw topic, the dedup's clean topic."""
    return template.replace(TOPIC_FIELD, source_topic)


# -- writing (the receiver) ---------------------------------------------------------------------


def raw_key(topic: str, partition: int, offset: int) -> str:
    """``<topic>:<partition>:<offset>``."""
    return f"{key_prefix(topic, partition)}{offset}"


def key_prefix(topic: str, partition: int) -> str:
    """The part of every raw key of one source partition that comes before the offset."""
    return f"{topic}:{partition}:"


def session_hex(session_id: bytes) -> bytes:
    """The ``diode.session`` header value: lower-case hex of the session id."""
    return session_id.hex().encode("ascii")


def timestamp_type_header(timestamp_type: int) -> tuple[str, bytes]:
    """The ``diode.timestamp-type`` header."""
    tt = timestamp_type
    return ("diode.timestamp-type", TIMESTAMP_TYPES[tt] if 0 <= tt <= 2 else b"%d" % tt)


def raw_headers(record: Record, session: bytes) -> Headers:
    """Source headers in order, then the four provenance headers (``session``: session_hex)."""
    return [
        *record.headers,
        ("diode.key", record.key),
        ("diode.timestamp", b"%d" % record.timestamp),
        timestamp_type_header(record.timestamp_type),
        ("diode.session", session),
    ]


def heartbeat_records(beat: Heartbeat) -> Iterator[tuple[str, int, str, bytes]]:
    """``(source topic, source partition, raw key, JSON value)`` per partition in ``beat``."""
    session = beat.session_id.hex()
    # The decoder guarantees low_offsets names exactly the partitions of high_offsets.
    lows = {(topic, partition): low for topic, partition, low in beat.low_offsets}
    counters = dict(beat.counters)
    chain = {name: counters[name] for name in HEARTBEAT_CHAIN_FIELDS if name in counters}
    for topic, partition, high in beat.high_offsets:
        value = json.dumps(
            {
                "type": "heartbeat",
                "sender_id": beat.sender_id,
                "session": session,
                HEARTBEAT_STARTED_AT: beat.started_at_ms,
                "sent_at_ms": beat.sent_at_ms,
                "high_offset": high,
                HEARTBEAT_LOW_OFFSET: lows[topic, partition],
                **chain,
            },
            separators=(",", ":"),
        ).encode()
        yield topic, partition, raw_key(topic, partition, high), value


def withheld_records(event: Withheld) -> Iterator[tuple[str, int, str, bytes]]:
    """``(source topic, source partition, raw key, JSON value)`` per range of ``event``."""
    session = event.session_id.hex()
    for topic, partition, first, last in event.ranges:
        value = json.dumps(
            {"type": "withheld", "session": session, "first": first, WITHHELD_LAST: last},
            separators=(",", ":"),
        ).encode()
        yield topic, partition, raw_key(topic, partition, first), value


def reset_record(topic: str, partition: int, requested_by: str, at_ms: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of a reset control record for one source partition (docs/dedup.md)."""
    value = json.dumps({"type": "reset", "requested_by": requested_by, "at_ms": at_ms})
    return raw_key(topic, partition, 0).encode("ascii"), value.encode()


# -- reading (the dedup, the verifier) ----------------------------------------------------------


def parse_raw_key(key: str | bytes | None) -> tuple[str, int, int] | None:
    """``(topic, partition, offset)`` of a v1 key ``<topic>:<partition>:<offset>``, or None.

    Split on the last two ``:`` (a topic name cannot hold one); the partition and offset must
    be canonical decimals (no sign but a leading ``-`` on the offset, no leading zeros, no
    blanks): the rule of ``dedup.classify_sql``'s SQL, which prints the parsed numbers again and
    compares. A v2 run key (``common.raw_run``) is not a v1 key.
    """
    if key is None:
        return None
    if isinstance(key, bytes):
        try:
            key = key.decode("ascii")
        except UnicodeDecodeError:
            return None
    rest, sep1, offset_text = key.rpartition(":")
    topic, sep2, partition_text = rest.rpartition(":")
    if not (sep1 and sep2 and topic) or not key.isascii():
        return None
    digits = offset_text[1:] if offset_text.startswith("-") else offset_text
    if not (partition_text.isdigit() and digits.isdigit()):
        return None
    partition, offset = int(partition_text), int(offset_text)
    if str(partition) != partition_text or str(offset) != offset_text:
        return None
    if partition > _MAX_PARTITION or not -_MAX_OFFSET <= offset <= _MAX_OFFSET:
        return None
    return topic, partition, offset


def restore(headers: Sequence[Header]) -> tuple[bytes | None, int, list[Header]] | None:
    """``(source key, source timestamp ms, source headers)`` of a data record, or None.

    None means malformed: fewer than four headers, trailing names not exactly
    ``PROVENANCE_HEADERS`` in order, or a timestamp that is not a decimal number within the signed
    64-bit range (the same rule as ``dedup.classify_sql``'s SQL).
    """
    # The hot path of the dedup's writer (once per clean record): no loops, no allocations
    # beyond the result.
    if len(headers) < 4:  # len(PROVENANCE_HEADERS)
        return None
    key, stamp, kind, session = headers[-4], headers[-3], headers[-2], headers[-1]
    if (
        key[0] != "diode.key"
        or stamp[0] != "diode.timestamp"
        or kind[0] != "diode.timestamp-type"
        or session[0] != "diode.session"
    ):
        return None
    value = stamp[1]
    if value is None or not _TIMESTAMP_RE.fullmatch(value):
        return None
    timestamp = int(value)
    if not -_MAX_OFFSET - 1 <= timestamp <= _MAX_OFFSET:
        return None
    return key[1], timestamp, list(headers[:-4])
