"""Running the dedup query until it stops (``kafka-diode dedup``).

Guarantees: the query runs until SIGTERM/Ctrl+C (graceful: the running micro-batch is allowed to
finish, then the query stops; a second signal stops at once — still safe, the batch is replayed
from the checkpoint and fenced), ``--until-idle``, ``--until-settled`` or ``--max-batches``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from common import settings
from common.errors import KafkaClientError
from dedup import class_archive
from dedup.config import DedupConfig
from dedup.idle_tick import IdleTicker
from dedup.layouts import StateLayout, implementation
from dedup.raw_position import reads_behind
from runtime import kafka, service

if TYPE_CHECKING:
    from common.metrics import CollectorRegistry
    from dedup.raw_position import RawPositionMetrics

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1
STOP_WAIT_S = 300.0
#: Seconds one probe of the downstream cluster may take at start-up (``wait_for_kafka``).
KAFKA_PROBE_S = 10.0
#: While waiting for the downstream cluster at start-up, a WARNING this often (seconds).
KAFKA_WAIT_SAY_S = 60.0
#: Seconds between two tries to start the query while the cluster is moving (``start_retrying``).
KAFKA_RETRY_S = 5.0
_Q = TypeVar("_Q")


def run(
    config: DedupConfig,
    *,
    until_idle: float | None = None,
    until_settled: bool = False,
    max_batches: int | None = None,
) -> int:
    """Start Spark and the query, and block until it stops; returns the exit code."""
    from dedup import job  # noqa: PLC0415  imports pyspark
    from dedup.batch_driver import TransactionalBatchWriter  # noqa: PLC0415
    from dedup.metrics import DedupMetrics  # noqa: PLC0415
    from dedup.writer_settings import WriterSettings  # noqa: PLC0415
    from runtime.maven import spark_connector_jars  # noqa: PLC0415
    from runtime.metrics_http import serve  # noqa: PLC0415

    log.info("dedup settings: %s", json.dumps(settings.describe(config)))
    metrics = DedupMetrics()
    serve(metrics.registry, config.metrics_port, config.metrics_addr)
    stop = threading.Event()

    def on_stop(signame: str) -> None:
        log.info("%s: stopping after the running micro-batch", signame)
        stop.set()

    with service.thread_signals(service.StopRequests(on_stop)):
        if not wait_for_kafka(config, stop):
            return EXIT_OK
        raw_partitions = 0
        if implementation(config.new_state_layout).NEEDS_RAW_TOPIC:
            raw_partitions = wait_for_raw_topic(config, stop)
            if not raw_partitions:
                return EXIT_OK
    writer = TransactionalBatchWriter(writer_settings(config, WriterSettings), metrics)
    writer.scan_interval_s = config.gap_emit_interval_sec
    raw = raw_position_metrics(config, metrics.registry)
    jars = [str(path) for path in spark_connector_jars()]
    archive = class_archive_plan(config, jars) if job.launches_jvm() else None
    spark = job.build_session(config, jars, raw_partitions, archive.option if archive else "")
    class_archive.check_mapped(archive, driver_jvm())
    with service.thread_signals(service.StopRequests(on_stop)):
        started = start_retrying(lambda: job.start_query(spark, config, writer), stop)
    if started is None:
        stop_spark(spark, requested=True)
        class_archive.finish(archive, driver_jvm())
        return EXIT_OK
    query = started
    ticker, close_ticks = idle_ticker(config, writer.layout)
    requests = service.StopRequests(
        on_stop,
        on_again=lambda _signame: query.stop(),
        again="stopping at once (the batch is replayed on restart)",
    )
    try:
        with service.thread_signals(requests):
            return drive(
                query,
                writer,
                metrics,
                stop,
                until_idle=until_idle,
                until_settled=until_settled,
                max_batches=max_batches,
                raw=raw,
                ticker=ticker,
            )
    finally:
        close_ticks()
        writer.close()
        raw.close()
        stop_spark(spark, requested=stop.is_set())
        class_archive.finish(archive, driver_jvm())


def class_archive_plan(config: DedupConfig, jars: list[str]) -> class_archive.ArchivePlan | None:
    """This start's use of the driver JVM's class archive (``JVM_CLASS_ARCHIVE_DIR``)."""
    import pyspark  # noqa: PLC0415  heavy

    from runtime.maven import cache_root, java_path  # noqa: PLC0415

    folder = class_archive.directory(config.jvm_class_archive_dir, os.environ, cache_root())
    java = java_path()
    if folder is None or java is None:
        return None
    home = os.environ.get("SPARK_HOME", "").strip()
    spark_jars = (Path(home) if home else Path(pyspark.__file__).parent) / "jars"
    name = class_archive.archive_name(Path(java), [spark_jars], jars)
    return class_archive.plan(
        folder, name, explicit=class_archive.named(config.jvm_class_archive_dir)
    )


def driver_jvm() -> Any:
    """The driver JVM's process that pyspark started (None: none, or not known)."""
    from pyspark import SparkContext  # noqa: PLC0415  heavy

    return getattr(SparkContext._gateway, "proc", None)  # pyspark keeps its Popen there


