"""Whether Spark's real-time mode would carry the dedup for less CPU than micro-batches.

Spark 4.1 added a real-time trigger (``trigger(realTime=...)``): long-running tasks that take
records as they arrive, their offsets logged once per "batch duration", instead of a micro-batch
(planned, scheduled, logged) per trigger. The dedup pays a fixed cost per micro-batch
(docs/dedup.md "Settings"); this bench measures what the mode costs, alone and
with the dedup's direct task in it. One SparkSession as the dedup builds it, except ``local[N]``
with a task slot per raw partition (a real-time query holds one per partition all the time); a
process writes runs of six ``--value-bytes`` records as the receiver does, round robin into
``--raw-partitions`` partitions at ``--mbps``. Per round, in alternating order, each case reads
the topic from its end for ``--warm`` seconds, then is measured for ``--seconds``:

- ``micro_batch``: Spark's Kafka source -> a Python ``foreach`` sink that counts the value
  bytes, on the dedup's 1 s trigger;
- ``real_time``: the same on a real-time trigger (a Python ``foreach`` is the only way into
  Python that is on the mode's operator allowlist);
- ``micro_batch_arrow``: the source -> ``mapInArrow`` counting the bytes (what the dedup's tasks
  are) -> Spark's ``noop`` sink, on the 1 s trigger;
- ``real_time_arrow``: the same on a real-time trigger, with the allowlist check off
  (``spark.sql.streaming.realTimeMode.allowlistCheck=false``) and one raw record per Arrow batch
  (a real-time task hands Python an Arrow batch only when it is full: no time bound);
- ``micro_batch_dedup``: ``mapInArrow`` running the direct layout's task
  (``dedup.direct_task.DirectTransaction``: a fresh producer, the fence, the state read, detection
  and the transaction per task) with the batch id from Spark's task properties; no
  ``foreachBatch``, so without the driver's share of a batch;
- ``real_time_dedup``: a prototype, not the product: the same task in a real-time task, one
  transaction a second with the producer and detectors kept in between, what arrived within
  ``--group-ms`` handled as one Arrow batch. Its batch ids restart at 0 with each task, so it is
  not effectively once across restarts; each case writes state under a query id of its own.

Per case: MB/s of raw values, clean records a second (the dedup cases), and the CPU of this
process tree (driver, JVM, Python workers; not the broker nor the writer: ``bench/dedup.py``'s
``tree_cpu``) per second and per GB of raw values.

    .venv/bin/python bench/realtime_mode.py [--mbps 10] [--raw-partitions 2] [--rounds 2]
        [--warm 30] [--seconds 60] [--group-ms 100] [--cases micro_batch,...]

Prints one line per case and round, and one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
from confluent_kafka import Producer
from pyspark import TaskContext

from bench.dedup import PACED_WRITER_PIDS, tree_cpu
from bench.dedup_aging import PacedRuns
from dedup import job
from dedup.clean_topics import create_dedup_topics
from dedup.config import from_sources
from dedup.detect import LiveBucket, Output
from dedup.detector_set import DetectorSet
from dedup.direct_state import DIRECT_STATE_BYTES
from dedup.direct_task import DirectTransaction
from dedup.layouts import Layout
from dedup.layouts.direct import STATE_TOPIC_CONFIG
from dedup.raw_batch import RawBatch, source_of
from dedup.runner import writer_settings
from dedup.writer_settings import BatchResult, TaskSpec, WriterSettings
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from runtime.maven import spark_connector_jars
from tests.kafka_helpers import create_topic

TOPIC = "raw"
WRITER = "--paced-writer"
ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"
ARROW_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: a real-time query's checkpoint interval; longer than a case, so no checkpoint falls in it
REAL_TIME_BATCH = "10 minutes"
CASES = (
    "micro_batch",
    "real_time",
    "micro_batch_arrow",
    "real_time_arrow",
    "micro_batch_dedup",
    "real_time_dedup",
)
#: records per run: 10 KB records fill a run of the receiver's 64 KiB with six
RUN_RECORDS = 6
#: a real-time dedup task commits a transaction this often
COMMIT_INTERVAL_S = 1.0


def paced_writer(bootstrap: str, mbps: float, value_bytes: int, partitions: int) -> int:
    """Runs of ``RUN_RECORDS`` records as the receiver writes them (``bench/dedup_aging.py``'s
    writer), round robin over the partitions at ``mbps``, until killed."""
    args = argparse.Namespace(
        mbps=mbps, value_bytes=value_bytes, run_records=RUN_RECORDS, raw_partitions=partitions
    )
    PacedRuns(bootstrap, TOPIC, args).run()
    return 0


class CountingSink:
    """A ``foreach`` writer: value bytes per task, saved at most once a second into ``out``."""

    def __init__(self, out: str) -> None:
        self.out = out

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.name = f"{self.out}/{partition_id}-{epoch_id}"
        self.bytes, self.saved = 0, time.monotonic()
        return True

    def process(self, row) -> None:
        self.bytes += len(row.value)
        if time.monotonic() - self.saved > 1:
            self.save()

    def close(self, error) -> None:
        self.save()

    def save(self) -> None:
        self.saved = time.monotonic()
        save(self.name, self.bytes)


def arrow_counter(out: str):
    """A ``mapInArrow`` task that saves the value bytes it got: at most once a second and at
    its end (a micro-batch's task ends with its batch, a real-time task with the query)."""

    def task(batches):
        name = f"{out}/arrow-{TaskContext.get().taskAttemptId()}"
        seen, saved = 0, time.monotonic()
        for batch in batches:
            seen += batch.column(0).buffers()[2].size
            if time.monotonic() - saved > 1:
                saved = time.monotonic()
                save(name, seen)
            yield pa.RecordBatch.from_pydict({"value": [b""]})
        save(name, seen)

    return task


def save(name: str, count: int) -> None:
    """``count`` into file ``name``, whole or not at all (``counted`` may read it meanwhile)."""
    Path(f"{name}.tmp").write_text(str(count))
    os.replace(f"{name}.tmp", name)


class KeptPartition(DirectTransaction):
    """The direct layout's task of one raw partition (``dedup/direct_task.py``), run once per
    commit interval of a long-lived task: the first interval fences and reads the state as a
    micro-batch's task does, the next ones keep its producer and the detectors it committed."""

    kept: ClassVar[dict[bytes, tuple[Producer, DetectorSet, int]]] = {}

    def fence(self) -> tuple[Producer, int]:
        member = self._current
        assert member is not None
        if member.key not in self.kept:
            return super().fence()
        producer, detectors, committed = self.kept[member.key]
        member.live = LiveBucket(self.params, detectors, self.spec.now_ms, DIRECT_STATE_BYTES)
        self._producer = producer
        return producer, committed

    def finish(self, producer: Producer, result: BatchResult) -> None:
        member = self._current
        assert member is not None
        live = member.live
        assert live is not None
        detectors = live.finish
        self._committing: DetectorSet | None = None

        def keep(stats: Output) -> DetectorSet:
            self._committing = detectors(stats)
            return self._committing

        live.finish = keep  # type: ignore[method-assign]
        super().finish(producer, result)

    def ended(self, committed: bool, abort_failed: bool) -> None:
        super().ended(committed, abort_failed)
        member = self._current
        if committed and self._producer is not None and self._committing is not None:
            assert member is not None
            self.kept[member.key] = (self._producer, self._committing, self.spec.batch_id)


def micro_batch_dedup(spec: TaskSpec, out: str):
    """A micro-batch's task of the dedup, as the direct layout runs it (a fresh producer, the
    fence and the state read per task), the batch id from Spark's task properties."""

    def task(batches):
        context = TaskContext.get()
        name = f"{out}/dedup-{context.taskAttemptId()}"
        seen = 0

        def counting():
            nonlocal seen
            for batch in batches:
                if batch.num_rows:
                    seen += batch.column("value").buffers()[2].size
                    yield batch

        pending = counting()
        first = next(pending, None)
        if first is None:
            return
        raw_topic, raw_partition = source_of(first)
        batch_id = int(context.getLocalProperty("streaming.sql.batchId"))
        now = time.time_ns() // 1_000_000
        spec_n = replace(spec, batch_id=batch_id, now_ms=now)
        part = DirectTransaction(spec_n, raw_topic, raw_partition)
        rows = map(RawBatch.from_arrow, itertools.chain((first,), pending))
        result = part.run(rows, lambda stats: None)
        save(name, seen)
        save(f"{name}.records", result.records)
        yield pa.RecordBatch.from_pydict({"value": [b""]})

    return task


def real_time_dedup(spec: TaskSpec, out: str, group_s: float):
    """A real-time task of the dedup: its raw partition's records as they come, committed once a
    ``COMMIT_INTERVAL_S`` (the interval's number as the batch id, its start as ``now``)."""

    def task(batches):
        name = f"{out}/dedup-{TaskContext.get().taskAttemptId()}"
        seen = 0
        pending = (b for b in batches if b.num_rows)
        first = next(pending, None)
        if first is None:
            return
        raw_topic, raw_partition = source_of(first)
        held: list[pa.RecordBatch] = [first]
        ended = False
        # an earlier case's producers would idle in this worker (Spark reuses it)
        KeptPartition.kept.clear()

        def interval():
            # Spark hands over one raw record per Arrow batch; the dedup's Python costs ~1 ms
            # per batch it handles, so the records of group_s are handled as one (checked as
            # each comes: a lone record waits for the next, which a product could not accept)
            nonlocal seen, ended
            ends = time.monotonic() + COMMIT_INTERVAL_S
            group: list[pa.RecordBatch] = []
            group_ends = time.monotonic() + group_s
            for batch in itertools.chain(held, pending):
                seen += batch.column("value").buffers()[2].size
                group.append(batch)
                now = time.monotonic()
                if now >= group_ends or now >= ends:
                    yield pa.concat_batches(group)
                    group, group_ends = [], now + group_s
                if now >= ends:
                    break
            else:
                ended = True  # the query stopped
            if group:
                yield pa.concat_batches(group)
            held.clear()

        records = 0
        for number in itertools.count():
            now = time.time_ns() // 1_000_000
            part = KeptPartition(
                replace(spec, batch_id=number, now_ms=now), raw_topic, raw_partition
            )
            rows = map(RawBatch.from_arrow, interval())
            records += part.run(rows, lambda stats: None).records
            save(name, seen)
            save(f"{name}.records", records)
            if ended:
                return
            yield pa.RecordBatch.from_pydict({"value": [b""]})

    return task


def counted(out: Path, suffix: str = "") -> int:
    """The bytes the sinks have saved so far (``.records``: the clean records they committed)."""
    return sum(
        int(p.read_text() or 0)
        for p in out.iterdir()
        if not p.name.endswith(".tmp") and p.suffix == suffix
    )


def run_case(
    spark, bootstrap: str, case: str, work: Path, args: argparse.Namespace, arrow_records: str
) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=work))
    real_time = case.startswith("real_time")
    python_sink = case in ("micro_batch", "real_time")
    options = job.source_options(job_config(bootstrap, work), (TOPIC,))
    if real_time:
        # a real-time query refuses a bound per trigger, and its consumers poll all the time:
        # Kafka's own fetch wait, not the micro-batch's short one
        del options["maxOffsetsPerTrigger"]
        options["kafka.fetch.max.wait.ms"] = "500"
    stream = (
        spark.readStream.format("kafka")
        .options(**options)
        .option("startingOffsets", "latest")
        .load()
    )
    if not case.endswith("_dedup"):
        stream = stream.select("value")
    forced = case in ("real_time_arrow", "real_time_dedup")
    spark.conf.set(ALLOWLIST_CHECK, str(not forced).lower())
    # a real-time task's Arrow batch goes to Python when full (no time bound): one raw record
    # per batch, or a slow link's records would wait for megabytes to come
    spark.conf.set(ARROW_RECORDS, "1" if forced else arrow_records)
    if case == "micro_batch_dedup":
        stream = stream.mapInArrow(
            micro_batch_dedup(dedup_spec(bootstrap, work), str(out)), "value binary"
        )
    elif case == "real_time_dedup":
        task = real_time_dedup(dedup_spec(bootstrap, work), str(out), args.group_ms / 1000)
        stream = stream.mapInArrow(task, "value binary")
    elif not python_sink:
        stream = stream.mapInArrow(arrow_counter(str(out)), "value binary")
    writer = stream.writeStream.outputMode("update").option(
        "checkpointLocation", str(work / f"checkpoint-{out.name}")
    )
    writer = writer.foreach(CountingSink(str(out))) if python_sink else writer.format("noop")
    if real_time:
        writer = writer.trigger(realTime=REAL_TIME_BATCH)
    else:
        writer = writer.trigger(processingTime="1 second")
    return measure(writer.start(), case, out, args)


