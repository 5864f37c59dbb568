"""Effectively-once output of the dedup query: one Kafka transaction per batch and partition.

Guarantee: for a reader with ``isolation.level=read_committed``, the records of micro-batch ``N``
appear in the clean and gap topics **at most once**, and exactly once if the query ever completes
batch ``N``, however often the process or any task crashes, is retried or lingers as a zombie,
and however often the query restarts from the same checkpoint.

Where the work runs: nowhere near the driver. ``foreachBatch`` (driver) only maps the batch's
DataFrame with ``write_partition_task`` (``mapInArrow``): one task per partition of the stateful
step, in the executors, in parallel. Each task re-reads its first-seen raw records by their raw
position (``dedup.reread``), restores them (``common.raw_topic.restore``), produces them with its
gap records and a marker in one transaction, and hands back a few counters. The driver collects
those (one row per task and one per source partition) for the metrics.

Argument (docs/dedup.md "Effectively once" has the long form):

1. **Fixed partitions.** The stateful step is hash-partitioned by source (topic, partition) into
   ``spark.sql.shuffle.partitions`` partitions, a number Spark fixes for a checkpoint at its
   first run. The write tasks follow it without a shuffle, so task ``p`` of batch ``N`` always
   holds exactly the groups of state partition ``p``, computed from the same input offsets and
   the same state version: a replayed (batch, partition) has the same output.
2. **One transaction per (batch, partition)** of a producer with ``transactional.id =
   <TRANSACTIONAL_ID>-p<p>``: the partition's clean records, gap records and a marker (progress
   topic, key ``<query id>:<p>``, value with the batch id) commit or abort together.
3. **Fence first.** Every task attempt creates its producer and calls ``init_transactions``,
   which fences every older producer with that id (an earlier attempt, a retried or speculative
   task, a zombie on an executor declared lost, a task of a crashed driver) and aborts its open
   transaction, or completes it if its commit had begun. Only then does it read the partition's
   highest committed marker ``M`` (``read_committed``): ``N <= M`` means batch ``N`` of this
   partition was committed (then the attempt that did it, or the driver, crashed before Spark's
   commit log) and the attempt skips it. A zombie fenced this way can no longer commit.
4. Spark writes batch ``N`` to its commit log only after every task succeeded; a batch missing
   there is re-run with the same offsets and state version, and step 3 decides per partition.

A raw record that is gone when re-read fails the task (aborted, nothing visible); a replay
re-reads the same immutable raw records for the same decisions, so it produces the same output.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
)

from common.errors import KafkaClientError, ServiceError
from common.metrics import CollectorRegistry, Counter, Gauge
from common.raw_topic import PROVENANCE_HEADERS, Header, restore
from common.topic_limits import (
    LONG_MAX,
    TimestampWindow,
    created_topic_config,
    record_limit,
    size_problem,
    timestamp_window,
)
from dedup.positions import KIND_RECORDS, POSITION_FIELDS, unpack_positions
from dedup.reread import DEFAULT_CHUNK, RawRereader, consumer_conf
from runtime import kafka

log = logging.getLogger(__name__)

#: How long the writer waits for the query id after the query started (start() returns fast).
BIND_TIMEOUT_S = 120.0
KAFKA_TIMEOUT_S = 30.0
#: Markers read per step when searching the progress topic backwards for this query's last one.
FENCE_SCAN_STEP = 512
#: The marker partition: one partition keeps the markers of a query in order.
MARKER_PARTITION = 0
#: Trailing header of a clean record written with the dedup's time: the source timestamp (ms,
#: ASCII decimal) its clean topic would have refused (docs/topics.md "Timestamps").
ORIGINAL_TIMESTAMP_HEADER = "diode.original-timestamp"
#: Clean topics checked at most this many per process (``checked_clean_topic``'s cache).
MAX_CHECKED_TOPICS = 4096
#: The per-group counters of the stateful step's ``stat`` rows (``dedup.job.OUTPUT_SCHEMA``).
STAT_COLUMNS = (
    "delivered",
    "duplicates",
    "malformed",
    "heartbeats",
    "resets",
    "open_gaps",
    "below_window",
    "budget_evictions",
    "expired_gaps",
    "withheld",
    "chains_missing",
)


@dataclass(frozen=True, kw_only=True)
class WriterSettings:
    """What the writer needs (a subset of ``DedupConfig``, so benches can build one)."""

    bootstrap_servers: str
    """Kafka bootstrap servers."""
    clean_topic: str
    """Clean topic name or template with ``{topic}``."""
    gap_topic: str
    """Gap topic."""
    progress_topic: str
    """Progress (marker) topic."""
    transactional_id: str
    """The stable transactional.id of this checkpoint."""
    new_topic_partitions: int = 1
    """Partitions of clean topics created when missing."""
    new_topic_replication: int = -1
    """Replication factor of created topics (-1: broker default)."""
    max_record_size: int = 16 * 1024 * 1024
    """Largest record the link carries (MAX_RECORD_SIZE): sizes the producer, the re-read
    consumer, created topics and the check of existing clean topics."""
    kafka_conf: Mapping[str, str] = field(default_factory=dict)
    """librdkafka pass-through properties."""
    raw_topics: tuple[str, ...] = ()
    """The topics the query reads, ``(*RAW_TOPICS, CONTROL_TOPIC)``: ``raw_topic`` indexes it."""
    source_options: Mapping[str, str] = field(default_factory=dict)
    """Options of Spark's Kafka source; the re-read consumer copies the shared security ones."""
    reread_chunk: int = DEFAULT_CHUNK
    """Raw records per re-read step (bounds the payload the driver holds at once)."""


