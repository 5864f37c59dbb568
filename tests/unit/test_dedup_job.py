"""The dedup's per-partition step without Spark: resets before state, heartbeat lows, stats.

``detect_one_partition`` (``tests/dedup_support.py``) runs one source partition's detector per
micro-batch as a bucket does for each of its partitions; here it gets a stand-in for Spark's
``GroupState`` (same four members) and pandas frames shaped like ``classify``'s output. No JVM
starts.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from dedup import detect
from dedup.detector import DetectorConfig, GapStateError, PartitionDetector
from dedup.metrics import DedupMetrics
from dedup.rows import COLUMN_NAMES, KIND_DATA, KIND_HEARTBEAT, KIND_RESET, STAT_COLUMNS
from tests.dedup_support import FakeState, delivered, detect_one_partition, frame

PARAMS = detect.DetectParams(
    window_size=64,
    max_windows=8,
    max_expired_gaps=100,
    max_state_bytes=1 << 20,
    scan_interval_ms=1,
)


rows = frame


def run(state: FakeState, *items: tuple[int, int, int, int]) -> pd.DataFrame:
    frames = [rows(*items)] if items else []
    out = list(detect_one_partition(PARAMS, ("t", 0), iter(frames), state))
    return pd.concat(out, ignore_index=True)


def settle(state: FakeState) -> pd.DataFrame:
    """Two timeouts (two scans: the two-scan rule); the output of both."""
    outs = []
    for _ in range(2):
        state.now += 10
        outs.append(run(state))
    return pd.concat(outs, ignore_index=True)


def open_gaps(out: pd.DataFrame) -> list[tuple[int, int]]:
    values = [json.loads(v) for v in out[out["kind"] == "gap"]["gap_value"]]
    return [(g["first"], g["last"]) for g in values if g["state"] == "open"]


DATA, HB, RESET = KIND_DATA, KIND_HEARTBEAT, KIND_RESET


def test_heartbeat_low_offset_reports_the_lost_head() -> None:
    state = FakeState()
    run(state, *[(DATA, o, -1, -1) for o in range(7, 12)], (HB, 11, 0, 5))
    assert open_gaps(settle(state)) == [(0, 6)]


def test_heartbeats_without_low_offset_keep_the_old_behaviour() -> None:
    state = FakeState()
    run(state, *[(DATA, o, -1, -1) for o in range(7, 12)], (HB, 14, -1, -1), (HB, 13, 20, -1))
    assert open_gaps(settle(state)) == [(12, 14)]  # the invalid low (above its high) is ignored


def test_a_reset_is_applied_before_the_saved_state_is_read() -> None:
    old = PartitionDetector("t", 0, DetectorConfig(window_size=128))
    old.observe(5, 1)
    state = FakeState((old.to_bytes(), 1))
    with pytest.raises(GapStateError) as info:
        run(FakeState((old.to_bytes(), 1)), (DATA, 6, -1, -1))
    message = str(info.value)
    assert "WINDOW_SIZE=128" in message
    assert "WINDOW_SIZE=64" in message
    assert "kafka-diode dedup reset --topic T --partition P --yes" in message
    assert "--topic t --partition 0" in message
    out = run(state, (RESET, 0, -1, -1), (DATA, 6, -1, -1), (HB, 6, 0, 9_999))
    assert [o for o, _ in delivered(out)] == [6]
    stat = out[out["kind"] == "stat"].iloc[0]
    assert stat["resets"] == 1
    restored = PartitionDetector.from_bytes(state.get[0], DetectorConfig(window_size=64))
    assert restored.lows_ignored == 1  # a session from before the reset: its low is not trusted
    assert restored.open_gaps() == []


def test_stat_rows_carry_the_detector_counters_and_metrics_export_them() -> None:
    params = detect.DetectParams(
        window_size=10, max_windows=1, max_expired_gaps=0, max_state_bytes=1 << 20,
        scan_interval_ms=1,
    )  # fmt: skip
    state = FakeState()
    outs = []
    for batch in (
        [(DATA, 0, -1, -1), (DATA, 5, -1, -1)],
        [(DATA, 15, -1, -1)],
        [(DATA, 2, -1, -1)],
    ):
        # one batch each: within a batch the offsets are sorted first
        outs += list(detect_one_partition(params, ("t", 0), iter([rows(*batch)]), state))
    out = pd.concat(outs, ignore_index=True)
    stat = out[out["kind"] == "stat"][list(STAT_COLUMNS)].astype(int).sum()
    # window 0 evicted with gaps [1,4] and [6,9], expired at once (MAX_EXPIRED_GAPS=0); offset 2
    # is then older than anything the state remembers
    assert (stat["expired_gaps"], stat["below_window"]) == (2, 1)
    metrics = DedupMetrics()
    stats = out[out["kind"] == "stat"]
    columns = ["src_topic", "src_partition", *STAT_COLUMNS, "state_bytes"]
    metrics.add_stats(pa.Table.from_pandas(stats[columns].reset_index(drop=True)))
    value: Any = metrics.registry.get_sample_value
    assert value("kafka_diode_dedup_gaps_expired_total") == 2
    assert value("kafka_diode_dedup_below_window_dropped_total") == 1
    assert value("kafka_diode_dedup_budget_evictions_total") == 0
    assert value("kafka_diode_dedup_resets_applied_total") == 0


def test_run_rows_carry_the_payload_of_first_seen_records_in_source_order() -> None:
    # runs 5..9 twice (the second is a duplicate), then 3..6 (3, 4 new), 12..12 (a gap 10..11)
    out = run(
        FakeState(),
        (DATA, 5, -1, -1, -1, 9, 1),
        (DATA, 5, -1, -1, -1, 9, 1),
        (DATA, 3, -1, -1, -1, 6, 1),
        (DATA, 12, -1, -1),
    )
    assert len(out[out["kind"] == "run"]) == 3  # the duplicate run leaves nothing
    assert delivered(out) == [(o, b"%d" % o) for o in (3, 4, 5, 6, 7, 8, 9, 12)]
    stat = out[out["kind"] == "stat"].iloc[0]
    assert (stat["delivered"], stat["duplicates"]) == (8, 7)
    assert list(out.columns) == list(COLUMN_NAMES)


def test_a_run_whose_value_disagrees_with_its_key_is_malformed_and_stays_a_gap() -> None:
    state = FakeState()
    bad = frame((DATA, 3, -1, -1, -1, 5, 1))
    bad.loc[0, "src_last"] = 6  # the key says 3..6, the value holds 3..5
    good = frame((DATA, 0, -1, -1, -1, 2, 1), (DATA, 7, -1, -1), (HB, 7, -1, -1))
    out = pd.concat(list(detect_one_partition(PARAMS, ("t", 0), iter([bad, good]), state)))
    assert [o for o, _ in delivered(out)] == [0, 1, 2, 7]
    assert int(out[out["kind"] == "stat"]["malformed"].sum()) == 1
    assert open_gaps(settle(state)) == [(3, 6)]


def test_share_chain_runs_are_observed_by_stride() -> None:
    state = FakeState()
    out = run(state, (DATA, 0, -1, -1, -1, 8, 2), (DATA, 4, -1, -1, -1, 12, 4), (HB, 12, -1, -1))
    assert [o for o, _ in delivered(out)] == [0, 2, 4, 6, 8, 12]
    assert open_gaps(settle(state)) == [(1, 1), (3, 3), (5, 5), (7, 7), (9, 11)]


def test_a_v1_record_leaves_as_a_run_of_one_with_its_provenance_restored() -> None:
    batch = pd.DataFrame(
        [
            {
                "kind": KIND_DATA, "src_offset": 4, "src_last": 4, "stride": 1,
                "payload": b"value", "h_keys": ["h", "diode.key", "diode.timestamp",
                "diode.timestamp-type", "diode.session"],
                "h_values": [None, b"", b"-5", b"0", b"ab"], "hb_low": -1, "hb_started": -1,
                "hb_chain": -1,
            }
        ]
    )  # fmt: skip
    out = pd.concat(list(detect_one_partition(PARAMS, ("t", 0), iter([batch]), FakeState())))
    payload = out[out["kind"] == "run"]["payload"].iloc[0]
    from common.wire.batch_decode import decode_record_groups  # noqa: PLC0415

    (group,), _ = decode_record_groups(payload)
    assert (group.offsets, group.timestamps, group.timestamp_type) == ((4,), (-5,), 0)
    assert (group.keys, group.values, group.headers) == ((b"",), (b"value",), ((("h", None),),))
