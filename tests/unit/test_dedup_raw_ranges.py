"""The direct layout's offset ranges (``dedup/raw_ranges.py``): what a micro-batch takes of each
raw partition, planned without a broker (its log starts and ends are given)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from common.errors import ConfigError, ServiceError
from dedup.config import from_sources
from dedup.layouts.direct import READER_GROUP
from dedup.raw_position import consumer_conf
from dedup.raw_ranges import (
    RANGE_ARROW_SCHEMA,
    Admission,
    RangeOptions,
    RawRangesReader,
    duration_ms,
    initial_offsets,
    plan_ends,
    ranges,
    rate_limit,
    source_options,
    starting_offsets,
    task_groups,
)
from runtime.kafka import FETCH_QUEUE_BACKOFF_MS

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/var/lib/d"}


def echo_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A write task that hands back its input (the real one: dedup.batch_driver.write_task)."""
    yield from batches


def read_ranges(source: RawRangesReader, partition: InputPartition) -> list[tuple[Any, ...]]:
    """What ``source.read`` handed its write task for ``partition``."""
    batches = list(source.read(partition))
    assert all(b.schema == RANGE_ARROW_SCHEMA for b in batches)
    return [tuple(row.values()) for b in batches for row in b.to_pylist()]


def options(env: dict[str, str] | None = None) -> dict[str, str]:
    config = from_sources({**BASE, **(env or {})})
    base = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    conf = consumer_conf(base, config.kafka_source, group_id=READER_GROUP)
    return source_options(
        "raw",
        conf,
        base,
        max_offsets=config.max_offsets_per_trigger,
        fail_on_data_loss=config.fail_on_data_loss,
        kafka_source=config.kafka_source,
        task=echo_task,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reader(
    lows: dict[str, int], highs: dict[str, int], env: dict[str, str] | None = None
) -> tuple[RawRangesReader, Clock]:
    clock = Clock()
    marks = {True: lows, False: highs}
    source = RawRangesReader(
        RangeOptions.parse(options(env)), watermarks=lambda earliest: dict(marks[earliest]),
        clock=clock,
    )  # fmt: skip
    return source, clock


def test_a_backlog_is_spread_over_the_partitions_by_their_share_of_it() -> None:
    start = {"0": 0, "1": 100, "2": 50}
    ends = {"0": 9000, "1": 1100, "2": 50}
    # 10,000 records behind, 1,000 taken: 900 of partition 0, 100 of partition 1
    assert rate_limit(1000, start, ends) == {"0": 900, "1": 200, "2": 50}
    # a share under one record still takes one, so no partition starves
    assert rate_limit(10, {"0": 0, "1": 0}, {"0": 100_000, "1": 2}) == {"0": 9, "1": 1}
    assert rate_limit(20_000, start, ends) == ends


def test_a_new_checkpoint_starts_where_starting_offsets_says() -> None:
    lows, highs = {"0": 5, "1": 0, "2": 7}, {"0": 50, "1": 60, "2": 70}
    assert initial_offsets("earliest", lows, highs) == lows
    assert initial_offsets("latest", lows, highs) == highs
    given = starting_offsets('{"raw": {"0": 20, "1": -1}}', "raw")
    # partition 2 unnamed: earliest, as with Spark's Kafka source
    assert initial_offsets(given, lows, highs) == {"0": 20, "1": 60, "2": 7}
    source, _ = reader(lows, highs, {"KAFKA_SOURCE_STARTINGOFFSETS": '{"raw": {"1": 3}}'})
    assert source.initialOffset() == {"raw": {"0": 5, "1": 3, "2": 7}}


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("newest", "use earliest, latest or JSON"),
        ('{"other": {"0": 1}}', "use earliest, latest or JSON"),
        ('{"raw": {"0": -3}}', "give each partition an offset"),
    ],
)
def test_bad_starting_offsets_stop_the_start_naming_the_key(value: str, fix: str) -> None:
    with pytest.raises(ConfigError, match="KAFKA_SOURCE_STARTINGOFFSETS") as err:
        options({"KAFKA_SOURCE_STARTINGOFFSETS": value})
    assert fix in str(err.value)