def measure(query, case: str, out: Path, args: argparse.Namespace) -> dict:
    """``--warm`` seconds of ``query``, then ``--seconds`` measured: what its sinks counted in
    ``out`` and this process tree's CPU; the query is stopped after."""
    try:
        query.awaitTermination(args.warm)  # returns at the timeout unless the query failed
        if not query.isActive:
            raise RuntimeError(f"{case} stopped: {query.exception()}")
        before, seen, start = tree_cpu(), counted(out), time.monotonic()
        records = counted(out, ".records")
        query.awaitTermination(args.seconds)
        split = {k: v - before[k] for k, v in tree_cpu().items()}
        cpu, seen = sum(split.values()), counted(out) - seen
        records = counted(out, ".records") - records
        seconds = time.monotonic() - start
        if not query.isActive:
            raise RuntimeError(f"{case} stopped: {query.exception()}")
    finally:
        query.stop()
    return {
        "case": case,
        "mb_per_s": round(seen / seconds / 1e6, 2),
        "clean_records_per_s": round(records / seconds),
        "cpu_s_per_s": round(cpu / seconds, 3),
        "cpu_s_per_gb": round(cpu / (seen / 1e9), 1) if seen else None,
        "cpu_s_per_s_by_process": {k: round(v / seconds, 3) for k, v in split.items()},
    }


