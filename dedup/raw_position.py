"""Where the dedup reads each raw partition, how far behind it is, what retention deleted unread.

Two questions an operator asks at 3 a.m. that Spark's own metrics do not answer:

- *Is the dedup falling behind?* Spark's progress names, per source partition, the offset the
  last micro-batch read up to (``endOffset``) and the log end it saw when planning it
  (``latestOffset``). Their difference is ``kafka_diode_dedup_raw_offsets_behind``.
- *Did retention delete raw records before the dedup read them?* With ``FAIL_ON_DATA_LOSS=false``
  Spark skips such records with a log line and nothing else. A small consumer asks the broker for
  each raw partition's log start offset (``kafka_diode_dedup_raw_log_start_offset``) every
  ``PROBE_INTERVAL_S``; a log start above the dedup's next offset means records were deleted
  unread, counted once each in ``kafka_diode_dedup_raw_records_expired_unread_total``.

The progress parsing and the counting are pure (:func:`positions_from_progress`,
:class:`ExpiryCounter`); :class:`RawPositionMetrics` is the thin part that asks Kafka. Runbook
entries: docs/metrics.md "Alerts".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.metrics import CollectorRegistry, Counter, Gauge
from common.topic_limits import record_limit
from runtime.kafka import FETCH_QUEUE_BACKOFF_MS

log = logging.getLogger(__name__)

#: Options of Spark's Kafka source (``KAFKA_SOURCE_KAFKA_<NAME>`` -> ``kafka.<name>``) whose name
#: and meaning are the same in librdkafka: consumers of the raw topic copy them, so they read it
#: as the source does. Java-only ones (``ssl.truststore.location``, ``sasl.jaas.config``) have no
#: librdkafka twin: give their librdkafka equivalents as ``KAFKA_CONF_<NAME>``.
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

#: Seconds between two log-start probes (one watermark request per raw partition).
PROBE_INTERVAL_S = 15.0
#: Seconds one watermark request may take before the probe gives up until the next interval.
PROBE_TIMEOUT_S = 5.0
#: Partitions tracked at most (bounds the label sets and the probe's work).
MAX_PARTITIONS = 4096

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Position:
    """The dedup's position in one raw partition after a micro-batch."""

    next_offset: int
    """The offset the next micro-batch starts at (Spark's ``endOffset``)."""
    latest_offset: int
    """The partition's log end when the batch was planned (Spark's ``latestOffset``)."""

    @property
    def behind(self) -> int:
        """Records written to the raw partition that the dedup has not read yet."""
        return max(0, self.latest_offset - self.next_offset)


def _offsets(value: object) -> dict[str, dict[str, int]]:
    """Spark's offset JSON (``{"topic": {"0": 12}}``), given as text or already parsed."""
    if value is None:
        return {}
    parsed = json.loads(value) if isinstance(value, str) else value
    if not isinstance(parsed, Mapping):
        return {}
    out: dict[str, dict[str, int]] = {}
    for topic, parts in parsed.items():
        if isinstance(parts, Mapping):
            out[str(topic)] = {str(p): int(o) for p, o in parts.items() if isinstance(o, int)}
    return out


def positions_from_progress(
    progress: Mapping[str, Any], topics: Iterable[str]
) -> dict[TopicPartition, Position]:
    """Per raw (topic, partition) in ``topics``: the position a StreamingQueryProgress reports.

    Sources that are not Kafka (or partitions without an end offset yet) are skipped; a
    partition without ``latestOffset`` is taken as caught up.
    """
    wanted = set(topics)
    out: dict[TopicPartition, Position] = {}
    for source in progress.get("sources") or ():
        try:
            ends = _offsets(source.get("endOffset"))
            latest = _offsets(source.get("latestOffset"))
        except (ValueError, TypeError, AttributeError):
            continue  # not a Kafka source's offsets
        for topic, parts in ends.items():
            if topic not in wanted:
                continue
            for partition, end in parts.items():
                if len(out) >= MAX_PARTITIONS:
                    return out
                last = latest.get(topic, {}).get(partition, end)
                out[(topic, int(partition))] = Position(next_offset=end, latest_offset=last)
    return out


def records_read(progress: Mapping[str, Any]) -> int:
    """Raw records a micro-batch read: what each source's offsets moved by, or its
    ``numInputRows`` where they do not say (a first batch, a source that is not Kafka's).

    Spark counts the rows its sources give; the direct layout's librdkafka reader gives its
    write tasks' result cells (``dedup/raw_ranges.py``), whose tasks read the records themselves.
    """
    total = 0
    for source in progress.get("sources") or ():
        try:
            begin = _offsets(source.get("startOffset"))
            end = _offsets(source.get("endOffset"))
        except (ValueError, TypeError, AttributeError):
            begin = end = {}
        if begin and end:
            total += sum(
                max(0, offset - begin.get(topic, {}).get(partition, offset))
                for topic, parts in end.items()
                for partition, offset in parts.items()
            )
        else:
            total += int(source.get("numInputRows") or 0)
    return total


def reads_behind(progress: Mapping[str, Any]) -> bool:
    """Whether a micro-batch ended short of what its sources held when it was planned (a batch
    bounded by ``maxOffsetsPerTrigger`` in a backlog): more input is there to read."""
    for source in progress.get("sources") or ():
        try:
            ends = _offsets(source.get("endOffset"))
            latest = _offsets(source.get("latestOffset"))
        except (ValueError, TypeError, AttributeError):
            continue
        for topic, parts in latest.items():
            for partition, last in parts.items():
                if last > ends.get(topic, {}).get(partition, last):
                    return True
    return False


