"""One stateful partition's transaction of one micro-batch: its clean records, gaps and marker.

Runs in a write task (an executor), never on the driver. ``PartitionWriter.write_table`` takes
the partition's rows of the batch (``dedup/rows.py``), fences every older attempt of the
partition (``dedup/fence.py``), skips a batch its marker says is committed, and otherwise
produces, in one transaction: the first-seen records of every ``run`` row (decoded from the
payload the row carries: nothing is read back from the raw topic), the gap reports and the
marker. docs/dedup-internals.md "Effectively once" has the argument.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer

from common.errors import RemoteProtocolError, ServiceError
from common.raw_topic import fill_topic
from common.topic_limits import TimestampWindow
from common.wire.batch_decode import decode_record_groups
from common.wire.events import RecordGroup
from dedup.clean_topics import checked_clean_topic, checked_clean_topics
from dedup.commit import commit_batch, produce_waiting
from dedup.fence import (
    MARKER_PARTITION,
    QUEUED_BATCHES,
    init_producer,
    partition_transactional_id,
    read_last_marker,
    wait_for_acks,
)
from dedup.rows import KIND_GAP, KIND_RUN, KIND_STAT, unpack_selection
from dedup.writer_settings import (
    KAFKA_TIMEOUT_S,
    BatchResult,
    WriterSettings,
    transaction_timeout_s,
)

log = logging.getLogger(__name__)

#: A ``run`` row as the write side takes it: source topic, source partition, payload (a run of
#: records, ``dedup/rows.py``) and selection (``rows.pack_selection``; empty: every record).
RunRow = tuple[str, int, bytes, bytes | None]

#: Trailing header of a clean record written with the dedup's time: the source timestamp (ms,
#: ASCII decimal) its clean topic would have refused (docs/topics.md "Timestamps").
ORIGINAL_TIMESTAMP_HEADER = "diode.original-timestamp"


class PartitionWriter:
    """The transactional writer of one stateful partition: one transaction per batch, fenced.

    ``transactional.id`` = ``<TRANSACTIONAL_ID>-p<partition>``; marker key =
    ``<query id>:<partition>``. A new instance (a task attempt) fences every older one of the
    same partition in ``init_transactions`` and only then reads the partition's last marker.
    One instance writes at most one batch in production (one per task attempt); tests reuse it.
    """

    def __init__(
        self,
        settings: WriterSettings,
        query_id: str,
        partition: int,
        *,
        windows: Mapping[str, TimestampWindow] | None = None,
    ) -> None:
        if partition < 0:
            raise ValueError("partition must be >= 0")
        self.settings = settings
        self.query_id = query_id
        self.partition = partition
        self.transactional_id = partition_transactional_id(settings.transactional_id, partition)
        self.marker_key = f"{query_id}:{partition}".encode()
        self._producer: Producer | None = None
        self._last_committed = -1
        self._partitions: dict[str, int] = {}
        #: clean topic -> the timestamps it accepts (checked: ``checked_clean_topic``)
        self._windows: dict[str, TimestampWindow] = dict(windows or {})
        self._clean_names: dict[str, str] = {}
        #: the clean partitions this writer's producer writes, and what it may hold per partition
        self._written: set[tuple[str, int]] = set()
        batch_bytes = settings.kafka_conf.get("batch.size", settings.write_batch_bytes)
        self._held_per_partition = QUEUED_BATCHES * int(batch_bytes)
        #: milliseconds the last ``_start`` took (producer, init_transactions, marker read)
        self.fence_ms = 0

    def close(self) -> None:
        """Drop the producer (idempotent)."""
        self._producer = None

    def _start(self) -> Producer:
        started = time.monotonic()
        producer = init_producer(self.settings, self.transactional_id)
        self._last_committed = read_last_marker(
            self.settings, self.marker_key, f"{self.transactional_id}.fence"
        )
        self.fence_ms = round((time.monotonic() - started) * 1000)
        log.debug(
            "partition writer ready: transactional.id=%s last committed batch=%d",
            self.transactional_id,
            self._last_committed,
        )
        return producer

    def write_table(
        self,
        table: pa.Table,
        batch_id: int,
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> BatchResult:
        """``write_batches`` over one table's record batches (tests, tools)."""
        return self.write_batches(table.to_batches(), batch_id, before_commit=before_commit)

    def write_batches(
        self,
        batches: Iterable[pa.RecordBatch],
        batch_id: int,
        *,
        before_commit: Callable[[], None] | None = None,
        on_stats: Callable[[pa.RecordBatch], None] | None = None,
    ) -> BatchResult:
        """Commit this partition's rows of batch ``batch_id`` in one transaction, or skip it
        (``dedup.commit.commit_batch``, which states the argument).

        The rows stream in: each Arrow batch is produced and dropped before the next is read,
        so a task holds one batch of payload at a time (``spark.sql.execution.arrow.*`` bound
        it), not its partition's whole share of the micro-batch. ``on_stats`` gets each batch's
        ``stat`` rows, written or not.
        """
        work = _StatefulWork(self, batch_id, on_stats)
        result = commit_batch(work, batches, batch_id, before_commit=before_commit)
        if not result.skipped:
            self._last_committed = batch_id
        return result

    def _check_new_topics(self, source_topics: list[str]) -> None:
        """Check the clean topics of ``source_topics`` this writer has not seen, together."""
        names = [self.clean_name(t) for t in source_topics]
        new = [name for name in names if name not in self._windows]
        if new:
            self._windows.update(checked_clean_topics(self.settings, new))

    def _learn_partition_counts(self, producer: Producer, topics: list[str]) -> None:
        """The partition counts of the clean topics not known yet, from one metadata request
        (a task of a raw partition that carries many source topics paid one per topic)."""
        missing = [t for t in topics if t not in self._partitions]
        if len(missing) < 2:
            return  # _partition_count asks for the one topic
        # every topic's metadata: asking for names would let a broker auto-create them; the
        # clean topics exist by now (_check_new_topics created the missing ones)
        meta = producer.list_topics(timeout=KAFKA_TIMEOUT_S).topics
        for topic in missing:
            found = meta.get(topic)
            if found is not None and found.error is None and found.partitions:
                self._partitions[topic] = len(found.partitions)

    def _partition_count(self, producer: Producer, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            if topic not in self._windows:
                # created (if missing) before any metadata request, then checked
                self._windows[topic] = checked_clean_topic(self.settings, topic)
            meta = producer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise ServiceError(f"clean topic {topic!r} has no partitions; create it first")
            count = len(meta.partitions)
            self._partitions[topic] = count
        return count

    def clean_name(self, source_topic: str) -> str:
        """The clean topic of ``source_topic`` (CLEAN_TOPIC, with ``{topic}`` filled in)."""
        name = self._clean_names.get(source_topic)
        if name is None:
            name = fill_topic(self.settings.clean_topic, source_topic)
            self._clean_names[source_topic] = name
        return name

    def produce_records(
        self, producer: Producer, runs: Sequence[RunRow], result: BatchResult
    ) -> None:
        """Produce the first-seen records of one batch's ``run`` rows (the hot loop); counts in
        ``result`` the records written with the dedup's time and the payload bytes consumed.

        The payload came with the rows (``dedup/rows.py``): nothing is read from Kafka here.
        Runs are written in the order the stateful step emitted them: per source partition, by
        first offset (docs/dedup.md "Upgrading from layout v1").

        Raises:
            ServiceError: a run's payload does not decode (it was checked in the stateful step,
                so only a bug or corrupted state gets here); the batch is aborted.
        """
        if not runs:
            return
        now_ms = int(time.time() * 1000)
        source_topics = list(dict.fromkeys(run[0] for run in runs))
        self._check_new_topics(source_topics)
        self._learn_partition_counts(producer, [self.clean_name(t) for t in source_topics])
        targets: dict[tuple[str, int], tuple[str, int, tuple[int, int]]] = {}
        payload_bytes = record_bytes = replaced = decoded = 0
        for topic, partition, payload, selection in runs:
            target = targets.get((topic, partition))
            if target is None:
                name = self.clean_name(topic)
                count = self._partition_count(producer, name)
                # the timestamps the clean topic accepts now: plain bounds for the hot loop
                accepts = self._windows.get(name, TimestampWindow()).bounds(now_ms)
                target = targets[topic, partition] = (name, partition % count, accepts)
                self._written.add((name, partition % count))
            try:
                groups, _ = decode_record_groups(payload)
            except RemoteProtocolError as exc:
                raise ServiceError(
                    f"a run of {topic}:{partition} no longer decodes in the write task ({exc}); "
                    "the batch is aborted"
                ) from exc
            payload_bytes += len(payload)
            for group in groups:
                record_bytes += _record_bytes(group)
                decoded += len(group)
                for first, last in unpack_selection(selection, len(group)):
                    replaced += _produce_run(producer, group, first, last + 1, target)
            # held bytes ~ messages x this call's mean record: QUEUED_BATCHES per partition
            room = self._held_per_partition * len(self._written)
            if len(producer) * record_bytes > room * decoded:
                wait_for_acks(producer, room * decoded // record_bytes)
        result.replaced += replaced
        result.payload_bytes += payload_bytes
        result.record_bytes += record_bytes

    def produce_gaps(self, producer: Producer, gaps: Iterable[tuple[bytes, bytes]]) -> None:
        """Produce gap records, ``(key, value)`` each."""
        topic = self.settings.gap_topic
        for key, value in gaps:
            produce_waiting(producer, topic, value, key)


class _StatefulWork:
    """A stateful partition's part of one batch (``dedup.commit.BatchWork``): its ``run`` and
    ``gap`` rows, then its marker (progress topic, key ``<query id>:<partition>``)."""

    drain_skipped = True

    def __init__(
        self,
        writer: PartitionWriter,
        batch_id: int,
        on_stats: Callable[[pa.RecordBatch], None] | None,
    ) -> None:
        self.writer = writer
        self.batch_id = batch_id
        self.on_stats = on_stats
        self.name = f"partition {writer.partition}"
        self.fault_key = writer.partition
        self.timeout_s = transaction_timeout_s(writer.settings.kafka_conf)
        self._runs: pa.RecordBatch | None = None
        self._gaps: pa.RecordBatch | None = None

    def publishes(self, batch: pa.RecordBatch) -> bool:
        kinds = batch.column("kind")
        if self.on_stats is not None:
            self.on_stats(batch.filter(pc.equal(kinds, KIND_STAT)))
        self._runs = batch.filter(pc.equal(kinds, KIND_RUN))
        self._gaps = batch.filter(pc.equal(kinds, KIND_GAP))
        return bool(self._runs.num_rows or self._gaps.num_rows)

    def fence(self) -> tuple[Producer, int]:
        writer = self.writer
        if writer._producer is None:
            writer._producer = writer._start()
        return writer._producer, writer._last_committed

    def produce(self, producer: Producer, batch: pa.RecordBatch, result: BatchResult) -> None:
        runs, gap_rows = self._runs, self._gaps
        assert runs is not None  # set by publishes(batch)
        assert gap_rows is not None
        result.records += record_count(runs)
        result.gaps += gap_rows.num_rows
        with gc_paused():
            self.writer.produce_records(producer, run_rows(runs), result)
        self.writer.produce_gaps(
            producer,
            zip(
                gap_rows.column("gap_key").to_pylist(),
                gap_rows.column("gap_value").to_pylist(),
                strict=True,
            ),
        )

    def finish(self, producer: Producer, result: BatchResult) -> None:
        writer = self.writer
        marker = {
            "query_id": writer.query_id,
            "partition": writer.partition,
            "batch_id": self.batch_id,
            "records": result.records,
            "gaps": result.gaps,
            "committed_at_ms": int(time.time() * 1000),
        }
        produce_waiting(
            producer,
            writer.settings.progress_topic,
            json.dumps(marker).encode(),
            writer.marker_key,
            MARKER_PARTITION,
        )

    def part_due(self) -> bool:
        # a replay recomputes the batch's rows from Spark's state; a marker cannot say where a
        # part of them ended, so a batch is one transaction (docs/operations.md "Known
        # limitations": the buckets layout bounds a batch by MAX_OFFSETS_PER_TRIGGER)
        return False

    def finish_part(self, producer: Producer, result: BatchResult) -> None:
        raise AssertionError("the buckets layout commits a batch in one transaction")

    def ended(self, committed: bool, abort_failed: bool) -> None:
        if abort_failed:
            self.writer._producer = None


def run_rows(runs: pa.RecordBatch) -> list[RunRow]:
    """The ``run`` rows of an Arrow batch as the write side takes them."""
    return list(
        zip(
            runs.column("src_topic").to_pylist(),
            runs.column("src_partition").to_pylist(),
            runs.column("payload").to_pylist(),
            runs.column("selection").to_pylist(),
            strict=True,
        )
    )


def record_count(runs: pa.Table | pa.RecordBatch) -> int:
    """Clean records the ``run`` rows of a batch select."""
    if runs.num_rows == 0:
        return 0
    return int(pc.sum(runs.column("records")).as_py() or 0)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the produce loop of a write task.

    The loop allocates a header list and header tuples per record; the collector's
    allocation-count trigger then ran gen-0/1/2 collections that walked every live object of the
    Python worker (pyspark, pandas, ...): 43 % of the loop's time in py-spy. These objects form no
    cycles, so reference counting frees them; the collector is re-enabled (if it was on) when the
    loop ends. It is process-wide, so other threads of the worker run without it meanwhile.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _record_bytes(group: RecordGroup) -> int:
    """Keys, values and headers (names and values) of a run's records, in bytes."""
    size = sum(map(len, filter(None, group.keys))) + sum(map(len, filter(None, group.values)))
    for headers in group.headers:
        for name, value in headers:
            size += len(name) + (len(value) if value is not None else 0)
    return size


def _produce_run(
    producer: Producer,
    group: RecordGroup,
    start: int,
    stop: int,
    target: tuple[str, int, tuple[int, int]],
) -> int:
    """Produce records ``start:stop`` of one run (the per-record hot loop); returns how many were
    written with the dedup's time (``_produce_replaced``).

    No per-record callback: a transactional producer's ``commit_transaction`` fails if any
    message of the transaction failed, and the batch is then aborted (``write_table``). So no
    record the broker would refuse may be produced: a timestamp outside what the clean topic
    accepts takes ``_produce_replaced``, never the broker's refusal, which would fail the whole
    transaction again on every replay.
    """
    name, partition, (low, high) = target
    produce = producer.produce
    replaced = 0
    for timestamp, key, value, headers in zip(
        group.timestamps[start:stop],
        group.keys[start:stop],
        group.values[start:stop],
        group.headers[start:stop],
        strict=True,
    ):
        rest: Any = list(headers) if headers else None
        if low <= timestamp <= high:
            try:
                # positional: keywords cost produce() a dict per call (~1 us here)
                produce(name, value, key, partition, None, None, timestamp, rest)
            except BufferError:
                produce_waiting(producer, name, value, key, partition, timestamp, rest, full=True)
        else:
            _produce_replaced(producer, (name, value, key, partition, timestamp, rest or []))
            replaced += 1
    return replaced


def _produce_replaced(
    producer: Producer,
    args: tuple[str, bytes | None, bytes | None, int, int, list[tuple[str, bytes | None]]],
) -> None:
    """A record whose source timestamp the clean topic would refuse: written with the dedup's
    time (timestamp 0: the producer's clock) and the source timestamp in a trailing
    ``diode.original-timestamp`` header (docs/topics.md "Timestamps"), so nothing is lost and no
    other record of the transaction fails with it."""
    name, value, key, target, timestamp, headers = args
    marked = [*headers, (ORIGINAL_TIMESTAMP_HEADER, b"%d" % timestamp)]
    produce_waiting(producer, name, value, key, target, 0, marked)
