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
#: Messages per ``consume`` call (the Python side holds at most this many at once).
DEFAULT_CHUNK = 5_000
#: One ``consume`` call's wait when fewer messages than asked for exist (see ``read``).
POLL_TIMEOUT_S = 0.2


class RawRecordGoneError(ServiceError):
    """A first-seen raw record cannot be re-read: the micro-batch must fail, not skip it."""

    retriable = False


def consumer_conf(
    kafka_conf: Mapping[str, str], source_options: Mapping[str, str], *, group_id: str
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
        "queued.max.messages.kbytes": 32_768,
    }
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
        if not offsets:
            return
        if self._consumer is None:
            self._consumer = Consumer(self._conf)
        consumer = self._consumer
        consumer.assign([TopicPartition(topic, partition, offsets[0])])
        count, i = len(offsets), 0
        want, last = offsets[0], offsets[-1]
        position = want
        deadline = time.monotonic() + self._timeout_s
        try:
            while i < count:
                # consume() waits until it has this many messages (or the poll timeout): never ask
                # for more than the offsets left up to the last wanted one, which exist unless
                # offsets are missing (transaction markers, compaction) - then the short timeout.
                wanted_span = min(self._chunk, last - position + 1)
                messages = consumer.consume(wanted_span, POLL_TIMEOUT_S)
                if not messages:
                    if time.monotonic() > deadline:
                        raise ServiceError(
                            f"re-reading raw records of {topic}:{partition} from offset {want}: "
                            f"nothing arrived in {self._timeout_s:.0f} s; is Kafka up?"
                        )
                    continue
                deadline = time.monotonic() + self._timeout_s
                out: list[Message] = []
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        raise self._error(err, topic, partition, want)
                    offset = msg.offset()
                    if offset is None:
                        continue
                    position = offset + 1
                    if offset < want:
                        continue  # between two first-seen records: a duplicate, control, ...
                    if offset > want:
                        raise _gone(topic, partition, want)
                    out.append(msg)
                    i += 1
                    if i == count:
                        break
                    want = offsets[i]
                if out:
                    yield out
        finally:
            # Drop the prefetch of this partition before the next one is read.
            consumer.unassign()

    @staticmethod
    def _error(err: KafkaError, topic: str, partition: int, want: int) -> ServiceError:
        code = err.code()
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            return _gone(topic, partition, want, detail=str(err))
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
            return _gone(topic, partition, want, detail=str(err))
        return ServiceError(f"re-reading raw records of {topic}:{partition} failed: {err}")


def _gone(topic: str, partition: int, offset: int, detail: str = "") -> RawRecordGoneError:
    why = f" ({detail})" if detail else ""
    return RawRecordGoneError(
        f"raw record {topic}:{partition} offset {offset} is gone{why}: it was read by the query "
        "and chosen as first seen, but deleted (retention, compaction or a deleted topic) before "
        "the writer re-read it. The micro-batch fails, as Spark's failOnDataLoss would, and its "
        "replay fails the same way: raise the raw topic's retention (docs/dedup.md "
        '"Raw records gone before the re-read")'
    )