def test_the_kafka_source_options_it_shares_win_and_bad_ones_are_refused() -> None:
    got = options({"KAFKA_SOURCE_MAXOFFSETSPERTRIGGER": "77", "KAFKA_SOURCE_MAXTRIGGERDELAY": "9s",
                   "KAFKA_SOURCE_MINOFFSETSPERTRIGGER": "500", "FAIL_ON_DATA_LOSS": "true",
                   "KAFKA_SOURCE_KAFKA_SECURITY_PROTOCOL": "SSL"})  # fmt: skip
    parsed = RangeOptions.parse(got)
    assert parsed.admission == Admission(max_offsets=77, min_offsets=500, max_delay_ms=9000)
    assert parsed.fail_on_data_loss
    # the tasks' consumers read as the retention probe does: the shared security options
    assert parsed.conf["security.protocol"] == "SSL"
    assert parsed.conf["group.id"] == READER_GROUP
    assert "group.id" not in parsed.admin
    with pytest.raises(ConfigError, match="KAFKA_SOURCE_MAXTRIGGERDELAY"):
        options({"KAFKA_SOURCE_MAXTRIGGERDELAY": "soon"})
    with pytest.raises(ConfigError, match="KAFKA_SOURCE_MINOFFSETSPERTRIGGER"):
        options({"KAFKA_SOURCE_MINOFFSETSPERTRIGGER": "-1"})
    with pytest.raises(ConfigError, match="DIRECT_READER"):
        from_sources({**BASE, "DIRECT_READER": "jvm"})


def test_durations_read_as_spark_reads_them() -> None:
    assert [duration_ms(t, "K") for t in ("250", "250ms", "10s", "2m", "1h")] == [
        250, 250, 10_000, 120_000, 3_600_000,
    ]  # fmt: skip


def test_a_batch_takes_at_most_max_offsets_and_the_rest_follows() -> None:
    source, _ = reader({"0": 0, "1": 0}, {"0": 30_000, "1": 10_000})
    start = source.initialOffset()
    assert source.getDefaultReadLimit().max_rows == 10_000  # type: ignore[attr-defined]
    first = source.latestOffset(start, ReadMaxRows(10_000))
    assert first == {"raw": {"0": 7500, "1": 2500}}
    # the log ends as planned: the progress's latestOffset (raw_offsets_behind)
    assert source.reportLatestOffset() == {"raw": {"0": 30_000, "1": 10_000}}
    assert [p.value for p in source.partitions(start, first)] == [
        (("raw", 0, 0, 7500),), (("raw", 1, 0, 2500),),
    ]  # fmt: skip
    # Spark's own limit (Trigger.AvailableNow) overrides the option
    assert source.latestOffset(first, ReadAllAvailable()) == {"raw": {"0": 30_000, "1": 10_000}}
    # a range is one row, read by the write task the reader runs over its task's ranges
    assert read_ranges(source, source.partitions(start, first)[1]) == [("raw", 1, 0, 2500)]


def test_min_offsets_waits_for_records_or_the_delay_then_takes_what_is_there() -> None:
    env = {"KAFKA_SOURCE_MINOFFSETSPERTRIGGER": "100", "KAFKA_SOURCE_MAXTRIGGERDELAY": "10s"}
    source, clock = reader({"0": 0}, {"0": 40}, env)
    start = {"raw": {"0": 0}}
    assert source.latestOffset(start, source.getDefaultReadLimit()) == start
    clock.now += 9.9
    assert source.latestOffset(start, source.getDefaultReadLimit()) == start
    clock.now += 0.2
    assert source.latestOffset(start, source.getDefaultReadLimit()) == {"raw": {"0": 40}}
    # the delay counts from the last batch
    assert source.latestOffset({"raw": {"0": 40}}, ReadMaxRows(10_000)) == {"raw": {"0": 40}}


def test_ranges_cover_exactly_what_the_batch_took() -> None:
    source, _ = reader({"0": 0, "3": 1}, {"0": 0})
    start = {"raw": {"0": 10, "1": 5, "2": 8}}
    end = {"raw": {"0": 20, "1": 5, "2": 9, "3": 4}}
    # partition 1 has nothing; partition 3 is new: from its log start
    assert [p.value for p in source.partitions(start, end)] == [
        (("raw", 0, 10, 20),), (("raw", 2, 8, 9),), (("raw", 3, 1, 4),),
    ]  # fmt: skip


def test_a_batch_of_many_partitions_takes_as_many_tasks_as_spark_runs_at_once() -> None:
    source, _ = reader({"0": 0}, {"0": 0})
    source.options = dataclasses.replace(source.options, tasks=2)
    start = {"raw": {str(p): 0 for p in range(8)}}
    end = {"raw": {"0": 10, "1": 10, "2": 10, "3": 10, "4": 100, "5": 10, "6": 10, "7": 0}}
    tasks = [p.value for p in source.partitions(start, end)]
    # the backlog of partition 4 alone, the other six in the second task, in partition order
    assert tasks == [
        tuple(("raw", p, 0, 10) for p in (0, 1, 2, 3, 5, 6)), (("raw", 4, 0, 100),),
    ]  # fmt: skip
    assert read_ranges(source, source.partitions(start, end)[0]) == list(tasks[0])
    # as many tasks as ranges when there are fewer, and the same groups for the same batch
    assert task_groups(ranges("raw", start["raw"], end["raw"])[:2], 4) == [
        [("raw", 0, 0, 10)], [("raw", 1, 0, 10)],
    ]  # fmt: skip
    assert [p.value for p in source.partitions(start, end)] == tasks


