"""The fence of the dedup's transactions: producers that fence their elders, and the markers.

Runs in the write tasks (executors). docs/dedup-internals.md "Effectively once", step 3: every
attempt calls ``init_transactions`` (fencing every older producer of its ``transactional.id``) and
only then reads its partition's highest committed marker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from common.errors import ServiceError
from common.topic_limits import record_limit
from dedup.writer_settings import KAFKA_TIMEOUT_S, WriterSettings
from runtime import kafka

log = logging.getLogger(__name__)

#: Markers read per step when searching the progress topic backwards for this query's last one.
FENCE_SCAN_STEP = 512
#: The marker partition: one partition keeps the markers of a query in order.
MARKER_PARTITION = 0
#: The write producers' linger (ms), unless KAFKA_CONF_LINGER_MS says otherwise. Nothing a
#: transaction writes is visible before its commit, and the commit flushes at once (librdkafka
#: ignores linger.ms while flushing), so a long linger delays no record: it only lets each clean
#: partition's batch fill. A task that writes into many clean partitions (one per source topic
#: its raw partition carries) sent each a small batch every 20 ms, and the broker's cost is per
#: batch: 32 clean partitions at 55k records/s cost it 2.5 CPU-s per 200k records at 20 ms, 1.1
#: at 2 s (docs/benchmarks.md "Dedup").
WRITE_LINGER_MS = 2_000
#: The write producers' ``batch.size`` at most (bytes), unless KAFKA_CONF_BATCH_SIZE says otherwise;
#: the driver lowers it to what the gap and progress topics admit (``WriterSettings``). A
#: transactional librdkafka producer whose partitions' batches fill (1 MB by default) faster than
#: the broker takes them keeps its broker thread busy polling: transactions of 50 MB into 2
#: partitions cost 2.85 CPU-s per GB with 1 MB batches, 0.87 with 8 MiB (bench/write_batch.py,
#: docs/benchmarks.md "Dedup"; docs/dedup-internals.md "A task's fixed cost").
WRITE_BATCH_BYTES = 8 << 20
#: Seconds a produce waits for room in a full local queue before it tries again.
ROOM_WAIT_S = 0.05
#: Full batches per clean partition a write task lets librdkafka hold at once, queued or in
#: flight (``PartitionWriter.produce_records``). An idempotent librdkafka producer counts the
#: records in flight per partition against its limit of 5 requests, so a batch of 5 or more
#: records in flight holds back the next; its broker thread wakes at once for a ready batch,
#: cannot send it and polls again, busily, until an acknowledgement comes: a task producing
#: faster than the broker takes its records paid 3-7 CPU-s per GB for that loop with 128 MiB
#: queued, 0.5-1.6 with 4 batches (docs/benchmarks.md "Dedup"). Per partition, not
#: ``queue.buffering.max.kbytes``: a task writing hundreds of clean partitions holds a partial
#: batch for each (a queue of 4 batches flushed them small, and a fan-in backlog ran 2.6x
#: slower).
QUEUED_BATCHES = 4
#: Seconds a write task waits for a delivery report while it holds ``QUEUED_BATCHES``.
ACK_WAIT_S = 0.1
#: Seconds a read of the progress or state topic keeps trying, a new consumer each time, while
#: the cluster moves: a killed leader's pending requests end in ``_DESTROY_BROKER`` once the
#: controller fences it (``broker.session.timeout.ms``) and the metadata drops it, and a new
#: request finds the new leader. Within ``transaction.timeout.ms`` (60 s by default).
READ_RETRY_S = KAFKA_TIMEOUT_S
#: Seconds between two tries of such a read.
READ_PAUSE_S = 1.0

_T = TypeVar("_T")


def partition_transactional_id(base: str, partition: int) -> str:
    """The ``transactional.id`` of stateful partition ``partition``'s writer."""
    return f"{base}-p{partition}"


def base_conf(settings: WriterSettings) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers}
    conf.update(settings.kafka_conf)
    return conf


