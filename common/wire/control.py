"""Control messages (kinds 1, 2, 5: heartbeat, resend marker, withheld ranges) and their rules.

fastavro reads and writes them (they are rare); the rules say which decoded messages are
impossible, so the decoder drops them by reason. docs/protocol.md §5.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Final

from fastavro import schemaless_reader, schemaless_writer

from common.errors import RemoteProtocolError
from common.wire.envelope import (
    load_schema,
)
from common.wire.events import RESEND_PHASES, DropReason

HEARTBEAT_SCHEMA: Final = load_schema("heartbeat")
RESEND_MARKER_SCHEMA: Final = load_schema("resend_marker")
WITHHELD_SCHEMA: Final = load_schema("withheld")
_INT64_MAX: Final = (1 << 63) - 1


def _bad(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(DropReason.MALFORMED, detail)


#: Kafka's longest topic name; a NUL in a name makes the Kafka client raise ValueError.
_MAX_TOPIC_LENGTH: Final = 249


def heartbeat_offsets_problem(
    high_offsets: Sequence[tuple[str, int, int]], low_offsets: Sequence[tuple[str, int, int]]
) -> str | None:
    """Why a heartbeat's offset lists are inconsistent, or None when they are fine.

    Rules (docs/protocol.md §5): partitions in ``0 .. 2^31-1``, offsets in ``0 .. 2^63-1``, no
    (topic, partition) twice in a list, ``low_offsets`` names exactly the partitions of
    ``high_offsets``, and each low is at most its high. Both lists came from a bounded payload,
    so the work here is bounded by the message size.
    """
    highs: dict[tuple[str, int], int] = {}
    for name, items in (("high", high_offsets), ("low", low_offsets)):
        seen: dict[tuple[str, int], int] = {}
        for topic, partition, offset in items:
            if not (0 <= partition <= 0x7FFFFFFF and 0 <= offset <= _INT64_MAX):
                return f"{name} offset {topic}:{partition}:{offset} out of range"
            if (topic, partition) in seen:
                return f"{name} offsets list {topic}:{partition} twice"
            seen[topic, partition] = offset
        if name == "high":
            highs = seen
            continue
        if seen.keys() != highs.keys():
            return "low offsets do not name the same partitions as high offsets"
        for tp, low in seen.items():
            if low > highs[tp]:
                return f"low offset {low} above high offset {highs[tp]} for {tp[0]}:{tp[1]}"
    return None


def resend_marker_problem(
    ranges: Sequence[Mapping[str, Any]], records_sent: int, sent_at_ms: int
) -> str | None:
    """Why a decoded resend marker cannot be genuine, or None (docs/protocol.md §5).

    Rules: each range names a partition in ``0 .. 2^31-1`` and offsets ``0 <= first <= last``;
    ``records_sent`` is not negative and, when there are ranges, not more than they hold;
    ``sent_at_ms`` is not negative.
    """
    held = 0
    for r in ranges:
        if not 0 <= r["partition"] <= 0x7FFFFFFF or not 0 <= r["first"] <= r["last"]:
            return f"range {r['topic']}:{r['partition']}:{r['first']}-{r['last']} out of range"
        held += r["last"] - r["first"] + 1
    if records_sent < 0 or (ranges and records_sent > held):
        return f"records_sent {records_sent} for ranges holding {held}"
    if sent_at_ms < 0:
        return f"sent_at_ms {sent_at_ms}"
    return None


def withheld_problem(ranges: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a decoded withheld message cannot be genuine, or None (docs/protocol.md §5a).

    Rules: at least one range; each names a non-empty topic, a partition in ``0 .. 2^31-1`` and
    offsets ``0 <= first <= last``.
    """
    if not ranges:
        return "no ranges"
    for r in ranges:
        if (
            not r["topic"]
            or not 0 <= r["partition"] <= 0x7FFFFFFF
            or not 0 <= r["first"] <= r["last"]
        ):
            return f"range {r['topic']}:{r['partition']}:{r['first']}-{r['last']} out of range"
    return None


def encode_control(schema: Any, datum: dict[str, Any]) -> bytes:
    """A control message payload with fastavro."""
    out = io.BytesIO()
    schemaless_writer(out, schema, datum)
    return out.getvalue()


def decode_control(schema: Any, data: bytes) -> dict[str, Any]:
    """Parse a control message payload; reject trailing bytes.

    Raises:
        RemoteProtocolError: MALFORMED or TRAILING_BYTES.
    """
    buf = io.BytesIO(data)
    try:
        datum = schemaless_reader(buf, schema, None)
    except (ValueError, EOFError, IndexError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise _bad(f"control message: {exc.__class__.__name__}") from exc
    if buf.tell() != len(data):
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the control message")
    if not isinstance(datum, dict):
        raise _bad("control message is not a record")
    if datum.get("phase", "start") not in RESEND_PHASES:
        raise _bad("unknown resend phase")
    return datum