class DedupMetrics:
    """Prometheus series of the dedup (names: ``kafka_diode_dedup_*``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ns, sub, reg = "kafka_diode", "dedup", self.registry
        self.forwarded = Counter(
            "records_forwarded", "Records committed to clean topics", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.duplicates = Counter(
            "duplicates_dropped", "Raw records dropped as duplicates", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.malformed = Counter(
            "malformed_records", "Raw records neither data nor known control", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.heartbeats = Counter(
            "heartbeats", "Heartbeat records applied", namespace=ns, subsystem=sub, registry=reg
        )
        self.gap_reports = Counter(
            "gap_reports", "Gap records committed to the gap topic", namespace=ns, subsystem=sub,
            registry=reg,
        )  # fmt: skip
        self.batches = Counter(
            "batches", "Micro-batches committed", namespace=ns, subsystem=sub, registry=reg
        )
        self.replayed = Counter(
            "batches_skipped", "Replayed micro-batches skipped by the fence", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.gaps_open = Gauge(
            "gaps_open", "Open gaps over all source partitions", namespace=ns, subsystem=sub,
            registry=reg,
        )  # fmt: skip
        self.state_bytes = Gauge(
            "state_bytes", "Serialised detector state over all partitions", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.batch_seconds = Gauge(
            "batch_duration_seconds", "Duration of the last micro-batch", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.input_rate = Gauge(
            "input_records_per_second", "Input rate of the last micro-batch", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.processed_rate = Gauge(
            "processed_records_per_second", "Processed rate of the last micro-batch",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        # What the detector counts (docs/dedup.md "Metrics and logs").
        self.below_window = Counter(
            "below_window_dropped", "Raw records dropped as older than the detector's state "
            "(below the oldest window, not in a remembered gap)", namespace=ns, subsystem=sub,
            registry=reg,
        )  # fmt: skip
        self.budget_evictions = Counter(
            "budget_evictions", "Windows evicted early because of MAX_STATE_BYTES", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.gaps_expired = Counter(
            "gaps_expired", "Gaps reported expired (forgotten beyond MAX_EXPIRED_GAPS)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.timestamps_replaced = Counter(
            "timestamps_replaced", "Clean records written with the dedup's time because the clean "
            "topic would refuse their source timestamp (kept in diode.original-timestamp)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.resets = Counter(
            "resets_applied", "Partition state resets applied (kafka-diode dedup reset)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.withheld = Counter(
            "withheld", "Source offsets a sender's content filter withheld (recorded, never gaps)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.chains_missing = Gauge(
            "chains_missing", "Share chains not heard from yet, summed over partitions",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self._open: dict[tuple[str, int], int] = {}
        self._state: dict[tuple[str, int], int] = {}
        self._missing: dict[tuple[str, int], int] = {}

    def add_stats(self, stats: pa.Table) -> None:
        """Fold the ``stat`` rows of one committed batch into the series."""
        cols = {name: stats.column(name).to_pylist() for name in stats.column_names}
        for i, topic in enumerate(cols["src_topic"]):
            partition = cols["src_partition"][i]
            self.duplicates.inc(cols["duplicates"][i] or 0)
            self.malformed.inc(cols["malformed"][i] or 0)
            self.heartbeats.inc(cols["heartbeats"][i] or 0)
            for counter, name in (
                (self.below_window, "below_window"),
                (self.budget_evictions, "budget_evictions"),
                (self.gaps_expired, "expired_gaps"),
                (self.resets, "resets"),
                (self.withheld, "withheld"),
            ):
                if name in cols:
                    counter.inc(cols[name][i] or 0)
            if topic:
                self._open[(topic, partition)] = cols["open_gaps"][i] or 0
                self._state[(topic, partition)] = cols["state_bytes"][i] or 0
                if "chains_missing" in cols:
                    self._missing[(topic, partition)] = cols["chains_missing"][i] or 0
        self.gaps_open.set(sum(self._open.values()))
        self.state_bytes.set(sum(self._state.values()))
        self.chains_missing.set(sum(self._missing.values()))

    def observe_progress(self, progress: Mapping[str, Any]) -> None:
        """Take rates and duration from a StreamingQueryProgress (as JSON)."""
        self.input_rate.set(float(progress.get("inputRowsPerSecond") or 0.0))
        self.processed_rate.set(float(progress.get("processedRowsPerSecond") or 0.0))
        duration = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration is not None:
            self.batch_seconds.set(float(duration) / 1000.0)


@dataclass
class BatchResult:
    """What one call wrote (for logs, tests and the bench)."""

    batch_id: int
    """The micro-batch id."""
    records: int = 0
    """Clean records committed."""
    gaps: int = 0
    """Gap records committed."""
    skipped: bool = False
    """Nothing was committed: already committed before (fenced replay), or nothing to write."""
    fenced: bool = False
    """Skipped (at least partly) because a marker says it was committed before a crash."""
    replaced: int = 0
    """Clean records written with the dedup's time (``_produce_replaced``)."""


