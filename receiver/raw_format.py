"""The raw topic's record layout (docs/topics.md), as pure functions.

Guarantee: every decoded source record maps to exactly one raw record whose key is
``<topic>:<partition>:<offset>``, whose value is the source value byte for byte (null stays null),
and whose headers are the source headers in order followed by exactly the four provenance headers
``diode.key``, ``diode.timestamp``, ``diode.timestamp-type``, ``diode.session``. A heartbeat maps
to one control record per ``(topic, partition, high_offset)``, its JSON value also carrying that
partition's ``low_offset``, with the single header ``diode.control: heartbeat``. Changing
anything here is a protocol version change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from common.wire.events import Heartbeat, Record

#: As confluent-kafka takes them (it also accepts str values; we only ever put bytes or None).
Headers = list[tuple[str, str | bytes | None]]

PROVENANCE_HEADERS = ("diode.key", "diode.timestamp", "diode.timestamp-type", "diode.session")
CONTROL_HEADER = "diode.control"
HEARTBEAT_HEADERS: Headers = [(CONTROL_HEADER, b"heartbeat")]
TIMESTAMP_TYPES = (b"0", b"1", b"2")


def raw_key(topic: str, partition: int, offset: int) -> str:
    """``<topic>:<partition>:<offset>``; split it with ``rsplit(":", 2)``."""
    return f"{topic}:{partition}:{offset}"


def parse_raw_key(key: str | bytes) -> tuple[str, int, int]:
    """Inverse of :func:`raw_key`.

    Raises:
        ValueError: the key does not have the raw topic's form.
    """
    text = key.decode("ascii") if isinstance(key, bytes) else key
    topic, partition, offset = text.rsplit(":", 2)
    return topic, int(partition), int(offset)


def raw_headers(record: Record, session_hex: bytes) -> Headers:
    """Source headers in order, then the four provenance headers (docs/topics.md)."""
    tt = record.timestamp_type
    return [
        *record.headers,
        ("diode.key", record.key),
        ("diode.timestamp", b"%d" % record.timestamp),
        ("diode.timestamp-type", TIMESTAMP_TYPES[tt] if 0 <= tt <= 2 else b"%d" % tt),
        ("diode.session", session_hex),
    ]


def session_hex(session_id: bytes) -> bytes:
    """The ``diode.session`` header value: lower-case hex of the session id."""
    return session_id.hex().encode("ascii")


def heartbeat_records(beat: Heartbeat) -> Iterator[tuple[str, int, str, bytes]]:
    """``(source topic, source partition, raw key, JSON value)`` per partition in ``beat``."""
    session = beat.session_id.hex()
    # The decoder guarantees low_offsets names exactly the partitions of high_offsets.
    lows = {(topic, partition): low for topic, partition, low in beat.low_offsets}
    for topic, partition, high in beat.high_offsets:
        value = json.dumps(
            {
                "type": "heartbeat",
                "sender_id": beat.sender_id,
                "session": session,
                "started_at_ms": beat.started_at_ms,
                "sent_at_ms": beat.sent_at_ms,
                "high_offset": high,
                "low_offset": lows[topic, partition],
            },
            separators=(",", ":"),
        ).encode()
        yield topic, partition, raw_key(topic, partition, high), value
