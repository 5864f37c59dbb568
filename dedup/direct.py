"""The direct layout: one task per raw partition detects, writes and keeps its own state.

Runs in the **executors** (``direct_task``, mapped by the driver's ``TransactionalBatchWriter``
over each micro-batch of Spark's Kafka source as it reads it: one task per raw topic-partition,
no projection, no shuffle; the task classifies its records itself, ``dedup/classify_python.py``).
No stateful operator and no RocksDB: the detectors of every source partition the raw partition
carries live in one record of ``STATE_TOPIC`` (``dedup/direct_state.py``), written in the same
Kafka transaction as the clean records and the gap records it produces, so the state and the
output commit or abort together.

The receiver writes every record, heartbeat and withheld range of a source partition into one
raw partition (``p mod N``), so one task sees all of a source partition's input; the layout
needs one raw topic (chains merge several, which the stateful layouts handle) and a fixed
partition count (checked by the driver, ``dedup/job.py``).

Effectively once (docs/dedup.md "The direct layout"), per (batch ``N``, raw partition ``p``):

1. every task attempt creates a producer with ``transactional.id`` =
   ``<TRANSACTIONAL_ID>-<raw topic>-<p>`` and calls ``init_transactions``, which fences every
   older attempt (retries, zombies, a crashed driver's tasks) and aborts or completes its open
   transaction;
2. only then does it read the last committed state record of ``p`` (``read_committed``): its
   ``batch_id`` ``M`` says which batch it completes. ``N <= M``: the batch was committed before
   Spark heard of it, and the attempt writes nothing. Otherwise the record's detectors are the
   state after every earlier batch (a batch without input for ``p`` changes nothing of it);
3. the attempt observes its input, produces the first-seen records, the gap reports and the new
   state record, and commits once. Spark writes its commit log only after every task returned.

So, unlike the stateful layouts, a replay need not compute the same output: committed work is
never redone, and ``now`` is the driver's clock at the batch.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException, Producer

from common.errors import ServiceError
from common.raw_topic import raw_partition_of
from common.topic_limits import TimestampWindow
from dedup.classify_python import classify_batch
from dedup.detect import DetectParams, LiveBucket, Output
from dedup.detector_set import DetectorSet
from dedup.direct_state import DIRECT_STATE_BYTES, STATE_RECORD_LIMIT, StateRecord, state_key
from dedup.faults import fault, fault_during
from dedup.fence import init_producer, wait_for_room
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
from dedup.task_result import task_attempt, task_result
from dedup.transaction import PartitionWriter, gc_paused, record_count
from dedup.worker_heap import FreezeOnLoad
from dedup.writer_settings import KAFKA_TIMEOUT_S, BatchResult, WriterSettings

log = logging.getLogger(__name__)


def transactional_id(base: str, raw_topic: str, raw_partition: int) -> str:
    """The ``transactional.id`` of one raw partition's task."""
    return f"{base}-{raw_topic}-{raw_partition}"


@dataclass(frozen=True, kw_only=True)
class DirectSpec:
    """What one micro-batch's direct tasks need (pickled with the task function)."""

    settings: WriterSettings
    """The writer's settings (``state_topic`` among them)."""
    params: DetectParams
    """The detectors' settings."""
    query_id: str
    """Spark's query id (stable per checkpoint): the state records' key prefix."""
    batch_id: int
    """The micro-batch."""
    now_ms: int
    """The driver's clock when it started the batch: the gap scans' time."""
    windows: Mapping[str, TimestampWindow] = field(default_factory=dict)
    """Clean topics the driver checked at start-up and the timestamps each accepts."""
    raw_partitions: int = 0
    """The raw topic's partition count (the driver checked it is fixed); a record of source
    partition ``p`` belongs in raw partition ``p mod raw_partitions`` (0: not checked)."""
    heap: FreezeOnLoad = field(default_factory=FreezeOnLoad)
    """Unpickled in a Python worker, freezes its loaded code out of the collector's walks."""


