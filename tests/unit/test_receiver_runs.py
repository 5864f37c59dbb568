"""The receiver's run coalescer (receiver/runs.py) with a fake clock: when a run ends."""

from __future__ import annotations

import pytest

from common.raw_run import check_run, parse_run_key
from common.wire.events import RecordGroup
from receiver.runs import Run, RunCoalescer

S1, S2 = b"\x01" * 16, b"\x02" * 16


def group(
    offsets: list[int] | range,
    *,
    partition: int = 0,
    topic: str = "t",
    ts_type: int = 1,
    value: bytes | None = b"v",
    ts: int = 1000,
) -> RecordGroup:
    n = len(offsets)
    return RecordGroup(
        topic, partition, ts_type, tuple(offsets), (ts,) * n, (None,) * n, (value,) * n, ((),) * n
    )


def keys(runs: list[Run]) -> list[str]:
    return [run.key for run in runs]


def decoded(run: Run) -> tuple[int, ...]:
    parsed = parse_run_key(run.key)
    assert parsed is not None
    return check_run(run.value, *parsed).offsets


def test_consecutive_groups_make_one_run_until_the_linger() -> None:
    c, out = RunCoalescer(1 << 20, 0.02), []
    c.add_group(S1, group(range(5)), 10.0, out)
    c.add_group(S1, group(range(5, 9)), 10.015, out)
    assert out == []
    assert c.next_deadline() == pytest.approx(10.02)
    c.flush_due(10.0199, out)
    assert out == []
    c.flush_due(10.02, out)
    assert keys(out) == ["t:0:0-8"]
    assert decoded(out[0]) == tuple(range(9))
    assert out[0].count == 9
    assert (len(c), c.records, c.next_deadline()) == (0, 0, None)


@pytest.mark.parametrize(
    ("second", "why"),
    [([6, 7], "an offset lost"), ([4, 5], "an offset repeated"), ([2], "an older offset")],
)
def test_a_break_in_the_offsets_ends_the_run(second: list[int], why: str) -> None:
    c, out = RunCoalescer(1 << 20, 1.0), []
    c.add_group(S1, group(range(5)), 0.0, out)
    c.add_group(S1, group(second), 0.0, out)
    assert keys(out) == ["t:0:0-4"], why
    c.flush_all(out)
    assert decoded(out[1]) == tuple(second)


def test_a_stride_is_kept_and_a_change_of_stride_breaks() -> None:
    c, out = RunCoalescer(1 << 20, 1.0), []
    c.add_group(S1, group([3, 7, 11]), 0.0, out)
    c.add_group(S1, group([15, 16]), 0.0, out)
    c.flush_all(out)
    assert keys(out) == ["t:0:3-15/4", "t:0:16-16"]


def test_another_timestamp_type_ends_the_run() -> None:
    c, out = RunCoalescer(1 << 20, 1.0), []
    c.add_group(S1, group(range(3), ts_type=1), 0.0, out)
    c.add_group(S1, group(range(3, 5), ts_type=2), 0.0, out)
    c.flush_all(out)
    assert keys(out) == ["t:0:0-2", "t:0:3-4"]
    assert check_run(out[1].value, "t", 0, 3, 4, 1).timestamp_type == 2


def test_a_timestamp_too_far_from_the_runs_base_ends_it() -> None:
    c, out = RunCoalescer(1 << 20, 1.0), []
    c.add_group(S1, group([0], ts=-(2**63)), 0.0, out)
    c.add_group(S1, group([1], ts=2**63 - 1), 0.0, out)
    c.flush_all(out)
    assert keys(out) == ["t:0:0-0", "t:0:1-1"]
    assert [decoded(run) for run in out] == [(0,), (1,)]


def test_the_cap_is_never_exceeded_and_a_larger_record_is_a_run_of_one() -> None:
    c, out = RunCoalescer(1024, 1.0), []
    c.add_group(S1, group(range(30), value=b"x" * 100), 0.0, out)
    assert out  # full runs go at once, without waiting for the linger
    assert all(len(run.value) <= 1024 for run in out)
    c.add_group(S1, group([30], value=b"y" * 5000), 0.0, out)
    assert keys(out)[-1] == "t:0:30-30"  # alone, at once
    assert c.records == 0
    c.add_group(S1, group([31]), 0.0, out)
    c.flush_all(out)
    assert [o for run in out for o in decoded(run)] == list(range(32))


