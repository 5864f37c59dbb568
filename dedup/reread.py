"""Re-read the first-seen raw records of a micro-batch by their raw position, on the driver.

Guarantee: ``RawRereader.read`` yields exactly the raw records at the requested offsets of one raw
(topic, partition), in offset order, each once; if any of them can no longer be read (deleted by
retention or compaction, or the partition is gone) it raises ``RawRecordGoneError`` naming the raw
topic, partition and offset, and yields nothing past it. It never skips a record silently.

Why: the dedup's stateful step sees no payload (docs/dedup.md "How it works"); it decides which raw
records are first seen and hands their raw positions to the writer, which fetches them here. The
raw topic is immutable, so a replayed micro-batch reads the same records again.

Memory is bounded: one partition is read at a time, in chunks of ``chunk`` messages, and the
consumer's prefetch queue is capped (``queued.max.messages.kbytes``, ``queued.min.messages``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from common.errors import ServiceError
from common.topic_limits import record_limit
from runtime import kafka

log = logging.getLogger(__name__)

#: Options of Spark's Kafka source (``KAFKA_SOURCE_KAFKA_<NAME>`` -> ``kafka.<name>``) whose name
#: and meaning are the same in librdkafka: the re-read consumer copies them, so it reads the raw
#: topic as the source does. Java-only ones (``ssl.truststore.location``, ``sasl.jaas.config``)
#: have no librdkafka twin: give their librdkafka equivalents as ``KAFKA_CONF_<NAME>``.
SHARED_SOURCE_OPTIONS = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.kerberos.service.name",
    "ssl.endpoint.identification.algorithm",
    "client.dns.lookup",
    "isolation.level",
)
#: librdkafka's default ``fetch.max.bytes``; a record up to it needs nothing special.
_FETCH_MAX_BYTES = 52_428_800
#: Room for the fetch response's own framing on top of one record batch.
_RESPONSE_MARGIN = 1 << 20
#: Messages per ``consume`` call (the Python side holds at most this many at once).
DEFAULT_CHUNK = 5_000
#: One ``consume`` call's wait when fewer messages than asked for exist (see ``read``).
POLL_TIMEOUT_S = 0.2


class RawRecordGoneError(ServiceError):
    """A first-seen raw record cannot be re-read: the micro-batch must fail, not skip it."""

    retriable = False


def consumer_conf(
    kafka_conf: Mapping[str, str],
    source_options: Mapping[str, str],
    *,
    group_id: str,
    max_record_size: int = 0,
) -> dict[str, Any]:
    """librdkafka settings of the re-read consumer (``kafka_conf`` includes bootstrap.servers).

    Precedence: our fixed settings < the source's shared options < ``KAFKA_CONF_*``; the consumer
    never commits, never resets its position by itself and reads what the source reads
    (``isolation.level`` defaults to Spark's ``read_uncommitted``).
    """
    conf: dict[str, Any] = {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        # An offset below the log start is an error event, never a silent jump forward.
        "auto.offset.reset": "error",
        "isolation.level": "read_uncommitted",
        "queued.min.messages": 20_000,
        # A fetch at the log end waits this long at the broker, and the next batch's first fetch
        # queues behind it (librdkafka's default 500 ms cost ~1 s per batch): keep it short. The
        # consumer is unassigned between batches, so this never becomes idle polling.
        "fetch.wait.max.ms": 10,
        "queued.max.messages.kbytes": 32_768,
    }
    needed = record_limit(max_record_size)
    if needed > _FETCH_MAX_BYTES:
        # librdkafka returns a record batch larger than fetch.max.bytes anyway (progress), but a
        # response over receive.message.max.bytes is an error: both must hold the largest record
        conf["fetch.max.bytes"] = needed
        conf["receive.message.max.bytes"] = needed + _RESPONSE_MARGIN
    for name in SHARED_SOURCE_OPTIONS:
        value = source_options.get(f"kafka.{name}")
        if value is not None:
            conf[name] = value
    conf.update(kafka_conf)
    return conf


class RawRereader:
    """One consumer, reused across micro-batches; ``read`` one raw partition at a time."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        *,
        chunk: int = DEFAULT_CHUNK,
        timeout_s: float = 30.0,
    ) -> None:
        if chunk < 1:
            raise ValueError("chunk must be at least 1")
        self._conf = dict(conf)
        self._chunk = chunk
        self._timeout_s = timeout_s
        self._consumer: Consumer | None = None

    def close(self) -> None:
        """Close the consumer (idempotent)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def read(self, topic: str, partition: int, offsets: Sequence[int]) -> Iterator[list[Message]]:
        """The records at ``offsets`` (strictly increasing) of ``topic:partition``, chunk by chunk.

        Raises:
            RawRecordGoneError: a requested offset no longer exists in the raw topic.
            ServiceError: Kafka reported another error, or nothing arrived within the timeout.
        """
        for _, messages in self.read_many([(topic, partition, offsets)]):
            yield messages

    def read_many(
        self, wanted: Sequence[tuple[str, int, Sequence[int]]]
    ) -> Iterator[tuple[int, list[Message]]]:
        """``read`` for several raw partitions at once: ``(index into wanted, records)`` steps.

        All partitions are fetched together (librdkafka prefetches each in the background), so
        the fetch latency of one is hidden behind the others' records; each partition's records
        still come in offset order. Records after a partition's last wanted one are skipped. The
        (topic, partition) pairs must differ.

        Raises:
            RawRecordGoneError: a requested offset no longer exists in the raw topic.
            ServiceError: Kafka reported another error, or nothing arrived within the timeout.
        """
        walkers: dict[tuple[str, int], _Walker] = {}
        for index, (topic, partition, offsets) in enumerate(wanted):
            if offsets:
                walkers[(topic, partition)] = _Walker(index, topic, partition, offsets)
        if not walkers:
            return
        if self._consumer is None:
            self._consumer = kafka.consumer(self._conf)
        consumer = self._consumer
        positions = [TopicPartition(w.topic, w.partition, w.want) for w in walkers.values()]
        consumer.assign(positions)
        active = len(walkers)
        deadline = time.monotonic() + self._timeout_s
        try:
            while active:
                # consume() waits until it has this many messages (or the poll timeout): never ask
                # for more than the offsets left up to the last wanted ones, which exist unless
                # offsets are missing (transaction markers, compaction) - then the short timeout.
                span = sum(w.last - w.position + 1 for w in walkers.values() if not w.done)
                messages = consumer.consume(min(self._chunk, span), POLL_TIMEOUT_S)
                if not messages:
                    if time.monotonic() > deadline:
                        late = next(w for w in walkers.values() if not w.done)
                        raise ServiceError(
                            f"re-reading raw records of {late.topic}:{late.partition} from offset "
                            f"{late.want}: nothing arrived in {self._timeout_s:.0f} s; is Kafka up?"
                        )
                    continue
                deadline = time.monotonic() + self._timeout_s
                out: dict[int, list[Message]] = {}
                for msg in messages:
                    walker = walkers.get((msg.topic() or "", msg.partition() or 0))
                    err = msg.error()
                    if err is not None:
                        w = walker or next(iter(walkers.values()))
                        raise self._error(err, w.topic, w.partition, w.want)
                    if walker is None or walker.done:
                        continue  # prefetched past the last wanted record before the pause
                    if walker.take(msg):
                        out.setdefault(walker.index, []).append(msg)
                        if walker.done:
                            # Not paused: a paused partition stays paused across unassign and
                            # assign, and resuming it later cost ~1 s per partition. Its
                            # prefetch (bounded by queued.min.messages) is dropped instead.
                            active -= 1
                yield from out.items()
        finally:
            # Drop the prefetch before the next batch assigns new positions.
            consumer.unassign()

    @staticmethod
    def _error(err: KafkaError, topic: str, partition: int, want: int) -> ServiceError:
        code = err.code()
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            return _gone(topic, partition, want, detail=str(err))
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
            return _gone(topic, partition, want, detail=str(err))
        return ServiceError(f"re-reading raw records of {topic}:{partition} failed: {err}")


class _Walker:
    """One raw partition's walk over its wanted offsets (strictly increasing)."""

    __slots__ = ("done", "i", "index", "last", "offsets", "partition", "position", "topic", "want")

    def __init__(self, index: int, topic: str, partition: int, offsets: Sequence[int]) -> None:
        self.index, self.topic, self.partition = index, topic, partition
        self.offsets, self.i = offsets, 0
        self.want, self.last = offsets[0], offsets[-1]
        self.position = self.want
        self.done = False

    def take(self, msg: Message) -> bool:
        """True if ``msg`` is the next wanted record; raises if a wanted one was skipped."""
        offset = msg.offset()
        if offset is None:
            return False
        self.position = offset + 1
        if offset < self.want:
            return False  # between two first-seen records: a duplicate, control, malformed
        if offset > self.want:
            raise _gone(self.topic, self.partition, self.want)
        self.i += 1
        if self.i == len(self.offsets):
            self.done = True
        else:
            self.want = self.offsets[self.i]
        return True


def _gone(topic: str, partition: int, offset: int, detail: str = "") -> RawRecordGoneError:
    why = f" ({detail})" if detail else ""
    return RawRecordGoneError(
        f"raw record {topic}:{partition} offset {offset} is gone{why}: it was read by the query "
        "and chosen as first seen, but deleted (retention, compaction or a deleted topic) before "
        "the writer re-read it. The micro-batch fails, as Spark's failOnDataLoss would, and its "
        "replay fails the same way: raise the raw topic's retention (docs/dedup.md "
        '"Raw records gone before the re-read")'
    )
