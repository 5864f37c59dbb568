"""Write decoded records to the downstream raw topic as runs (raw layout v2), never blocking the
socket reader.

Guarantee: every record handed to :meth:`RawTopicSink.write_batch` ends in exactly one of three
states, each counted: delivered to the raw topic inside one run (``delivered``), reported lost with
its ``(topic, partition, offset)`` in a logged range (``downstream_overflow`` drop or
``delivery_errors``), or still held when the process is killed without SIGTERM. Nothing is dropped
silently.

Layout (docs/topics.md, "Layout v2"): records are coalesced by ``receiver.runs.RunCoalescer`` into
runs of one (session, topic, partition), across datagrams, up to ``run_max_bytes`` and for at most
``run_linger`` seconds; one run is one raw record (key
``<topic>:<partition>:<first>-<last>[/stride]``, value a one-group ``RecordBatch``, header
``diode.session``). A partition's open runs are finished
and produced before its control records (heartbeats, withheld ranges), so the raw topic keeps a
partition's records ahead of its heartbeat, as the dedup needs. The receiver writes only v2; the
dedup reads v1 and v2.

Delivery order and buffering:

1. ``producer.produce()`` never blocks: when librdkafka's queue (bounded by ``buffer_max_records``
   raw records / ``buffer_max_bytes``) is full it raises ``BufferError``.
2. Runs that cannot be produced yet (queue full, or the raw topic's partition count still being
   looked up) wait in a per-raw-topic **backlog** of at most ``backlog_max_records`` source
   records, in order (control records queue behind the runs before them); :meth:`service` (called
   after every socket wakeup and on a short timer) moves them into the producer as soon as it
   takes them.
3. A run that finds the backlog full is **overflow**: counted as the drop reason
   ``downstream_overflow`` (once per record) and every offset of it added to the loss report,
   logged as ranges every ``overflow_report_interval`` seconds so an operator knows what to resend.
4. librdkafka retries delivery itself (idempotent, ``acks=all``); with ``message.timeout.ms=0``
   (the default) a record waits for a broker that is away as long as it takes, so a restart of the
   downstream broker loses nothing that fit the buffers.
5. On shutdown :meth:`close` finishes the open runs, flushes for at most ``shutdown_timeout``
   seconds, then purges what is left and reports it as lost ranges.

Delivery reports: one per raw record, that is per run (``delivery.report.only.error`` is false):
a success adds the run's record count to ``delivered``; a failure parses the run's key
(``common.raw_run.parse_run_key``) and reports every offset of the run as lost.

Timestamps: raw records carry the **receiver's** clock (``produce(..., timestamp=0)``), never the
source timestamp, so the raw topic does not depend on the source clock being acceptable to the
downstream broker (Kafka refuses CreateTime more than ``message.timestamp.after.max.ms``, one hour
by default in Kafka 4, ahead of its clock); the run's value keeps every source timestamp and the
dedup restores them for the clean topic (docs/topics.md).

Refusals: ``produce()`` refusing one raw record (``KafkaException`` such as
``MSG_SIZE_TOO_LARGE``) fails that run only, every offset of it reported in the loss report as
``delivery_errors``; the rest is written.

Partition counts come from metadata lookups on a worker thread (they block), cached per raw topic
and refreshed every ``metadata_refresh`` seconds; the raw partition is the source partition modulo
that count (docs/topics.md). A finished lookup is applied by the next :meth:`service`, so the first
runs of a new raw topic wait in the backlog for the lookup itself (milliseconds), not for the
once-a-second :meth:`tick`.

Raw topics made here (``create_raw_topic``): the first lookup of a raw topic not yet known to exist
first ensures it (``topic_ensure``: ``receiver.topic_check.ensure_raw_topic``, the same partitions,
replication, ``min.insync.replicas`` and ``max.message.bytes`` as the fixed raw topic at start-up),
on the same metadata thread and before the producer's metadata request, which a broker with
``auto.create.topics.enable`` would answer by creating the topic with its own defaults. That is how
each topic of a ``{topic}`` template is made when its first source record arrives. A refusal is
logged (an ERROR naming the setting) and the lookup goes on: records wait in the backlog and the
creation is tried again with the next lookup. A topic is ensured once (until the set of ensured
topics reaches its bound and is forgotten).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from common.errors import ConfigError
from common.logging import RateLimitedLog
from common.raw_run import SESSION_HEADER, parse_run_key
from common.raw_topic import (
    HEARTBEAT_HEADERS,
    WITHHELD_HEADERS,
    Headers,
    heartbeat_records,
    parse_raw_key,
    raw_partition_of,
    withheld_records,
)
from common.wire.events import Heartbeat, RecordBatch, Withheld
from receiver.config import ReceiverConfig
from receiver.heartbeat_repeats import HeartbeatRepeats
from receiver.loss_report import LossReport, format_ranges
from receiver.metrics import DOWNSTREAM_OVERFLOW, ReceiverStats
from receiver.runs import Run, RunCoalescer
from runtime import kafka

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("receiver.librdkafka")


class _PerFacilityLimit(logging.Filter):
    """librdkafka logs every failed reconnect; let ``burst`` lines per facility per ``period``."""

    def __init__(self, period: float = 30.0, burst: int = 3) -> None:
        super().__init__()
        self._period = period
        self._burst = burst
        self._windows: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        key = str(args[0]) if args else str(record.msg)[:40]
        start, passed = self._windows.get(key, (record.created, 0))
        if record.created - start >= self._period:
            start, passed = record.created, 0
        if len(self._windows) < 256 or key in self._windows:
            self._windows[key] = (start, passed + 1)
        return passed < self._burst


librdkafka_log.addFilter(_PerFacilityLimit())


class ProducerApi(Protocol):
    """The part of ``confluent_kafka.Producer`` the sink uses (a seam for pure unit tests)."""

    def produce(  # noqa: PLR0917  confluent-kafka's signature; the sink calls it positionally
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callable[[Any, Any], None] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
        timestamp: int = 0,
        headers: Headers | None = None,
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def purge(
        self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True
    ) -> None: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...

    def __len__(self) -> int: ...


#: Builds the producer from librdkafka properties (plus the Python client's callback keys).
ProducerFactory = Callable[[dict[str, Any]], ProducerApi]

#: A raw record waiting in the backlog: (raw topic, source topic, source partition, first offset,
#: last offset, stride, value, key, headers, source records). A control record has first -1 and
#: 0 records (it carries no source record).
_Item = tuple[str, str, int, int, int, int, bytes | None, str, Headers, int]
_RETRY_LOOKUP = 2.0  # seconds between metadata attempts for a topic that is not there yet
_POLL_INTERVAL = 0.005  # at most one producer.poll(0) per this many seconds from service()
_MAX_SESSIONS = 1024  # diode.session headers cached (session ids come from the wire)
_MAX_ENSURED = 100_000  # raw topics remembered as ensured (topic names come from the wire)


def _item_bytes(item: _Item) -> int:
    """What a backlog item holds in memory, as ``backlog_max_bytes`` counts it."""
    value = item[6]
    return (len(value) if value is not None else 0) + len(item[7])


#: Makes a raw topic when it is missing; True if this call created it (receiver.topic_check).
TopicEnsure = Callable[[ReceiverConfig, str], bool]
#: What a metadata lookup found: the partition count (None: not there) and, when it tried to
#: create the topic and was refused, why.
_Found = tuple[int | None, str | None]


class RawTopicSink:
    """Idempotent producer for the raw topic, with a bounded backlog and a loss report."""

    def __init__(
        self,
        config: ReceiverConfig,
        stats: ReceiverStats,
        *,
        producer_factory: ProducerFactory = kafka.producer,
        topic_check: Callable[[ReceiverConfig, str], str | None] | None = None,
        topic_ensure: TopicEnsure | None = None,
    ) -> None:
        self._config = config
        self._stats = stats
        self._rlog = RateLimitedLog(log)
        self._producer_factory = producer_factory
        #: which partitions of a heartbeat say something new (the dedup batches on each record)
        self._repeats = HeartbeatRepeats(config.heartbeat_repeat_interval)
        #: checks a raw topic's limits (receiver.topic_check) when it is first used; None: off
        self._topic_check = topic_check
        self._checks: dict[str, concurrent.futures.Future[str | None]] = {}
        #: raw topics whose limits are checked elsewhere (the fixed raw topic, at start-up)
        self.checked_elsewhere: set[str] = set()
        #: creates a missing raw topic before its first lookup (module docstring); None: off
        self._topic_ensure = topic_ensure
        #: raw topics known to exist (found by a lookup), never ensured again
        self.ensured: set[str] = set()
        self._producer = self._new_producer()
        self._runs = RunCoalescer(config.run_max_bytes, config.run_linger)
        self._finished: list[Run] = []  # runs finished by the coalescer, produced at once
        self._raw_topics: dict[str, str] = {}  # source topic -> raw topic
        self._partitions: dict[str, int] = {}  # raw topic -> partition count
        self._refreshed: dict[str, float] = {}  # raw topic -> monotonic time of last lookup
        self._lookups: dict[str, concurrent.futures.Future[_Found]] = {}
        self._retry_at: dict[str, float] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "receiver-metadata")
        self._backlog: dict[str, deque[_Item]] = {}  # raw topic -> waiting items, in order
        self._backlog_records = 0
        self._backlog_bytes = 0
        self._overflow = LossReport()
        self._failed = LossReport()
        self._fatal: KafkaError | None = None
        self._session_headers: dict[bytes, Headers] = {}
        self._next_poll = 0.0
        self._closed = False

    # -- producer -----------------------------------------------------------------------------

    def _new_producer(self) -> ProducerApi:
        props: dict[str, Any] = dict(self._config.producer_config())
        # One report per raw record (a run): successes count delivered records, failures name
        # the run's offsets. The Python client wants a bool here.
        props["delivery.report.only.error"] = False
        props["on_delivery"] = self._on_delivery
        props["error_cb"] = self._on_error
        props["logger"] = librdkafka_log
        return self._producer_factory(props)

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        # Called from poll()/flush() on the thread that polls: the event loop thread.
        key = msg.key()
        run = parse_run_key(key)
        if err is None:
            self._stats.delivered += (run[3] - run[2]) // run[4] + 1 if run else 1
            return
        self._stats.delivery_errors += 1
        if run is not None:
            topic, partition, first, last, stride = run
            self._lose(self._failed, topic, partition, range(first, last + 1, stride))
        else:  # a control record (v1-form key): its offset, as the v1 sink reported it
            parsed = parse_raw_key(key)
            if parsed is not None:
                self._failed.add(*parsed)
        hint = ""
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            hint = " (raise the topic's max.message.bytes: docs/operations.md, Large records)"
        self._rlog.warning("delivery", "delivery to %s failed: %s%s", msg.topic(), err, hint)

    @staticmethod
    def _lose(report: LossReport, topic: str, partition: int, offsets: range) -> None:
        for offset in offsets:
            report.add(topic, partition, offset)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            log.error("downstream producer fatal error: %s; a new producer will be created", err)
            return
        self._rlog.warning("kafka-error", "downstream Kafka: %s", err)

    # -- writing ------------------------------------------------------------------------------

    def _raw_topic(self, source_topic: str) -> str:
        raw = self._raw_topics.get(source_topic)
        if raw is None:
            if len(self._raw_topics) > 100_000:
                self._raw_topics.clear()  # bounded: topic names come from the wire
            raw = self._raw_topics[source_topic] = self._config.raw_topic_for(source_topic)
        return raw

    def _session_header(self, session_id: bytes) -> Headers:
        headers = self._session_headers.get(session_id)
        if headers is None:
            if len(self._session_headers) >= _MAX_SESSIONS:
                self._session_headers.clear()
            headers = [(SESSION_HEADER, session_id.hex().encode("ascii"))]
            self._session_headers[session_id] = headers
        return headers

    def write_batch(self, batch: RecordBatch, now: float | None = None) -> None:
        """Add every record of ``batch`` to its open run; produce the runs this finishes."""
        if now is None:
            now = time.monotonic()
        runs, finished = self._runs, self._finished
        session_id = batch.session_id
        for group in batch.groups:
            runs.add_group(session_id, group, now, finished)
        deadline = runs.next_deadline()
        if deadline is not None and deadline <= now:
            runs.flush_due(now, finished)
        if finished:
            self._produce_runs()

    def _produce_runs(self) -> None:
        finished = self._finished
        produce = self._producer.produce
        partitions = self._partitions
        backlog = self._backlog
        raw_topics = self._raw_topics
        produced = 0
        for run in finished:
            topic = run.topic
            raw = raw_topics.get(topic) or self._raw_topic(topic)
            headers = self._session_header(run.session_id)
            count = partitions.get(raw)
            if count is not None and raw not in backlog:
                try:
                    # positional: keywords would cost produce() a dict per call.
                    # Timestamp 0: the receiver's clock (module docstring, "Timestamps").
                    produce(
                        raw,
                        run.value,
                        run.key,
                        raw_partition_of(run.partition, count),
                        None,
                        None,
                        0,
                        headers,
                    )
                    produced += run.count
                    continue
                except BufferError:
                    pass
                except Exception as exc:  # noqa: BLE001  one run's refusal, reported
                    self._refused(topic, run.partition, run.offsets(), run.key, exc)
                    continue
            self._hold(
                (
                    raw,
                    topic,
                    run.partition,
                    run.first,
                    run.last,
                    run.stride,
                    run.value,
                    run.key,
                    headers,
                    run.count,
                )
            )
        finished.clear()
        self._stats.produced += produced

    def flush_runs(self, now: float | None = None) -> None:
        """Produce the runs open for ``run_linger`` or longer (the caller's timer)."""
        runs = self._runs
        deadline = runs.next_deadline()
        if deadline is None:
            return
        if now is None:
            now = time.monotonic()
        if deadline <= now:
            runs.flush_due(now, self._finished)
            self._produce_runs()

    def next_deadline(self) -> float | None:
        """When the oldest open run must be produced (``run_linger``), or None."""
        return self._runs.next_deadline()

    @property
    def open_records(self) -> int:
        """Records in open runs (coalescing, not yet produced)."""
        return self._runs.records

    def write_heartbeat(self, beat: Heartbeat, now: float | None = None) -> None:
        """One control record per partition of ``beat`` (docs/topics.md, heartbeats), each after
        that partition's open runs; a partition whose heartbeat repeats the last one written is
        skipped for ``heartbeat_repeat_interval`` (``receiver/heartbeat_repeats.py``)."""
        repeats = self._repeats
        dropped = repeats.dropped
        selected = repeats.select(beat, time.monotonic() if now is None else now)
        self._stats.heartbeat_repeats += repeats.dropped - dropped
        if selected is not None:
            self._write_control(heartbeat_records(selected), HEARTBEAT_HEADERS)

    def write_withheld(self, event: Withheld) -> None:
        """One control record per range of ``event`` (docs/topics.md, withheld ranges), each after
        that partition's open runs."""
        self._write_control(withheld_records(event), WITHHELD_HEADERS)

    def _write_control(
        self, records: Iterable[tuple[str, int, str, bytes]], headers: Headers
    ) -> None:
        for topic, partition, key, value in records:
            # docs/topics.md: a partition's records precede its control records in the raw topic
            self._runs.flush_partition(topic, partition, self._finished)
            if self._finished:
                self._produce_runs()
            raw = self._raw_topic(topic)
            item: _Item = (raw, topic, partition, -1, -1, 1, value, key, headers, 0)
            # behind anything of the same raw topic already waiting: order is kept
            if raw in self._backlog or not self._produce_item(item):
                self._hold(item)

    def _produce_item(self, item: _Item) -> bool:
        raw, topic, partition, first, last, stride, value, key, headers, records = item
        count = self._partitions.get(raw)
        if count is None:
            return False
        try:
            # positional: keyword arguments cost produce() a dict per call
            self._producer.produce(
                raw, value, key, raw_partition_of(partition, count), None, None, 0, headers
            )
        except BufferError:
            return False
        except Exception as exc:  # noqa: BLE001  one record's refusal, reported; never a wedge
            offsets = range(first, last + 1, stride) if first >= 0 else range(0)
            self._refused(topic, partition, offsets, key, exc)
            return True
        self._stats.produced += records or 1
        return True

    def _refused(
        self, topic: str, partition: int, offsets: range, key: str, exc: Exception
    ) -> None:
        # Refused at produce() time (too large, ...): this raw record only; the rest goes on.
        # Its offsets join the loss report like a failed delivery, so an operator knows what to
        # resend.
        self._stats.delivery_errors += 1
        self._lose(self._failed, topic, partition, offsets)
        self._rlog.warning("refused", "producer refused %s: %s", key, exc)

    def _hold(self, item: _Item) -> None:
        raw, records = item[0], item[9]
        # strict bounds: a run that would take the backlog past either limit overflows whole;
        # an empty backlog takes one record larger than backlog_max_bytes (max_record_size may
        # be raised past it), or such a record could never wait for its raw topic's metadata
        size = _item_bytes(item)
        if self._backlog_records + max(1, records) > self._config.backlog_max_records or (
            self._backlog_bytes and self._backlog_bytes + size > self._config.backlog_max_bytes
        ):
            self._stats.drop(DOWNSTREAM_OVERFLOW, max(1, records))
            # control records (heartbeats) are repeated by the sender anyway (an unchanged one
            # is written again within heartbeat_repeat_interval)
            if records:
                self._lose(self._overflow, item[1], item[2], range(item[3], item[4] + 1, item[5]))
            return
        queue = self._backlog.get(raw)
        if queue is None:
            queue = self._backlog[raw] = deque()
            if raw not in self._partitions:
                self._lookup(raw)
        queue.append(item)
        self._backlog_records += max(1, records)
        self._backlog_bytes += size

    # -- servicing ----------------------------------------------------------------------------

    def service(self, now: float | None = None) -> None:
        """Serve delivery reports, produce lingered runs, apply finished metadata lookups, move
        backlog into the producer; never blocks. Called after every socket burst, so it must stay
        cheap."""
        if now is None:
            now = time.monotonic()
        if now >= self._next_poll and len(self._producer):
            # Every 5 ms instead of after every burst (thousands a second) serves the same
            # reports in fewer calls (docs/benchmarks.md, Receiver); with nothing in flight there
            # is no report to serve (an idle receiver's 20 wakeups a second stay cheap); tick()
            # polls once a second regardless, for librdkafka's error and log callbacks.
            self._next_poll = now + _POLL_INTERVAL
            self._producer.poll(0)
        self.flush_runs(now)
        if self._lookups:
            # A new raw topic's runs wait in the backlog until its partition count is known:
            # apply the answer as soon as it is there, not at the next tick (up to a second
            # later, long enough for the backlog to overflow at 100k records/s).
            self._collect_lookups(now)
        if self._backlog_records:
            self._drain_backlog()

    def _collect_lookups(self, now: float) -> None:
        for raw, future in list(self._lookups.items()):
            if future.done():
                del self._lookups[raw]
                self._lookup_done(raw, future, now)

    def _drain_backlog(self) -> None:
        for raw in list(self._backlog):
            if raw not in self._partitions:
                continue
            queue = self._backlog[raw]
            while queue:
                if not self._produce_item(queue[0]):
                    return  # producer queue full: try again on the next service()
                done = queue.popleft()
                self._backlog_records -= max(1, done[9])
                self._backlog_bytes -= _item_bytes(done)
            del self._backlog[raw]

    @property
    def backlog_bytes(self) -> int:
        """Bytes of raw values and keys waiting in the backlog (``backlog_max_bytes``)."""
        return self._backlog_bytes

    @property
    def backlog_records(self) -> int:
        """Source records (and control records) waiting in the receiver before the producer."""
        return self._backlog_records

    @property
    def queued(self) -> int:
        """Raw records (runs and control records) in librdkafka's queue, not yet acknowledged."""
        return len(self._producer)

    def tick(self, now: float) -> None:
        """Once a second or so: metadata lookups and refreshes, loss reports, fatal recovery."""
        self._producer.poll(0)  # error and log callbacks, even with nothing in flight
        if self._fatal is not None:
            self._replace_producer()
        self._collect_lookups(now)
        for raw in list(self._backlog):
            waiting = raw not in self._partitions and raw not in self._lookups
            if waiting and now >= self._retry_at.get(raw, 0.0):
                self._lookup(raw)
        for raw, at in list(self._refreshed.items()):
            if now - at >= self._config.metadata_refresh and raw not in self._lookups:
                self._refreshed[raw] = now
                self._lookup(raw)
        for raw, future in list(self._checks.items()):
            if future.done():
                del self._checks[raw]
                problem = future.exception() or future.result()
                if problem:
                    log.error(
                        "%s; larger records are refused by the broker and reported as lost", problem
                    )
        self.report_losses(now)

    _last_report = 0.0

    def report_losses(self, now: float, *, force: bool = False) -> None:
        """Log overflowed and undeliverable ranges (at most every overflow_report_interval)."""
        if not force and now - self._last_report < self._config.overflow_report_interval:
            return
        self._last_report = now
        for report, what in (
            (self._overflow, "dropped: downstream buffers full (downstream_overflow)"),
            (self._failed, "could not be delivered to the raw topic"),
        ):
            if report:
                records, unlisted, ranges = report.take()
                log.error(
                    "%d records %s; resend these source ranges: %s%s",
                    records,
                    what,
                    format_ranges(ranges),
                    f" (+{unlisted} records of further partitions)" if unlisted else "",
                )

    def _lookup(self, raw: str) -> None:
        if raw in self._lookups or self._closed:
            return
        producer, config = self._producer, self._config
        ensure = None if raw in self.ensured else self._topic_ensure
        self._lookups[raw] = self._executor.submit(_look_up, producer, config, raw, ensure)

    def _lookup_done(self, raw: str, future: concurrent.futures.Future[_Found], now: float) -> None:
        try:
            count, refused = future.result()
        except KafkaException as exc:
            count, refused = None, None
            self._rlog.warning("metadata", "metadata for raw topic %s failed: %s", raw, exc)
        if refused is not None:
            self._rlog.log(
                logging.ERROR,
                "create-refused",
                "cannot create raw topic %s: %s; its records wait in the backlog (up to %d)",
                raw,
                refused,
                self._config.backlog_max_records,
            )
        if count is not None:
            if len(self.ensured) >= _MAX_ENSURED:
                self.ensured.clear()
            self.ensured.add(raw)
        if count is None:
            self._retry_at[raw] = now + _RETRY_LOOKUP
            self._rlog.warning(
                "metadata-missing",
                "raw topic %s is not available downstream yet; records wait in the backlog",
                raw,
            )
            return
        old = self._partitions.get(raw)
        if old is not None and old != count:
            log.warning("raw topic %s now has %d partitions (was %d)", raw, count, old)
        elif old is None:
            log.info("raw topic %s has %d partitions", raw, count)
            if self._topic_check is not None and raw not in self.checked_elsewhere:
                # first seen now, records already flowing: a problem is logged (the fixed raw
                # topic, when it is there at start-up, is checked there and stops the receiver)
                self._checks[raw] = self._executor.submit(self._topic_check, self._config, raw)
        self._partitions[raw] = count
        self._refreshed[raw] = now

    async def wait_metadata(self, raw: str, limit: float) -> bool:
        """Look up ``raw``'s partition count now (start-up); ``False`` if not known in time."""
        self._lookup(raw)
        deadline = time.monotonic() + limit
        while raw not in self._partitions and time.monotonic() < deadline:
            future = self._lookups.get(raw)
            if future is None:
                self._lookup(raw)
                future = self._lookups[raw]
            await asyncio.wait([asyncio.wrap_future(future)], timeout=deadline - time.monotonic())
            if future.done():
                self._lookups.pop(raw, None)
                self._lookup_done(raw, future, time.monotonic())
                if raw not in self._partitions:
                    await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        return raw in self._partitions

    def _replace_producer(self) -> None:
        old, self._fatal = self._producer, None
        old.purge(in_queue=True, in_flight=True)
        old.flush(0)  # purged runs come back as delivery errors -> loss report
        self._producer = self._new_producer()

    # -- shutdown -----------------------------------------------------------------------------

    async def close(self, limit: float) -> int:
        """Produce the open runs, flush for at most ``limit`` seconds; report and return the raw
        records (runs, control records) that could not be written."""
        self._runs.flush_all(self._finished)
        if self._finished:
            self._produce_runs()
        self._closed = True
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            self.tick(time.monotonic())
            self.service()
            if not self._backlog_records and len(self._producer) == 0:
                break
            self._producer.flush(min(0.1, max(0.0, deadline - time.monotonic())))
            await asyncio.sleep(0)
        lost = len(self._producer) + sum(len(queue) for queue in self._backlog.values())
        if lost:
            log.error("shutdown timeout: %d raw records were not written to the raw topic", lost)
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.flush(0)  # purged runs come back as delivery errors: loss report
            for queue in self._backlog.values():
                for item in queue:
                    if item[9]:
                        self._lose(
                            self._failed, item[1], item[2], range(item[3], item[4] + 1, item[5])
                        )
            self._backlog.clear()
            self._backlog_records = 0
            self._backlog_bytes = 0
        self.report_losses(time.monotonic(), force=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        return lost


def _look_up(
    producer: ProducerApi, config: ReceiverConfig, raw: str, ensure: TopicEnsure | None
) -> _Found:
    """Ensure ``raw`` exists (when ``ensure`` is given), then count its partitions (blocking;
    runs on the metadata thread)."""
    refused = None
    if ensure is not None:
        try:
            ensure(config, raw)
        except ConfigError as exc:
            refused = str(exc)
    return _partition_count(producer, raw, config.metadata_timeout), refused


def _partition_count(producer: ProducerApi, raw: str, timeout: float) -> int | None:
    """Partition count of ``raw`` (blocking; runs on the metadata thread), None if not there."""
    metadata = producer.list_topics(topic=raw, timeout=timeout)
    topic = metadata.topics.get(raw)
    if topic is None or topic.error is not None or not topic.partitions:
        return None
    return len(topic.partitions)
