"""What the dedup's write side needs, and what one write task reports (driver and executors).

``WriterSettings`` is a subset of ``DedupConfig`` (so benchmarks and tests can build one), shipped
to the executors with every batch's ``TaskSpec``; ``BatchResult`` is what one partition's
transaction wrote, folded by the driver into the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from common.topic_limits import TimestampWindow
from dedup.layouts import Layout
from dedup.worker_heap import FreezeOnLoad

if TYPE_CHECKING:
    from dedup.detect import DetectParams
    from dedup.range_reader import RangeReading

#: Seconds any one Kafka call of the writer may take (commits: four times this).
KAFKA_TIMEOUT_S = 30.0
#: librdkafka's own ``batch.size``: a batch every topic admits at the brokers' default limit.
LIBRDKAFKA_BATCH_BYTES = 1_000_000
#: librdkafka's ``transaction.timeout.ms`` when ``KAFKA_CONF_TRANSACTION_TIMEOUT_MS`` is unset.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


def transaction_timeout_s(kafka_conf: Mapping[str, str]) -> float:
    """Seconds the broker lets a write task's transaction stay open before it aborts it."""
    return int(kafka_conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)) / 1000


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
    """Largest record the link carries (MAX_RECORD_SIZE): sizes the producer, the consumers,
    created topics and the check of existing clean topics."""
    kafka_conf: Mapping[str, str] = field(default_factory=dict)
    """librdkafka pass-through properties."""
    state_topic: str = "kafka-diode.dedup.state"
    """The direct layout's state records (``dedup/direct_state.py``): compacted, one partition
    per raw partition."""
    raw_topics: tuple[str, ...] = ()
    """The topics the query reads, ``(*RAW_TOPICS, CONTROL_TOPIC)``: ``raw_topic`` indexes it."""
    write_batch_bytes: int = LIBRDKAFKA_BATCH_BYTES
    """The write producers' ``batch.size``: the driver sets what the gap and progress topics
    admit, up to ``dedup.fence.WRITE_BATCH_BYTES`` (``dedup.clean_topics.write_batch_bytes``)."""


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What one micro-batch's write tasks need, every layout (pickled with the task function)."""

    settings: WriterSettings
    """The writer's settings (``state_topic`` among them)."""
    query_id: str = ""
    """Spark's query id (stable per checkpoint): the markers' and state records' key prefix
    ("" with ``batch_id`` -1: the running task's, ``in_batch``)."""
    batch_id: int = -1
    """The micro-batch (-1: the running Spark task's, ``in_batch``: the query's task function is
    built once, when it starts, so its spec names no batch)."""
    windows: Mapping[str, TimestampWindow] = field(default_factory=dict)
    """Clean topics the driver checked at start-up (a fixed CLEAN_TOPIC) and the timestamps
    each accepts; the tasks check any other clean topic at its first use in their process."""
    layout: Layout = Layout.BUCKETS
    """The checkpoint's state layout: its module runs the task (``dedup/layouts/``)."""
    params: DetectParams | None = None
    """The direct layout: the detectors' settings (None: a stateful layout, the rows come
    detected)."""
    now_ms: int = 0
    """The direct layout: the gap scans' time, the task's clock when it started (``in_batch``)."""
    raw_partitions: int = 0
    """The direct layout: the raw topic's partition count (the driver checked it is fixed); a
    record of source partition ``p`` belongs in raw partition ``p mod raw_partitions`` (0: not
    checked)."""
    transaction_groups: int = 0
    """The direct layout: raw partition ``p`` commits in transaction group ``p mod`` this (0:
    each raw partition in a transaction of its own; ``dedup/direct_task.py``)."""
    reading: RangeReading | None = None
    """The direct layout with ``DIRECT_READER=librdkafka``: how each task reads its offset range
    (None: the rows come from Spark's Kafka source)."""
    heap: FreezeOnLoad = field(default_factory=FreezeOnLoad)
    """Unpickled in a Python worker, freezes its loaded code out of the collector's walks
    (``dedup/worker_heap.py``)."""

    def in_batch(self, query_id: str, batch_id: int, now_ms: int) -> TaskSpec:
        """This spec for one micro-batch's task (unchanged if it names its batch already)."""
        if self.batch_id >= 0:
            return self
        return replace(self, query_id=query_id, batch_id=batch_id, now_ms=now_ms)


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
    payload_bytes: int = 0
    """Bytes of run payloads the write consumed (docs/dedup-internals.md "Each payload read
    once")."""
    record_bytes: int = 0
    """Bytes of the keys, values and headers of every record in those runs (delivered or not)."""
    parts: int = 0
    """Transactions committed as parts of the batch before its last one (the direct layout,
    docs/dedup-internals.md "Parts of a batch")."""