def init_producer(
    settings: WriterSettings, transactional_id: str, *, message_bytes: int = 0
) -> Producer:
    """A transactional producer after ``init_transactions``: every older one with that id is
    fenced and its open transaction aborted (or completed, if its commit had begun).
    ``message_bytes``: a larger message than the link's largest record it must write."""
    producer = kafka.producer(writer_conf(settings, transactional_id, message_bytes))
    try:
        # Metadata first, twice: a fresh librdkafka producer that asks for its transaction
        # coordinator before a connection to a broker it learned from metadata is up finds "no
        # brokers available" and waits for its 500 ms coordinator-query timer. The first request
        # goes through the bootstrap connection, the second through a learned broker (a few ms
        # each). Measured in the dedup's write tasks (bench/dedup_latency.py, quiet): a ~500 ms
        # fence in 23 of 65 batches with one request, 1 of 31 inits with two (docs/benchmarks.md).
        for _ in range(2):
            producer.list_topics(settings.progress_topic, timeout=KAFKA_TIMEOUT_S)
        producer.init_transactions(KAFKA_TIMEOUT_S)
    except KafkaException as exc:
        raise kafka.error(
            exc,
            f"cannot initialise Kafka transactions as {transactional_id!r} (check "
            "BOOTSTRAP_SERVERS and that the broker allows transactions)",
        ) from exc
    return producer


def writer_conf(
    settings: WriterSettings, transactional_id: str, message_bytes: int = 0
) -> dict[str, Any]:
    """A write producer's configuration: the dedup's defaults, ``KAFKA_CONF_<NAME>`` over them."""
    conf = base_conf(settings)
    conf.update(
        {
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "linger.ms": conf.get("linger.ms", _write_linger_ms(conf)),
            "batch.num.messages": conf.get("batch.num.messages", 10_000),
            "batch.size": conf.get("batch.size", settings.write_batch_bytes),
            "queue.buffering.max.messages": conf.get("queue.buffering.max.messages", 500_000),
            # bounds the payload in flight in a task (records stream in from the task's rows)
            "queue.buffering.max.kbytes": conf.get("queue.buffering.max.kbytes", 131_072),
            # A sparse client's first request after the bootstrap fails (librdkafka drops the
            # bootstrap connection, with the request in it, once metadata names the brokers)
            # and its retry waits ~50 ms: on a task's critical path every batch. Connected to
            # every broker at once, a new producer is ready in ~14 ms instead of ~64
            # (docs/benchmarks.md "Dedup").
            "enable.sparse.connections": conf.get("enable.sparse.connections", False),
        }
    )
    # librdkafka refuses a message over message.max.bytes (1 MB by default) by itself
    needed = max(record_limit(settings.max_record_size), message_bytes)
    if int(conf.get("message.max.bytes", 0) or 0) < needed:
        conf["message.max.bytes"] = needed
    return conf


