"""Gap-topic records (docs/gaps.md), the contract between the dedup, ``gaps``, ``bundle`` and
``resend``: what a gap is (:class:`GapReport`), its key and its JSON value.

Key ``<topic>:<partition>:<first>`` (ASCII), so a compacted gap topic keeps the latest state per
(topic, partition, gap start). Value: human-readable JSON, schema version 1. A null value
(tombstone) means "no gap with this key", like FILLED. ``parse_gap`` treats every byte as
untrusted: anything that does not match the schema raises :class:`GapRecordError`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common.errors import DiodeError, ServiceError

log = logging.getLogger(__name__)

__all__ = [
    "GAP_RECORD_VERSION",
    "MAX_OFFSET",
    "GapRecordError",
    "GapReport",
    "GapScan",
    "GapState",
    "gap_key",
    "gap_value",
    "latest_gaps",
    "parse_gap",
]

GAP_RECORD_VERSION = 1
#: Distinct gap keys a reader keeps (``latest_gaps``): bounds its memory on a hostile topic.
MAX_GAP_KEYS = 5_000_000
MAX_OFFSET = 2**63 - 2
"""Largest offset accepted: Kafka offsets are signed 64-bit and ``next`` (offset + 1) must fit."""
_MAX_RECORD = 64 * 1024  # a gap record is a few hundred bytes; refuse anything absurd
_FIELDS = frozenset(
    {
        "topic",
        "partition",
        "first",
        "last",
        "count",
        "state",
        "detected_at",
        "reported_at",
        "version",
    }
)


class GapState(StrEnum):
    """State of a gap in the gap topic."""

    OPEN = "open"
    FILLED = "filled"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class GapReport:
    """One gap-topic record: the latest state of the gap starting at ``first``."""

    topic: str
    """Source topic."""
    partition: int
    """Source partition."""
    first: int
    """First missing offset; with (topic, partition) the compaction key."""
    last: int
    """Last offset of the range (inclusive). For FILLED: the closed prefix of the range."""
    state: GapState
    """OPEN, FILLED (a resend or late record closed it) or EXPIRED (forgotten: records are lost)."""
    detected_at: int
    """Milliseconds: ``now_ms`` of the scan or eviction that first saw the gap (or its parent)."""
    reported_at: int
    """Milliseconds: ``now_ms`` of the call that produced this report."""

    @property
    def count(self) -> int:
        """Number of offsets in ``first..last``."""
        return self.last - self.first + 1


class GapRecordError(DiodeError):
    """A gap-topic record does not match the documented schema (docs/gaps.md)."""


def gap_key(report: GapReport) -> bytes:
    """Compaction key ``<topic>:<partition>:<first>``."""
    return f"{report.topic}:{report.partition}:{report.first}".encode("ascii")


def gap_value(report: GapReport) -> bytes:
    """JSON value, keys in a fixed order, version 1."""
    return json.dumps(
        {
            "topic": report.topic,
            "partition": report.partition,
            "first": report.first,
            "last": report.last,
            "count": report.count,
            "state": report.state.value,
            "detected_at": report.detected_at,
            "reported_at": report.reported_at,
            "version": GAP_RECORD_VERSION,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def _split_key(key: bytes) -> tuple[str, int, int]:
    try:
        text = key.decode("ascii")
        topic, partition, first = text.rsplit(":", 2)
        return topic, int(partition), int(first)
    except (UnicodeDecodeError, ValueError) as exc:
        raise GapRecordError(f"gap key {key[:80]!r} is not <topic>:<partition>:<first>") from exc


def _int(doc: dict[str, object], name: str, low: int, high: int) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise GapRecordError(f"gap field {name!r} must be an integer in {low}..{high}")
    return value


def parse_gap(key: bytes, value: bytes | None) -> GapReport | None:
    """Parse one gap-topic record; ``None`` for a tombstone.

    Raises:
        GapRecordError: malformed key or value, unknown version or state, or key/value mismatch.
    """
    topic, partition, first = _split_key(key)
    if value is None:
        return None
    if len(value) > _MAX_RECORD:
        raise GapRecordError(f"gap value of {len(value)} bytes exceeds {_MAX_RECORD}")
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise GapRecordError(f"gap value is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise GapRecordError("gap value must be a JSON object")
    if doc.get("version") != GAP_RECORD_VERSION:
        raise GapRecordError(f"gap record version {doc.get('version')!r} is not supported")
    if not doc.keys() >= _FIELDS:
        raise GapRecordError(f"gap value lacks {sorted(_FIELDS - doc.keys())}")
    try:
        state = GapState(doc["state"])
    except ValueError as exc:
        raise GapRecordError(f"unknown gap state {doc['state']!r}") from exc
    if not isinstance(doc["topic"], str):
        raise GapRecordError("gap field 'topic' must be a string")
    report = GapReport(
        topic=doc["topic"],
        partition=_int(doc, "partition", 0, 2**31 - 1),
        first=_int(doc, "first", 0, MAX_OFFSET),
        last=_int(doc, "last", 0, MAX_OFFSET),
        state=state,
        detected_at=_int(doc, "detected_at", 0, 2**63 - 1),
        reported_at=_int(doc, "reported_at", 0, 2**63 - 1),
    )
    if (report.topic, report.partition, report.first) != (topic, partition, first):
        raise GapRecordError("gap key and value disagree on topic, partition or first")
    if report.last < report.first or _int(doc, "count", 1, 2**63 - 1) != report.count:
        raise GapRecordError("gap range is empty or count does not match first..last")
    return report


@dataclass(slots=True)
class GapScan:
    """What the gap topic holds now."""

    open_reports: list[GapReport] = field(default_factory=list)
    """Every OPEN gap (after the topic filter), in gap-topic order of first appearance."""
    records_read: int = 0
    """Gap-topic records read."""
    malformed: int = 0
    """Records that do not match the gap schema (skipped, logged)."""
    states: dict[str, int] = field(default_factory=dict)
    """Latest state counts (open, filled, expired) over every key."""

    @property
    def open_gaps(self) -> list[tuple[str, int, int, int]]:
        """``(topic, partition, first, last)`` of every OPEN gap."""
        return [(r.topic, r.partition, r.first, r.last) for r in self.open_reports]


def latest_gaps(
    records: Iterable[tuple[bytes | None, bytes | None]], topics: Sequence[str] = ()
) -> GapScan:
    """Latest state per gap key from ``(key, value)`` in topic order; keep the OPEN ones.

    ``topics``: only gaps of these source topics (all when empty). Malformed records are counted
    and skipped (the first ten logged), a tombstone forgets its key.

    Raises:
        ServiceError: more than ``MAX_GAP_KEYS`` distinct gap keys (memory bound).
    """
    scan = GapScan()
    latest: dict[bytes, Any] = {}
    for key, value in records:
        scan.records_read += 1
        if key is None:
            scan.malformed += 1
            continue
        try:
            report = parse_gap(key, value)
        except GapRecordError as exc:
            scan.malformed += 1
            if scan.malformed <= 10:
                log.warning("skipping malformed gap record %r: %s", key[:80], exc)
            continue
        if report is None:
            latest.pop(key, None)
            continue
        latest[key] = report
        if len(latest) > MAX_GAP_KEYS:
            raise ServiceError(f"the gap topic holds more than {MAX_GAP_KEYS} gap keys")
    wanted = set(topics)
    for report in latest.values():
        scan.states[report.state.value] = scan.states.get(report.state.value, 0) + 1
        if report.state is GapState.OPEN and (not wanted or report.topic in wanted):
            scan.open_reports.append(report)
    return scan
