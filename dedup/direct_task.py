"""The direct layout: each raw partition is detected, written and keeps its own state by itself.

Runs in the **executors** (``dedup.batch_driver.write_task``, mapped by the driver's
``TransactionalBatchWriter`` over each micro-batch: per transaction group with input, whose raw
partitions' ranges its task reads itself, ``dedup/range_reader.py``, one after another, or per
raw partition getting Spark's Kafka source's rows; no projection, no shuffle; the task
classifies its records itself, ``dedup/classify_python.py``).
No stateful operator and no RocksDB: the detectors of every source partition a raw partition
carries live in one record of ``STATE_TOPIC`` (``dedup/direct_state.py``), written in the same
Kafka transaction as the clean records and the gap records they produce, so the state and the
output commit or abort together. A transaction covers a fixed group of raw partitions (the
checkpoint's ``transaction_groups``: ``p mod`` it; a checkpoint without groups commits each raw
partition alone), each with its own state record.

The receiver writes every record, heartbeat and withheld range of a source partition into one
raw partition (``p mod N``), so one task sees all of a source partition's input; the layout
needs one raw topic (chains merge several, which the buckets layout handles) and a fixed
partition count (checked by the driver, ``dedup/job.py``).

Effectively once: the commit path every layout takes (``dedup.commit.commit_batch``, which states
the argument); here what says batch ``N`` is done for a group is its raw partitions' state
records themselves (``batch_id``), written by its last commit of ``N`` together, so a replay
never redoes committed work, and ``now`` is the task's clock at its start (docs/dedup.md "The
direct layout").

A task whose transaction has been open for a third of ``transaction.timeout.ms`` commits what it
wrote as a **part** of the batch: each state record it read into then says through which raw
offset the batch is committed, and an attempt that finds it goes on after that offset. Without
parts a task with more to write than the timeout allows (a backlog of multi-megabyte records)
would be aborted by the broker at every attempt and the query would replay the same batch for
ever (docs/dedup-internals.md "Parts of a batch").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import numpy as np
from confluent_kafka import Producer

from common.errors import ServiceError
from common.raw_topic import raw_partition_of
from dedup.classify_python import classify_raw
from dedup.commit import commit_batch, produce_waiting
from dedup.detect import LiveBucket, Output
from dedup.detector_set import DetectorSet
from dedup.direct_state import DIRECT_STATE_BYTES, STATE_RECORD_LIMIT, StateRecord, state_key
from dedup.fence import init_producer
from dedup.raw_batch import RawBatch
from dedup.rows import (
    KIND_GAP,
    KIND_MALFORMED,
    KIND_RUN,
    KIND_TICK,
    UNPARSED_PARTITION,
    UNPARSED_TOPIC,
    InputRows,
)
from dedup.state_reader import forget, read_state, remember
from dedup.transaction import PartitionWriter, RunRow, gc_paused
from dedup.writer_settings import BatchResult, TaskSpec, transaction_timeout_s

log = logging.getLogger(__name__)

#: A part commits once its transaction has been open this share of the timeout: its commit then
#: still has two thirds of it to flush the producer's queue (at most 128 MiB).
PART_SHARE: Final = 1 / 3


def transactional_id(base: str, raw_topic: str, group: int, groups: int) -> str:
    """The ``transactional.id`` of one transaction group's task: ``<base>-<raw topic>-<p>`` for
    raw partition ``p`` when each raw partition commits alone (``groups`` 0, every checkpoint
    created before groups), ``<base>-<raw topic>-<g>of<groups>`` for a group."""
    if groups == 0:
        return f"{base}-{raw_topic}-{group}"
    return f"{base}-{raw_topic}-{group}of{groups}"


def group_of(raw_partition: int, groups: int) -> int:
    """The transaction group of ``raw_partition`` (``groups`` 0: each raw partition its own)."""
    return raw_partition if groups == 0 else raw_partition % groups


class _Member:
    """One raw partition's share of a group's transaction: its detectors, counts, offsets."""

    def __init__(self, spec: TaskSpec, raw_topic: str, raw_partition: int) -> None:
        self.raw_partition = raw_partition
        self.key = state_key(spec.query_id, raw_topic, raw_partition)
        self.name = f"raw partition {raw_topic}:{raw_partition}"
        self.live: LiveBucket | None = None
        #: the last state record committed with ``key`` (None: none yet)
        self.committed: StateRecord | None = None
        self.records = 0
        self.gaps = 0
        #: the raw offset a committed part of this batch ends at (-1: none), and the last one read
        self.resume_after = -1
        self.last_offset = -1
        self.state = b""
        self.written: list[int] = []


class DirectTransaction:
    """One transaction group's transaction of one batch (``dedup.commit.BatchWork``): fence,
    each raw partition's state, detect, write, commit.

    A group is raw partition ``group`` alone when the checkpoint commits each raw partition by
    itself (``TaskSpec.transaction_groups`` 0), else every raw partition ``p`` with
    ``p mod transaction_groups == group``: one ``transactional.id``, one fence and one commit
    for them all, each with its own state record (docs/dedup-internals.md "Transaction groups").
    """

    def __init__(
        self,
        spec: TaskSpec,
        raw_topic: str,
        group: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if spec.params is None:
            raise ValueError("a direct task needs the detectors' settings (TaskSpec.params)")
        self.spec = spec
        self.params = spec.params
        self.settings = spec.settings
        self.raw_topic = raw_topic
        self.group = group
        self.groups = spec.transaction_groups
        self.transactional_id = transactional_id(
            spec.settings.transactional_id, raw_topic, group, self.groups
        )
        #: the clean topics' names, partition counts and timestamp checks (no producer of its own)
        self.clean = PartitionWriter(spec.settings, spec.query_id, group, windows=spec.windows)
        #: milliseconds of the fence and the state reads
        self.fence_ms = 0
        self.name = (
            f"raw partition {raw_topic}:{group}"
            if self.groups == 0
            else f"raw partitions {raw_topic}:{group} mod {self.groups}"
        )
        self.fault_key = group
        #: a skipped batch's input is not read on (nothing downstream of it in the stage)
        self.drain_skipped = False
        self._on_stats: Any = None
        self._producer: Producer | None = None
        #: the group's raw partitions with input, in the order their input came
        self._members: dict[int, _Member] = {}
        self._current: _Member | None = None
        self._clock = clock
        self.timeout_s = transaction_timeout_s(spec.settings.kafka_conf)
        #: seconds a transaction stays open before the task commits a part of the batch
        self.part_after_s = self.timeout_s * PART_SHARE
        self._part_started = 0.0

    def run(
        self,
        batches: Iterable[RawBatch],
        on_stats: Any,
    ) -> BatchResult:
        """Commit this group's part of the batch, or skip it if its state records say it is
        committed (``dedup.commit.commit_batch``, which states the argument); ``on_stats`` gets
        the ``stat`` rows (written only)."""
        self._on_stats = on_stats
        return commit_batch(self, batches, self.spec.batch_id)

    # -- dedup.commit.BatchWork ----------------------------------------------------------------

    def publishes(self, batch: RawBatch) -> bool:
        # every row is input (a tick runs the scans); the batch's raw partition, checked
        topic, partition = batch.topic, batch.partition
        if topic != self.raw_topic or group_of(partition, self.groups) != self.group:
            raise ServiceError(
                f"a direct task of {self.name} got rows of raw partition {topic}:{partition}; "
                "nothing is written"
            )
        member = self._members.get(partition)
        if member is None:
            member = _Member(self.spec, topic, partition)
            if self._producer is not None:
                self._join(member)  # fenced already: its state is read now
            self._members[partition] = member
        self._current = member
        return True

    def fence(self) -> tuple[Producer, int]:
        assert self._current is not None  # set by publishes()
        started = time.monotonic()
        producer = init_producer(
            self.settings, self.transactional_id, message_bytes=STATE_RECORD_LIMIT
        )
        self.fence_ms = round((time.monotonic() - started) * 1000)
        self._producer = producer
        self._part_started = self._clock()
        # Whether the group committed this batch, from its first raw partition with input:
        # the last commit of a batch writes every one of them, and a replay has the same input
        first = self._join(self._current)
        committed = first.committed
        if committed is None:
            return producer, -1
        if first.resume_after >= 0:
            return producer, self.spec.batch_id - 1
        return producer, committed.batch_id

    def produce(self, producer: Producer, batch: RawBatch, result: BatchResult) -> None:
        member = self._current
        assert member is not None  # set by publishes()
        assert member.live is not None  # made by _join()
        if batch.offsets:  # in offset order, from either reader
            member.last_offset = max(member.last_offset, batch.offsets[-1])
        if member.resume_after >= 0:
            # rows a committed part covered; the rest of a batch keeps its offset order
            batch = batch.after(member.resume_after)
        if len(batch):
            records, gaps = result.records, result.gaps
            self._one_batch(producer, batch, member, result)
            member.records += result.records - records
            member.gaps += result.gaps - gaps

    def part_due(self) -> bool:
        return self._clock() - self._part_started >= self.part_after_s

    def finish_part(self, producer: Producer, result: BatchResult) -> None:
        for member in self._members.values():
            assert member.live is not None  # made by _join()
            state = StateRecord(
                batch_id=self.spec.batch_id,
                raw_topic=self.raw_topic,
                raw_partition=member.raw_partition,
                detectors=member.live.snapshot(),
                records=member.records,
                gaps=member.gaps,
                committed_at_ms=int(time.time() * 1000),
                through_offset=member.last_offset,
            )
            produce_waiting(producer, self.settings.state_topic, state.encode(), member.key,
                            member.raw_partition)  # fmt: skip
        # rare (a task writing for longer than a third of the timeout), and the executors log
        # WARNING and up: an operator sees that batches outgrow a transaction
        log.warning(
            "batch %d %s: committing part %d, through raw offset %s, after %.0f s open "
            "(a third of transaction.timeout.ms)",
            self.spec.batch_id,
            self.name,
            result.parts + 1,
            ", ".join(
                f"{m.last_offset}" if self.groups == 0 else f"{m.last_offset} of {m.raw_partition}"
                for m in self._members.values()
            ),
            self._clock() - self._part_started,
        )
        self._part_started = self._clock()

    def finish(self, producer: Producer, result: BatchResult) -> None:
        for member in self._members.values():
            assert member.live is not None  # made by _join()
            stats = Output()
            detectors = member.live.finish(stats)
            if stats.rows:
                self._on_stats(stats.record_batch())
            state = StateRecord(
                batch_id=self.spec.batch_id,
                raw_topic=self.raw_topic,
                raw_partition=member.raw_partition,
                detectors=detectors,
                records=member.records,
                gaps=member.gaps,
                committed_at_ms=int(time.time() * 1000),
            )
            member.state = state.encode()
            member.written.clear()
            produce_waiting(
                producer,
                self.settings.state_topic,
                member.state,
                member.key,
                member.raw_partition,
                on_delivery=_delivered(member.written),
            )

    def ended(self, committed: bool, abort_failed: bool) -> None:
        if committed and self._producer is not None:
            # the state records' delivery reports, if the commit left them queued
            self._producer.poll(0)
        for m in self._members.values():
            if committed and m.written and m.written[0] >= 0:
                # the partition then ends after the record and this transaction's commit marker
                remember(self.settings, m.key, m.raw_partition, m.written[0] + 2, m.state)
            else:
                forget(self.settings, m.key, m.raw_partition)

    def _join(self, member: _Member) -> _Member:
        """Read ``member``'s last committed state record (after the fence) and start its
        detectors from it."""
        started = time.monotonic()
        committed = read_state(self.settings, member.key, member.raw_partition)
        self.fence_ms += round((time.monotonic() - started) * 1000)
        member.committed = committed
        # parsed once each, saved once at the end (not per Arrow batch)
        member.live = LiveBucket(
            self.params,
            committed.detectors if committed is not None else DetectorSet(),
            self.spec.now_ms,
            DIRECT_STATE_BYTES,
        )
        if committed is None or committed.complete:
            return member
        if committed.batch_id == self.spec.batch_id:
            # a part of this batch is committed: go on after it
            member.resume_after = member.last_offset = committed.through_offset
            log.warning(  # after a crash or a retry: where operators look (WARNING and up)
                "batch %d %s: a part through raw offset %d was committed; going on after it",
                self.spec.batch_id,
                member.name,
                committed.through_offset,
            )
        elif committed.batch_id < self.spec.batch_id:
            # Spark completed no batch whose task did not finish: not reached by the query
            # (another program wrote the state topic); the batch's uncommitted rest stays gaps
            log.warning(
                "%s: the state record holds a part of batch %d (through raw offset %d) and "
                "Spark runs batch %d: the rest of batch %d is reported as gaps",
                member.name,
                committed.batch_id,
                committed.through_offset,
                self.spec.batch_id,
                committed.batch_id,
            )
        return member

    def _one_batch(
        self,
        producer: Producer,
        batch: RawBatch,
        member: _Member,
        result: BatchResult,
    ) -> None:
        """Observe one batch of input, produce what it delivers (one batch of payload in the
        task at a time)."""
        assert member.live is not None  # made by _join()
        columns = classify_raw(batch)
        if self.spec.raw_partitions:
            _drop_misrouted(columns, self.spec.raw_partitions, self.raw_topic, member.raw_partition)
        kinds = columns["kind"]
        keep = np.flatnonzero(kinds != KIND_TICK)
        rows = None
        if len(keep):
            rows = InputRows(columns)
            if len(keep) != len(kinds):
                rows = rows.take(keep)
        out = Output()
        member.live.observe(rows, out)
        # straight from the rows: an Arrow batch of them cost two copies of every payload
        runs: list[RunRow] = []
        gaps: list[tuple[bytes, bytes]] = []
        records = 0
        for kind, topic, partition, values in out.rows:
            if kind == KIND_RUN:
                runs.append((topic, partition, values["payload"], values["selection"]))
                records += values["records"]
            elif kind == KIND_GAP:
                gaps.append((values["gap_key"], values["gap_value"]))
        result.records += records
        result.gaps += len(gaps)
        with gc_paused():
            self.clean.produce_records(producer, runs, result)
        self.clean.produce_gaps(producer, gaps)


def _delivered(offsets: list[int]) -> Callable[[Any, Any], None]:
    """A delivery callback that appends the record's offset to ``offsets`` (-1: failed)."""

    def report(err: Any, msg: Any) -> None:
        offsets.append(-1 if err else msg.offset())

    return report