def _write_linger_ms(conf: dict[str, Any]) -> int:
    """``WRITE_LINGER_MS``, or less where the user's timeouts are shorter (librdkafka refuses a
    linger as long as ``message.timeout.ms``, which a transaction's timeout caps)."""
    timeouts = (
        int(conf[name])
        for name in ("message.timeout.ms", "delivery.timeout.ms", "transaction.timeout.ms")
        if str(conf.get(name, "")).isdigit()
    )
    return min([WRITE_LINGER_MS, *(t // 2 for t in timeouts)])


def wait_for_room(producer: Producer) -> None:
    """The producer's local queue is full: send what it holds, now.

    librdkafka keeps a partition's batch until ``linger.ms`` expires even when the queue is full,
    so a poll could wait a whole ``WRITE_LINGER_MS`` (measured: a queue of 256 partial batches
    stalled until the transaction timed out); a flush sends every partition's batch at once and
    serves the delivery reports."""
    producer.flush(ROOM_WAIT_S)


def wait_for_acks(producer: Producer, limit: int) -> None:
    """Serve delivery reports until the producer holds at most ``limit`` messages, queued or in
    flight (``QUEUED_BATCHES``). A poll that brings no report flushes (``wait_for_room``): then
    the queue may hold only partial batches, which librdkafka keeps until ``linger.ms``."""
    while (held := len(producer)) > limit:
        producer.poll(ACK_WAIT_S)
        if len(producer) >= held:
            wait_for_room(producer)


def read_last_marker(settings: WriterSettings, key: bytes, group_id: str) -> int:
    """The highest batch id of the committed markers with ``key`` (-1: none), read_committed.

    Searches the progress topic backwards from its end in growing steps, so a marker written a
    few batches ago costs one short read.
    """
    values = retrying(
        lambda: last_values(
            settings, settings.progress_topic, MARKER_PARTITION, key, group_id, FENCE_SCAN_STEP
        ),
        f"reading the markers of {group_id}",
    )
    return max((int(json.loads(v)["batch_id"]) for v in values), default=-1)


def last_values(  # noqa: PLR0917  one keyed read of one partition
    settings: WriterSettings, topic: str, partition: int, key: bytes, group_id: str, step: int
) -> list[bytes]:
    """The committed values with ``key`` (read_committed, in offset order) of the last range of
    ``topic``'s ``partition`` that holds any: the search goes backwards from the partition's end
    in ranges of ``step`` records, growing fourfold, so a record written lately costs one short
    read. Empty: no record with ``key``. (The fence's markers; the direct layout's state.)

    Raises:
        ServiceError: the topic cannot be read.
    """
    consumer = kafka.consumer(reader_conf(settings, group_id))
    try:
        where = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(where, timeout=KAFKA_TIMEOUT_S)
        return scan_back(consumer, where, key, (low, high), step)
    finally:
        consumer.close()


def retrying(
    read: Callable[[], _T], what: str, *, within: float = READ_RETRY_S, pause: float = READ_PAUSE_S
) -> _T:
    """``read()``, tried again every ``pause`` seconds for ``within`` seconds while it fails with
    a transient Kafka error (``runtime.kafka.TRANSIENT_ERRORS``); ``read`` makes its own consumer,
    so each try asks the cluster afresh. Raises the last error, or any other at once."""
    deadline = time.monotonic() + within
    while True:
        try:
            return read()
        except KafkaException as exc:
            if not kafka.error(exc, what).retriable or time.monotonic() + pause >= deadline:
                raise
            # executors log WARNING and up: a failover an operator may look for
            log.warning("%s failed (%s); trying again in %.0f s", what, exc, pause)
        time.sleep(pause)  # a retry interval while the cluster elects leaders


def reader_conf(settings: WriterSettings, group_id: str) -> dict[str, Any]:
    """A consumer's configuration for ``last_values`` and ``scan_back`` (assigned, never
    subscribed: ``group_id`` only names it)."""
    conf = base_conf(settings)
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
    return conf


def scan_back(
    consumer: Consumer, where: TopicPartition, key: bytes, ends: tuple[int, int], step: int
) -> list[bytes]:
    """``last_values`` with a consumer of ``reader_conf`` and the partition's watermarks
    ``ends`` (low, high) in hand; the consumer is left unassigned (it fetches nothing after)."""
    low, end = ends
    try:
        while end > low:
            start = max(low, end - step)
            found = _scan(consumer, TopicPartition(where.topic, where.partition, start), key, end)
            if found:
                return found
            end, step = start, step * 4
        return []
    finally:
        consumer.unassign()


def _scan(consumer: Consumer, where: TopicPartition, key: bytes, end: int) -> list[bytes]:
    """The values with ``key`` from ``where`` up to offset ``end`` (exclusive)."""
    consumer.assign([where])
    found: list[bytes] = []
    deadline = time.monotonic() + KAFKA_TIMEOUT_S
    while time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return found
            if not err.fatal() and (err.retriable() or err.code() in kafka.TRANSIENT_ERRORS):
                continue  # a leader moving: the consumer fetches from the new one
            raise ServiceError(f"reading topic {where.topic!r} failed: {err}")
        offset, value = msg.offset(), msg.value()
        if offset is None or offset >= end:
            return found
        if msg.key() == key and value is not None:
            found.append(value)
    raise ServiceError(f"reading topic {where.topic!r} timed out; is Kafka up?")