def dedup_spec(bootstrap: str, work: Path) -> TaskSpec:
    """A direct task's spec on a query id and transactional ids of its own (a stopped case's
    task may still be running, and would fence the next case's), its topics made."""
    config = job_config(bootstrap, work)
    query_id = f"bench-{uuid.uuid4()}"
    settings = writer_settings(config, WriterSettings)
    settings = replace(settings, transactional_id=f"{settings.transactional_id}-{query_id}")
    partitions = job.raw_partition_count(config)
    create_dedup_topics(
        settings,
        [config.state_topic],
        compact=True,
        partitions=partitions,
        config=STATE_TOPIC_CONFIG,
    )
    create_dedup_topics(settings, [config.gap_topic], compact=True)
    create_dedup_topics(settings, ["clean.src"])
    return TaskSpec(
        settings=settings,
        query_id=query_id,
        batch_id=0,
        layout=Layout.DIRECT,
        params=job.detect_params(config),
        raw_partitions=partitions,
    )


def job_config(bootstrap: str, work: Path, master: str = "local[2]"):
    env = {
        "BOOTSTRAP_SERVERS": bootstrap,
        "RAW_TOPICS": TOPIC,
        "STATE_LAYOUT": "direct",
        "STATE_DIR_CONFIG": str(work / "state"),
        "SPARK_MASTER": master,
    }
    return from_sources(env, {"spark_conf": {"spark.driver.memory": "512m"}})