def test_a_checkpoint_with_transaction_groups_takes_one_task_per_group() -> None:
    """Raw partition p goes with the others of group p mod 3, whatever the backlog: two tasks
    of one group would share a transactional.id and fence each other."""
    source, _ = reader({"0": 0}, {"0": 0})
    source.options = dataclasses.replace(source.options, tasks=2, groups=3)
    start = {"raw": {str(p): 0 for p in range(8)}}
    end = {"raw": {"0": 10, "1": 0, "2": 10, "3": 10, "4": 0, "5": 900, "6": 10, "7": 0}}
    tasks = [p.value for p in source.partitions(start, end)]
    assert tasks == [
        (("raw", 0, 0, 10), ("raw", 3, 0, 10), ("raw", 6, 0, 10)),
        (("raw", 2, 0, 10), ("raw", 5, 0, 900)),
    ]  # fmt: skip


def test_a_partition_new_since_the_last_batch_starts_at_its_log_start() -> None:
    ends = plan_ends({"0": 10}, {"0": 12, "1": 30}, {"0": 0, "1": 4}, admission=None,
                     waited_ms=0, fail_on_data_loss=False, topic="raw")  # fmt: skip
    assert ends == {"0": 12, "1": 30}
    source, _ = reader({"0": 0, "1": 4}, {"0": 12, "1": 30})
    end = source.latestOffset({"raw": {"0": 10}}, source.getDefaultReadLimit())
    assert end == {"raw": {"0": 12, "1": 30}}
    # and the batch reads it from there: what it planned, nothing skipped
    read = [r for task in source.partitions({"raw": {"0": 10}}, end) for r in task.value]
    assert sorted(read) == [("raw", 0, 10, 12), ("raw", 1, 4, 30)]


def test_a_checkpoint_of_another_raw_topic_reads_this_one_from_its_log_start() -> None:
    source, _ = reader({"0": 3, "1": 0}, {"0": 40, "1": 25})
    before = {"old.raw": {"0": 9000, "1": 9100}}  # RAW_TOPICS changed under the checkpoint
    end = source.latestOffset(before, source.getDefaultReadLimit())
    assert end == {"raw": {"0": 40, "1": 25}}
    read = [r for task in source.partitions(before, end) for r in task.value]
    assert sorted(read) == [("raw", 0, 3, 40), ("raw", 1, 0, 25)]


def test_a_log_end_below_the_next_offset_is_data_loss(caplog: pytest.LogCaptureFixture) -> None:
    args = ({"0": 100, "1": 5}, {"0": 40, "1": 9}, {"0": 0, "1": 0})
    with caplog.at_level(logging.WARNING):
        ends = plan_ends(*args, admission=Admission(max_offsets=1000), waited_ms=0,
                         fail_on_data_loss=False, topic="raw")  # fmt: skip
    # read on from the log end: the detectors drop what they saw before, as duplicates
    assert ends == {"0": 40, "1": 9}
    assert "[(0, 100, 40)]" in caplog.text
    with pytest.raises(ServiceError, match="FAIL_ON_DATA_LOSS=true"):
        plan_ends(*args, admission=None, waited_ms=0, fail_on_data_loss=True, topic="raw")


def test_the_options_survive_the_trip_to_spark_as_text() -> None:
    got = options({"KAFKA_CONF_SECURITY_PROTOCOL": "SASL_SSL"})
    assert all(isinstance(v, str) for v in got.values())
    assert json.loads(got["admin"])["security.protocol"] == "SASL_SSL"
    assert json.loads(got["conf"])["security.protocol"] == "SASL_SSL"


def test_a_reader_whose_prefetch_queue_filled_fetches_again_soon() -> None:
    # librdkafka's default (1 s) outlasted a task's queue drained at full speed: the task then
    # waited, a third of a 10 KB backlog's time (docs/dedup-internals.md); KAFKA_CONF_* wins.
    def conf(env: dict[str, str]) -> dict[str, object]:
        config = from_sources({**BASE, **env})
        base = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
        return consumer_conf(base, config.kafka_source, group_id=READER_GROUP)

    assert conf({})["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS <= 50
    assert conf({"KAFKA_CONF_FETCH_QUEUE_BACKOFF_MS": "300"})["fetch.queue.backoff.ms"] == "300"