def _drop_misrouted(
    columns: dict[str, np.ndarray], raw_partitions: int, raw_topic: str, raw_partition: int
) -> None:
    """Make malformed the rows whose source partition belongs in another raw partition.

    The receiver writes source partition ``p`` into raw partition ``p mod N`` only
    (``common.raw_topic.raw_partition_of``), and this
    layout keeps each source partition's detector in the state of that one raw partition: a
    record elsewhere (written by something else) would start a second detector, blind to the
    first one's offsets. Counted as malformed and logged instead, like any record this dedup
    cannot take; its offsets stay gaps in the right detector until a resend brings them through
    a receiver."""
    kinds = columns["kind"]
    partitions = columns["src_partition"]
    parsed = (kinds != KIND_TICK) & (kinds != KIND_MALFORMED)
    misrouted = np.flatnonzero(
        parsed & (raw_partition_of(partitions, raw_partitions) != raw_partition)
    )
    if not len(misrouted):
        return
    first = int(misrouted[0])
    log.warning(
        "%d raw records in %s:%d belong in other raw partitions (the first: source %s:%d, "
        "which a receiver writes into raw partition %d of %d): counted as malformed, their "
        "offsets stay gaps until a resend; is something other than kafka-diode's receiver "
        "writing into the raw topic?",
        len(misrouted),
        raw_topic,
        raw_partition,
        columns["src_topic"][first],
        int(partitions[first]),
        raw_partition_of(int(partitions[first]), raw_partitions),
        raw_partitions,
    )
    kinds[misrouted] = KIND_MALFORMED
    columns["src_topic"][misrouted] = UNPARSED_TOPIC
    partitions[misrouted] = UNPARSED_PARTITION
