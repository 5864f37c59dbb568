"""A direct task's raw records: one offset range of one raw partition, read with librdkafka.

Runs in the **executors** (``dedup/layouts/direct.py``'s task, given a row of
``dedup/raw_ranges.py``'s source). The records come as ``RawBatch``es (``dedup/raw_batch.py``,
Python lists as librdkafka gives them: no Arrow between the consumer and the classifier); a batch
holds at most ``max_batch_bytes`` of values (one record more than that alone), so a task holds
one batch of payload at a time whatever the record size.

Each Python worker keeps one consumer per configuration between tasks (a reader cannot be
fenced, unlike the task's transactional producer): assigned at the range's start, unassigned at
its end. A range ends by the consumer's position, not by the last record seen, since a
transaction's commit marker takes an offset no record has. Records below the log start
(deleted by retention before this batch read them) stop the task with ``fail_on_data_loss``,
else are passed over with a WARNING, as Spark's source does; the retention probe counts them
(``dedup/raw_position.py``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from common.errors import ServiceError
from dedup.raw_batch import RawBatch
from runtime import kafka

log = logging.getLogger(__name__)

#: Values per batch: the direct layout's ``arrow.maxBytesPerBatch`` with Spark's source.
MAX_BATCH_BYTES: Final = 4 << 20
#: Records asked of librdkafka per call at most (a raw record is a run of up to 64 KiB by
#: default); a call asks for no more than the range still holds, since it waits for as many as
#: it asks for (or ``CONSUME_WAIT_S``): asking for more at a range's end waited out the timeout
#: in every task (a backlog's second batch of 16 runs a partition took 2.5 s instead of 0.3).
CONSUME_RECORDS: Final = 256
#: Seconds one consume call waits for records (at most: a commit marker at the range's end, which
#: takes an offset no record has, ends the range by the position after the wait).
CONSUME_WAIT_S: Final = 0.1
#: Seconds without progress before the task fails (Spark's source: ``pollTimeoutMs``, 120 s).
STALL_S: Final = 120.0
#: Consumers a Python worker keeps (one per configuration; a dedup has one).
MAX_KEPT: Final = 4
#: Seconds before a range asks again after its partition's log start could not be read (a
#: leader being replaced). ``dedup.fence.READ_PAUSE_S``'s value: fence imports the writer
#: settings, which import this module.
RETRY_PAUSE_S: Final = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RangeReading:
    """What a task needs to read its range (shipped in ``TaskSpec``)."""

    conf: Mapping[str, Any] = field(default_factory=dict)
    """librdkafka settings of the consumer (``dedup.raw_position.consumer_conf``)."""
    fail_on_data_loss: bool = False
    """``FAIL_ON_DATA_LOSS``: records deleted before they were read stop the task."""


_kept: dict[str, Consumer] = {}


def _consumer(conf: Mapping[str, Any]) -> Consumer:
    key = json.dumps(dict(conf), sort_keys=True)
    consumer = _kept.get(key)
    if consumer is None:
        if len(_kept) >= MAX_KEPT:
            close()
        consumer = _kept[key] = kafka.consumer(conf)
    return consumer


def close() -> None:
    """Close the kept consumers (tests; a worker's exit closes them too)."""
    for consumer in _kept.values():
        consumer.close()
    _kept.clear()


def read_range(
    reading: RangeReading,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    max_batch_bytes: int = MAX_BATCH_BYTES,
    stall_s: float = STALL_S,
) -> Iterator[RawBatch]:
    """The raw records ``[start, end)`` of ``topic``/``partition``, in batches.

    Raises:
        ServiceError: records deleted before they were read and ``fail_on_data_loss``; no
            progress for ``stall_s`` (the broker is gone: Spark retries the task, then the
            batch); a consumer error that is not transient.
    """
    consumer = _consumer(reading.conf)
    consumer.assign([TopicPartition(topic, partition, start)])
    at, last_progress = start, time.monotonic()
    pending: list[Message] = []
    size = 0
    try:
        while at < end:
            for message in consumer.consume(min(CONSUME_RECORDS, end - at), CONSUME_WAIT_S):
                error = message.error()
                if error is not None:
                    at = _on_error(consumer, reading, error, (topic, partition), (at, end))
                    last_progress = time.monotonic()
                    continue
                offset = int(message.offset() or 0)
                if offset < at or offset >= end:
                    continue  # before a reset, or the next batch's
                pending.append(message)
                size += len(message.value() or b"")
                at = offset + 1
                last_progress = time.monotonic()
                if size >= max_batch_bytes:
                    yield raw_batch(pending, topic, partition)
                    pending, size = [], 0
            if at < end:
                # a commit marker or an aborted transaction's records may end the range
                position = int(consumer.position([TopicPartition(topic, partition)])[0].offset or 0)
                if position > at:
                    at, last_progress = min(position, end), time.monotonic()
            if at < end and time.monotonic() - last_progress > stall_s:
                raise ServiceError(
                    f"raw partition {topic}:{partition}: no record past offset {at} of "
                    f"[{start}, {end}) for {stall_s:.0f} s; is the broker reachable?"
                )
        if pending:
            yield raw_batch(pending, topic, partition)
    finally:
        consumer.unassign()


def _on_error(
    consumer: Consumer,
    reading: RangeReading,
    error: KafkaError,
    where: tuple[str, int],
    span: tuple[int, int],
) -> int:
    """Where the range ``span`` (next offset, end) reads on after ``error`` (its next offset:
    nothing changes)."""
    topic, partition = where
    at, end = span
    code = error.code()
    if code == KafkaError._PARTITION_EOF:
        return at
    if code not in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        if error.fatal() or not error.retriable():
            raise ServiceError(f"raw partition {topic}:{partition}: {error.str()}")
        log.warning("raw partition %s:%d: %s (retrying)", topic, partition, error.str())
        return at
    try:
        low, _high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=30, cached=False
        )
    except KafkaException as exc:
        failure = kafka.error(exc, f"the log start of raw partition {topic}:{partition}")
        if not failure.retriable:
            raise failure from exc
        # A leader being replaced (its handle destroyed, a timeout): fetch again from the same
        # offset a little later; the new leader serves it or reports the offset error again.
        log.warning("%s (retrying)", failure)
        time.sleep(RETRY_PAUSE_S)
        consumer.assign([TopicPartition(topic, partition, at)])
        return at
    if low <= at:
        raise ServiceError(f"raw partition {topic}:{partition}: offset {at}: {error.str()}")
    message = (
        f"raw records {at}..{min(low, end) - 1} of {topic}:{partition} were deleted by retention "
        "before the dedup read them"
    )
    if reading.fail_on_data_loss:
        raise ServiceError(message + "; FAIL_ON_DATA_LOSS=true stops the query")
    log.warning("%s: passed over (FAIL_ON_DATA_LOSS=false)", message)
    if low < end:
        consumer.assign([TopicPartition(topic, partition, low)])
    return min(low, end)


def raw_batch(messages: list[Message], topic: str, partition: int) -> RawBatch:
    """``messages`` as a direct task takes them."""
    return RawBatch(
        topic,
        partition,
        [m.offset() or 0 for m in messages],
        [m.key() for m in messages],
        [m.value() for m in messages],
        [_headers(m) for m in messages],
    )


def _headers(message: Message) -> Sequence[tuple[str, bytes | None]]:
    return cast("Sequence[tuple[str, bytes | None]]", message.headers() or ())
