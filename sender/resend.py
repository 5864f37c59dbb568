"""Resend planning: which upstream offsets to read, and which can no longer be read (pure).

A resend is given offset ranges per source (topic, partition) (from a bundle, or typed by an
operator) and the partition's current watermarks upstream. Guarantee: every requested offset ends
up in exactly one bucket of the :class:`PartitionPlan` and, after reading, of the
:class:`PartitionOutcome`:

- ``expired``: below the log start offset (deleted by retention or ``DeleteRecords``);
- ``beyond_end``: at or above the high watermark (never written upstream, or truncated);
- ``to_read``: inside the log; after reading, each such offset was either **sent** or is
  **absent** (inside the log, but no record came back: a transaction marker, a record compaction
  removed, an aborted transactional record, or retention deleted it while we were reading).

``expired``, ``beyond_end`` and ``absent`` are *unrecoverable*: a resend cannot fill them, and the
operator is told so separately from what was sent (docs/resend.md, "Unrecoverable offsets").

Reading is done in **spans**: ranges closer than ``max_skip`` offsets are read as one span and the
records in between are skipped, because a seek costs a fetch round trip while skipping a few
records costs nothing. Everything here is pure: watermarks come in as numbers, records as offsets.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from common.bundle import merge_ranges
from common.errors import ConfigError

Range = tuple[int, int]
"""Inclusive ``(first, last)`` offsets."""

DEFAULT_MAX_SKIP = 10_000
"""Ranges closer than this many offsets are read as one span (cheaper than a seek)."""

MAX_MARKER_RANGES = 1000
"""A resend marker lists exact ranges up to this many; beyond, one envelope range per partition."""


def _count(ranges: Iterable[Range]) -> int:
    return sum(last - first + 1 for first, last in ranges)


def clip(
    ranges: Sequence[Range], low: int, high: int
) -> tuple[list[Range], list[Range], list[Range]]:
    """Split merged ``ranges`` by the log ``[low, high)``: ``(below, inside, above)``."""
    below: list[Range] = []
    inside: list[Range] = []
    above: list[Range] = []
    for first, last in ranges:
        if first < low:
            below.append((first, min(last, low - 1)))
        if last >= high:
            above.append((max(first, high), last))
        a, b = max(first, low), min(last, high - 1)
        if a <= b:
            inside.append((a, b))
    return below, inside, above


def spans(ranges: Sequence[Range], max_skip: int = DEFAULT_MAX_SKIP) -> list[Range]:
    """Group sorted, disjoint ``ranges`` into read spans (closer than ``max_skip``: one span)."""
    out: list[list[int]] = []
    for first, last in ranges:
        if out and first - out[-1][1] - 1 < max_skip:
            out[-1][1] = last
        else:
            out.append([first, last])
    return [(a, b) for a, b in out]


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """What to do for one source partition."""

    topic: str
    """Source topic."""
    partition: int
    """Source partition."""
    requested: tuple[Range, ...]
    """The ranges asked for, merged."""
    low: int
    """Log start offset upstream when planned."""
    high: int
    """High watermark upstream when planned (next offset to be written)."""
    to_read: tuple[Range, ...]
    """Requested ranges inside ``[low, high)``."""
    expired: tuple[Range, ...]
    """Requested ranges below ``low``: deleted upstream."""
    beyond_end: tuple[Range, ...]
    """Requested ranges at or above ``high``: not (or no longer) in the log."""
    spans: tuple[Range, ...]
    """``to_read`` grouped into read spans (each one seek)."""

    @property
    def records_to_read(self) -> int:
        """Offsets inside the log that were asked for."""
        return _count(self.to_read)

    @property
    def unrecoverable_planned(self) -> int:
        """Offsets known unrecoverable before reading."""
        return _count(self.expired) + _count(self.beyond_end)

    def wanted(self, offset: int) -> bool:
        """True when ``offset`` is in ``to_read`` (records between ranges of a span are skipped)."""
        i = bisect.bisect_right(self.to_read, (offset, 2**63)) - 1
        return i >= 0 and self.to_read[i][0] <= offset <= self.to_read[i][1]


def plan_partition(
    topic: str,
    partition: int,
    ranges: Iterable[Range],
    *,
    low: int,
    high: int,
    max_skip: int = DEFAULT_MAX_SKIP,
) -> PartitionPlan:
    """Plan one partition from its requested ranges and watermarks ``[low, high)``."""
    merged = merge_ranges(ranges)
    below, inside, above = clip(merged, low, high)
    return PartitionPlan(
        topic=topic,
        partition=partition,
        requested=merged,
        low=low,
        high=high,
        to_read=tuple(inside),
        expired=tuple(below),
        beyond_end=tuple(above),
        spans=tuple(spans(inside, max_skip)),
    )


@dataclass(slots=True)
class PartitionOutcome:
    """What reading one partition achieved; fed offset by offset while reading."""

    plan: PartitionPlan
    """The plan it follows."""
    sent: list[Range] = field(default_factory=list)
    """Offsets whose records were handed to the send pipeline, as merged ranges."""
    too_large: list[Range] = field(default_factory=list)
    """Offsets whose records exceed ``max_record_size`` (not sent, like the live sender)."""
    withheld: list[Range] = field(default_factory=list)
    """Offsets the content filter held back (sent as withheld, like the live sender)."""
    filter_errors: list[Range] = field(default_factory=list)
    """Offsets on which a content filter rule failed or timed out (not sent; they stay open)."""

    def _note(self, ranges: list[Range], offset: int) -> None:
        if ranges and ranges[-1][1] + 1 == offset:
            ranges[-1] = (ranges[-1][0], offset)
        else:
            ranges.append((offset, offset))

    def record_sent(self, offset: int) -> None:
        """Note one record handed to the pipeline (offsets arrive increasing per partition)."""
        self._note(self.sent, offset)

    def record_too_large(self, offset: int) -> None:
        """Note one record that cannot be sent."""
        self._note(self.too_large, offset)

    def record_withheld(self, offset: int) -> None:
        """Note one record the content filter held back."""
        self._note(self.withheld, offset)

    @property
    def records_sent(self) -> int:
        """Records handed to the pipeline."""
        return _count(self.sent)

    def record_filter_error(self, offset: int) -> None:
        """Note one record a failing content filter rule kept back."""
        self._note(self.filter_errors, offset)

    @property
    def records_withheld(self) -> int:
        """Records the content filter held back."""
        return _count(self.withheld)

    def absent(self) -> list[Range]:
        """Offsets inside the log that were asked for but never came back from Kafka."""
        got = merge_ranges([*self.sent, *self.too_large, *self.withheld, *self.filter_errors])
        out: list[Range] = []
        j = 0
        for first, last in self.plan.to_read:
            cursor = first
            while j < len(got) and got[j][1] < first:
                j += 1
            k = j
            while k < len(got) and got[k][0] <= last:
                a, b = got[k]
                if a > cursor:
                    out.append((cursor, a - 1))
                cursor = max(cursor, b + 1)
                k += 1
            if cursor <= last:
                out.append((cursor, last))
        return out

    @property
    def unrecoverable(self) -> int:
        """Expired + beyond the end + absent + too large + content filter errors."""
        return (
            self.plan.unrecoverable_planned
            + _count(self.absent())
            + _count(self.too_large)
            + _count(self.filter_errors)
        )


def marker_ranges(plans: Sequence[PartitionPlan]) -> list[tuple[str, int, int, int]]:
    """Ranges for the resend markers: exact when few, else one envelope per partition."""
    exact = [(p.topic, p.partition, a, b) for p in plans for a, b in p.requested]
    if len(exact) <= MAX_MARKER_RANGES:
        return exact
    return [
        (p.topic, p.partition, p.requested[0][0], p.requested[-1][1]) for p in plans if p.requested
    ]


def format_ranges(ranges: Sequence[Range], limit: int = 5) -> str:
    """``"10-19, 27, … (+3 more)"`` for logs and tables."""
    shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges[:limit])
    if len(ranges) > limit:
        shown += f", … (+{len(ranges) - limit} more)"
    return shown or "-"


def check_offset_range(from_offset: int, to_offset: int) -> Range:
    """Validate ``--from-offset``/``--to-offset`` (inclusive).

    Raises:
        ConfigError: negative or inverted.
    """
    if from_offset < 0:
        raise ConfigError("--from-offset", f"is {from_offset}", "use an offset >= 0")
    if to_offset < from_offset:
        raise ConfigError(
            "--to-offset", f"{to_offset} is below --from-offset {from_offset}", "both are inclusive"
        )
    return (from_offset, to_offset)


def time_range_offsets(
    start: int | None, end_exclusive: int | None, *, low: int, high: int
) -> Range | None:
    """Offsets of a time range from ``offsets_for_times`` answers (pure).

    ``start``: the first offset with timestamp >= from-time (``None``: no such record, so nothing
    to read). ``end_exclusive``: the first offset with timestamp > to-time (``None``: none, so up
    to the end of the log). Returns inclusive offsets, or ``None`` when the range is empty.
    """
    if start is None:
        return None
    first = max(start, low)
    last = (end_exclusive if end_exclusive is not None else high) - 1
    last = min(last, high - 1)
    return (first, last) if first <= last else None