class ExpiryCounter:
    """Counts records deleted before they were read, each offset at most once.

    ``observe`` takes the dedup's next offset and the broker's log start for one partition;
    records in ``[next, log_start)`` were deleted unread. Offsets already counted are remembered
    per partition (the highest one), so a repeated probe before Spark moves on counts nothing new.
    """

    def __init__(self) -> None:
        self._counted_to: dict[TopicPartition, int] = {}

    def observe(self, tp: TopicPartition, next_offset: int, log_start: int) -> int:
        """Records newly found deleted unread in ``tp`` (0 if none)."""
        start = max(next_offset, self._counted_to.get(tp, next_offset))
        if log_start <= start:
            return 0
        self._counted_to[tp] = log_start
        return log_start - start


class RawPositionMetrics:
    """The ``kafka_diode_dedup_raw_*`` series, fed from progress and a log-start probe."""

    def __init__(
        self,
        registry: CollectorRegistry,
        topics: Iterable[str],
        watermarks: Callable[[str, int], tuple[int, int]] | None = None,
        *,
        clock: Callable[[], float],
        probe_interval: float = PROBE_INTERVAL_S,
        close: Callable[[], None] | None = None,
    ) -> None:
        self._close = close
        self._topics = tuple(topics)
        self._watermarks = watermarks
        self._clock = clock
        self._interval = probe_interval
        self._next_probe = 0.0
        self._positions: dict[TopicPartition, Position] = {}
        self._expiry = ExpiryCounter()
        labels = ["topic", "partition"]
        ns, sub = "kafka_diode", "dedup"
        self.next_offset = Gauge(
            "raw_next_offset", "Offset the dedup reads next in each raw partition", labels,
            namespace=ns, subsystem=sub, registry=registry,
        )  # fmt: skip
        self.latest_offset = Gauge(
            "raw_latest_offset", "Log end of each raw partition when the last batch was planned",
            labels, namespace=ns, subsystem=sub, registry=registry,
        )  # fmt: skip
        self.behind = Gauge(
            "raw_offsets_behind", "Raw records written but not yet read by the dedup", labels,
            namespace=ns, subsystem=sub, registry=registry,
        )  # fmt: skip
        self.log_start = Gauge(
            "raw_log_start_offset", "Oldest offset the broker still keeps in each raw partition",
            labels, namespace=ns, subsystem=sub, registry=registry,
        )  # fmt: skip
        self.expired = Counter(
            "raw_records_expired_unread", "Raw records deleted by retention before the dedup "
            "read them", labels, namespace=ns, subsystem=sub, registry=registry,
        )  # fmt: skip

    def close(self) -> None:
        """Release the probe's Kafka client (idempotent)."""
        close, self._close = self._close, None
        if close is not None:
            close()

    def observe_progress(self, progress: Mapping[str, Any]) -> None:
        """Take the positions of one StreamingQueryProgress; probe log starts when due."""
        for tp, pos in positions_from_progress(progress, self._topics).items():
            self._positions[tp] = pos
            labels = {"topic": tp[0], "partition": str(tp[1])}
            self.next_offset.labels(**labels).set(pos.next_offset)
            self.latest_offset.labels(**labels).set(pos.latest_offset)
            self.behind.labels(**labels).set(pos.behind)
            # a partition seen is exported at once, so a rule never meets a missing series
            self.expired.labels(**labels)
        self.probe()

    def probe(self) -> None:
        """Ask the broker for the log start of every known partition, at most once per interval."""
        now = self._clock()
        if self._watermarks is None or now < self._next_probe:
            return
        self._next_probe = now + self._interval
        for tp, pos in list(self._positions.items()):
            try:
                low, _high = self._watermarks(*tp)
            except Exception as exc:  # noqa: BLE001  a failed probe must never stop the dedup
                log.warning("log start of %s/%d unknown this round: %s", tp[0], tp[1], exc)
                return
            labels = {"topic": tp[0], "partition": str(tp[1])}
            self.log_start.labels(**labels).set(low)
            lost = self._expiry.observe(tp, pos.next_offset, low)
            if lost:
                log.error(
                    "%d raw records of %s/%d were deleted by retention before the dedup read "
                    "them (offsets %d..%d): they are lost unless a resend brings them again",
                    lost, tp[0], tp[1], low - lost, low - 1,
                )  # fmt: skip
                self.expired.labels(**labels).inc(lost)


def kafka_watermarks(
    conf: Mapping[str, Any],
) -> tuple[Callable[[str, int], tuple[int, int]], Callable[[], None]]:
    """A ``(topic, partition) -> (low, high)`` function over one consumer, and its ``close``."""
    from confluent_kafka import TopicPartition  # noqa: PLC0415  keeps the module pure

    from runtime import kafka  # noqa: PLC0415  as above

    consumer = kafka.consumer(conf)

    def watermarks(topic: str, partition: int) -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=PROBE_TIMEOUT_S, cached=False
        )
        return int(low), int(high)

    return watermarks, consumer.close


def consumer_conf(
    kafka_conf: Mapping[str, str],
    source_options: Mapping[str, str],
    *,
    group_id: str,
    max_record_size: int = 0,
) -> dict[str, Any]:
    """librdkafka settings of a consumer that reads the raw topic as Spark's source does (the
    retention probe) (``kafka_conf`` includes bootstrap.servers).

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
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
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