def case_parser(doc: str, cases: tuple[str, ...]) -> argparse.ArgumentParser:
    """The options every bench of alternated Spark cases takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--mbps", type=float, default=10.0)
    parser.add_argument("--value-bytes", type=int, default=10_000)
    parser.add_argument("--raw-partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--cases", default=",".join(cases))
    return parser


def alternate(name: str, args: argparse.Namespace, prepare) -> int:
    """Run ``args.cases`` in one SparkSession on a raw topic the paced writer fills, in
    alternating order per round; print each result and then one JSON object of medians.

    ``prepare(spark)`` returns ``run(spark, bootstrap, case, work, args) -> dict``."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    broker = LocalBroker(f"bench-{name}", free_port(), data_dir=work / "kafka")
    broker.start()
    writer = None
    try:
        create_topic(broker.bootstrap, TOPIC, partitions=args.raw_partitions)
        master = f"local[{max(2, args.raw_partitions)}]"
        spark = job.build_session(
            job_config(broker.bootstrap, work, master), [str(p) for p in spark_connector_jars()]
        )
        run = prepare(spark)
        writer = subprocess.Popen(
            [sys.executable, __file__, WRITER, broker.bootstrap]
            + [str(v) for v in (args.mbps, args.value_bytes, args.raw_partitions)]
        )
        PACED_WRITER_PIDS.add(writer.pid)
        cases = args.cases.split(",")
        runs: dict[str, list[dict]] = {case: [] for case in cases}
        for round_ in range(args.rounds):
            for case in cases if round_ % 2 == 0 else cases[::-1]:
                result = run(spark, broker.bootstrap, case, work, args)
                print(json.dumps({"round": round_, **result}), flush=True)
                runs[case].append(result)
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)  # GBs of raw and clean records

    def median(case: str, key: str) -> float | None:
        values = [r[key] for r in runs[case] if r[key] is not None]
        return round(statistics.median(values), 2) if values else None

    print(
        json.dumps(
            {
                "bench": name,
                "machine": f"{platform.machine()} {os.cpu_count()} cpus",
                "mbps": args.mbps,
                "value_bytes": args.value_bytes,
                "raw_partitions": args.raw_partitions,
                "master": master,
                **{
                    f"{case}_{key}": median(case, key)
                    for case in cases
                    for key in ("mb_per_s", "cpu_s_per_s", "cpu_s_per_gb")
                },
                "rounds": runs,
            }
        )
    )
    return 0


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == WRITER:
        return paced_writer(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    parser = case_parser(__doc__, CASES)
    parser.add_argument("--group-ms", type=float, default=100.0)
    args = parser.parse_args()

    def prepare(spark):
        # each case sets its own batch size; the others get the session's
        return functools.partial(run_case, arrow_records=spark.conf.get(ARROW_RECORDS))

    return alternate("realtime_mode", args, prepare)


if __name__ == "__main__":
    sys.exit(main())
