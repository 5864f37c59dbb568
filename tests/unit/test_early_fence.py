"""The write task's early fence (``PartitionWriter.fence_early``): its outcome reaches the task.

Pure: ``_start`` (producer, ``init_transactions``, marker read) is replaced; the fence against a
real broker is in tests/integration/test_dedup_fencing.py.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from common.errors import ServiceError
from dedup.rows import KIND_GAP
from dedup.transaction import PartitionWriter
from dedup.writer_settings import WriterSettings

SETTINGS = WriterSettings(
    bootstrap_servers="127.0.0.1:1",
    clean_topic="clean",
    gap_topic="gaps",
    progress_topic="progress",
    transactional_id="txn",
)


def test_an_unused_early_fence_that_failed_does_not_fail_the_task(monkeypatch) -> None:
    started = threading.Event()

    def unreachable(self: PartitionWriter) -> object:
        started.set()
        raise ServiceError("cannot initialise Kafka transactions")

    monkeypatch.setattr(PartitionWriter, "_start", unreachable)
    writer = PartitionWriter(SETTINGS, "q", 0)
    writer.fence_early()
    assert writer.write_batches([], 3).skipped  # nothing to publish
    writer.close()  # the fence's error is not needed: logged, not raised
    assert started.is_set()


def test_an_early_fence_that_failed_fails_a_task_with_rows_to_publish(monkeypatch) -> None:
    def unreachable(self: PartitionWriter) -> object:
        raise ServiceError("cannot initialise Kafka transactions as 'txn-p0'")

    monkeypatch.setattr(PartitionWriter, "_start", unreachable)
    writer = PartitionWriter(SETTINGS, "q", 0)
    writer.fence_early()
    rows = pa.RecordBatch.from_pydict({"kind": pa.array([KIND_GAP], pa.string())})
    with pytest.raises(ServiceError, match="cannot initialise Kafka transactions"):
        writer.write_batches([rows], 3)
    writer.close()


def test_the_fence_starts_once(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(PartitionWriter, "_start", lambda self: calls.append(1))
    writer = PartitionWriter(SETTINGS, "q", 0)
    writer.fence_early()
    writer.fence_early()
    writer.close()
    assert calls == [1]
