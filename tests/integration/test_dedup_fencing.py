"""The per-task transactional writer's fence, against a real broker, without Spark (fast).

Each scenario is what one stateful partition's write task can go through (docs/dedup.md
"Effectively once"); a ``read_committed`` reader must see every record of the batch exactly once:

1. A zombie attempt (its executor declared lost) has produced and not committed when the retry
   runs: the retry fences it, writes the batch; the zombie's commit fails; a third attempt skips.
2. An attempt committed, then died before Spark heard of it (a retried task, or a crash between
   the Kafka commits and Spark's commit log): the next attempt skips the batch; the next batch is
   written.
3. A process killed before, or during, its commit (the once-only fault of ``dedup.batch_driver``):
   the next attempt aborts or completes what it left and the outcome is exact either way.
4. Partitions are fenced independently: one partition's marker says nothing about another's.
   (The whole-batch marker of the driver-side writer before per-task transactions, the "floor",
   is retired with the partitions layout whose checkpoints it served: docs/operations.md
   "Upgrading".)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from common.errors import ServiceError
from dedup.faults import FAULT_ENV, FAULT_EXIT
from dedup.transaction import PartitionWriter
from dedup.writer_settings import WriterSettings
from tests.integration.test_dedup_writer import decisions, raw_record
from tests.kafka_helpers import consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka]

SOURCE = "orders.eu"
TS = 1_700_000_000_000
RECORDS = 40


def setup(bootstrap: str) -> tuple[WriterSettings, str]:
    raw = create_topic(bootstrap, partitions=1)
    tag = raw
    produce_records(bootstrap, raw, [raw_record(0, o, b"k", b"v%d" % o, (), TS + o)
                                     for o in range(RECORDS)])  # fmt: skip
    for name in (f"gaps.{tag}", f"progress.{tag}"):
        create_topic(bootstrap, name, partitions=1, config={"cleanup.policy": "compact"})
    create_topic(bootstrap, f"clean.{tag}.{SOURCE}", partitions=1)
    settings = WriterSettings(
        bootstrap_servers=bootstrap,
        clean_topic=f"clean.{tag}.{{topic}}",
        gap_topic=f"gaps.{tag}",
        progress_topic=f"progress.{tag}",
        transactional_id=f"txn.{tag}",
        raw_topics=(raw, f"control.{tag}"),
    )
    return settings, f"query-{tag}"


def batch(first: int, last: int):
    for o in range(first, last):  # the source records (also in a crash test's subprocess)
        raw_record(0, o, b"k", b"v%d" % o, (), TS + o)
    return decisions([(0, o, o) for o in range(first, last)])


def clean_offsets(bootstrap: str, settings: WriterSettings) -> Counter[int]:
    topic = settings.clean_topic.replace("{topic}", SOURCE)
    return Counter(r.timestamp - TS for r in consume_all(bootstrap, topic, timeout=20))


def markers(bootstrap: str, settings: WriterSettings) -> list[bytes]:
    return [r.key or b"" for r in consume_all(bootstrap, settings.progress_topic, timeout=20)]


def test_a_zombie_attempt_is_fenced_and_the_retry_writes_once(downstream_kafka) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query = setup(bootstrap)
    zombie = PartitionWriter(settings, query, 0)
    retry = PartitionWriter(settings, query, 0)
    outcome: dict[str, object] = {}

    def executor_declared_lost() -> None:
        # the zombie produced everything and is about to commit; Spark runs the task again
        outcome["retry"] = retry.write_table(batch(0, 20), 5)

    try:
        with pytest.raises(ServiceError, match="partition 0 failed and was aborted"):
            zombie.write_table(batch(0, 20), 5, before_commit=executor_declared_lost)
        third = PartitionWriter(settings, query, 0)
        skipped = third.write_table(batch(0, 20), 5)
        following = third.write_table(batch(20, 30), 6)
    finally:
        for w in (zombie, retry):
            w.close()
    assert outcome["retry"].records == 20  # type: ignore[attr-defined]
    assert (skipped.skipped, skipped.fenced) == (True, True)
    assert following.records == 10
    assert clean_offsets(bootstrap, settings) == Counter(range(30))
    assert markers(bootstrap, settings) == [f"{query}:0".encode()] * 2


def test_a_batch_committed_before_a_crash_is_skipped_by_the_next_attempt(downstream_kafka) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query = setup(bootstrap)
    first = PartitionWriter(settings, query, 0)
    assert first.write_table(batch(0, 20), 3).records == 20
    first.close()  # the task "died" after its commit, before Spark's commit log
    again = PartitionWriter(settings, query, 0)
    assert again.write_table(batch(0, 20), 3).fenced
    assert again.write_table(batch(20, 40), 4).records == 20
    again.close()
    assert clean_offsets(bootstrap, settings) == Counter(range(40))


def _crash_in_subprocess(settings: WriterSettings, query: str, point: str, tmp: Path) -> int:
    """Run one write attempt of batch 2 in a child process that dies at ``point``."""
    script = textwrap.dedent(
        f"""
        from dedup.transaction import PartitionWriter
        from dedup.writer_settings import WriterSettings
        from tests.integration.test_dedup_fencing import batch
        settings = WriterSettings(**{settings.__dict__!r})
        PartitionWriter(settings, {query!r}, 0).write_table(batch(0, 25), 2)
        """
    )
    env = {**os.environ, FAULT_ENV: f"{point}:2:0:{tmp / point}"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, timeout=120, check=False, capture_output=True
    )
    assert (tmp / point).exists(), done.stderr.decode(errors="replace")[-2000:]
    return done.returncode


@pytest.mark.parametrize("point", ["task-before-commit", "task-in-commit", "task-after-commit"])
def test_a_task_killed_around_its_commit_is_exact_after_the_next_attempt(
    downstream_kafka, tmp_path, point
) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query = setup(bootstrap)
    assert _crash_in_subprocess(settings, query, point, tmp_path) == FAULT_EXIT
    retry = PartitionWriter(settings, query, 0)
    result = retry.write_table(batch(0, 25), 2)
    retry.close()
    if point == "task-before-commit":
        assert result.records == 25  # the open transaction was aborted; written now
    if point == "task-after-commit":
        assert result.fenced
    # in-commit: either outcome, as long as the reader sees each record once
    assert clean_offsets(bootstrap, settings) == Counter(range(25))
    assert markers(bootstrap, settings) == [f"{query}:0".encode()]


def test_partitions_are_fenced_apart(downstream_kafka) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query = setup(bootstrap)
    p0 = PartitionWriter(settings, query, 0)
    assert p0.write_table(batch(0, 10), 8).records == 10
    p0.close()
    # partition 1 holds other source partitions: partition 0's marker says nothing about it
    p1 = PartitionWriter(settings, query, 1)
    assert p1.write_table(batch(10, 20), 6).records == 10  # below partition 0's marker: written
    assert p1.write_table(batch(20, 30), 8).records == 10
    assert p1.write_table(batch(20, 30), 8).fenced  # its own marker: done before
    p1.close()
    assert clean_offsets(bootstrap, settings) == Counter(range(30))
    assert set(markers(bootstrap, settings)) == {f"{query}:0".encode(), f"{query}:1".encode()}


def test_the_write_streams_its_batches_into_one_transaction(downstream_kafka) -> None:
    """Each Arrow batch is produced before the next is read (one batch of payload in the task at
    a time), the fence runs once, and all batches commit together: a read_committed reader sees
    nothing before the commit and every record once after it."""
    bootstrap = downstream_kafka.bootstrap
    settings, query = setup(bootstrap)
    writer = PartitionWriter(settings, query, 0)
    events: list[str] = []
    produce = writer.produce_records

    def produce_logged(*args, **kwargs) -> None:
        events.append("produce")
        produce(*args, **kwargs)

    writer.produce_records = produce_logged  # type: ignore[method-assign]

    def batches():
        for first in range(0, RECORDS, 10):
            events.append("read")
            yield from batch(first, first + 10).to_batches()
            if first == 20:
                assert clean_offsets(bootstrap, settings) == Counter()  # nothing visible yet

    result = writer.write_batches(batches(), 4)
    assert events == ["read", "produce"] * (RECORDS // 10)
    assert result.records == RECORDS
    assert not result.skipped
    assert clean_offsets(bootstrap, settings) == Counter(range(RECORDS))
    assert markers(bootstrap, settings) == [f"{query}:0".encode()]