#: Columns of what a write task hands back to the driver (``mapInArrow``'s output, as DDL so
#: this module needs no pyspark import): the ``stat`` rows of its partition unchanged, plus one
#: ``task`` row with what the task wrote.
RESULT_COLUMNS = (
    ("kind", "string"),
    ("src_topic", "string"),
    ("src_partition", "int"),
    *((name, "bigint") for name in STAT_COLUMNS),
    ("state_bytes", "bigint"),
    ("task_partition", "int"),
    ("attempt", "int"),
    ("records", "bigint"),
    ("gaps", "bigint"),
    ("replaced", "bigint"),
    ("skipped", "boolean"),
    ("fence_ms", "bigint"),
    ("write_ms", "bigint"),
)
RESULT_DDL = ", ".join(f"{name} {kind}" for name, kind in RESULT_COLUMNS)
_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "boolean": pa.bool_(),
}
RESULT_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in RESULT_COLUMNS])


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What one micro-batch's write tasks need (pickled with the task function)."""

    settings: WriterSettings
    """The writer's settings."""
    query_id: str
    """Spark's query id (stable per checkpoint): the markers' key prefix."""
    batch_id: int
    """The micro-batch."""
    floor: int = -1
    """Highest batch the driver-side writer of earlier versions committed (one transaction for
    the whole batch, key = query id): every partition's batches up to it are done."""
    windows: Mapping[str, TimestampWindow] = field(default_factory=dict)
    """Clean topics the driver checked at start-up (a fixed CLEAN_TOPIC) and the timestamps
    each accepts; the tasks check any other clean topic at its first use in their process."""


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
        floor: int = -1,
        windows: Mapping[str, TimestampWindow] | None = None,
    ) -> None:
        if partition < 0:
            raise ValueError("partition must be >= 0")
        self.settings = settings
        self.query_id = query_id
        self.partition = partition
        self.floor = floor
        self.transactional_id = partition_transactional_id(settings.transactional_id, partition)
        self.marker_key = f"{query_id}:{partition}".encode()
        self._producer: Producer | None = None
        self._reader: RawRereader | None = None
        self._last_committed = -1
        self._partitions: dict[str, int] = {}
        #: clean topic -> the timestamps it accepts (checked: ``checked_clean_topic``)
        self._windows: dict[str, TimestampWindow] = dict(windows or {})
        self._clean_names: dict[str, str] = {}
        #: milliseconds the last ``_start`` took (producer, init_transactions, marker read)
        self.fence_ms = 0

    def close(self) -> None:
        """Drop the producer and close the re-read consumer (idempotent)."""
        self._producer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _rereader(self) -> RawRereader:
        if self._reader is None:
            conf = consumer_conf(
                _base_conf(self.settings),
                self.settings.source_options,
                group_id=f"{self.settings.transactional_id}.reread",
                max_record_size=self.settings.max_record_size,
            )
            self._reader = RawRereader(
                conf, chunk=self.settings.reread_chunk, timeout_s=KAFKA_TIMEOUT_S
            )
        return self._reader

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
        """Commit this partition's rows of batch ``batch_id`` in one transaction, or skip it.

        ``before_commit`` runs after everything was produced, before the commit (tests: a zombie
        or a second attempt in between).
        """
        kinds = table.column("kind")
        records = table.filter(pc.equal(kinds, KIND_RECORDS))
        gap_rows = table.filter(pc.equal(kinds, "gap"))
        result = BatchResult(batch_id, records=record_count(records), gaps=gap_rows.num_rows)
        if result.records == 0 and gap_rows.num_rows == 0:
            # Nothing to publish: no transaction, no marker. A replay of this batch is empty too.
            result.skipped = True
            return result
        if self._producer is None:
            self._producer = self._start()
        producer = self._producer
        if batch_id <= max(self._last_committed, self.floor):
            log.info(
                "batch %d partition %d already committed (marker %d): skipped",
                batch_id,
                self.partition,
                max(self._last_committed, self.floor),
            )
            return BatchResult(batch_id, skipped=True, fenced=True)
        producer.begin_transaction()
        try:
            with _gc_paused():
                _, result.replaced = self._produce_records(producer, records)
            self._produce_gaps(producer, gap_rows)
            marker = {
                "query_id": self.query_id,
                "partition": self.partition,
                "batch_id": batch_id,
                "records": result.records,
                "gaps": result.gaps,
                "committed_at_ms": int(time.time() * 1000),
            }
            producer.produce(
                self.settings.progress_topic,
                json.dumps(marker).encode(),
                self.marker_key,
                MARKER_PARTITION,
            )
            if before_commit is not None:
                before_commit()
            _fault("task-before-commit", batch_id, self.partition)
            with _fault_during("task-in-commit", batch_id, self.partition):
                producer.commit_transaction(KAFKA_TIMEOUT_S * 4)
        except KafkaException as exc:
            self._abort(producer)
            raise ServiceError(
                f"writing batch {batch_id} partition {self.partition} failed and was aborted "
                f"(nothing of it is visible): {exc}"
            ) from exc
        except BaseException:
            self._abort(producer)
            log.error("batch %d partition %d aborted", batch_id, self.partition)  # noqa: TRY400  re-raised below with the cause
            raise
        self._last_committed = batch_id
        _fault("task-after-commit", batch_id, self.partition)
        return result

    def _abort(self, producer: Producer) -> None:
        try:
            producer.abort_transaction(KAFKA_TIMEOUT_S)
        except KafkaException:
            # fenced (a newer attempt took over) or the broker is away: the newer attempt's, or
            # the next, init_transactions aborts what is left open
            log.warning("abort of %s failed; the producer is dropped", self.transactional_id)
            self._producer = None

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
            name = self.settings.clean_topic.replace("{topic}", source_topic)
            self._clean_names[source_topic] = name
        return name

    def _produce_records(self, producer: Producer, records: pa.Table) -> tuple[int, int]:
        """Re-read one batch's first-seen raw records, restore them, produce them (the hot loop);
        returns how many were produced and how many of them got the dedup's time.

        All raw partitions of the batch are read together, each in raw offset order
        (docs/dedup.md "Order"); one chunk of raw records at a time, so the driver never holds the
        batch's payload.

        Raises:
            RawRecordGoneError: a first-seen raw record was deleted before this re-read.
            ServiceError: a re-read record is not the one the query decided on.
        """
        if records.num_rows == 0:
            return 0, 0
        raw_topics = self.settings.raw_topics
        packed = [unpack_positions(blob) for blob in records.column("positions").to_pylist()]
        positions = np.concatenate(packed)
        src_offset, raw_topic, raw_partition, raw_offset = positions.T
        # Clean target per row (one source partition each), then per record.
        targets: list[tuple[str, int, bytes, tuple[int, int]]] = []
        now_ms = int(time.time() * 1000)
        index_of: dict[tuple[str, int], int] = {}
        row_target = []
        for topic, partition in zip(
            records.column("src_topic").to_pylist(),
            records.column("src_partition").to_pylist(),
            strict=True,
        ):
            if (topic, partition) not in index_of:
                name = self.clean_name(topic)
                index_of[(topic, partition)] = len(targets)
                count = self._partition_count(producer, name)
                # the timestamps the clean topic accepts now: plain bounds for the hot loop
                accepts = self._windows.get(name, TimestampWindow()).bounds(now_ms)
                targets.append((name, partition % count, f"{topic}:{partition}:".encode(), accepts))
            row_target.append(index_of[(topic, partition)])
        source_of = np.repeat(np.asarray(row_target), [len(p) for p in packed])
        order = np.lexsort((raw_offset, raw_partition, raw_topic))
        group_key = (raw_topic[order].astype(np.int64) << 32) | raw_partition[order]
        bounds = [0, *(np.flatnonzero(np.diff(group_key)) + 1).tolist(), len(order)]
        wanted: list[tuple[str, int, list[int]]] = []
        plans: list[tuple[list[int], list[int]]] = []  # per raw partition: targets, src offsets
        for start, end in itertools.pairwise(bounds):
            rows = order[start:end]
            topic_index, partition = int(raw_topic[rows[0]]), int(raw_partition[rows[0]])
            if not 0 <= topic_index < len(raw_topics):
                raise ServiceError(f"raw topic index {topic_index} is not one the query reads")
            wanted.append((raw_topics[topic_index], partition, raw_offset[rows].tolist()))
            plans.append((source_of[rows].tolist(), src_offset[rows].tolist()))
        done = [0] * len(plans)
        # Runs of equal clean target per raw partition (usually one run: a raw partition holds
        # one source partition): the loops below then look nothing up per record.
        runs = [_runs(which) for which, _ in plans]
        cursor = [0] * len(plans)  # the first run of each raw partition not yet written
        replaced = 0
        for index, chunk in self._rereader().read_many(wanted):
            expected_offsets, its_runs = plans[index][1], runs[index]
            j, end, r = done[index], done[index] + len(chunk), cursor[index]
            while r < len(its_runs) and its_runs[r][0] < end:
                run_start, run_end, t = its_runs[r]
                lo, hi = max(run_start, j), min(run_end, end)
                part = chunk[lo - j : hi - j]
                name, target, prefix, accepts = targets[t]
                if not _keys_match(part, prefix, expected_offsets[lo:hi]):
                    raise _not_chosen(part, prefix, expected_offsets[lo:hi], wanted[index][:2])
                replaced += self._produce_chunk(
                    producer, part, name, target, wanted[index][:2], accepts
                )
                if run_end > end:
                    break  # the run goes on in the next chunk
                r += 1
            done[index], cursor[index] = end, r
        return sum(done), replaced

    @staticmethod
    def _produce_chunk(  # noqa: PLR0917  the hot loop's inputs, positional
        producer: Producer,
        chunk: list[Message],
        name: str,
        target: int,
        raw: tuple[str, int],
        bounds: tuple[int, int],
    ) -> int:
        """Restore and produce raw records whose keys were checked (the per-record hot loop);
        returns how many were written with the dedup's time (``_produce_replaced``).

        No per-record callback: a transactional producer's ``commit_transaction`` fails if any
        message of the transaction failed, and the batch is then aborted (``write_table``). So no
        record the broker would refuse may be produced: a timestamp outside ``bounds`` (what the
        clean topic accepts) takes ``_produce_replaced``, never the broker's refusal, which would
        fail the whole transaction again on every replay.
        """
        produce = producer.produce
        rest: Any = None
        low, high = bounds
        replaced = 0
        for msg in chunk:
            value, headers = msg.value(), msg.headers()
            # Fast path (every record the receiver writes for a source record without headers):
            # exactly the four provenance headers, a timestamp of at most 18 ASCII digits.
            # Anything else takes restore()'s full rule, which the SQL classification shares.
            if headers is not None and len(headers) == 4:  # len(PROVENANCE_HEADERS)
                key_h, stamp_h, type_h, session_h = headers
                stamp = stamp_h[1]
                if (
                    (key_h[0], stamp_h[0], type_h[0], session_h[0]) == PROVENANCE_HEADERS
                    and stamp is not None
                    and len(stamp) < 19  # 18 digits always fit a signed 64-bit integer
                    and stamp.isdigit()
                ):
                    key, timestamp, rest = cast("bytes | None", key_h[1]), int(stamp), None
                    if low <= timestamp <= high:
                        try:
                            # positional: keywords cost produce() a dict per call (~1 us here)
                            produce(name, value, key, target, None, None, timestamp, rest)
                        except BufferError:
                            _produce_blocking(producer, (name, value, key, target, timestamp, rest))
                        continue
            restored = restore(cast("list[Header]", headers or ()))
            if restored is None:
                raise ServiceError(
                    f"raw record {raw[0]}:{raw[1]} offset {msg.offset()} has no valid provenance "
                    "headers although the query classified it as data: was the raw topic deleted "
                    "and re-created? The batch is aborted."
                )
            key, timestamp, source_headers = restored
            if not low <= timestamp <= high:
                _produce_replaced(producer, (name, value, key, target, timestamp, source_headers))
                replaced += 1
                continue
            rest = source_headers or None
            try:
                produce(name, value, key, target, None, None, timestamp, rest)
            except BufferError:
                _produce_blocking(producer, (name, value, key, target, timestamp, rest))
        return replaced

    def _produce_gaps(self, producer: Producer, gap_rows: pa.Table) -> None:
        if gap_rows.num_rows == 0:
            return
        topic = self.settings.gap_topic
        for key, value in zip(
            gap_rows.column("gap_key").to_pylist(),
            gap_rows.column("gap_value").to_pylist(),
            strict=True,
        ):
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.05)


