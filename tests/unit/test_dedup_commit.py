"""The one commit path (``dedup.commit.commit_batch``) with a stand-in producer, no Kafka: the
order of its steps, the parts of a long batch, the skip of a committed batch, and the abort on
any failure."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException

from common.errors import ServiceError
from dedup.commit import commit_batch
from dedup.writer_settings import BatchResult


class FakeProducer:
    def __init__(self, fail_commit: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_commit = fail_commit

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, _timeout: float) -> None:
        if self.fail_commit:
            raise KafkaException("fenced")
        self.calls.append("commit")

    def abort_transaction(self, _timeout: float) -> None:
        self.calls.append("abort")


class Work:
    fault_key = 0

    def __init__(
        self,
        committed: int,
        *,
        drain: bool,
        fail_commit: bool = False,
        parts_after: int = 0,
        timeout_s: float = 3600.0,
    ) -> None:
        self.name = "partition 0"
        self.timeout_s = timeout_s
        #: a part is due after every this many produced batches (0: never)
        self.parts_after = parts_after
        self.produced = 0
        self.drain_skipped = drain
        self.committed = committed
        self.producer = FakeProducer(fail_commit)
        self.seen: list[int] = []
        self.ends: list[tuple[bool, bool]] = []

    def publishes(self, batch: pa.RecordBatch) -> bool:
        self.seen.append(batch.num_rows)
        return batch.num_rows > 1

    def fence(self) -> tuple[Any, int]:
        self.producer.calls.append("fence")
        return self.producer, self.committed

    def produce(self, producer: Any, batch: pa.RecordBatch, result: BatchResult) -> None:
        producer.calls.append(f"produce {batch.num_rows}")
        result.records += batch.num_rows
        self.produced += 1

    def part_due(self) -> bool:
        return bool(self.parts_after) and self.produced % self.parts_after == 0

    def finish_part(self, producer: Any, result: BatchResult) -> None:
        producer.calls.append(f"part {result.records}")

    def finish(self, producer: Any, result: BatchResult) -> None:
        producer.calls.append("finish")

    def ended(self, committed: bool, abort_failed: bool) -> None:
        self.ends.append((committed, abort_failed))


def _batches(*sizes: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"x": list(range(n))}) for n in sizes]


def test_fence_at_the_first_published_batch_then_produce_finish_commit() -> None:
    work = Work(committed=4, drain=True)
    result = commit_batch(work, _batches(1, 2, 3), 5)
    assert work.producer.calls == ["fence", "begin", "produce 2", "produce 3", "finish", "commit"]
    assert (result.records, result.skipped, work.ends) == (5, False, [(True, False)])


def test_a_part_due_commits_what_was_produced_and_goes_on_in_a_new_transaction() -> None:
    """The direct layout's parts of a long batch (docs/dedup-internals.md "Parts of a batch"):
    each ends its transaction with what says how far the batch is committed."""
    work = Work(committed=4, drain=True, parts_after=2)
    result = commit_batch(work, _batches(2, 3, 4, 5, 6), 5)
    assert work.producer.calls == [
        "fence", "begin", "produce 2", "produce 3", "part 5", "commit",
        "begin", "produce 4", "produce 5", "part 14", "commit",
        "begin", "produce 6", "finish", "commit",
    ]  # fmt: skip
    assert (result.records, result.skipped, work.ends) == (20, False, [(True, False)])


def test_a_failure_after_a_part_aborts_only_the_open_transaction() -> None:
    work = Work(committed=-1, drain=True, parts_after=1)

    def boom() -> None:
        raise RuntimeError("task killed")

    with pytest.raises(RuntimeError, match="task killed"):
        commit_batch(work, _batches(2), 3, before_commit=boom)
    assert work.producer.calls == [
        "fence", "begin", "produce 2", "part 2", "commit", "begin", "finish", "abort",
    ]  # fmt: skip
    assert work.ends == [(False, False)]


def test_nothing_published_opens_no_transaction() -> None:
    work = Work(committed=-1, drain=True)
    result = commit_batch(work, _batches(1, 1), 0)
    assert work.producer.calls == []
    assert result.skipped
    assert not result.fenced


@pytest.mark.parametrize("drain", [True, False])
def test_a_committed_batch_is_skipped_and_its_input_drained_if_the_layout_asks(
    drain: bool,
) -> None:
    work = Work(committed=5, drain=drain)
    result = commit_batch(work, _batches(2, 3, 4), 5)
    assert work.producer.calls == ["fence"]
    assert result.skipped
    assert result.fenced
    assert work.seen == ([2, 3, 4] if drain else [2])
    assert work.ends == []


def test_a_failed_commit_aborts_and_says_nothing_is_visible() -> None:
    work = Work(committed=-1, drain=True, fail_commit=True)
    with pytest.raises(ServiceError, match="batch 3 partition 0 failed and was aborted"):
        commit_batch(work, _batches(2), 3)
    assert work.producer.calls[-1] == "abort"
    assert work.ends == [(False, False)]


def test_any_other_failure_aborts_too_and_is_raised_as_it_is() -> None:
    work = Work(committed=-1, drain=True)

    def boom() -> None:
        raise RuntimeError("task killed")

    with pytest.raises(RuntimeError, match="task killed"):
        commit_batch(work, _batches(2), 3, before_commit=boom)
    assert work.producer.calls[-2:] == ["finish", "abort"]
    assert work.ends == [(False, False)]


def test_a_long_transaction_warns_once_and_its_failure_says_how_to_let_the_batch_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past half of ``transaction.timeout.ms`` a WARNING (once per transaction); a failure past
    all of it (the broker aborts such a transaction, and every replay of the batch is as long)
    names the setting that lets it commit (docs/operations.md "Known limitations")."""
    work = Work(committed=-1, drain=True, fail_commit=True, timeout_s=0.0)
    with (
        caplog.at_level(logging.WARNING, logger="dedup.commit"),
        pytest.raises(ServiceError, match="set KAFKA_CONF_TRANSACTION_TIMEOUT_MS above"),
    ):
        commit_batch(work, _batches(2, 3, 4), 7)
    long = [r.getMessage() for r in caplog.records if "has been open" in r.getMessage()]
    assert len(long) == 1
    assert long[0].startswith("batch 7 partition 0: its transaction has been open")
    assert "MAX_OFFSETS_PER_TRIGGER" in long[0]


def test_a_short_transaction_neither_warns_nor_blames_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = Work(committed=-1, drain=True, fail_commit=True)
    with (
        caplog.at_level(logging.WARNING, logger="dedup.commit"),
        pytest.raises(ServiceError) as failed,
    ):
        commit_batch(work, _batches(2, 3), 7)
    assert "TRANSACTION_TIMEOUT" not in str(failed.value)
    assert not [r for r in caplog.records if "has been open" in r.getMessage()]


def test_each_part_restarts_the_long_transaction_clock(caplog: pytest.LogCaptureFixture) -> None:
    """A part ends its transaction: the next one is new and may warn again."""
    work = Work(committed=-1, drain=True, parts_after=2, timeout_s=0.0)
    with caplog.at_level(logging.WARNING, logger="dedup.commit"):
        commit_batch(work, _batches(2, 3, 4, 5), 7)
    assert len([r for r in caplog.records if "has been open" in r.getMessage()]) == 2
