"""The write task's spec, built once when the query starts (dedup/writer_settings.py): each task
names its micro-batch from Spark's task context, and a spec that names one keeps it."""

from __future__ import annotations

import pytest

from dedup.task_result import task_batch
from dedup.writer_settings import TaskSpec, WriterSettings

SETTINGS = WriterSettings(
    bootstrap_servers="127.0.0.1:1",
    clean_topic="c",
    gap_topic="g",
    progress_topic="p",
    transactional_id="t",
)


def test_the_querys_spec_takes_the_tasks_batch() -> None:
    spec = TaskSpec(settings=SETTINGS, transaction_groups=2, raw_partitions=8)
    assert (spec.query_id, spec.batch_id) == ("", -1)
    task = spec.in_batch("q-1", 41, 1_700_000_000_000)
    assert (task.query_id, task.batch_id, task.now_ms) == ("q-1", 41, 1_700_000_000_000)
    assert (task.settings, task.transaction_groups, task.raw_partitions) == (SETTINGS, 2, 8)


def test_a_spec_that_names_its_batch_keeps_it() -> None:
    """The benchmarks and tests run a task outside a query, with the batch they name."""
    spec = TaskSpec(settings=SETTINGS, query_id="q", batch_id=3, now_ms=5)
    assert spec.in_batch("other", 9, 10) is spec


def test_outside_a_spark_task_there_is_no_batch_to_take() -> None:
    with pytest.raises(RuntimeError, match="not inside a Spark task"):
        task_batch()
