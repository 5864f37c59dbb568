"""The dedup's packed record positions: how first-seen records travel from the Spark state
function to the writer (one row per group, not one per record).

The raw-topic layout itself (keys, provenance headers) is ``common.raw_topic``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: The dedup's output kind of a row carrying first-seen records: its ``positions`` column packs,
#: per record, ``POSITION_FIELDS`` as little-endian int64, in source offset order (the raw topic
#: as an index into ``(*RAW_TOPICS, CONTROL_TOPIC)``). One row per group and up to
#: ``MAX_POSITIONS_PER_ROW`` records: a million rows through Spark's Python -> JVM -> driver
#: path cost more than the detector; a few packed rows cost nothing.
KIND_RECORDS = "records"
POSITION_FIELDS = ("src_offset", "raw_topic", "raw_partition", "raw_offset")
MAX_POSITIONS_PER_ROW = 1 << 20


def pack_positions(columns: Sequence[npt.ArrayLike]) -> bytes:
    """``POSITION_FIELDS`` columns (equal lengths) -> the packed ``positions`` value."""
    return np.column_stack([np.asarray(c, dtype=np.int64) for c in columns]).astype("<i8").tobytes()


def unpack_positions(blob: bytes) -> npt.NDArray[np.int64]:
    """A ``positions`` value -> an (n, 4) int64 array, columns in ``POSITION_FIELDS`` order."""
    return np.frombuffer(blob, dtype="<i8").reshape(-1, len(POSITION_FIELDS)).astype(np.int64)
