"""The bucketed state layout (``dedup/detector_set.py``, ``dedup/detect.py``) without Spark.

The property: a bucket that holds many source partitions gives exactly the output (first-seen
runs with their selections, gap reports, counters) of one group per source partition, called in
the same batches (with rows, or with a scan due), whatever the interleaving of partitions, runs
that overlap earlier ones, heartbeats and the time between batches.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from common.errors import GapStateError
from dedup import detect, detector_set
from dedup.detector import DetectorConfig, PartitionDetector
from dedup.rows import (
    COLUMN_NAMES,
    KIND_HEARTBEAT,
    KIND_MALFORMED,
    KIND_RESET,
    KIND_RUN_IN,
    STAT_COLUMNS,
    UNPARSED_PARTITION,
    UNPARSED_TOPIC,
    InputRows,
)
from tests.dedup_support import FakeState, detect_one_partition, run_value

INTERVAL = 1_000
PARAMS = detect.DetectParams(
    window_size=64,
    max_windows=8,
    max_expired_gaps=100,
    max_state_bytes=1 << 20,
    scan_interval_ms=INTERVAL,
)
PARTITIONS = [("a", 0), ("a", 1), ("b", 0), ("b", 7)]
BUCKET = (detector_set.BUCKET_TOPIC, 3)

# one item: (source partition index, heartbeat?, first offset, count)
items = st.tuples(
    st.integers(0, len(PARTITIONS) - 1), st.booleans(), st.integers(0, 150), st.integers(1, 12)
)
batches = st.lists(
    st.tuples(st.lists(items, max_size=8), st.integers(0, 2 * INTERVAL)), min_size=1, max_size=8
)


def _row(topic: str, partition: int, heartbeat: bool, first: int, count: int) -> dict[str, Any]:
    last = first + count - 1
    return {
        "src_topic": topic,
        "src_partition": partition,
        "kind": KIND_HEARTBEAT if heartbeat else KIND_RUN_IN,
        "src_offset": last if heartbeat else first,
        "src_last": last,
        "stride": 1,
        "payload": None
        if heartbeat
        else run_value(first, last, topic=topic, partition=partition, tag=b"v"),
        "h_keys": None,
        "h_values": None,
        "hb_low": -1,
        "hb_started": -1,
        "hb_chain": -1,
    }


def _per_partition(out: pd.DataFrame) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    found: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for row in out.itertuples(index=False):
        values = tuple(None if pd.isna(v) else v for v in row)  # type: ignore[call-overload]
        found.setdefault((values[1], values[2]), []).append(values)
    return found


@settings(max_examples=60, deadline=None)
@given(batches)
def test_a_bucket_gives_exactly_the_output_of_one_group_per_partition(
    plan: list[tuple[list[tuple[int, bool, int, int]], int]],
) -> None:
    now = 10_000
    single = {key: FakeState(now=now) for key in PARTITIONS}
    bucket = FakeState(now=now)
    for batch_items, step in plan:
        now += step
        rows = [_row(*PARTITIONS[i], hb, first, n) for i, hb, first, n in batch_items]
        expected: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        for key in PARTITIONS:
            mine = [r for r in rows if (r["src_topic"], r["src_partition"]) == key]
            state = single[key]
            state.now = now
            due = state.exists and now - state.get[1] >= INTERVAL
            if mine or due:
                frames = [pd.DataFrame(mine)] if mine else []
                (out,) = detect_one_partition(PARAMS, key, iter(frames), state)
                expected.update(_per_partition(out))
        bucket.now = now
        frames = [pd.DataFrame(rows)] if rows else []
        (out,) = detect.detect_group(PARAMS, BUCKET, iter(frames), bucket)
        assert list(out.columns) == list(COLUMN_NAMES)
        assert _per_partition(out) == expected
        saved = detector_set.DetectorSet.from_bytes(bucket.get[0])
        for key in saved:
            assert saved.get(key) == single[key].get
        assert bucket.timeout_ms == saved.next_due_in(now, INTERVAL)


def test_a_quiet_partition_is_scanned_when_its_scan_is_due_not_before() -> None:
    state = FakeState(now=10_000)
    first = [_row("a", 0, False, 0, 5), _row("a", 0, False, 8, 2)]  # 5-7 missing
    list(detect.detect_group(PARAMS, BUCKET, iter([pd.DataFrame(first)]), state))
    assert state.timeout_ms == INTERVAL
    gaps_seen = []
    for now in (10_500, 11_000, 12_000):
        state.now = now
        (out,) = detect.detect_group(PARAMS, BUCKET, iter([]), state)
        gaps_seen.append(len(out[out["kind"] == "gap"]))
        scanned = len(out[out["kind"] == "stat"])
        assert scanned == (0 if now == 10_500 else 1)
    assert gaps_seen == [0, 0, 1]  # reported open at the second scan that saw it


def test_unparsed_rows_in_a_bucket_are_counted_as_malformed() -> None:
    bad = _row("a", 0, False, 0, 1) | {
        "src_topic": UNPARSED_TOPIC,
        "src_partition": UNPARSED_PARTITION,
        "kind": KIND_MALFORMED,
        "payload": None,
    }
    state = FakeState()
    (out,) = detect.detect_group(PARAMS, BUCKET, iter([pd.DataFrame([bad, bad])]), state)
    stats = out[out["kind"] == "stat"]
    assert stats["src_partition"].tolist() == [UNPARSED_PARTITION]
    assert stats["malformed"].tolist() == [2]
    assert len(detector_set.DetectorSet.from_bytes(state.get[0])) == 0


@given(
    st.dictionaries(
        st.tuples(st.text(min_size=1, max_size=20), st.integers(-1, 2**31 - 1)),
        st.tuples(st.binary(max_size=64), st.integers(-(2**63), 2**63 - 1)),
        max_size=10,
    )
)
def test_the_container_round_trips(entries: dict[tuple[str, int], tuple[bytes, int]]) -> None:
    data = detector_set.DetectorSet(entries).to_bytes()
    back = detector_set.DetectorSet.from_bytes(data)
    assert {key: back.get(key) for key in back} == entries
    assert back.to_bytes() == data


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],
        lambda b: b + b"\0",
        lambda b: b"KDGD" + b[4:],
        lambda b: b[:7],
    ],
)
def test_a_damaged_container_is_refused(mangle: Any) -> None:
    data = detector_set.DetectorSet({("t", 1): (b"blob", 5)}).to_bytes()
    with pytest.raises(GapStateError, match="bucket"):
        detector_set.DetectorSet.from_bytes(mangle(data))


def test_the_timeout_is_the_soonest_scan() -> None:
    bucket = detector_set.DetectorSet({("a", 0): (b"", 1_000), ("a", 1): (b"", 1_700)})
    assert bucket.next_due_in(1_500, 1_000) == 500
    assert bucket.next_due_in(2_500, 1_000) == 1
    assert detector_set.DetectorSet().next_due_in(0, 1_000) == 1_000
    assert bucket.due(2_000, 1_000) == [("a", 0)]


def test_the_detectors_of_a_bucket_share_its_budget() -> None:
    bucket = detector_set.DetectorSet({("a", p): (b"", 0) for p in range(3)})
    assert bucket.budget(64 << 20) == 64 << 20  # 192 MiB / 3
    assert bucket.budget(64 << 20, joining=1) == detector_set.BUCKET_STATE_BYTES // 4
    assert bucket.budget(1 << 20, joining=1) == 1 << 20


#: Windows of 4096 offsets: every other offset of a window is a bitmap of its own (~4 KiB).
WIDE = detect.DetectParams(
    window_size=4096,
    max_windows=64,
    max_expired_gaps=100,
    max_state_bytes=1 << 30,  # above the bucket's share: the share is the budget
    scan_interval_ms=INTERVAL,
)


def test_a_partition_over_its_share_of_the_bucket_evicts_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    params = WIDE
    many = {("x", p): (b"", 10_000) for p in range(detector_set.BUCKET_STATE_BYTES // 8192)}
    share = detector_set.DetectorSet(many).budget(params.max_state_bytes, joining=1)
    assert 4096 <= share < 8192
    # every other offset of 16 windows: each window a bitmap of its own, over the share
    rows = InputRows.from_frame(
        pd.DataFrame([_row("a", 0, False, o, 1) for o in range(0, 16 * 4096, 2)])
    )
    out = detect.Output()
    detect.detect_partition(params, "a", 0, rows, None, 10_000, out, share)
    stats = out.frame().query("kind == 'stat'")
    assert stats["budget_evictions"].tolist()[0] > 0
    assert "share of its bucket" in caplog.text
    full = detect.Output()
    detect.detect_partition(params, "a", 0, rows, None, 10_000, full)  # the setting's budget
    assert full.frame().query("kind == 'stat'")["budget_evictions"].tolist() == [0]


def test_a_share_never_drops_below_the_least_budget() -> None:
    crowded = detector_set.DetectorSet({("x", p): (b"", 0) for p in range(100_000)})
    assert crowded.budget(64 << 20) == detector_set.MIN_STATE_BYTES


#: Stat columns that are the detector's state after a call; the others count what a call did.
GAUGES = ("open_gaps", "chains_missing", "pending_gaps", "state_bytes")
kinds = st.sampled_from(["run", "run", "run", "heartbeat", "reset"])
task_items = st.tuples(
    st.integers(0, len(PARTITIONS) - 1), kinds, st.integers(0, 150), st.integers(1, 12)
)
# tasks: each a few calls (Arrow batches) at one time, the time between tasks
calls = st.lists(st.lists(task_items, max_size=6), min_size=1, max_size=4)
tasks = st.lists(st.tuples(calls, st.integers(0, 2 * INTERVAL)), min_size=1, max_size=5)


def _task_row(topic: str, partition: int, kind: str, first: int, count: int) -> dict[str, Any]:
    row = _row(topic, partition, kind != "run", first, count)
    if kind == "reset":
        row["kind"] = KIND_RESET
    return row


def _rows(items: list[tuple[int, str, int, int]]) -> InputRows | None:
    rows = [_task_row(*PARTITIONS[i], kind, first, n) for i, kind, first, n in items]
    return InputRows.from_frame(pd.DataFrame(rows)) if rows else None


def _split(out: detect.Output) -> tuple[dict[Any, list[Any]], dict[Any, dict[str, Any]]]:
    """(the non-stat rows per partition, in order; the stat rows' values per partition)."""
    frame = out.frame()
    rows = _per_partition(frame[frame["kind"] != "stat"])
    stats: dict[Any, dict[str, Any]] = {}
    for row in frame[frame["kind"] == "stat"].to_dict("records"):
        stats[(row["src_topic"], row["src_partition"])] = row
    return rows, stats


@settings(max_examples=80, deadline=None)
@given(tasks)
# offsets 61-64 then 0: the kept bitmap holds an array container, the saved one a run container
# of the same size, so their bytes differ while their members agree
@example([([[(0, "run", 61, 4)], [(0, "run", 0, 1)]], 0)])
def test_detectors_kept_parsed_across_a_tasks_calls_give_the_output_of_saving_each_call(
    plan: list[tuple[list[list[tuple[int, str, int, int]]], int]],
) -> None:
    """The direct layout's task keeps each detector parsed across its Arrow batches
    (``detect.LiveBucket``): the same runs, gaps and final state as parsing and saving per
    call, and per partition one stat row with the calls' counters summed."""
    now = 10_000
    per_call = detector_set.DetectorSet()
    kept = detector_set.DetectorSet()
    for calls, step in plan:
        now += step
        expected_rows: dict[Any, list[Any]] = {}
        expected_stats: dict[Any, dict[str, Any]] = {}
        live = detect.LiveBucket(PARAMS, kept, now, total_bytes=40_000)
        live_out = detect.Output()
        for items in calls:
            out = detect.Output()
            detect.detect_bucket_rows(PARAMS, _rows(items), per_call, now, out, 40_000)
            rows, stats = _split(out)
            for key, found in rows.items():
                expected_rows.setdefault(key, []).extend(found)
            for key, row in stats.items():
                total = expected_stats.setdefault(key, dict.fromkeys(row, 0))
                for name, value in row.items():
                    if name in STAT_COLUMNS and name not in GAUGES:
                        total[name] += value
                    else:
                        total[name] = value
            live.observe(_rows(items), live_out)
        assert live.finish(live_out) is kept
        rows, stats = _split(live_out)
        assert rows == expected_rows
        # state_bytes is the size of the state as saved, which is not canonical: a bitmap
        # container whose array and run forms are the same size keeps the form it had, and a
        # detector kept parsed has a different history of forms than one saved and parsed per
        # call. The state itself must be the same; its size is the size of what is saved.
        for key, row in stats.items():
            assert row.pop("state_bytes") == len(kept.get(key)[0]), key  # type: ignore[index]
        for row in expected_stats.values():
            row.pop("state_bytes")
        assert stats == expected_stats
        assert _logical(kept) == _logical(per_call)


def _logical(detectors: detector_set.DetectorSet) -> dict[Any, tuple[int, dict[str, Any]]]:
    """Each detector's whole state as values (bitmaps compared by their members, not by the
    container forms that their serialised bytes depend on), and its last scan time."""
    config = DetectorConfig(window_size=PARAMS.window_size, max_windows=PARAMS.max_windows)
    out = {}
    for key in detectors:
        blob, last = detectors.get(key)  # type: ignore[misc]
        detector = PartitionDetector.from_bytes(blob, config)
        fields = {k: v for k, v in vars(detector).items() if k not in _NOT_STATE}
        out[key] = (last, fields)
    return out


#: Attributes of a parsed detector that are not saved state (its settings, undrained output).
_NOT_STATE = frozenset({"config", "_reports", "_warnings"})


def test_a_kept_detector_takes_the_smaller_share_when_partitions_join_in_a_later_call() -> None:
    params = WIDE
    total = 1 << 20
    alone = [_row("a", 0, False, o, 1) for o in range(0, 8 * 4096, 2)]  # ~32 KiB of bitmaps
    crowd = [_row("x", p, False, 0, 1) for p in range(200)] + [_row("a", 0, False, 9 * 4096, 1)]
    calls = [InputRows.from_frame(pd.DataFrame(rows)) for rows in (alone, crowd)]
    per_call, kept = detector_set.DetectorSet(), detector_set.DetectorSet()
    expected = detect.Output()
    for rows in calls:
        detect.detect_bucket_rows(params, rows, per_call, 10_000, expected, total)
    live = detect.LiveBucket(params, kept, 10_000, total)
    out = detect.Output()
    for rows in calls:
        live.observe(rows, out)
    live.finish(out)
    evictions = out.frame().query("kind == 'stat' and src_topic == 'a'")["budget_evictions"]
    assert evictions.tolist()[0] > 0  # 1 MiB alone, then 1 MiB / 201 partitions
    assert evictions.sum() == expected.frame().query("src_topic == 'a'")["budget_evictions"].sum()
    assert kept.to_bytes() == per_call.to_bytes()
