"""The batch driver: each micro-batch's write tasks, run from ``foreachBatch``, and their results.

Guarantee: for a reader with ``isolation.level=read_committed``, the records of micro-batch ``N``
appear in the clean and gap topics **at most once**, and exactly once if the query ever completes
batch ``N``, however often the process or any task crashes, is retried or lingers as a zombie,
and however often the query restarts from the same checkpoint.

Where the work runs: nowhere near the driver. The query maps the layout's plan with
``write_task`` (``mapInArrow``, built once: ``task_function``; the direct layout's range source
runs it in its ``read``), and ``foreachBatch`` (driver) runs
each batch with one action: one task per partition of the stateful step (or per raw partition:
the direct layout), in the executors, in parallel. Each task learns its micro-batch from Spark's
task context (``TaskSpec.in_batch``). Each task
(``dedup/transaction.py``, ``dedup/direct_task.py``) produces the first-seen records with their
payload, its gap records and what says the batch is done in one transaction, and hands back a few
counters. The driver collects those (one row per task and one per source partition) for the
metrics (``dedup/metrics.py``).

The effectively-once argument is stated once, at the commit path every layout takes:
``dedup.commit.commit_batch`` (docs/dedup-internals.md "Effectively once" has the long form).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from common.errors import ServiceError
from common.raw_topic import TOPIC_FIELD
from common.topic_limits import TimestampWindow
from dedup.clean_topics import checked_clean_topic, create_dedup_topics, write_batch_bytes
from dedup.detect import DetectParams
from dedup.faults import fault
from dedup.layouts import Layout, StateLayout, implementation
from dedup.metrics import DedupMetrics
from dedup.range_reader import RangeReading
from dedup.task_result import decode_results, task_attempt, task_batch, task_result
from dedup.transaction import ORIGINAL_TIMESTAMP_HEADER
from dedup.writer_settings import BatchResult, TaskSpec, WriterSettings

log = logging.getLogger(__name__)


class TransactionalBatchWriter:
    """``foreachBatch`` target on the driver: runs each batch's write tasks, folds their results.

    The driver handles no record: the query maps the batch with ``write_task`` (one task per
    stateful partition, ``mapInArrow`` on the stateful step's output, so no shuffle: task ``p``
    holds exactly the groups of state partition ``p``), and the driver collects one ``task`` row
    and the ``stat`` rows of each.
    """

    def __init__(self, settings: WriterSettings, metrics: DedupMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._prepared = False
        #: a fixed clean topic checked at start-up -> the timestamps it accepts (to the tasks)
        self._windows: dict[str, TimestampWindow] = {}
        self.last: BatchResult | None = None
        self.committed_batches = 0
        #: micro-batches handed to this writer (committed, skipped or empty)
        self.batches_seen = 0
        #: monotonic time of the last batch with any input row (for --until-idle)
        self.last_input_at = time.monotonic()
        #: the last batch had no input and wrote nothing, and no partition it scanned holds a gap
        #: awaiting its second scan: further scans change nothing until input comes
        #: (dedup/idle_tick.py ticks less often then)
        self.settled = False
        #: the gap scans' interval (GAP_EMIT_INTERVAL_SEC), set by the runner: ``settled`` needs
        #: a batch this long after the last input
        self.scan_interval_s = 0.0
        #: a batch is being computed and written now (driver thread of Spark's stream execution);
        #: a slow batch is work, not idleness, so --until-idle never stops in the middle of one
        self.in_batch = False
        #: the last batch's task rows (tests, bench)
        self.last_tasks: pa.Table | None = None
        #: the checkpoint's state layout, set by ``dedup/job.py`` (its module runs the tasks)
        self.layout = StateLayout(Layout.BUCKETS)
        #: the detectors' settings, set by a layout whose tasks detect (``dedup/layouts/direct.py``)
        self.params: DetectParams | None = None
        #: how the tasks read their offset ranges, set by the direct layout's librdkafka reader
        self.reading: RangeReading | None = None
        #: set by ``request_stop``; ``between_batches`` is set when a batch call returns after it
        self._stop_requested = threading.Event()
        self.between_batches = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def bind(self, query_id: str) -> None:
        """Log the Spark query id (stable across restarts from one checkpoint: the tasks'
        markers and state records carry it; they read it from their task context)."""
        log.info("query %s started", query_id)

    def request_stop(self) -> None:
        """Ask to be told (``between_batches``) when the running batch call has returned."""
        self._stop_requested.set()

    def close(self) -> None:
        """Nothing to release: every transaction is complete when its task returns."""

    def prepare(self) -> None:
        """Ready the query's write side before it starts: the gap and progress topics, the write
        batch size they admit, a fixed clean topic checked (a clean topic too small stops the job
        here, on the driver, not in the tasks). Call before the layout's plan, which readies
        ``params`` and ``reading`` and then takes ``task_function``."""
        create_dedup_topics(
            self.settings, [self.settings.gap_topic, self.settings.progress_topic], compact=True
        )
        batch_bytes = write_batch_bytes(self.settings)
        self.settings = dataclasses.replace(self.settings, write_batch_bytes=batch_bytes)
        clean = self.settings.clean_topic
        if TOPIC_FIELD not in clean:
            self._windows[clean] = checked_clean_topic(self.settings, clean)
        log.info(
            "writer ready: transactional.id=%s-p<partition> batch.size=%s",
            self.settings.transactional_id,
            self.settings.kafka_conf.get("batch.size", batch_bytes),
        )
        self._prepared = True

    def task_function(self) -> functools.partial[Iterator[pa.RecordBatch]]:
        """The query's write task (``mapInArrow`` over the layout's plan, or the range source's
        ``read``), built once: each task takes its query and micro-batch from Spark's task
        context (``TaskSpec.in_batch``).

        Built per batch in ``foreachBatch`` instead, Spark would analyze and plan the mapped
        DataFrame again and the driver build and ship the Python function again every batch: a
        few ms of the driver's and the JVM's CPU in each (docs/dedup-internals.md, "A
        micro-batch's fixed cost in the JVM")."""
        if not self._prepared:
            raise ServiceError("the dedup's writer was not prepared before its query was planned")
        spec = TaskSpec(
            settings=self.settings,
            windows=dict(self._windows),
            layout=self.layout.kind,
            params=self.params,
            raw_partitions=self.layout.raw_partitions,
            transaction_groups=self.layout.transaction_groups,
            reading=self.reading,
        )
        return functools.partial(write_task, spec)

    # -- one micro-batch ---------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Write micro-batch ``batch_id``: a DataFrame in ``dedup.rows.OUTPUT_SCHEMA`` (the
        buckets layout), or the direct layout's offset ranges or Spark's Kafka source columns."""
        self.in_batch = True
        try:
            self._write_batch(df, batch_id)
        finally:
            self.in_batch = False
            if self._stop_requested.is_set():
                self.between_batches.set()

    def idle_s(self, now: float) -> float:
        """Seconds without input (0 while a batch runs: its input is not counted until written)."""
        return 0.0 if self.in_batch else now - self.last_input_at

    def _write_batch(self, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        # One action, which runs the batch's write tasks (the query maps its plan with
        # ``task_function``; no shuffle between the stateful step and the tasks: the class doc).
        table = decode_results(df.toArrow())
        fault("driver-after-commit", batch_id, 0)
        self.last = self.account(table, batch_id, started=started)
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

    def account(
        self, table: pa.Table, batch_id: int, *, started: float | None = None
    ) -> BatchResult:
        """Fold the tasks' result rows of one batch into the metrics (public for the bench);
        ``started``: the batch's monotonic start (None: not known, the bench's)."""
        input_before = self.last_input_at
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
        payload_bytes = int(pc.sum(written.column("payload_bytes")).as_py() or 0)
        record_bytes = int(pc.sum(written.column("record_bytes")).as_py() or 0)
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
        # The first batch of a process restarts the idle clock even without input: until it
        # ended the query had not looked at the raw topic (the JVM's start, the replay of a
        # batch the previous process logged but did not commit), so that time is not idleness.
        if inputs or records or fenced or self.batches_seen == 0:
            self.last_input_at = time.monotonic()
        pending = pc.sum(stats.column("pending_gaps")).as_py() or 0
        withheld = pc.sum(stats.column("withheld")).as_py() or 0
        # A partition is scanned once its last scan is an interval old, so a batch less than an
        # interval after input (a tick written while the first batch was planned, say) may have
        # scanned none of the gaps that input opened: not proof of a settled state.
        scanned = started is None or started - input_before >= self.scan_interval_s
        self.settled = scanned and not (
            inputs or withheld or records or gap_count or fenced or pending
        )
        if not result.skipped:
            self.committed_batches += 1
        if self.metrics is not None:
            self.metrics.timestamps_replaced.inc(replaced)
            self.metrics.write_payload_bytes.inc(payload_bytes)
            self.metrics.write_record_bytes.inc(record_bytes)
            self.metrics.forwarded.inc(records)
            self.metrics.gap_reports.inc(gap_count)
            self.metrics.transaction_parts.inc(int(pc.sum(tasks.column("parts")).as_py() or 0))
            if not result.skipped:
                self.metrics.batches.inc()
            if fenced:
                self.metrics.replayed.inc()
            self.metrics.add_stats(stats)
        return result


def write_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The write task of one micro-batch part (``mapInArrow``; runs in an executor), every layout.

    The layout's module runs it (``dedup/layouts/``: a state partition's output rows, or the
    records of one or more raw partitions' offset ranges, which the task reads and detects
    itself, one range after another). Each partition commits through
    ``dedup.commit.commit_batch`` with a fresh producer per attempt, whose
    ``init_transactions`` fences every earlier attempt (retries, zombies) before it reads what
    was committed, and hands back its ``stat`` rows and one ``task`` row as soon as it has
    committed. The rows stream in: one Arrow batch of payload in the task at a time.
    """
    partition, attempt = task_attempt()
    started = time.monotonic()
    if spec.batch_id < 0:
        spec = spec.in_batch(*task_batch(), now_ms=int(time.time() * 1000))
    nonempty = (b for b in batches if b.num_rows)
    for run in implementation(spec.layout).run_task(spec, partition, nonempty):
        write_ms = round((time.monotonic() - started) * 1000)
        yield from task_result(run.partition, attempt, run.result, run.stats, run.fence_ms,
                               write_ms)  # fmt: skip
        started = time.monotonic()
