"""The receiver's loss report: lost ranges merged, bounded, never under-reported."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from receiver.loss_report import LossReport, format_ranges


def test_loss_report_merges_ranges() -> None:
    report = LossReport()
    for offset in [5, 6, 7, 10, 9, 1, 8, 7]:
        report.add("t", 0, offset)
    report.add("u", 2, 100)
    records, unlisted, ranges = report.take()
    assert records == 9
    assert unlisted == 0
    assert ranges == [("t", 0, 1, 1), ("t", 0, 5, 10), ("u", 2, 100, 100)]
    assert format_ranges(ranges) == "t:0:1, t:0:5-10, u:2:100"
    assert not report


@given(st.lists(st.integers(0, 300), max_size=200))
def test_loss_report_never_under_reports(offsets) -> None:
    report = LossReport(max_ranges_per_partition=8)
    for offset in offsets:
        report.add("t", 1, offset)
    _, _, ranges = report.take()
    covered = {o for _, _, first, last in ranges for o in range(first, last + 1)}
    assert set(offsets) <= covered
    assert len(ranges) <= 8


def test_loss_report_bounds_partitions() -> None:
    report = LossReport(max_partitions=2)
    for p in range(5):
        report.add("t", p, 0)
    records, unlisted, ranges = report.take()
    assert (records, unlisted, len(ranges)) == (5, 3, 2)