def direct_task(spec: DirectSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One raw partition's task of one micro-batch (``mapInArrow``; runs in an executor)."""
    _, attempt = task_attempt()
    started = time.monotonic()
    nonempty = (b for b in batches if b.num_rows)
    first = next(nonempty, None)
    if first is None:
        return  # no input: no fence, no state read, nothing written
    raw_topic, raw_partition = _source_of(first)
    task = DirectPartition(spec, raw_topic, raw_partition)
    stat_parts: list[pa.RecordBatch] = []
    result = task.run(itertools.chain((first,), nonempty), stat_parts.append)
    write_ms = round((time.monotonic() - started) * 1000)
    yield from task_result(raw_partition, attempt, result, stat_parts, task.fence_ms, write_ms)


def _source_of(batch: pa.RecordBatch) -> tuple[str, int]:
    """The one raw topic-partition of ``batch``.

    Raises:
        ServiceError: rows of several raw partitions in one task: Spark's source was told to
            split or merge partitions (``KAFKA_SOURCE_MINPARTITIONS`` and the like), which the
            configuration refuses; nothing is written.
    """
    topics = pc.unique(batch.column("topic"))
    partitions = pc.unique(batch.column("partition"))
    if len(topics) != 1 or len(partitions) != 1:
        raise ServiceError(
            "a direct task got rows of several raw partitions "
            f"({topics.to_pylist()} / {partitions.to_pylist()}): Spark's Kafka source must make "
            "one task per raw partition (unset KAFKA_SOURCE_MINPARTITIONS and "
            "KAFKA_SOURCE_MAXRECORDSPERPARTITION)"
        )
    return str(topics[0].as_py()), int(partitions[0].as_py())


class DirectPartition:
    """One raw partition's transaction of one batch: fence, state, detect, write, commit."""

    def __init__(self, spec: DirectSpec, raw_topic: str, raw_partition: int) -> None:
        self.spec = spec
        self.settings = spec.settings
        self.raw_topic = raw_topic
        self.raw_partition = raw_partition
        self.transactional_id = transactional_id(
            spec.settings.transactional_id, raw_topic, raw_partition
        )
        self.key = state_key(spec.query_id, raw_topic, raw_partition)
        #: the clean topics' names, partition counts and timestamp checks (no producer of its own)
        self.clean = PartitionWriter(
            spec.settings, spec.query_id, raw_partition, windows=spec.windows
        )
        #: milliseconds of the fence and the state read
        self.fence_ms = 0

    def run(
        self,
        batches: Iterable[pa.RecordBatch],
        on_stats: Any,
    ) -> BatchResult:
        """Commit this raw partition's part of the batch, or skip it if its state record says
        it is committed; ``on_stats`` gets each Arrow batch's ``stat`` rows (written only)."""
        batch_id = self.spec.batch_id
        started = time.monotonic()
        producer = init_producer(
            self.settings, self.transactional_id, message_bytes=STATE_RECORD_LIMIT
        )
        committed = read_state(self.settings, self.key, self.raw_partition)
        self.fence_ms = round((time.monotonic() - started) * 1000)
        if committed is not None and batch_id <= committed.batch_id:
            log.info(
                "batch %d raw partition %s:%d already committed (state record of batch %d)",
                batch_id,
                self.raw_topic,
                self.raw_partition,
                committed.batch_id,
            )
            return BatchResult(batch_id, skipped=True, fenced=True)
        # parsed once each, saved once at the end (not per Arrow batch)
        live = LiveBucket(
            self.spec.params,
            committed.detectors if committed is not None else DetectorSet(),
            self.spec.now_ms,
            DIRECT_STATE_BYTES,
        )
        result = BatchResult(batch_id)
        producer.begin_transaction()
        try:
            for batch in batches:
                self._check_source(batch)
                self._one_batch(producer, batch, live, result)
            stats = Output()
            detectors = live.finish(stats)
            if stats.rows:
                on_stats(stats.record_batch())
            state = StateRecord(
                batch_id=batch_id,
                raw_topic=self.raw_topic,
                raw_partition=self.raw_partition,
                detectors=detectors,
                records=result.records,
                gaps=result.gaps,
                committed_at_ms=int(time.time() * 1000),
            )
            value = state.encode()
            written: list[int] = []
            _produce_waiting(
                producer,
                self.settings.state_topic,
                value,
                self.key,
                self.raw_partition,
                on_delivery=lambda err, msg: written.append(-1 if err else msg.offset()),
            )
            fault("task-before-commit", batch_id, self.raw_partition)
            with fault_during("task-in-commit", batch_id, self.raw_partition):
                producer.commit_transaction(KAFKA_TIMEOUT_S * 4)
            producer.poll(0)  # the state record's delivery report, if the commit left it queued
        except KafkaException as exc:
            _abort(producer, self.transactional_id)
            forget(self.settings, self.key, self.raw_partition)
            raise ServiceError(
                f"writing batch {batch_id} raw partition {self.raw_topic}:{self.raw_partition} "
                f"failed and was aborted (nothing of it is visible): {exc}"
            ) from exc
        except BaseException:
            _abort(producer, self.transactional_id)
            forget(self.settings, self.key, self.raw_partition)
            raise
        if written and written[0] >= 0:
            # the partition then ends after the record and this transaction's commit marker
            remember(self.settings, self.key, self.raw_partition, written[0] + 2, value)
        else:
            forget(self.settings, self.key, self.raw_partition)
        fault("task-after-commit", batch_id, self.raw_partition)
        return result

    def _check_source(self, batch: pa.RecordBatch) -> None:
        if _source_of(batch) != (self.raw_topic, self.raw_partition):
            raise ServiceError(
                f"a direct task of raw partition {self.raw_topic}:{self.raw_partition} got rows "
                "of another one; nothing is written"
            )

    def _one_batch(
        self,
        producer: Producer,
        batch: pa.RecordBatch,
        live: LiveBucket,
        result: BatchResult,
    ) -> None:
        """Observe one Arrow batch of input, produce what it delivers (one batch of payload in
        the task at a time)."""
        columns = classify_batch(batch, (self.raw_topic,))
        if self.spec.raw_partitions:
            _drop_misrouted(columns, self.spec.raw_partitions, self.raw_topic, self.raw_partition)
        kinds = columns["kind"]
        keep = np.flatnonzero(kinds != KIND_TICK)
        rows = None
        if len(keep):
            rows = InputRows(columns)
            if len(keep) != len(kinds):
                rows = rows.take(keep)
        out = Output()
        live.observe(rows, out)
        if not out.rows:
            return
        produced = out.record_batch()
        kind = produced.column("kind")
        runs = produced.filter(pc.equal(kind, KIND_RUN))
        gap_rows = produced.filter(pc.equal(kind, KIND_GAP))
        result.records += record_count(runs)
        result.gaps += gap_rows.num_rows
        with gc_paused():
            self.clean.produce_records(producer, runs, result)
        self.clean.produce_gaps(producer, gap_rows)


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


def _produce_waiting(  # noqa: PLR0917  produce's own arguments
    producer: Producer,
    topic: str,
    value: bytes,
    key: bytes,
    partition: int,
    on_delivery: Callable[[Any, Any], None] | None = None,
) -> None:
    while True:
        try:
            producer.produce(topic, value, key, partition, on_delivery=on_delivery)
            return
        except BufferError:
            wait_for_room(producer)


def _abort(producer: Producer, transactional_id: str) -> None:
    try:
        producer.abort_transaction(KAFKA_TIMEOUT_S)
    except KafkaException:
        # fenced (a newer attempt took over) or the broker is away: the next attempt's
        # init_transactions aborts what is left open
        log.warning("abort of %s failed; the producer is dropped", transactional_id)
