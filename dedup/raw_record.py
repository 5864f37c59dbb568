"""The raw-topic record layout (docs/topics.md), pure: key parsing and provenance checks.

The Spark job evaluates the same rules in SQL (``dedup.job.classify``) with ``KEY_PATTERN``; this
module is the reference the unit tests pin down, and what non-Spark tools use.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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
    if len(headers) < len(PROVENANCE):
        return None
    tail = headers[-len(PROVENANCE) :]
    if tuple(name for name, _ in tail) != PROVENANCE:
        return None
    stamp = tail[1][1]
    if stamp is None or not _TIMESTAMP_RE.fullmatch(stamp):
        return None
    timestamp = int(stamp)
    if not -_MAX_OFFSET - 1 <= timestamp <= _MAX_OFFSET:
        return None
    return tail[0][1], timestamp, list(headers[: -len(PROVENANCE)])
