"""Resend planning (pure): clipping to the log, spans, outcome accounting, time ranges."""

from hypothesis import given
from hypothesis import strategies as st

from common.bundle import merge_ranges
from sender.resend import (
    MAX_MARKER_RANGES,
    PartitionOutcome,
    clip,
    marker_ranges,
    plan_partition,
    spans,
    time_range_offsets,
)


def test_plan_splits_requested_offsets_by_the_log() -> None:
    plan = plan_partition("t", 0, [(0, 9), (20, 29), (95, 120)], low=5, high=100)
    assert plan.expired == ((0, 4),)
    assert plan.to_read == ((5, 9), (20, 29), (95, 99))
    assert plan.beyond_end == ((100, 120),)
    assert plan.records_to_read == 5 + 10 + 5
    assert plan.unrecoverable_planned == 5 + 21


def test_everything_deleted_upstream_is_all_unrecoverable() -> None:
    plan = plan_partition("t", 1, [(0, 9)], low=50, high=60)
    assert plan.to_read == ()
    assert plan.spans == ()
    assert plan.expired == ((0, 9),)


def test_spans_join_close_ranges_and_wanted_skips_between() -> None:
    plan = plan_partition(
        "t", 0, [(10, 12), (20, 21), (5000, 5000)], low=0, high=10_000, max_skip=100
    )
    assert plan.spans == ((10, 21), (5000, 5000))
    assert [o for o in range(30) if plan.wanted(o)] == [10, 11, 12, 20, 21]
    assert plan.wanted(5000)
    assert not plan.wanted(4999)


def test_outcome_reports_absent_offsets() -> None:
    plan = plan_partition("t", 0, [(0, 9)], low=0, high=10)
    outcome = PartitionOutcome(plan)
    for offset in (0, 1, 2, 5, 6):
        outcome.record_sent(offset)
    outcome.record_too_large(7)
    assert outcome.sent == [(0, 2), (5, 6)]
    assert outcome.records_sent == 5
    assert outcome.absent() == [(3, 4), (8, 9)]
    assert outcome.unrecoverable == 2 + 2 + 1


ranges_st = st.lists(
    st.tuples(st.integers(0, 500), st.integers(0, 50)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=20,
)


@given(ranges_st, st.integers(0, 600), st.integers(0, 600), st.integers(0, 300))
def test_every_requested_offset_lands_in_exactly_one_bucket(
    ranges: list[tuple[int, int]], low: int, width: int, max_skip: int
) -> None:
    high = low + width
    plan = plan_partition("t", 0, ranges, low=low, high=high, max_skip=max_skip)
    requested = {o for a, b in ranges for o in range(a, b + 1)}
    buckets = [plan.expired, plan.to_read, plan.beyond_end]
    seen: list[int] = [o for bucket in buckets for a, b in bucket for o in range(a, b + 1)]
    assert sorted(seen) == sorted(requested)
    assert all(o < low for a, b in plan.expired for o in (a, b))
    assert all(low <= o < high for a, b in plan.to_read for o in (a, b))
    # spans cover to_read, and wanted() is exactly to_read
    assert all(any(s <= a and b <= e for s, e in plan.spans) for a, b in plan.to_read)
    in_spans = {o for s, e in plan.spans for o in range(s, e + 1)}
    assert {o for o in in_spans if plan.wanted(o)} == {
        o for a, b in plan.to_read for o in range(a, b + 1)
    }
    # reading every other offset: the rest is absent, nothing counted twice
    outcome = PartitionOutcome(plan)
    for o in sorted(in_spans):
        if plan.wanted(o) and o % 2 == 0:
            outcome.record_sent(o)
    absent = {o for a, b in outcome.absent() for o in range(a, b + 1)}
    sent = {o for a, b in outcome.sent for o in range(a, b + 1)}
    assert absent | sent == {o for a, b in plan.to_read for o in range(a, b + 1)}
    assert not absent & sent
    assert outcome.unrecoverable == len(requested) - len(sent)


def test_clip_and_spans_edge_cases() -> None:
    assert clip([(5, 5)], 5, 6) == ([], [(5, 5)], [])
    assert clip([(5, 5)], 6, 7) == ([(5, 5)], [], [])
    assert clip([(5, 5)], 0, 5) == ([], [], [(5, 5)])
    assert spans([(0, 0), (2, 2)], max_skip=0) == [(0, 0), (2, 2)]
    assert spans([(0, 0), (2, 2)], max_skip=2) == [(0, 2)]
    assert merge_ranges(spans([(0, 1), (3, 4)], 10)) == ((0, 4),)


def test_marker_ranges_fall_back_to_one_envelope_per_partition() -> None:
    few = [plan_partition("t", 0, [(1, 2), (5, 6)], low=0, high=10)]
    assert marker_ranges(few) == [("t", 0, 1, 2), ("t", 0, 5, 6)]
    many = [
        plan_partition("t", p, [(i * 3, i * 3) for i in range(MAX_MARKER_RANGES)], low=0, high=1)
        for p in range(2)
    ]
    assert marker_ranges(many) == [("t", 0, 0, 3 * (MAX_MARKER_RANGES - 1)), ("t", 1, 0, 2997)]


def test_time_range_offsets() -> None:
    assert time_range_offsets(None, None, low=0, high=10) is None
    assert time_range_offsets(3, None, low=0, high=10) == (3, 9)
    assert time_range_offsets(3, 7, low=0, high=10) == (3, 6)
    assert time_range_offsets(3, 3, low=0, high=10) is None
    assert time_range_offsets(1, 5, low=2, high=10) == (2, 4)
