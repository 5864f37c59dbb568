"""The driver folds its write tasks' result rows into the metrics (pure: no Kafka, no Spark).

The parts a task committed of a long batch (docs/dedup-internals.md "Parts of a batch") are
counted in ``transaction_parts``.

Records written with the dedup's time (their clean topic would refuse the source timestamp) are
counted in the tasks; the driver adds those of the tasks that wrote (not of fenced replays) to
``timestamps_replaced`` and says so in one WARNING per batch.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pytest

from dedup.batch_driver import TransactionalBatchWriter
from dedup.metrics import DedupMetrics
from dedup.rows import STAT_COLUMNS
from dedup.task_result import RESULT_SCHEMA
from dedup.writer_settings import WriterSettings

SETTINGS = WriterSettings(
    bootstrap_servers="localhost:1",
    clean_topic="clean.{topic}",
    gap_topic="gaps",
    progress_topic="progress",
    transactional_id="txn",
)


def tasks(rows: list[tuple[int, int, int, bool]]) -> pa.Table:
    """Task rows ``(partition, records, replaced, skipped)``."""
    columns: dict[str, list[Any]] = {name: [None] * len(rows) for name in RESULT_SCHEMA.names}
    columns["kind"] = ["task"] * len(rows)
    columns["task_partition"] = [p for p, _, _, _ in rows]
    columns["attempt"] = [0] * len(rows)
    columns["records"] = [n for _, n, _, _ in rows]
    columns["gaps"] = [0] * len(rows)
    columns["replaced"] = [r for _, _, r, _ in rows]
    columns["skipped"] = [s for _, _, _, s in rows]
    columns["fence_ms"] = [0] * len(rows)
    columns["write_ms"] = [0] * len(rows)
    return pa.Table.from_pydict(columns, schema=RESULT_SCHEMA)


def test_replaced_timestamps_of_the_writing_tasks_are_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = DedupMetrics()
    writer = TransactionalBatchWriter(SETTINGS, metrics)
    with caplog.at_level(logging.WARNING, logger="dedup.batch_driver"):
        result = writer.account(tasks([(0, 10, 2, False), (1, 5, 3, False), (2, 0, 0, True)]), 7)
    assert (result.records, result.replaced) == (15, 5)
    assert metrics.timestamps_replaced._value.get() == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "batch 7: 5 records" in warnings[0]
    assert "diode.original-timestamp" in warnings[0]
    writer.account(tasks([(0, 4, 0, False), (1, 0, 0, False)]), 8)
    assert metrics.timestamps_replaced._value.get() == 5


def test_the_parts_tasks_committed_are_counted() -> None:
    metrics = DedupMetrics()
    writer = TransactionalBatchWriter(SETTINGS, metrics)
    rows = tasks([(0, 10, 0, False), (1, 5, 0, False), (2, 0, 0, False)])
    rows = rows.set_column(
        RESULT_SCHEMA.get_field_index("parts"), "parts", pa.array([2, None, 1], pa.int64())
    )
    writer.account(rows, 7)
    assert metrics.transaction_parts._value.get() == 3
    writer.account(tasks([(0, 4, 0, False)]), 8)
    assert metrics.transaction_parts._value.get() == 3


def with_stats(task_rows: pa.Table, stats: list[dict[str, int]]) -> pa.Table:
    """``task_rows`` plus one ``stat`` row per dict (partition ``i`` of topic ``t``)."""
    columns: dict[str, list[Any]] = {name: [None] * len(stats) for name in RESULT_SCHEMA.names}
    columns["kind"] = ["stat"] * len(stats)
    columns["src_topic"] = ["t"] * len(stats)
    columns["src_partition"] = list(range(len(stats)))
    columns["task_partition"] = [0] * len(stats)
    for name in STAT_COLUMNS:
        columns[name] = [row.get(name, 0) for row in stats]
    columns["state_bytes"] = [0] * len(stats)
    return pa.concat_tables([task_rows, pa.Table.from_pydict(columns, schema=RESULT_SCHEMA)])


@pytest.mark.parametrize(
    ("records", "gaps", "fenced", "stat", "settled"),
    [
        (0, 0, False, {}, True),  # a tick's batch that scanned and found nothing to do
        (0, 0, False, {"pending_gaps": 1}, False),  # the next scan reports a gap
        (0, 1, False, {}, False),  # this scan reported one: the state moved
        (3, 0, False, {"delivered": 3}, False),  # input
        (0, 0, False, {"heartbeats": 1}, False),  # a heartbeat may announce a tail gap
        (0, 0, False, {"duplicates": 2}, False),
        (0, 0, False, {"resets": 1}, False),
        (0, 0, False, {"withheld": 5}, False),
        (0, 0, True, {}, False),  # a replay's stats are not counted: unknown
    ],
)
def test_a_batch_is_settled_only_when_it_changed_nothing_and_left_no_gap_pending(
    records: int, gaps: int, fenced: bool, stat: dict[str, int], settled: bool
) -> None:
    writer = TransactionalBatchWriter(SETTINGS, DedupMetrics())
    task_rows = tasks([(0, records, 0, fenced), (1, 0, 0, False)])
    task_rows = task_rows.set_column(
        task_rows.schema.get_field_index("gaps"), "gaps", pa.array([gaps, 0], pa.int64())
    )
    writer.account(with_stats(task_rows, [{}, stat]), 9)
    assert writer.settled is settled


def test_a_batch_within_a_scan_interval_of_input_is_not_settled() -> None:
    """A partition's gaps are scanned once its last scan is an interval old: a quiet batch that
    came sooner after input (a tick written while the first batch was planned) may have scanned
    nothing, so it does not slow the ticks down (or stop ``--until-settled``)."""
    writer = TransactionalBatchWriter(SETTINGS, DedupMetrics())
    writer.scan_interval_s = 10.0
    writer.batches_seen = 1
    writer.last_input_at = 100.0
    quiet = with_stats(tasks([(0, 0, 0, False)]), [{}])
    writer.account(quiet, 12, started=109.5)
    assert writer.settled is False
    writer.account(quiet, 13, started=110.0)
    assert writer.settled is True


def test_the_first_batch_restarts_the_idle_clock_even_without_input() -> None:
    """A restart replays the batch its predecessor logged but did not commit, often one with no
    input: the JVM's start and that replay took longer than --until-idle (an upgrade from a
    pre-runs release stopped right after it, before reading the new records). The idle time
    counts from the end of the first batch; from the second on, only input restarts it."""
    writer = TransactionalBatchWriter(SETTINGS, DedupMetrics())
    writer.last_input_at = 0.0  # the process started long ago
    writer.account(with_stats(tasks([(0, 0, 0, False)]), [{}]), 11)
    restarted = writer.last_input_at
    assert restarted > 0.0
    writer.batches_seen = 1
    writer.account(with_stats(tasks([(0, 0, 0, False)]), [{}]), 12)
    assert writer.last_input_at == restarted