class TransactionalBatchWriter:
    """``foreachBatch`` target on the driver: runs each batch's write tasks, folds their results.

    The driver handles no record: it hands the batch to ``write_partition_task`` (one task per
    stateful partition, ``mapInArrow`` on the batch, so no shuffle: task ``p`` holds exactly the
    groups of state partition ``p``) and collects one ``task`` row and the ``stat`` rows of each.
    """

    def __init__(self, settings: WriterSettings, metrics: DedupMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._query_id: str | None = None
        self._bound = threading.Event()
        self._floor: int | None = None
        #: a fixed clean topic checked at start-up -> the timestamps it accepts (to the tasks)
        self._windows: dict[str, TimestampWindow] = {}
        self.last: BatchResult | None = None
        self.committed_batches = 0
        #: micro-batches handed to this writer (committed, skipped or empty)
        self.batches_seen = 0
        #: monotonic time of the last batch with any input row (for --until-idle)
        self.last_input_at = time.monotonic()
        #: the last batch's task rows (tests, bench)
        self.last_tasks: pa.Table | None = None
        #: set by ``request_stop``; ``between_batches`` is set when a batch call returns after it
        self._stop_requested = threading.Event()
        self.between_batches = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def bind(self, query_id: str) -> None:
        """Give the writer the Spark query id (stable across restarts from one checkpoint)."""
        self._query_id = query_id
        self._bound.set()

    def request_stop(self) -> None:
        """Ask to be told (``between_batches``) when the running batch call has returned."""
        self._stop_requested.set()

    def close(self) -> None:
        """Nothing to release: every transaction is complete when its task returns."""

    def ensure_topics(
        self, topics: Iterable[str], *, compact: bool = False, partitions: int | None = None
    ) -> None:
        """Create those of ``topics`` that do not exist (clean: NEW_TOPIC_PARTITIONS; else 1)."""
        ensure_topics(self.settings, topics, compact=compact, partitions=partitions)

    def _start(self) -> int:
        """Fence the single driver-side writer of earlier versions; its last batch (the floor).

        Before per-task transactions, one producer with ``TRANSACTIONAL_ID`` itself wrote whole
        batches with markers keyed by the query id. ``init_transactions`` under that id aborts a
        transaction such a writer left open, and its last marker says which batches are
        complete in every partition (a checkpoint upgraded right after a crash between its
        Kafka commit and Spark's commit log replays that batch: it must be skipped).
        """
        if not self._bound.wait(BIND_TIMEOUT_S):
            raise ServiceError("the dedup query did not report its id; cannot fence batches")
        query_id = self._query_id or ""
        self.ensure_topics([self.settings.gap_topic, self.settings.progress_topic], compact=True)
        clean = self.settings.clean_topic
        if "{topic}" not in clean:
            # at start-up, on the driver: a clean topic too small stops the job here, not in tasks
            self._windows[clean] = checked_clean_topic(self.settings, clean)
        producer = init_producer(self.settings, self.settings.transactional_id)
        del producer  # nothing is written under the old id; holding its epoch fences it
        floor = read_last_marker(
            self.settings, query_id.encode(), f"{self.settings.transactional_id}.fence"
        )
        log.info(
            "writer ready: transactional.id=%s-p<partition> query=%s (whole-batch marker: %d)",
            self.settings.transactional_id,
            query_id,
            floor,
        )
        return floor

    # -- one micro-batch ---------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Write micro-batch ``batch_id`` (a DataFrame in ``dedup.job.OUTPUT_SCHEMA``)."""
        try:
            self._write_batch(df, batch_id)
        finally:
            if self._stop_requested.is_set():
                self.between_batches.set()

    def _write_batch(self, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        if self._floor is None:
            self._floor = self._start()
        if batch_id <= self._floor:
            log.info("batch %d already committed (marker %d): skipped", batch_id, self._floor)
            if self.metrics is not None:
                self.metrics.replayed.inc()
            self.last = BatchResult(batch_id, skipped=True, fenced=True)
            self.batches_seen += 1
            self.last_input_at = time.monotonic()
            return
        spec = TaskSpec(
            settings=self.settings,
            query_id=self._query_id or "",
            batch_id=batch_id,
            floor=self._floor,
            windows=dict(self._windows),
        )
        # One action; no shuffle between the stateful step and the tasks (see the class doc).
        table = df.mapInArrow(functools.partial(write_partition_task, spec), RESULT_DDL).toArrow()
        _fault("driver-after-commit", batch_id, 0)
        self.last = self.account(table, batch_id)
        self.batches_seen += 1
        tasks = self.last_tasks
        log.debug(
            "batch %d: %d records, %d gaps in %.2fs (tasks: fence max %d ms, write max %d ms)",
            batch_id,
            self.last.records,
            self.last.gaps,
            time.monotonic() - started,
            (pc.max(tasks.column("fence_ms")).as_py() or 0) if tasks is not None else 0,
            (pc.max(tasks.column("write_ms")).as_py() or 0) if tasks is not None else 0,
        )

    def account(self, table: pa.Table, batch_id: int) -> BatchResult:
        """Fold the tasks' result rows of one batch into the metrics (public for the bench)."""
        kinds = table.column("kind")
        tasks = table.filter(pc.equal(kinds, "task"))
        self.last_tasks = tasks
        fenced = {
            p
            for p, skipped in zip(
                tasks.column("task_partition").to_pylist(),
                tasks.column("skipped").to_pylist(),
                strict=True,
            )
            if skipped
        }
        if fenced:
            # the tasks' own logs stay in the executors: say it where operators look
            log.info("batch %d: partitions %s already committed (markers): skipped", batch_id,
                     sorted(fenced))  # fmt: skip
        stats = table.filter(pc.equal(kinds, "stat"))
        if fenced:
            # counted when they were committed (before the crash this replay follows)
            mask = pc.invert(pc.is_in(stats.column("task_partition"), pa.array(sorted(fenced))))
            stats = stats.filter(mask)
        written = tasks.filter(pc.invert(tasks.column("skipped")))
        records = int(pc.sum(written.column("records")).as_py() or 0)
        gap_count = int(pc.sum(written.column("gaps")).as_py() or 0)
        replaced = int(pc.sum(written.column("replaced")).as_py() or 0)
        result = BatchResult(batch_id, records=records, gaps=gap_count, replaced=replaced)
        if replaced:
            log.warning(
                "batch %d: %d records written with the dedup's time: their clean topic would "
                "refuse their source timestamp (kept in the %s header)",
                batch_id,
                replaced,
                ORIGINAL_TIMESTAMP_HEADER,
            )
        result.skipped = records == 0 and gap_count == 0
        result.fenced = bool(fenced)
        inputs = sum(
            pc.sum(stats.column(name)).as_py() or 0
            for name in ("delivered", "duplicates", "malformed", "heartbeats", "resets")
        )
        if inputs or records or fenced:
            self.last_input_at = time.monotonic()
        if not result.skipped:
            self.committed_batches += 1
        if self.metrics is not None:
            self.metrics.timestamps_replaced.inc(replaced)
            self.metrics.forwarded.inc(records)
            self.metrics.gap_reports.inc(gap_count)
            if not result.skipped:
                self.metrics.batches.inc()
            if fenced:
                self.metrics.replayed.inc()
            self.metrics.add_stats(stats)
        return result


def write_partition_task(
    spec: TaskSpec, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The write task of one stateful partition (``mapInArrow``; runs in an executor).

    Takes the partition's output rows of the batch, commits its clean and gap records in the
    partition's own transaction (``PartitionWriter``) and hands back the ``stat`` rows and one
    ``task`` row. A fresh writer per task attempt: its ``init_transactions`` fences every
    earlier attempt of this partition (retries, zombies) before it reads the marker.
    """
    from dedup.job import task_attempt  # noqa: PLC0415  the one pyspark import stays in job.py

    partition, attempt = task_attempt()
    parts = [b for b in batches if b.num_rows]
    started = time.monotonic()
    if parts:
        table = pa.Table.from_batches(parts)
        writer = PartitionWriter(
            spec.settings, spec.query_id, partition, floor=spec.floor, windows=spec.windows
        )
        try:
            result = writer.write_table(table, spec.batch_id)
        finally:
            writer.close()
        fence_ms = writer.fence_ms
        stats = table.filter(pc.equal(table.column("kind"), "stat"))
    else:
        result, fence_ms, stats = BatchResult(spec.batch_id, skipped=True), 0, None
    write_ms = round((time.monotonic() - started) * 1000)
    n = 0 if stats is None else stats.num_rows
    columns: dict[str, list[Any]] = {name: [None] * (n + 1) for name in RESULT_SCHEMA.names}
    columns["kind"] = ["stat"] * n + ["task"]
    if stats is not None:
        for name in ("src_topic", "src_partition", *STAT_COLUMNS, "state_bytes"):
            columns[name][:n] = stats.column(name).to_pylist()
    columns["task_partition"] = [partition] * (n + 1)
    columns["attempt"][n] = attempt
    columns["records"][n] = 0 if result.fenced else result.records
    columns["gaps"][n] = 0 if result.fenced else result.gaps
    columns["replaced"][n] = 0 if result.fenced else result.replaced
    columns["skipped"][n] = result.fenced
    columns["fence_ms"][n] = fence_ms
    columns["write_ms"][n] = write_ms
    yield from pa.Table.from_pydict(columns, schema=RESULT_SCHEMA).to_batches()


# -- Kafka helpers shared by the driver and the tasks -----------------------------------------


def partition_transactional_id(base: str, partition: int) -> str:
    """The ``transactional.id`` of stateful partition ``partition``'s writer."""
    return f"{base}-p{partition}"


def _base_conf(settings: WriterSettings) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers}
    conf.update(settings.kafka_conf)
    return conf


def init_producer(settings: WriterSettings, transactional_id: str) -> Producer:
    """A transactional producer after ``init_transactions``: every older one with that id is
    fenced and its open transaction aborted (or completed, if its commit had begun)."""
    conf = _base_conf(settings)
    conf.update(
        {
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "linger.ms": conf.get("linger.ms", 20),
            "batch.num.messages": conf.get("batch.num.messages", 10_000),
            "queue.buffering.max.messages": conf.get("queue.buffering.max.messages", 500_000),
            # bounds the payload in flight in a task (records stream in from the re-read)
            "queue.buffering.max.kbytes": conf.get("queue.buffering.max.kbytes", 131_072),
        }
    )
    # librdkafka refuses a message over message.max.bytes (1 MB by default) by itself
    needed = record_limit(settings.max_record_size)
    if int(conf.get("message.max.bytes", 0) or 0) < needed:
        conf["message.max.bytes"] = needed
    producer = kafka.producer(conf)
    try:
        producer.init_transactions(KAFKA_TIMEOUT_S)
    except KafkaException as exc:
        raise kafka.error(
            exc,
            f"cannot initialise Kafka transactions as {transactional_id!r} (check "
            "BOOTSTRAP_SERVERS and that the broker allows transactions)",
        ) from exc
    return producer


def read_last_marker(settings: WriterSettings, key: bytes, group_id: str) -> int:
    """The highest batch id of the committed markers with ``key`` (-1: none), read_committed.

    Searches the progress topic backwards from its end in growing steps, so a marker written a
    few batches ago costs one short read.
    """
    conf = _base_conf(settings)
    conf.update(
        {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
    )
    consumer = kafka.consumer(conf)
    try:
        tp = TopicPartition(settings.progress_topic, MARKER_PARTITION)
        low, high = consumer.get_watermark_offsets(tp, timeout=KAFKA_TIMEOUT_S)
        step = FENCE_SCAN_STEP
        end = high
        while end > low:
            start = max(low, end - step)
            found = _scan_markers(consumer, settings.progress_topic, key, start, end)
            if found is not None:
                return found
            end, step = start, step * 4
        return -1
    finally:
        consumer.close()


def _scan_markers(consumer: Consumer, topic: str, key: bytes, start: int, end: int) -> int | None:
    consumer.assign([TopicPartition(topic, MARKER_PARTITION, start)])
    best: int | None = None
    deadline = time.monotonic() + KAFKA_TIMEOUT_S
    while time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return best
            raise ServiceError(f"reading the progress topic failed: {err}")
        offset, value = msg.offset(), msg.value()
        if offset is None or offset >= end:
            return best
        if msg.key() == key and value is not None:
            batch = int(json.loads(value)["batch_id"])
            best = batch if best is None else max(best, batch)
    raise ServiceError(f"reading progress topic {topic!r} timed out; is Kafka up?")


def ensure_topics(
    settings: WriterSettings,
    topics: Iterable[str],
    *,
    compact: bool = False,
    partitions: int | None = None,
) -> None:
    """Create those of ``topics`` that do not exist (clean: NEW_TOPIC_PARTITIONS; else 1)."""
    admin = kafka.admin(_base_conf(settings))
    existing = admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics
    missing = [t for t in dict.fromkeys(topics) if t not in existing]
    if not missing:
        return
    if partitions is None:
        partitions = 1 if compact else settings.new_topic_partitions
    config = (
        {"cleanup.policy": "compact"}
        if compact
        else created_topic_config(settings.max_record_size, any_timestamp=True)
    )
    futures = admin.create_topics(
        [NewTopic(t, partitions, settings.new_topic_replication, config=config) for t in missing]
    )
    for topic, future in futures.items():
        try:
            future.result(KAFKA_TIMEOUT_S)
            log.info("created topic %s (%d partitions)", topic, partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise kafka.error(exc, f"cannot create topic {topic!r}") from exc
    # Created is not yet usable: metadata and leaders reach the brokers a moment later, and a
    # produce or describe in between fails. Wait for every partition to have a leader.
    deadline = time.monotonic() + KAFKA_TIMEOUT_S
    for topic in missing:
        while not _has_leaders(admin, topic, partitions):
            if time.monotonic() > deadline:
                raise ServiceError(f"topic {topic!r} was created but has no leaders yet")
            time.sleep(0.1)


def _has_leaders(admin: AdminClient, topic: str, partitions: int) -> bool:
    meta = admin.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None or len(meta.partitions) < partitions:
        return False
    return all(p.leader >= 0 and p.error is None for p in meta.partitions.values())


#: (bootstrap servers, clean topic, max_record_size) -> its window, per process: a Python worker
#: runs many write tasks, and each would otherwise ask the broker again for every batch.
_checked: dict[tuple[str, str, int], TimestampWindow] = {}
_checked_lock = threading.Lock()


def checked_clean_topic(settings: WriterSettings, topic: str) -> TimestampWindow:
    """At first use of a clean topic (per process): create it if missing (with our settings,
    never by a broker's auto-create), refuse it if it cannot take the largest record, learn which
    timestamps it accepts (docs/topics.md "Timestamps").

    Raises:
        ServiceError: the topic's max.message.bytes is below what MAX_RECORD_SIZE needs.
    """
    key = (settings.bootstrap_servers, topic, settings.max_record_size)
    with _checked_lock:
        window = _checked.get(key)
    if window is not None:
        return window
    ensure_topics(settings, [topic])
    window = _check_clean_topic(settings, topic)
    with _checked_lock:
        if len(_checked) >= MAX_CHECKED_TOPICS:
            _checked.clear()  # bounded; a topic checked again costs one describe
        _checked[key] = window
    return window


def _check_clean_topic(settings: WriterSettings, topic: str) -> TimestampWindow:
    try:
        configs = kafka.topic_config(_base_conf(settings), topic, KAFKA_TIMEOUT_S)
    except KafkaClientError as exc:
        log.warning("cannot read the configuration of clean topic %s (%s)", topic, exc)
        return TimestampWindow()
    problem = size_problem(topic, configs, settings.max_record_size, "MAX_RECORD_SIZE")
    if problem is not None:
        raise ServiceError(f"clean {problem}")
    window = timestamp_window(configs)
    if not window.unlimited:
        log.warning(
            "clean topic %s does not take every source timestamp (%s): records outside it "
            "are written with the dedup's time and their own in the diode.original-timestamp "
            "header (metric kafka_diode_dedup_timestamps_replaced_total). To keep every "
            "timestamp: kafka-configs --alter --entity-type topics --entity-name %s "
            "--add-config message.timestamp.after.max.ms=%d,message.timestamp.before.max.ms=%d",
            topic,
            window.describe(),
            topic,
            LONG_MAX,
            LONG_MAX,
        )
    return window


def record_count(records: pa.Table) -> int:
    """Clean records in the ``records`` rows of a batch (packed: 8 bytes per field)."""
    if records.num_rows == 0:
        return 0
    size = pc.sum(pc.binary_length(records.column("positions"))).as_py() or 0
    return int(size) // (8 * len(POSITION_FIELDS))


# -- fault injection (tests only) ---------------------------------------------------------------

#: ``<point>:<batch>:<partition>:<once-file>`` (several: comma-separated): at that point of
#: that batch (``*``: the first to get there) and partition the process exits (code
#: ``FAULT_EXIT``), once: only if it can
#: create the once-file. Points: ``task-before-commit``, ``task-in-commit`` (during the commit),
#: ``task-after-commit`` (a Python worker of the task dies), ``driver-after-commit`` (every task
#: committed, Spark's commit log not written: the driver dies). Crash tests set it; nothing else
#: should.
FAULT_ENV = "KAFKA_DIODE_DEDUP_FAULT"
FAULT_EXIT = 70


def _fault_matches(point: str, batch_id: int, partition: int) -> bool:
    for spec in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        name, batch, part, once = spec.split(":", 3)
        if (name, int(part)) != (point, partition) or batch not in ("*", str(batch_id)):
            continue
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        log.warning("injected fault %s at batch %d partition %d", point, batch_id, partition)
        return True
    return False


def _fault(point: str, batch_id: int, partition: int) -> None:
    if _fault_matches(point, batch_id, partition):
        os._exit(FAULT_EXIT)


@contextlib.contextmanager
def _fault_during(point: str, batch_id: int, partition: int) -> Iterator[None]:
    """Exit from another thread while the body (a commit) runs, at a random moment in it."""
    if not _fault_matches(point, batch_id, partition):
        yield
        return
    started = threading.Event()

    def kill() -> None:
        started.wait()
        time.sleep(random.uniform(0, 0.005))  # a random crash point in the commit
        os._exit(FAULT_EXIT)

    threading.Thread(target=kill, daemon=True).start()
    started.set()
    yield
    threading.Event().wait()  # the commit returned first: never go on past the crash point


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the re-read + produce loop.

    The loop allocates a Message, a header list and four header tuples per record; the
    collector's allocation-count trigger then ran gen-0/1/2 collections that walked every live
    object of the driver (pyspark, pandas, ...): 43 % of the loop's time in py-spy. These objects
    form no cycles, so reference counting frees them; the collector is re-enabled (if it was on)
    when the loop ends. It is process-wide, so other driver threads run without it meanwhile.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _runs(which: list[int]) -> list[tuple[int, int, int]]:
    """``(start, end, target)`` runs of equal values in ``which``."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(which) + 1):
        if i == len(which) or which[i] != which[start]:
            out.append((start, i, which[start]))
            start = i
    return out


def _keys_match(chunk: list[Message], prefix: bytes, offsets: list[int]) -> bool:
    """True if the records' keys are exactly ``prefix + offset``, in order (two joins, no loop).

    The joined forms are equal only if every key is: the expected keys contain no newline, so
    equal joins of equally many parts split at the same places.
    """
    if b"\n" in prefix or len(chunk) != len(offsets):
        return all(m.key() == b"%s%d" % (prefix, o) for m, o in zip(chunk, offsets, strict=True))
    keys = [m.key() for m in chunk]
    if None in keys:
        return False
    text = prefix.decode("utf-8", "surrogateescape")
    expected = text + ("\n" + text).join(map(str, offsets))
    return b"\n".join(cast("list[bytes]", keys)) == expected.encode("utf-8", "surrogateescape")


def _not_chosen(
    chunk: list[Message], prefix: bytes, offsets: list[int], raw: tuple[str, int]
) -> ServiceError:
    """The error for the first record in ``chunk`` whose key is not the expected one."""
    for msg, offset in zip(chunk, offsets, strict=True):
        if msg.key() != b"%s%d" % (prefix, offset):
            break
    return ServiceError(
        f"raw record {raw[0]}:{raw[1]} offset {msg.offset()} is not the record the query chose "
        f"(key {msg.key()!r}, expected {prefix.decode(errors='replace')}{offset}): was the raw "
        "topic deleted and re-created? The batch is aborted."
    )


def _produce_replaced(
    producer: Producer, args: tuple[str, bytes | None, bytes | None, int, int, list[Header]]
) -> None:
    """A record whose source timestamp the clean topic would refuse: written with the dedup's
    time (timestamp 0: the producer's clock) and the source timestamp in a trailing
    ``diode.original-timestamp`` header (docs/topics.md "Timestamps"), so nothing is lost and no
    other record of the transaction fails with it."""
    name, value, key, target, timestamp, headers = args
    marked = [*headers, (ORIGINAL_TIMESTAMP_HEADER, b"%d" % timestamp)]
    _produce_blocking(producer, (name, value, key, target, 0, marked), first_try=True)


def _produce_blocking(
    producer: Producer,
    args: tuple[str, bytes | None, bytes | None, int, int, Any],
    *,
    first_try: bool = False,
) -> None:
    """``produce`` once librdkafka's local queue has room (it is bounded)."""
    name, value, key, target, timestamp, headers = args
    while True:
        if not first_try:
            producer.poll(0.05)  # the local queue is full: let librdkafka send
        first_try = False
        try:
            producer.produce(name, value, key, target, None, None, timestamp, headers)
        except BufferError:
            continue
        return
