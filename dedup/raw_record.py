"""The raw-topic record layout (docs/topics.md), pure: key parsing and provenance checks.

The Spark job evaluates the same rules in SQL (``dedup.job.classify``) with ``KEY_PATTERN``; this
module is the reference the unit tests pin down, and what non-Spark tools use.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: ``<topic>:<partition>:<offset>``; the topic is greedy, so the split is on the last two ``:``.
KEY_PATTERN = r"^(.+):([0-9]{1,10}):(-?[0-9]{1,19})$"
_KEY_RE = re.compile(KEY_PATTERN.encode(), re.DOTALL)
PROVENANCE = ("diode.key", "diode.timestamp", "diode.timestamp-type", "diode.session")
CONTROL_HEADER = "diode.control"
#: ``diode.timestamp``: the whole value is ASCII decimal (no sign but ``-``, no blanks, no
#: newline) and fits a signed 64-bit integer. Unanchored: Java and Python anchor differently
#: (both ``$`` accept a trailing newline), so each side matches it against the whole value.
TIMESTAMP_PATTERN = r"-?[0-9]{1,19}"
_TIMESTAMP_RE = re.compile(TIMESTAMP_PATTERN.encode())
_MAX_PARTITION = 2**31 - 1
_MAX_OFFSET = 2**63 - 1

Header = tuple[str, bytes | None]

#: The dedup's output kind of a row carrying first-seen records: its ``positions`` column packs,
#: per record, ``POSITION_FIELDS`` as little-endian int64, in source offset order (the raw topic
#: as an index into ``(*RAW_TOPICS, CONTROL_TOPIC)``). One row per group and up to
#: ``MAX_POSITIONS_PER_ROW`` records: a million rows through Spark's Python -> JVM -> driver
#: path cost more than the detector; a few packed rows cost nothing.
KIND_RECORDS = "records"
POSITION_FIELDS = ("src_offset", "raw_topic", "raw_partition", "raw_offset")
MAX_POSITIONS_PER_ROW = 1 << 20


def parse_raw_key(key: bytes | None) -> tuple[str, int, int] | None:
    """``(topic, partition, offset)`` of a raw key, or None when it does not parse."""
    if key is None:
        return None
    match = _KEY_RE.match(key)
    if match is None:
        return None
    try:
        topic = match.group(1).decode("ascii")
    except UnicodeDecodeError:
        return None
    partition, offset = int(match.group(2)), int(match.group(3))
    if partition > _MAX_PARTITION or not -_MAX_OFFSET <= offset <= _MAX_OFFSET:
        return None
    return topic, partition, offset


def restore(headers: Sequence[Header]) -> tuple[bytes | None, int, list[Header]] | None:
    """``(source key, source timestamp ms, source headers)`` of a data record, or None.

    None means malformed: fewer than four headers, trailing names not exactly ``PROVENANCE`` in
    order, or a timestamp that is not a decimal number within the signed 64-bit range (the same
    rule as ``dedup.job.classify``'s SQL).
    """
    # The hot path of the dedup's writer (once per clean record): no loops, no allocations
    # beyond the result.
    if len(headers) < 4:  # len(PROVENANCE)
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


def pack_positions(columns: Sequence[npt.ArrayLike]) -> bytes:
    """``POSITION_FIELDS`` columns (equal lengths) -> the packed ``positions`` value."""
    return np.column_stack([np.asarray(c, dtype=np.int64) for c in columns]).astype("<i8").tobytes()


def unpack_positions(blob: bytes) -> npt.NDArray[np.int64]:
    """A ``positions`` value -> an (n, 4) int64 array, columns in ``POSITION_FIELDS`` order."""
    return np.frombuffer(blob, dtype="<i8").reshape(-1, len(POSITION_FIELDS)).astype(np.int64)