class _Waiting:
    """A start-up wait's WARNING: said at the first call, then at most every ``say_every``
    seconds, with the seconds waited so far as its last argument."""

    def __init__(self, say_every: float) -> None:
        self.began = time.monotonic()
        self.say_every = say_every
        self.said = -say_every

    def waited(self) -> float:
        return time.monotonic() - self.began

    def say(self, message: str, *args: object) -> None:
        waited = self.waited()
        if waited - self.said >= self.say_every:
            self.said = waited
            log.warning(message, *args, waited)


def wait_for_kafka(
    config: DedupConfig,
    stop: threading.Event,
    *,
    probe_timeout: float = KAFKA_PROBE_S,
    say_every: float = KAFKA_WAIT_SAY_S,
) -> bool:
    """Wait, before Spark starts, until the downstream cluster answers; False if ``stop`` was set
    first. A start while the cluster is away (a restart by systemd during an outage) therefore
    waits instead of failing: failing starts would use up the unit's start limit
    (``StartLimitBurst``) and leave the dedup down after the outage (docs/dedup.md "Running it").
    """
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    waiting = _Waiting(say_every)
    while not stop.is_set():
        try:
            kafka.broker_count(conf, probe_timeout)
        except KafkaClientError as exc:
            waiting.say(
                "downstream Kafka at %s does not answer (%s); waiting for it (%.0f s so far) "
                "before starting Spark",
                config.bootstrap_servers,
                exc,
            )
            stop.wait(1.0)  # a retry interval with a stop check, not a synchronisation
            continue
        if waiting.waited() > probe_timeout:
            log.info("downstream Kafka answers after %.0f s", waiting.waited())
        return True
    return False


def wait_for_raw_topic(
    config: DedupConfig, stop: threading.Event, *, say_every: float = KAFKA_WAIT_SAY_S
) -> int:
    """Wait until the (first) raw topic exists: its partition count; 0 if ``stop`` was set first.

    The direct layout takes the raw topic's partition count when its checkpoint is created
    (docs/dedup.md "The direct layout"), and the receiver creates the topic: a dedup started
    first waits for it, with a WARNING once a minute, instead of failing its start.
    """
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    topic = config.raw_topics[0]
    waiting = _Waiting(say_every)
    while not stop.is_set():
        try:
            partitions = kafka.topic_partitions(conf, topic, KAFKA_PROBE_S)
            if partitions > 0:
                return partitions
            why = "does not exist yet (the receiver creates it)"
        except KafkaClientError as exc:
            why = f"cannot be described ({exc})"
        waiting.say("raw topic %s %s; waiting for it (%.0f s so far)", topic, why)
        stop.wait(1.0)  # a retry interval with a stop check, not a synchronisation
    return 0


