"""The dedup's per-partition step without Spark: resets before state, heartbeat lows, stats.

``detect_group`` is the function Spark calls per (topic, partition) and micro-batch; here it gets
a stand-in for Spark's ``GroupState`` (same four members) and pandas frames shaped like
``classify``'s output. No JVM starts.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from dedup import gaps, job
from dedup.positions import unpack_positions
from dedup.writer import DedupMetrics

PARAMS = job.DetectParams(
    window_size=64,
    max_windows=8,
    max_expired_gaps=100,
    max_state_bytes=1 << 20,
    scan_interval_ms=1,
)


class FakeState:
    """The members of pyspark's GroupState that detect_group uses."""

    def __init__(self, value: tuple[bytes, int] | None = None, now: int = 10_000) -> None:
        self.value, self.now = value, now

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[bytes, int]:
        assert self.value is not None
        return self.value

    def getCurrentProcessingTimeMs(self) -> int:
        return self.now

    def update(self, value: tuple[bytes, int]) -> None:
        self.value = value

    def setTimeoutDuration(self, _ms: int) -> None:
        pass


def rows(*items: tuple[int, int, int, int]) -> pd.DataFrame:
    """(kind, src_offset, hb_low, hb_started) rows as classify() produces them."""
    return pd.DataFrame(
        {
            "kind": [k for k, *_ in items],
            "src_offset": [o for _, o, *_ in items],
            "raw_topic": [0] * len(items),
            "raw_partition": [0] * len(items),
            "raw_offset": [100 + i for i in range(len(items))],
            "hb_low": [low for *_, low, _ in items],
            "hb_started": [s for *_, s in items],
        }
    )


def run(state: FakeState, *items: tuple[int, int, int, int]) -> pd.DataFrame:
    frames = [rows(*items)] if items else []
    out = list(job.detect_group(PARAMS, ("t", 0), iter(frames), state))
    return pd.concat(out, ignore_index=True)


def settle(state: FakeState) -> pd.DataFrame:
    """Two timeouts (two scans: the two-scan rule); the output of both."""
    outs = []
    for _ in range(2):
        state.now += 10
        outs.append(run(state))
    return pd.concat(outs, ignore_index=True)


def positions(out: pd.DataFrame) -> list[tuple[int, ...]]:
    """The first-seen records of ``out``'s ``records`` rows, unpacked."""
    rows = out[out["kind"] == "records"]["positions"]
    return [tuple(int(x) for x in p) for blob in rows for p in unpack_positions(blob)]


def open_gaps(out: pd.DataFrame) -> list[tuple[int, int]]:
    values = [json.loads(v) for v in out[out["kind"] == "gap"]["gap_value"]]
    return [(g["first"], g["last"]) for g in values if g["state"] == "open"]


DATA, HB, RESET = job.KIND_DATA, job.KIND_HEARTBEAT, job.KIND_RESET


def test_heartbeat_low_offset_reports_the_lost_head() -> None:
    state = FakeState()
    run(state, *[(DATA, o, -1, -1) for o in range(7, 12)], (HB, 11, 0, 5))
    assert open_gaps(settle(state)) == [(0, 6)]


def test_heartbeats_without_low_offset_keep_the_old_behaviour() -> None:
    state = FakeState()
    run(state, *[(DATA, o, -1, -1) for o in range(7, 12)], (HB, 14, -1, -1), (HB, 13, 20, -1))
    assert open_gaps(settle(state)) == [(12, 14)]  # the invalid low (above its high) is ignored


def test_a_reset_is_applied_before_the_saved_state_is_read() -> None:
    old = gaps.PartitionDetector("t", 0, gaps.DetectorConfig(window_size=128))
    old.observe(5, 1)
    state = FakeState((old.to_bytes(), 1))
    with pytest.raises(gaps.GapStateError) as info:
        run(FakeState((old.to_bytes(), 1)), (DATA, 6, -1, -1))
    message = str(info.value)
    assert "WINDOW_SIZE=128" in message
    assert "WINDOW_SIZE=64" in message
    assert "kafka-diode dedup reset --topic T --partition P --yes" in message
    assert "--topic t --partition 0" in message
    out = run(state, (RESET, 0, -1, -1), (DATA, 6, -1, -1), (HB, 6, 0, 9_999))
    assert [p[0] for p in positions(out)] == [6]
    stat = out[out["kind"] == "stat"].iloc[0]
    assert stat["resets"] == 1
    restored = gaps.PartitionDetector.from_bytes(state.get[0], gaps.DetectorConfig(window_size=64))
    assert restored.lows_ignored == 1  # a session from before the reset: its low is not trusted
    assert restored.open_gaps() == []


def test_stat_rows_carry_the_detector_counters_and_metrics_export_them() -> None:
    params = job.DetectParams(
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
        outs += list(job.detect_group(params, ("t", 0), iter([rows(*batch)]), state))
    out = pd.concat(outs, ignore_index=True)
    stat = out[out["kind"] == "stat"][list(job._STAT_COLUMNS)].astype(int).sum()
    # window 0 evicted with gaps [1,4] and [6,9], expired at once (MAX_EXPIRED_GAPS=0); offset 2
    # is then older than anything the state remembers
    assert (stat["expired_gaps"], stat["below_window"]) == (2, 1)
    metrics = DedupMetrics()
    stats = out[out["kind"] == "stat"]
    columns = ["src_topic", "src_partition", *job._STAT_COLUMNS, "state_bytes"]
    metrics.add_stats(pa.Table.from_pandas(stats[columns].reset_index(drop=True)))
    value: Any = metrics.registry.get_sample_value
    assert value("kafka_diode_dedup_gaps_expired_total") == 2
    assert value("kafka_diode_dedup_below_window_dropped_total") == 1
    assert value("kafka_diode_dedup_budget_evictions_total") == 0
    assert value("kafka_diode_dedup_resets_applied_total") == 0


def test_record_rows_carry_the_raw_position_of_the_first_copy_and_no_payload() -> None:
    # raw offsets 100, 101, 102, 103: source offset 5 twice (the first copy wins), then 4, 6
    out = run(
        FakeState(), (DATA, 5, -1, -1), (DATA, 5, -1, -1), (DATA, 4, -1, -1), (DATA, 6, -1, -1)
    )
    # one packed row per group: (src_offset, raw_topic, raw_partition, raw_offset), source order
    assert len(out[out["kind"] == "records"]) == 1
    assert positions(out) == [(4, 0, 0, 102), (5, 0, 0, 100), (6, 0, 0, 103)]
    assert not {"key", "value", "headers", "timestamp"} & set(out.columns)
    assert list(out.columns) == [f.name for f in job.OUTPUT_SCHEMA.fields]


def test_reread_consumer_settings_follow_the_source_and_kafka_conf() -> None:
    from dedup.reread import consumer_conf  # noqa: PLC0415

    conf = consumer_conf(
        {"bootstrap.servers": "b:9092", "sasl.username": "u"},
        {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.ssl.truststore.location": "/java/only.jks",
            "kafka.isolation.level": "read_committed",
        },
        group_id="g",
    )
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["isolation.level"] == "read_committed"
    assert conf["sasl.username"] == "u"
    assert "ssl.truststore.location" not in conf  # Java-only: librdkafka would refuse it
    assert conf["auto.offset.reset"] == "error"  # never a silent jump past deleted records
    assert conf["enable.auto.commit"] is False