def test_control_flush_takes_every_session_of_that_partition_only() -> None:
    c, out = RunCoalescer(1 << 20, 1.0), []
    c.add_group(S1, group(range(3)), 0.0, out)
    c.add_group(S2, group([100, 101]), 0.0, out)
    c.add_group(S1, group(range(2), partition=1), 0.0, out)
    c.add_group(S1, group(range(2), topic="u"), 0.0, out)
    c.flush_partition("t", 0, out)
    assert sorted(keys(out)) == ["t:0:0-2", "t:0:100-101"]
    assert {run.session_id for run in out} == {S1, S2}
    assert len(c) == 2
    c.flush_partition("t", 0, out)  # nothing open there any more
    assert len(out) == 2


def test_interleaved_partitions_and_sessions_keep_their_own_runs() -> None:
    c, out = RunCoalescer(1 << 20, 1.0), []
    for base in range(0, 12, 3):
        c.add_group(S1, group(range(base, base + 3), partition=0), 0.0, out)
        c.add_group(S1, group(range(base, base + 3), partition=1), 0.0, out)
        c.add_group(S2, group(range(base + 1000, base + 1003), partition=0), 0.0, out)
    assert out == []
    c.flush_all(out)
    assert sorted(keys(out)) == ["t:0:0-11", "t:0:1000-1011", "t:1:0-11"]


def test_linger_takes_the_oldest_runs_first() -> None:
    c, out = RunCoalescer(1 << 20, 0.02), []
    c.add_group(S1, group([0], partition=0), 1.000, out)
    c.add_group(S1, group([0], partition=1), 1.010, out)
    c.add_group(S1, group([1], partition=0), 1.015, out)  # joins the older run: its age counts
    c.flush_due(1.025, out)
    assert keys(out) == ["t:0:0-1"]
    assert c.next_deadline() == pytest.approx(1.03)
    c.flush_due(1.03, out)
    assert keys(out) == ["t:0:0-1", "t:1:0-0"]


def test_zero_linger_ends_runs_at_once() -> None:
    c, out = RunCoalescer(1 << 20, 0.0), []
    c.add_group(S1, group(range(3)), 5.0, out)
    c.flush_due(5.0, out)
    assert keys(out) == ["t:0:0-2"]


def test_open_runs_are_bounded() -> None:
    c, out = RunCoalescer(1 << 20, 1.0, max_open=3), []
    for partition in range(5):
        c.add_group(S1, group([0], partition=partition), float(partition), out)
    assert len(c) == 3
    assert keys(out) == ["t:0:0-0", "t:1:0-0"]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="positive"):
        RunCoalescer(0, 1.0)
    with pytest.raises(ValueError, match="linger"):
        RunCoalescer(1024, -1.0)


def test_a_continuing_group_in_one_piece_is_the_same_run_as_record_by_record() -> None:
    whole, each, out_whole, out_each = (
        RunCoalescer(1 << 20, 1.0),
        RunCoalescer(1 << 20, 1.0),
        [],
        [],
    )
    groups = [group(range(i * 5, i * 5 + 5), value=None if i % 2 else b"v" * i) for i in range(6)]
    for g in groups:
        whole.add_group(S1, g, 0.0, out_whole)
        for k in range(len(g)):  # the same records, one per group: never the one-piece path
            each.add_group(S1, group([g.offsets[k]], value=g.values[k]), 0.0, out_each)
    whole.flush_all(out_whole)
    each.flush_all(out_each)
    assert [(r.key, r.value) for r in out_whole] == [(r.key, r.value) for r in out_each]
    assert keys(out_whole) == ["t:0:0-29"]


def test_a_continuing_group_that_would_pass_the_cap_is_cut_record_by_record() -> None:
    c, out = RunCoalescer(1024, 1.0), []
    c.add_group(S1, group(range(3), value=b"x" * 200), 0.0, out)
    c.add_group(S1, group(range(3, 8), value=b"x" * 200), 0.0, out)
    c.flush_all(out)
    assert all(len(run.value) <= 1024 for run in out)
    assert [o for run in out for o in decoded(run)] == list(range(8))