def start_retrying(
    start: Callable[[], _Q],
    stop: threading.Event,
    *,
    pause: float = KAFKA_RETRY_S,
    say_every: float = KAFKA_WAIT_SAY_S,
) -> _Q | None:
    """``start()``, tried again every ``pause`` seconds while it fails with a retriable
    :class:`KafkaClientError`; None if ``stop`` was set first.

    Starting the query creates the dedup's topics and reads the raw topic's partitions: a broker
    or controller failing over meanwhile ends a request in a timeout (``runtime.kafka``'s
    ``TRANSIENT_ERRORS``) that a new try gets past. Exiting instead would leave it to systemd's
    restart, and its start limit, as ``wait_for_kafka`` explains. Anything else is raised.
    """
    waiting = _Waiting(say_every)
    while not stop.is_set():
        try:
            return start()
        except KafkaClientError as exc:
            if not exc.retriable:
                raise
            waiting.say(
                "downstream Kafka could not ready the dedup's topics (%s); trying again every "
                "%.0f s (%.0f s so far)",
                exc,
                pause,
            )
        stop.wait(pause)  # a retry interval with a stop check, not a synchronisation
    return None


def _jvm_gone(exc: BaseException) -> bool:
    """True if ``exc`` says Spark's JVM is no longer there (py4j cannot reach it)."""
    from py4j.protocol import Py4JNetworkError  # type: ignore[import-untyped]  # noqa: PLC0415

    return isinstance(exc, ConnectionError | Py4JNetworkError)


def drive(
    query: Any,
    writer: Any,
    metrics: Any,
    stop: threading.Event,
    *,
    until_idle: float | None = None,
    until_settled: bool = False,
    max_batches: int | None = None,
    raw: RawPositionMetrics | None = None,
    ticker: IdleTicker | None = None,
) -> int:
    """Watch the query until it ends or ``stop`` is set; returns the exit code.

    ``ticker`` (dedup/idle_tick.py) writes a tick to the control topic when no batch ran for a
    gap-scan interval, so that the scans run although Spark runs no batch without input.

    If the JVM is gone while a requested stop is under way (systemd's KillMode=control-group
    signals the JVM too), the stop succeeded: exit 0. Gone without a request: exit 1.
    """
    last_progress: Any = None
    behind = False  # the last batch left input unread (a bounded batch in a backlog)
    settled = False  # the last batch changed nothing and left no gap pending (idle_tick.py)
    try:
        while query.isActive:
            query.awaitTermination(0.5)
            progress = query.lastProgress
            if progress is not None and progress.get("id") and progress != last_progress:
                metrics.observe_progress(progress)
                if raw is not None:
                    raw.observe_progress(progress)
                last_progress = progress
                behind = reads_behind(progress)
                log.debug("batch %s took (ms): %s; state: %s", progress.get("batchId"),
                          progress.get("durationMs"), _state_timings(progress))  # fmt: skip
            # idle only with nothing left to read: between two batches of a backlog a loaded
            # driver can plan for longer than --until-idle
            idle = 0.0 if behind else writer.idle_s(time.monotonic())
            if ticker is not None and not behind:
                if writer.settled != settled:
                    settled = writer.settled
                    log.info(
                        "gap scans %s: idle ticks every %.0f s",
                        "settled" if settled else "busy again",
                        ticker.idle_wait(settled=settled),
                    )
                ticker.poll(
                    time.monotonic(),
                    batches_seen=writer.batches_seen,
                    in_batch=writer.in_batch,
                    settled=settled,
                )
            if until_idle is not None and writer.batches_seen and idle >= until_idle:
                log.info("no input for %.1f s: stopping", until_idle)
                stop.set()
            if until_settled and not behind and writer.settled and not writer.in_batch:
                # a batch found nothing to read and left no gap pending: every gap is reported
                # and nothing changes until input comes (dedup/idle_tick.py)
                log.info("nothing left to read and every gap reported: stopping")
                stop.set()
            if max_batches is not None and writer.batches_seen >= max_batches:
                log.info("%d micro-batches done: stopping", writer.batches_seen)
                stop.set()
            if stop.is_set():
                _graceful_stop(query, writer)
                break
        exception = query.exception()
    except Exception as exc:
        if not _jvm_gone(exc):
            raise
        if stop.is_set():
            log.info("Spark's JVM had already exited during the requested stop (%s): stopped", exc)
            return EXIT_OK
        log.error("Spark's JVM exited unexpectedly: %s", exc)  # noqa: TRY400  the diagnosis
        return EXIT_FAILED
    if exception is not None:
        log.error("the query failed: %s", exception)
        return EXIT_FAILED
    return EXIT_OK


