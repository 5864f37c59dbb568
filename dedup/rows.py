"""The dedup's row kinds: the detector's input rows and the rows it hands the write tasks.

Input (``InputRows``, a tinyint ``kind`` column): the raw records as ``dedup/classify_sql.py``
(Spark SQL, the stateful layout) or ``dedup/classify_python.py`` (Python, the direct layout)
classify them, with the columns ``kind``, ``src_topic``, ``src_partition``, ``src_offset``,
``src_last``, ``stride``, ``payload``, ``h_keys``, ``h_values``, ``hb_low``, ``hb_started``
and ``hb_chain``. Output (below): the rows the stateful step hands its write tasks, the one
contract between them.

``dedup/detect.py`` (the stateful step, in the executors) emits them; ``dedup/transaction.py``
(the write tasks, in the executors, same stage) and ``dedup/batch_driver.py`` (the driver's
accounting) read them. Nothing else defines these names.

Row kinds (column ``kind``):

- ``run``: first-seen records of one source partition, **with their payload**: ``payload`` is a
  run value (``common.raw_run``: one record-batch group), ``selection`` says which of its records
  to deliver (packed little-endian int64 pairs ``(first index, last index)``, inclusive,
  increasing; empty = all) and ``records`` how many that is. Carrying the payload means no write
  task ever reads the raw topic again: each payload is read once, by Spark's source
  (docs/dedup-internals.md "Each payload read once").
- ``gap``: one gap report, ``gap_key`` and ``gap_value`` as the gap topic takes them.
- ``stat``: one per group and micro-batch: the counters of ``STAT_COLUMNS`` and ``state_bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa

# -- input: the detector's rows ------------------------------------------------------------------

#: Input kinds computed by the classifiers (a tinyint column, cheap across Arrow).
KIND_DATA, KIND_HEARTBEAT, KIND_RESET, KIND_MALFORMED, KIND_WITHHELD, KIND_RUN_IN = 0, 1, 2, 3, 4, 5
#: The direct layout's tick in a raw partition (``dedup/direct_task.py``): makes its task run, no
#: input.
KIND_TICK = 6
#: Group key of raw records whose key does not parse (counted as malformed).
UNPARSED_TOPIC, UNPARSED_PARTITION = "", -1


class InputRows:
    """Some input rows of one detector call, as numpy arrays per column (taken from the frame once).

    A bucket's call splits its rows by source partition with ``take``: indexing arrays costs
    microseconds where slicing a pandas frame per partition cost ~0.1 ms.
    """

    def __init__(self, columns: dict[str, np.ndarray[Any, Any]]) -> None:
        self._columns = columns

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> InputRows:
        return cls({str(name): frame[name].to_numpy() for name in frame.columns})

    def __getitem__(self, name: str) -> np.ndarray[Any, Any]:
        return self._columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __len__(self) -> int:
        return len(self._columns["kind"])

    def take(self, index: np.ndarray[Any, Any]) -> InputRows:
        return InputRows({name: column[index] for name, column in self._columns.items()})

    def by_partition(self) -> dict[tuple[str, int], np.ndarray[Any, Any]]:
        """Row indexes per source ``(topic, partition)``, in first-appearance order."""
        groups: dict[tuple[str, int], list[int]] = {}
        topics = self._columns["src_topic"].tolist()
        partitions = self._columns["src_partition"].tolist()
        for i, key in enumerate(zip(topics, partitions, strict=True)):
            groups.setdefault((str(key[0]), int(key[1])), []).append(i)
        return {key: np.asarray(rows, dtype=np.intp) for key, rows in groups.items()}


# -- output: the rows the detector hands the write tasks ------------------------------------------

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
#: The same columns as Arrow types: the direct layout (``dedup/direct_task.py``) builds its rows in
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
