"""The rows the dedup's stateful step hands its write tasks: the one contract between them.

``dedup/detect.py`` (the stateful step, in the executors) emits them; ``dedup/transaction.py``
(the write tasks, in the executors, same stage) and ``dedup/writer.py`` (the driver's accounting)
read them. Nothing else defines these names.

Row kinds (column ``kind``):

- ``run``: first-seen records of one source partition, **with their payload**: ``payload`` is a
  run value (``common.raw_run``: one record-batch group), ``selection`` says which of its records
  to deliver (packed little-endian int64 pairs ``(first index, last index)``, inclusive,
  increasing; empty = all) and ``records`` how many that is. Carrying the payload means no write
  task ever reads the raw topic again: each payload is read once, by Spark's source
  (docs/dedup.md "Each payload read once").
- ``gap``: one gap report, ``gap_key`` and ``gap_value`` as the gap topic takes them.
- ``stat``: one per group and micro-batch: the counters of ``STAT_COLUMNS`` and ``state_bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import pyarrow as pa

KIND_RUN: Final = "run"
KIND_GAP: Final = "gap"
KIND_STAT: Final = "stat"

#: The per-group counters of ``stat`` rows, as the driver folds them into metrics.
STAT_COLUMNS: Final = (
    "delivered",
    "duplicates",
    "malformed",
    "heartbeats",
    "resets",
    "open_gaps",
    "below_window",
    "budget_evictions",
    "expired_gaps",
    "withheld",
    "chains_missing",
    # gaps the partition's last scan saw first and its next scan will report (dedup/idle_tick.py)
    "pending_gaps",
)

#: ``(name, Spark DDL type)`` of every output column of the stateful step, in order.
OUTPUT_COLUMNS: Final = (
    ("kind", "string"),
    ("src_topic", "string"),
    ("src_partition", "int"),
    ("src_offset", "bigint"),
    ("payload", "binary"),
    ("selection", "binary"),
    ("records", "bigint"),
    ("gap_key", "binary"),
    ("gap_value", "binary"),
    *((name, "bigint") for name in STAT_COLUMNS),
    ("state_bytes", "bigint"),
)
OUTPUT_DDL: Final = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)
COLUMN_NAMES: Final = tuple(name for name, _ in OUTPUT_COLUMNS)
_ARROW_TYPES: Final = {
    "string": pa.string(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "binary": pa.binary(),
}
#: The same columns as Arrow types: the direct layout (``dedup/direct.py``) builds its rows in
#: the task that writes them, without Spark in between.
OUTPUT_SCHEMA: Final = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in OUTPUT_COLUMNS])

_PAIR: Final = struct.Struct("<qq")


def pack_selection(ranges: Sequence[tuple[int, int]]) -> bytes:
    """``(first index, last index)`` pairs -> the ``selection`` value."""
    return b"".join(_PAIR.pack(a, b) for a, b in ranges)


def unpack_selection(blob: bytes | None, count: int) -> list[tuple[int, int]]:
    """The index ranges of a ``selection`` value; empty (or None) = all ``count`` records."""
    if not blob:
        return [(0, count - 1)] if count else []
    return list(_PAIR.iter_unpack(blob))
