"""Effectively-once output of the dedup query: one Kafka transaction per micro-batch, fenced.

Guarantee: for a reader with ``isolation.level=read_committed``, the records of micro-batch ``N``
appear in the clean and gap topics **at most once**, and exactly once if the query ever completes
batch ``N``, however often the process crashes and restarts from the same checkpoint.

Argument (docs/dedup.md "Effectively once" has the long form):

1. Every batch is written in **one** transaction of **one** producer whose ``transactional.id`` is
   stable per checkpoint: the clean records, the gap records and a *progress marker*
   (progress topic, key = Spark query id, value = the batch id) commit or abort together.
2. ``init_transactions`` at start-up fences any older instance with the same id and aborts its
   open transaction, so after it the committed markers can no longer change behind our back.
3. Before writing batch ``N`` the writer knows the highest committed marker ``M`` of this query
   (read once with ``read_committed`` after step 2, then tracked): if ``N <= M`` the batch was
   already committed (the crash came between the Kafka commit and Spark's commit log) and is
   skipped.
4. Spark marks batch ``N`` done in its commit log only after this function returned, i.e. after
   the transaction committed; a batch whose transaction did not commit is re-run by Spark from the
   same offsets and the same state version, and written again in a new transaction.

Only the driver writes (``foreachBatch`` runs there): a batch is collected as Arrow, so
``MAX_OFFSETS_PER_TRIGGER`` bounds the driver's memory.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from common.errors import ServiceError
from common.metrics import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

#: How long the writer waits for the query id after the query started (start() returns fast).
BIND_TIMEOUT_S = 120.0
KAFKA_TIMEOUT_S = 30.0
#: Markers read per step when searching the progress topic backwards for this query's last one.
FENCE_SCAN_STEP = 512
#: The marker partition: one partition keeps the markers of a query in order.
MARKER_PARTITION = 0


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
    kafka_conf: Mapping[str, str] = field(default_factory=dict)
    """librdkafka pass-through properties."""


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
        self.resets = Counter(
            "resets_applied", "Partition state resets applied (kafka-diode dedup reset)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self._open: dict[tuple[str, int], int] = {}
        self._state: dict[tuple[str, int], int] = {}

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
            ):
                if name in cols:
                    counter.inc(cols[name][i] or 0)
            if topic:
                self._open[(topic, partition)] = cols["open_gaps"][i] or 0
                self._state[(topic, partition)] = cols["state_bytes"][i] or 0
        self.gaps_open.set(sum(self._open.values()))
        self.state_bytes.set(sum(self._state.values()))

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
    """The batch was already committed before (fenced replay) or empty."""


class TransactionalBatchWriter:
    """``foreachBatch`` target: one Kafka transaction per batch id, skipping committed ones."""

    def __init__(self, settings: WriterSettings, metrics: DedupMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._query_id: str | None = None
        self._bound = threading.Event()
        self._producer: Producer | None = None
        self._last_committed = -1
        self._partitions: dict[str, int] = {}
        self._clean_names: dict[str, str] = {}
        self.last: BatchResult | None = None
        self.committed_batches = 0
        #: micro-batches handed to this writer (committed, skipped or empty)
        self.batches_seen = 0
        #: monotonic time of the last batch with any input row (for --until-idle)
        self.last_input_at = time.monotonic()
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
        """Flush nothing (transactions are complete per batch) and drop the producer."""
        self._producer = None

    def _base_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.settings.bootstrap_servers}
        conf.update(self.settings.kafka_conf)
        return conf

    def _start(self) -> Producer:
        if not self._bound.wait(BIND_TIMEOUT_S):
            raise ServiceError("the dedup query did not report its id; cannot fence batches")
        conf = self._base_conf()
        conf.update(
            {
                "transactional.id": self.settings.transactional_id,
                "enable.idempotence": True,
                "linger.ms": conf.get("linger.ms", 20),
                "batch.num.messages": conf.get("batch.num.messages", 10_000),
                "queue.buffering.max.messages": conf.get("queue.buffering.max.messages", 1_000_000),
                "queue.buffering.max.kbytes": conf.get("queue.buffering.max.kbytes", 1_048_576),
            }
        )
        producer = Producer(conf)
        try:
            producer.init_transactions(KAFKA_TIMEOUT_S)
        except KafkaException as exc:
            raise ServiceError(
                f"cannot initialise Kafka transactions as {self.settings.transactional_id!r} "
                f"({exc}); check BOOTSTRAP_SERVERS and that the broker allows transactions"
            ) from exc
        self.ensure_topics([self.settings.gap_topic, self.settings.progress_topic], compact=True)
        self._last_committed = self._read_last_marker()
        log.info(
            "writer ready: transactional.id=%s query=%s last committed batch=%d",
            self.settings.transactional_id,
            self._query_id,
            self._last_committed,
        )
        return producer

    # -- the fence ---------------------------------------------------------------------------

    def _read_last_marker(self) -> int:
        """The highest batch id committed for this query (-1: none), read_committed."""
        conf = self._base_conf()
        conf.update(
            {
                "group.id": f"{self.settings.transactional_id}.fence",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        consumer = Consumer(conf)
        try:
            tp = TopicPartition(self.settings.progress_topic, MARKER_PARTITION)
            low, high = consumer.get_watermark_offsets(tp, timeout=KAFKA_TIMEOUT_S)
            step = FENCE_SCAN_STEP
            end = high
            while end > low:
                start = max(low, end - step)
                found = self._scan_markers(consumer, start, end)
                if found is not None:
                    return found
                end, step = start, step * 4
            return -1
        finally:
            consumer.close()

    def _scan_markers(self, consumer: Consumer, start: int, end: int) -> int | None:
        key = (self._query_id or "").encode()
        consumer.assign([TopicPartition(self.settings.progress_topic, MARKER_PARTITION, start)])
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
        raise ServiceError(
            f"reading progress topic {self.settings.progress_topic!r} timed out; is Kafka up?"
        )

    # -- topics ------------------------------------------------------------------------------

    def ensure_topics(
        self, topics: Iterable[str], *, compact: bool = False, partitions: int | None = None
    ) -> None:
        """Create those of ``topics`` that do not exist (clean: NEW_TOPIC_PARTITIONS; else 1)."""
        admin = AdminClient(self._base_conf())
        existing = admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics
        missing = [t for t in dict.fromkeys(topics) if t not in existing]
        if not missing:
            return
        if partitions is None:
            partitions = 1 if compact else self.settings.new_topic_partitions
        config = {"cleanup.policy": "compact"} if compact else {}
        futures = admin.create_topics(
            [
                NewTopic(t, partitions, self.settings.new_topic_replication, config=config)
                for t in missing
            ]
        )
        for topic, future in futures.items():
            try:
                future.result(KAFKA_TIMEOUT_S)
                log.info("created topic %s (%d partitions)", topic, partitions)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ServiceError(f"cannot create topic {topic!r}: {exc}") from exc

    def _partition_count(self, producer: Producer, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            meta = producer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                self.ensure_topics([topic])
                meta = producer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics.get(topic)
            if meta is None or not meta.partitions:
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
        if self._producer is None:
            self._producer = self._start()
        if batch_id <= self._last_committed:
            log.info(
                "batch %d already committed (marker %d): skipped", batch_id, self._last_committed
            )
            if self.metrics is not None:
                self.metrics.replayed.inc()
            self.last = BatchResult(batch_id, skipped=True)
            self.batches_seen += 1
            self.last_input_at = time.monotonic()
            return
        # One action on the batch; persist anyway so a second action (debugging, a future second
        # output) can never re-run the stateful step.
        df.persist()
        try:
            table = df.toArrow()
        finally:
            df.unpersist()
        self.last = self.write_table(table, batch_id)
        self.batches_seen += 1
        log.debug(
            "batch %d: %d records, %d gaps in %.2fs",
            batch_id,
            self.last.records,
            self.last.gaps,
            time.monotonic() - started,
        )

    def write_table(self, table: pa.Table, batch_id: int) -> BatchResult:
        """Commit one batch's rows in one transaction (public for tests of the fence)."""
        producer = self._producer or self._start()
        self._producer = producer
        kinds = table.column("kind")
        records = table.filter(pc.equal(kinds, "record"))
        gap_rows = table.filter(pc.equal(kinds, "gap"))
        stats = table.filter(pc.equal(kinds, "stat"))
        result = BatchResult(batch_id, records=records.num_rows, gaps=gap_rows.num_rows)
        inputs = sum(
            pc.sum(stats.column(name)).as_py() or 0
            for name in ("delivered", "duplicates", "malformed", "heartbeats", "resets")
        )
        if inputs or result.records:
            self.last_input_at = time.monotonic()
        if records.num_rows == 0 and gap_rows.num_rows == 0:
            # Nothing to publish: no transaction, no marker. A replay of this batch is empty too.
            result.skipped = True
            if self.metrics is not None:
                self.metrics.add_stats(stats)
            return result
        producer.begin_transaction()
        try:
            self._produce_records(producer, records)
            self._produce_gaps(producer, gap_rows)
            marker = {
                "query_id": self._query_id,
                "batch_id": batch_id,
                "records": result.records,
                "gaps": result.gaps,
                "committed_at_ms": int(time.time() * 1000),
            }
            producer.produce(
                self.settings.progress_topic,
                json.dumps(marker).encode(),
                (self._query_id or "").encode(),
                MARKER_PARTITION,
            )
            producer.commit_transaction(KAFKA_TIMEOUT_S * 4)
        except KafkaException as exc:
            self._abort(producer)
            raise ServiceError(f"writing batch {batch_id} failed and was aborted: {exc}") from exc
        except BaseException:
            self._abort(producer)
            raise
        self._last_committed = batch_id
        self.committed_batches += 1
        if self.metrics is not None:
            self.metrics.forwarded.inc(result.records)
            self.metrics.gap_reports.inc(result.gaps)
            self.metrics.batches.inc()
            self.metrics.add_stats(stats)
        return result

    def _abort(self, producer: Producer) -> None:
        try:
            producer.abort_transaction(KAFKA_TIMEOUT_S)
        except KafkaException:
            log.exception("abort failed; the producer is dropped (the next start fences it)")
            self._producer = None

    def _produce_records(self, producer: Producer, records: pa.Table) -> None:
        """Produce one batch's clean records (the hot loop: ~2/3 of it is librdkafka's produce)."""
        if records.num_rows == 0:
            return
        # Rows of one source partition are contiguous (one group of the stateful step), so the
        # target is computed once per run of equal (topic, partition), not once per row.
        sources = pc.binary_join_element_wise(
            records.column("src_topic"),
            pc.cast(records.column("src_partition"), pa.string()),
            ":",
        )
        runs = pc.run_end_encode(sources).combine_chunks()
        keys = records.column("key").to_pylist()
        values = records.column("value").to_pylist()
        stamps = records.column("timestamp").to_pylist()
        headers = records.column("headers")
        has_headers = pc.any(pc.greater(pc.list_value_length(headers), 0)).as_py()
        header_rows = headers.to_pylist() if has_headers else None
        produce = producer.produce
        start = 0
        for end, source in zip(runs.run_ends.to_pylist(), runs.values.to_pylist(), strict=True):
            topic_name, _, partition_text = source.rpartition(":")
            name = self.clean_name(topic_name)
            partition = int(partition_text) % self._partition_count(producer, name)
            for i in range(start, end):
                hdrs = header_rows[i] if header_rows is not None else None
                extra: dict[str, Any] = (
                    {"headers": [(h["key"], h["value"]) for h in hdrs]} if hdrs else {}
                )
                while True:
                    try:
                        produce(name, values[i], keys[i], partition, timestamp=stamps[i], **extra)
                        break
                    except BufferError:
                        producer.poll(0.05)  # the local queue is full: let librdkafka send
            start = end

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
