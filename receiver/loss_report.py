"""Offset ranges the receiver could not write downstream, collected for the operator.

When the downstream Kafka is away long enough for the buffers to fill (overflow), or a record's
delivery fails for good, the record is gone from the low side: only a resend from the high side
brings it back. :class:`LossReport` collects the lost ``(topic, partition, offset)`` triples as
merged inclusive ranges per partition so a log line can say exactly what to resend. Bounded: at
most ``max_ranges_per_partition`` ranges and ``max_partitions`` partitions are kept; beyond that
the ranges of a partition collapse into one covering range (over-reporting, never under-reporting)
and further partitions are only counted. Pure; the caller decides when to log.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Partition:
    ranges: list[list[int]] = field(default_factory=list)  # sorted, disjoint [first, last]


class LossReport:
    """Merge lost offsets into ranges per (topic, partition)."""

    def __init__(self, *, max_ranges_per_partition: int = 64, max_partitions: int = 4096) -> None:
        self._max_ranges = max_ranges_per_partition
        self._max_partitions = max_partitions
        self._parts: dict[tuple[str, int], _Partition] = {}
        self.records = 0
        """Records added since the last :meth:`take`."""
        self.unlisted = 0
        """Records whose partition could not be listed (too many partitions)."""

    def add(self, topic: str, partition: int, offset: int) -> None:
        """Record one lost offset."""
        self.records += 1
        part = self._parts.get((topic, partition))
        if part is None:
            if len(self._parts) >= self._max_partitions:
                self.unlisted += 1
                return
            part = self._parts[(topic, partition)] = _Partition()
        ranges = part.ranges
        if ranges:
            last = ranges[-1]
            if last[0] <= offset <= last[1]:
                return
            if offset == last[1] + 1:  # the common case: consecutive offsets
                last[1] = offset
                return
        self._insert(ranges, offset)
        if len(ranges) > self._max_ranges:
            ranges[:] = [[ranges[0][0], max(r[1] for r in ranges)]]

    @staticmethod
    def _insert(ranges: list[list[int]], offset: int) -> None:
        lo, hi = 0, len(ranges)
        while lo < hi:
            mid = (lo + hi) // 2
            if ranges[mid][1] < offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(ranges) and ranges[lo][0] <= offset:
            return  # already inside
        ranges.insert(lo, [offset, offset])
        # merge with neighbours that now touch
        if lo + 1 < len(ranges) and ranges[lo + 1][0] == offset + 1:
            ranges[lo][1] = ranges[lo + 1][1]
            del ranges[lo + 1]
        if lo > 0 and ranges[lo - 1][1] + 1 == offset:
            ranges[lo - 1][1] = ranges[lo][1]
            del ranges[lo]

    def __bool__(self) -> bool:
        return self.records > 0

    def take(self) -> tuple[int, int, list[tuple[str, int, int, int]]]:
        """Return ``(records, unlisted, [(topic, partition, first, last), ...])`` and reset."""
        out = [
            (topic, partition, first, last)
            for (topic, partition), part in sorted(self._parts.items())
            for first, last in part.ranges
        ]
        result = (self.records, self.unlisted, out)
        self._parts.clear()
        self.records = 0
        self.unlisted = 0
        return result


def format_ranges(ranges: list[tuple[str, int, int, int]], limit: int = 50) -> str:
    """``orders:3:[10-99,120]`` style text, at most ``limit`` ranges (the rest counted)."""
    parts = [
        f"{t}:{p}:{first}" if first == last else f"{t}:{p}:{first}-{last}"
        for t, p, first, last in ranges[:limit]
    ]
    if len(ranges) > limit:
        parts.append(f"... and {len(ranges) - limit} more ranges")
    return ", ".join(parts)