def _state_timings(progress: dict[str, Any]) -> list[dict[str, Any]]:
    """The stateful operators' update, timeout and commit times of one batch (DEBUG lines)."""
    names = ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")
    return [{n: op.get(n) for n in names} for op in progress.get("stateOperators") or ()]


def stop_spark(spark: Any, *, requested: bool) -> None:
    """``spark.stop()``; a JVM that already exited is not an error (logged, never raised)."""
    try:
        spark.stop()
    except Exception as exc:
        if not _jvm_gone(exc):
            raise
        level = logging.INFO if requested else logging.WARNING
        log.log(level, "Spark's JVM had already exited when stopping the session: %s", exc)


def _graceful_stop(query: Any, writer: Any) -> None:
    """Let the running batch's write finish (bounded), then stop the query.

    Only a write under way is waited for: a trigger that is still reading offsets or running the
    stateful step is stopped (its batch is replayed from the offset log on restart), and without
    no-data batches an active trigger may never become a batch. Stopping between the writer's
    commit and Spark's commit log is safe: the batch is replayed on restart and skipped by the
    fence.
    """
    writer.request_stop()
    if writer.in_batch:  # if it ended since, ``between_batches`` is already set
        writer.between_batches.wait(STOP_WAIT_S)
    query.stop()


def idle_ticker(config: DedupConfig, layout: StateLayout) -> tuple[IdleTicker, Callable[[], None]]:
    """The driver's ticker over a producer to where ``layout`` says ticks go (its
    ``tick_targets``), and what closes it."""
    from common import raw_topic  # noqa: PLC0415

    producer = kafka.producer({"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf})

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:  # the next idle interval writes another
            log.warning("a tick to %s was not written: %s", config.control_topic, err)

    targets = layout.impl.tick_targets(config, layout)

    def write_tick() -> None:
        for topic, partition in targets:
            producer.produce(
                topic,
                b"",
                b"tick",
                partition,
                headers=raw_topic.TICK_HEADERS,
                on_delivery=delivered,
            )
        producer.poll(0)

    def close() -> None:
        producer.flush(5)

    return IdleTicker(write_tick, config.gap_emit_interval_sec, time.monotonic()), close


def raw_position_metrics(config: DedupConfig, registry: CollectorRegistry) -> RawPositionMetrics:
    """``kafka_diode_dedup_raw_*`` (dedup/raw_position.py) over a consumer of its own."""
    from dedup.raw_position import (  # noqa: PLC0415
        RawPositionMetrics,
        consumer_conf,
        kafka_watermarks,
    )

    base = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    conf = consumer_conf(base, config.kafka_source, group_id="kafka-diode-dedup.retention-probe")
    watermarks, close = kafka_watermarks(conf)
    return RawPositionMetrics(
        registry, config.raw_topics, watermarks, clock=time.monotonic, close=close
    )


def writer_settings(config: DedupConfig, cls: Any) -> Any:
    """The writer's settings from the job configuration."""
    return cls(
        bootstrap_servers=config.bootstrap_servers,
        clean_topic=config.clean_topic,
        gap_topic=config.gap_topic,
        progress_topic=config.progress_topic,
        state_topic=config.state_topic,
        transactional_id=config.writer_transactional_id,
        new_topic_partitions=config.new_topic_partitions,
        new_topic_replication=config.new_topic_replication,
        max_record_size=config.max_record_size,
        kafka_conf=dict(config.kafka_conf),
        raw_topics=(*config.raw_topics, config.control_topic),
    )
