"""The dedup's raw-position series: progress parsing and counting records deleted unread."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from common.metrics import CollectorRegistry
from dedup.metrics import DedupMetrics
from dedup.raw_position import (
    ExpiryCounter,
    Position,
    RawPositionMetrics,
    positions_from_progress,
    records_read,
)


def _progress(end: dict[str, Any], latest: dict[str, Any] | None, *, text: bool) -> dict[str, Any]:
    def enc(value: dict[str, Any] | None) -> object:
        return json.dumps(value) if text and value is not None else value

    source = {"description": "KafkaV2[Subscribe[raw,ctl]]", "endOffset": enc(end)}
    if latest is not None:
        source["latestOffset"] = enc(latest)
    return {"id": "q", "sources": [source]}


def test_positions_from_spark_offsets_as_text_or_parsed() -> None:
    end = {"raw": {"0": 10, "1": 7}, "ctl": {"0": 3}}
    latest = {"raw": {"0": 15, "1": 7}, "ctl": {"0": 3}}
    for text in (True, False):
        got = positions_from_progress(_progress(end, latest, text=text), ["raw"])
        assert got == {
            ("raw", 0): Position(next_offset=10, latest_offset=15),
            ("raw", 1): Position(next_offset=7, latest_offset=7),
        }
        assert got[("raw", 0)].behind == 5


def test_positions_without_latest_are_caught_up_and_odd_sources_are_skipped() -> None:
    progress = _progress({"raw": {"0": 4}}, None, text=True)
    progress["sources"].append({"description": "rate", "endOffset": "not json"})
    progress["sources"].append({"description": "memory", "endOffset": 17})
    assert positions_from_progress(progress, ["raw"]) == {
        ("raw", 0): Position(next_offset=4, latest_offset=4)
    }
    assert positions_from_progress({"id": "q"}, ["raw"]) == {}


def test_expiry_counts_each_deleted_offset_once() -> None:
    counter = ExpiryCounter()
    tp = ("raw", 0)
    assert counter.observe(tp, next_offset=100, log_start=90) == 0
    assert counter.observe(tp, next_offset=100, log_start=130) == 30  # 100..129 deleted unread
    assert counter.observe(tp, next_offset=100, log_start=130) == 0  # same probe again
    assert counter.observe(tp, next_offset=100, log_start=150) == 20  # 130..149
    assert counter.observe(tp, next_offset=150, log_start=150) == 0  # Spark skipped ahead
    assert counter.observe(("raw", 1), next_offset=0, log_start=5) == 5


@given(
    start=st.integers(0, 10**6),
    steps=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), max_size=30),
)
def test_expiry_total_is_the_deleted_range_beyond_what_was_read(
    start: int, steps: list[tuple[int, int]]
) -> None:
    """However probes and reads interleave, the count is exactly the offsets deleted unread."""
    counter = ExpiryCounter()
    tp = ("raw", 0)
    next_offset, log_start, total = start, start, 0
    unread_deleted: set[int] = set()
    read: set[int] = set()
    for read_more, delete_more in steps:
        # the dedup reads forward from where it is (past deleted offsets it cannot read)
        new_next = max(next_offset, log_start) + read_more
        read.update(range(max(next_offset, log_start), new_next))
        next_offset = new_next
        # retention deletes up to a new log start, never past the log end we model as unbounded
        new_start = log_start + delete_more
        unread_deleted.update(o for o in range(log_start, new_start) if o not in read)
        log_start = new_start
        total += counter.observe(tp, next_offset, log_start)
        read.update(range(next_offset, max(next_offset, log_start)))  # skipped: gone, not read
    assert total == len(unread_deleted)


def test_metrics_probe_rate_limits_and_counts() -> None:
    registry = CollectorRegistry()
    now = [0.0]
    lows = {("raw", 0): 0}
    calls: list[tuple[str, int]] = []

    def watermarks(topic: str, partition: int) -> tuple[int, int]:
        calls.append((topic, partition))
        return lows[(topic, partition)], 100

    metrics = RawPositionMetrics(
        registry, ["raw"], watermarks, clock=lambda: now[0], probe_interval=10.0
    )
    metrics.observe_progress(_progress({"raw": {"0": 40}}, {"raw": {"0": 100}}, text=True))
    assert calls == [("raw", 0)]
    lows[("raw", 0)] = 55
    metrics.observe_progress(_progress({"raw": {"0": 40}}, {"raw": {"0": 100}}, text=True))
    assert calls == [("raw", 0)], "probed again before the interval"
    now[0] = 10.0
    metrics.observe_progress(_progress({"raw": {"0": 40}}, {"raw": {"0": 100}}, text=True))
    text = generate_latest(registry).decode()
    assert 'kafka_diode_dedup_raw_offsets_behind{partition="0",topic="raw"} 60.0' in text
    assert 'kafka_diode_dedup_raw_log_start_offset{partition="0",topic="raw"} 55.0' in text
    assert 'kafka_diode_dedup_raw_records_expired_unread_total{partition="0",topic="raw"} 15.0' in (
        text
    )


def test_a_failing_probe_never_raises() -> None:
    def broken(_topic: str, _partition: int) -> tuple[int, int]:
        raise RuntimeError("broker away")

    metrics = RawPositionMetrics(CollectorRegistry(), ["raw"], broken, clock=lambda: 0.0)
    metrics.observe_progress(_progress({"raw": {"0": 1}}, None, text=True))


def test_the_rates_count_raw_records_when_a_row_is_a_range_of_them() -> None:
    """The librdkafka reader's batch is one row per raw partition's range: Spark's rates of its
    rows become rates of the records the ranges span; Spark's Kafka source's rows are records."""
    registry = CollectorRegistry()
    metrics = DedupMetrics(registry)
    ranges = {
        "numInputRows": 2,
        "inputRowsPerSecond": 2.0,
        "processedRowsPerSecond": 4.0,
        "sources": [{"description": "kafka_diode_raw_ranges",
                     "startOffset": json.dumps({"raw": {"0": 100, "1": 50}}),
                     "endOffset": json.dumps({"raw": {"0": 400, "1": 50, "2": 7}}),
                     "numInputRows": 2}],
    }  # fmt: skip
    # 300 records of partition 0; partition 2 is new (no start): nothing counted for it
    assert records_read(ranges) == 300
    metrics.observe_progress(ranges)
    text = generate_latest(registry).decode()
    assert "kafka_diode_dedup_input_records_per_second 300.0" in text
    assert "kafka_diode_dedup_processed_records_per_second 600.0" in text
    first = {**ranges, "sources": [{**ranges["sources"][0], "startOffset": None}]}
    assert records_read(first) == 2  # no start yet: Spark's rows
    assert records_read({"numInputRows": 0, "sources": []}) == 0
