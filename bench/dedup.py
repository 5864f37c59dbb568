"""Dedup cost per source record: raw layout v1 (a raw record per source record) against v2 (runs).

Builds one set of source records (``--topics`` source topics x 8 partitions, 200-byte values, 1 %
gaps) and writes it twice, as the receiver of each layout would: a v1 raw topic (one raw record
per source record, provenance headers) and a v2 raw topic (one raw record per run of up to
``--run-records`` consecutive offsets, docs/topics.md). Both carry the same copies: 10 % of the
runs arrive twice (whole copies) and 2 % are followed by a resend that overlaps half of them
(partly overlapping resends); in v1 these are the same records, one by one. Source partition p of
every topic lands in raw partition p mod 8, so ``--topics 8`` puts 8 source partitions in each raw
partition (the fan-in).

Then, in ONE SparkSession (local[2]), over the whole of each topic:

1. a pass-through of the v1 topic (Spark's Kafka source -> Spark's Kafka sink, unchanged): cold,
   reported but never the baseline;
2. a dedup of the v2 topic (warm-up: JIT, Python workers);
3. the dedup of the v1 topic, then of the v2 topic (the measured pair; ``--order`` swaps it);
4. the pass-through of the v1 topic again: warm, the baseline.

CPU is the process tree's (driver JVM = executor in local mode, Python workers; not the broker)
per million **source** records read (copies included), robust to other load on a shared machine.
Beside it, not part of it: the broker's CPU per million (``broker_cpu_s_per_million``, when the
bench started the broker) and the JIT's compile seconds inside the JVM's share
(``jvm_jit_s_per_million``, from JMX). ``--clean-topics-exist`` creates each dedup's clean topics
before it starts, as a deployment past its first batch has them. ``DIRECT_READER`` in the
environment chooses how the direct dedup reads (docs/dedup.md "The direct layout"), and
``DIRECT_TRANSACTIONS`` how it commits.

``--chains N`` (with ``--only runs``) measures copy chains (docs/sender.md "Chains"): N receivers
each write every unit. The buckets dedup reads them as chains run on it, one raw topic per chain
(``RAW_TOPICS`` lists N topics, each holding every unit once); the direct dedup reads ONE raw
topic that every chain's receiver writes (each unit N times, chain ``c``'s copies ``c *
CHAIN_LAG_UNITS`` units behind the first chain's, as receivers of chains a little out of step
write them). Both read the same N copies of every record; ``*_clean_records_per_s`` is the rate
of records delivered to the clean topic, ``*_cpu_s_per_million_clean`` the CPU per million of
them.
The clean and gap topics of the two measured dedups are compared record for record. Write tasks
consume only the payload the stateful step hands them: ``write_payload_ratio`` is those bytes over
the bytes of the records they turn into clean records or drop as duplicates (values, keys,
headers, as the run encodes them). Needs a broker: ``--bootstrap`` (default: start one). Last
line: one JSON object.

``--paced-mbps R`` (with ``--only runs --state-layout direct``) measures the dedup **live** against
its single batch in the same session, so with the same JIT: besides each single-batch query, a
direct dedup with its own trigger (``PERSIST_INTERVAL_MS``' default) over an empty raw topic into
which another process writes the same runs at R MB/s of values, as a receiver writes what a paced
link brings (that writer's CPU is not counted); alternated single, live, live, single. It reports
CPU-s per GB of values for each (``single_batch_cpu_s_per_gb``, ``paced_cpu_s_per_gb``), the live
run's committed batches, its CPU per batch by process (``cpu_s_per_batch``: ``jvm`` with its
``jvm_jit`` share, ``workers``, ``reaped`` child processes, ``driver``) and
``paced_to_single_batch_cpu_ratio``; each also less the JIT's compile time (``*_less_jit``: what a
dedup pays once its JIT has settled, which a run of minutes has not; a single batch's share of the
JIT is whatever the compilers finished during its few seconds, so no ratio is taken of those).
``--raw-partitions N`` writes raw topics of N partitions (source partition p in p mod N): the live
dedup runs N tasks per micro-batch.

    .venv/bin/python bench/dedup.py --records 1000000
    .venv/bin/python bench/dedup.py --records 1000000 --topics 32 --only runs
    .venv/bin/python bench/dedup.py --records 500000 --only runs --state-layout both --chains 2
    .venv/bin/python bench/dedup.py --records 60000 --value-bytes 10000 --run-records 6 \
        --only runs --state-layout direct --paced-mbps 10
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and its name would shadow the
# ``dedup`` package; drop it before importing the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402

import pyarrow.compute as pc  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from common.raw_run import RunBuilder  # noqa: E402
from dedup import job  # noqa: E402
from dedup.batch_driver import TransactionalBatchWriter  # noqa: E402
from dedup.config import DedupConfig, from_sources  # noqa: E402
from dedup.raw_position import records_read  # noqa: E402
from dedup.runner import idle_ticker, writer_settings  # noqa: E402
from dedup.writer_settings import WriterSettings  # noqa: E402
from kafka_diode.local_kafka.broker import LocalBroker, free_port  # noqa: E402
from runtime import kafka  # noqa: E402
from runtime.maven import spark_connector_jars  # noqa: E402

PARTITIONS = 8
#: Partitions of each raw topic (``--raw-partitions``): source partition p lands in p mod this
RAW_PARTITIONS = PARTITIONS
VALUE = b"v" * 200
#: ``--chains``: how many units a chain's copies trail the previous chain's in the one raw topic
CHAIN_LAG_UNITS = 64


#: One unit of the raw topic: (source topic, source partition, first offset, last offset).
Unit = tuple[str, int, int, int]


def plan(records: int, topics: int, run_records: int, seed: int = 1) -> list[Unit]:
    """The raw topic's units in arrival order, the same for both layouts: runs of consecutive
    offsets (a gap ends a run), 10 % of them twice, 2 % followed by a resend overlapping half."""
    rng = random.Random(seed)
    per_partition = max(1, records // (PARTITIONS * topics) * 100 // 113)
    units: list[Unit] = []
    for t in range(topics):
        topic = f"src{t}"
        for partition in range(PARTITIONS):
            offset = 0
            while offset < per_partition:
                length = min(run_records, per_partition - offset)
                if rng.random() < 0.05:  # 1 % of the records lost: a run ends early
                    length = max(1, length // 2)
                    skip = max(1, run_records // 20)
                else:
                    skip = 0
                unit: Unit = (topic, partition, offset, offset + length - 1)
                units.append(unit)
                if rng.random() < 0.10:
                    units.append(unit)  # a whole copy
                if rng.random() < 0.02:
                    half = max(unit[2], unit[3] - length // 2)
                    units.append((topic, partition, half, unit[3] + length // 2))  # a resend
                offset += length + skip
    # each source partition's units in order; partitions interleaved round robin (as a receiver
    # writes many partitions at once)
    lanes: dict[tuple[str, int], list[Unit]] = {}
    for unit in units:
        lanes.setdefault(unit[:2], []).append(unit)
    queues = list(lanes.values())
    out: list[Unit] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def copy_chains(units: list[Unit], chains: int) -> list[Unit]:
    """The one raw topic every copy chain's receiver writes: each unit ``chains`` times, chain
    ``c``'s copy ``c * CHAIN_LAG_UNITS`` units after the first chain's."""
    out: list[Unit] = []
    for i in range(len(units) + (chains - 1) * CHAIN_LAG_UNITS):
        for c in range(chains):
            j = i - c * CHAIN_LAG_UNITS
            if 0 <= j < len(units):
                out.append(units[j])
    return out


def create_raw_topic(bootstrap: str, topic: str) -> None:
    """The raw topic, ``RAW_PARTITIONS`` partitions, admitting the largest run."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"max.message.bytes": str(64 << 20)}
    for future in admin.create_topics([NewTopic(topic, RAW_PARTITIONS, 1, config=config)]).values():
        future.result(30)


def prefill(
    bootstrap: str,
    topic: str,
    units: list[Unit],
    layout: str,
    now: int,
    pace_bytes_per_s: float = 0.0,
    create: bool = True,
) -> int:
    """Write ``units`` as ``layout`` (records: v1, runs: v2) raw records, source timestamps from
    ``now`` (ms; the same for both layouts, so their clean topics compare record for record);
    returns the number of source records written (copies included). ``pace_bytes_per_s``: no
    faster than that many bytes of raw values a second, as a paced link brings them (runs the
    receiver writes as they arrive: ``--paced-mbps``)."""
    if create:
        create_raw_topic(bootstrap, topic)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            "message.max.bytes": 64 << 20,
            "compression.type": "lz4",
        }
    )
    session = b"ab" * 16
    written = 0
    paced_bytes = 0
    paced_from = time.monotonic()

    def produce(*args: object, **kwargs: object) -> None:
        while True:
            try:
                producer.produce(*args, **kwargs)
                return
            except BufferError:
                producer.poll(0.05)

    for src, partition, first, last in units:
        written += last - first + 1
        if layout == "records":
            for offset in range(first, last + 1):
                headers = [
                    ("diode.key", b"key-%d" % offset),
                    ("diode.timestamp", b"%d" % (now + offset)),
                    ("diode.timestamp-type", b"1"),
                    ("diode.session", session.hex().encode()),
                ]
                key = b"%s:%d:%d" % (src.encode(), partition, offset)
                produce(
                    topic, VALUE, key, partition % RAW_PARTITIONS, headers=headers, timestamp=now
                )
        else:
            run = RunBuilder(src, partition, 1, first, now + first)
            for offset in range(first, last + 1):
                run.append(offset, now + offset, b"key-%d" % offset, VALUE, ())
            value = run.encode()
            if pace_bytes_per_s:
                paced_bytes += len(value)
                ahead = paced_bytes / pace_bytes_per_s - (time.monotonic() - paced_from)
                if ahead > 0:
                    producer.poll(0)
                    time.sleep(ahead)  # the pace of the link, not a synchronisation
            produce(
                topic,
                value,
                run.key().encode(),
                partition % RAW_PARTITIONS,
                headers=[("diode.session", session.hex().encode())],
                timestamp=now,
            )
    producer.flush(300)
    return written


class CountingWriter(TransactionalBatchWriter):
    """Counts input rows of committed batches (stat rows) and the write tasks' times."""

    rows_in = 0
    delivered = 0  # source records first seen (to the clean topic)
    fence_s = 0.0  # summed over tasks: fresh producer + init_transactions + marker read
    task_s = 0.0  # summed over tasks: the whole write task (fence, re-read, produce, commit)
    tasks = 0
    payload_bytes = 0  # run payloads the write tasks consumed
    record_bytes = 0  # bytes of the records in them (delivered and duplicates)

    def account(self, table, batch_id):
        stats = table.filter(pc.equal(table.column("kind"), "stat"))
        if stats.num_rows:
            delivered = pc.sum(stats.column("delivered")).as_py() or 0
            self.delivered += delivered
            self.rows_in += delivered + (pc.sum(stats.column("duplicates")).as_py() or 0)
        tasks = table.filter(pc.equal(table.column("kind"), "task"))
        self.fence_s += (pc.sum(tasks.column("fence_ms")).as_py() or 0) / 1000
        self.task_s += (pc.sum(tasks.column("write_ms")).as_py() or 0) / 1000
        self.tasks += tasks.num_rows
        self.payload_bytes += pc.sum(tasks.column("payload_bytes")).as_py() or 0
        self.record_bytes += pc.sum(tasks.column("record_bytes")).as_py() or 0
        return super().account(table, batch_id)


def tree_members() -> list[tuple[int, str, list[str]]]:
    """``(pid, command name, /proc stat fields after the name)`` of this process and its
    descendants alive now (the JVM, the Python workers, which Spark reuses), not a broker we
    started nor a paced writer."""
    stats: dict[int, tuple[str, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        stats[int(entry)] = (comm, text.rpartition(")")[2].split())
    me = os.getpid()
    members = []
    for pid, (comm, fields) in stats.items():
        walk = pid
        while walk not in (0, 1, me) and walk in stats:
            walk = int(stats[walk][1][1])
        if walk == me and pid not in PACED_WRITER_PIDS and not _is_broker(pid):
            members.append((pid, comm, fields))
    return members


def tree_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of ``tree_members``, by kind: ``driver`` (this Python
    process), ``jvm`` (Spark's JVM: driver and executor in local mode), ``workers`` (Python
    workers: the stateful step and the write tasks), ``reaped`` (short-lived processes they
    started and waited for, such as the ``readlink`` and ``chmod`` that Hadoop's local file
    system runs per checkpoint file). Robust to other load."""
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    out = {"driver": 0.0, "jvm": 0.0, "workers": 0.0, "reaped": 0.0}
    for pid, comm, fields in tree_members():
        kind = "driver" if pid == me else "jvm" if comm == "java" else "workers"
        out[kind] += (int(fields[11]) + int(fields[12])) / tick
        if pid != me:  # the driver's children are members, counted above while they live
            out["reaped"] += (int(fields[13]) + int(fields[14])) / tick
    return out


def tree_cpu_s() -> float:
    """The sum of ``tree_cpu``."""
    return sum(tree_cpu().values())


def cpu_split_per_million(before: dict[str, float], total: int) -> dict[str, float]:
    """CPU seconds per million records since ``before``, by kind (``tree_cpu``)."""
    return {k: round((v - before[k]) * 1e6 / total, 1) for k, v in tree_cpu().items()}


def jit_s(spark) -> float:
    """Seconds the JVM's JIT compilers have spent compiling (JMX ``getTotalCompilationTime``,
    summed over its compiler threads): part of the JVM's CPU, and timed by when HotSpot gets
    to its queue, not by the query's work."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    return bean.getTotalCompilationTime() / 1000.0


def side_costs(spark, total: int) -> Callable[[], dict[str, float]]:
    """Starts counting what is measured beside the dedup's CPU; the returned call gives it per
    million of ``total``: the broker's CPU (``broker_cpu_s``) and the JIT's compile time."""
    broker, jit = broker_cpu_s(), jit_s(spark)

    def since() -> dict[str, float]:
        return {
            "broker_cpu_s_per_million": round((broker_cpu_s() - broker) * 1e6 / total, 1),
            "jvm_jit_s_per_million": round((jit_s(spark) - jit) * 1e6 / total, 1),
        }

    return since


def broker_cpu_s() -> float:
    """CPU seconds of the broker this bench started, a child of this process (0 with
    ``--bootstrap``: not ours to see)."""
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            children = [int(p) for p in f.read().split()]
    except OSError:
        return 0.0
    total = 0.0
    for pid in filter(_is_broker, children):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


#: The command-line flag of the paced writer's process (``--paced-mbps``): it plays the receiver,
#: so its CPU is not the dedup's.
PACED_WRITER = "--paced-writer"


#: The paced writers' pids, never part of the measured tree. By pid, not by command line: a
#: writer that has finished is a zombie until the bench waits for it, and a zombie's command line
#: is empty while its CPU is still in /proc (counted as the dedup's, it added up to the writer's
#: ~2 CPU-s per run, ~7 CPU-s per GB, to a live figure).
PACED_WRITER_PIDS: set[int] = set()


def start_paced_writer(bootstrap: str, topic: str, args: argparse.Namespace, now: int):
    """A process that writes the bench's runs into ``topic`` at ``--paced-mbps`` (as the
    receiver writes what a paced link brings), the same units as the prefilled topics."""
    spec = {
        "bootstrap": bootstrap,
        "topic": topic,
        "records": args.records,
        "topics": args.topics,
        "run_records": args.run_records,
        "value_bytes": args.value_bytes,
        "raw_partitions": RAW_PARTITIONS,
        "now": now,
        "pace": args.paced_mbps * 1e6,
    }
    proc = subprocess.Popen([sys.executable, __file__, PACED_WRITER, json.dumps(spec)])
    PACED_WRITER_PIDS.add(proc.pid)
    return proc


def paced_writer(spec: dict) -> int:
    """The paced writer's process (``start_paced_writer``)."""
    global VALUE, RAW_PARTITIONS  # noqa: PLW0603  one setting for the whole process
    VALUE = b"v" * spec["value_bytes"]
    RAW_PARTITIONS = spec["raw_partitions"]
    units = plan(spec["records"], spec["topics"], spec["run_records"])
    prefill(
        spec["bootstrap"], spec["topic"], units, "runs", spec["now"], spec["pace"], create=False
    )
    return 0


def _is_broker(pid: int) -> bool:
    """The Kafka broker this bench may have started is not part of the measured job."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"kafka.Kafka" in f.read()
    except OSError:
        return False


def steady(progresses) -> dict:
    """Rows per second and batch times over the batches with input after the first two (JIT
    warm-up, first fetches), from Spark's own ``triggerExecution`` durations."""
    batches = [
        (records_read(p), p["durationMs"]["triggerExecution"] / 1000.0)
        for p in sorted(progresses, key=lambda p: p["batchId"])
        if p.get("numInputRows")
    ]
    later = batches[2:]
    rows, secs = sum(r for r, _ in later), sum(t for _, t in later)
    return {
        "batch_s": [round(t, 2) for _, t in batches],
        "steady_records_per_s": round(rows / secs) if secs else None,
    }


def run_query(
    spark, config, writer, total: int, transform=None, started: Callable[[], None] | None = None
) -> tuple[float, dict]:
    """Seconds to read ``total`` rows, and where the micro-batches' time went (query progress);
    ``started`` runs once the query has started (a paced writer of its raw topic)."""
    split_before = tree_cpu()
    cpu_before = sum(split_before.values())
    side = side_costs(spark, total)
    driver_before = time.process_time()
    start = time.monotonic()
    query = job.start_query(spark, config, writer, transform=transform)
    if started is not None:
        started()
    try:
        while writer.rows_in < total:
            if not query.isActive:
                raise RuntimeError(f"query stopped: {query.exception()}")
            query.awaitTermination(0.2)
        seconds = time.monotonic() - start
        cpu_s = tree_cpu_s() - cpu_before
        split = cpu_split_per_million(split_before, total)
        beside = side()
        driver_s = time.process_time() - driver_before
        # The last batch's progress is posted after its foreachBatch returned: wait for it.
        last_id = writer.last.batch_id if writer.last is not None else -1
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            p.get("batchId") == last_id for p in query.recentProgress
        ):
            query.awaitTermination(0.2)
        durations: dict[str, float] = {}
        batches = 0
        for progress in query.recentProgress:
            if not progress.get("numInputRows"):
                continue
            batches += 1
            for name, ms in (progress.get("durationMs") or {}).items():
                durations[name] = durations.get(name, 0.0) + ms / 1000.0
        profile = {k: round(v, 2) for k, v in sorted(durations.items())}
        profile["batches_with_input"] = batches
        profile |= steady(query.recentProgress)
        profile["write_tasks"] = writer.tasks
        profile["write_task_s_sum"] = round(writer.task_s, 2)
        profile["fence_s_sum"] = round(writer.fence_s, 2)
        profile["driver_python_cpu_s"] = round(driver_s, 2)
        profile["driver_python_cpu_s_per_million"] = round(driver_s * 1e6 / total, 2)
        profile["cpu_s"] = round(cpu_s, 1)
        profile["cpu_s_per_million"] = round(cpu_s * 1e6 / total, 1)
        profile["cpu_s_per_million_by_process"] = split
        # not part of the dedup's CPU: what its writes cost the (bench's own) broker, and the JIT
        profile |= beside
        # Gaps are reported by time (two scans GAP_EMIT_INTERVAL_SEC apart), not by data: keep the
        # query running three intervals more, outside the measured CPU, so that each layout's gap
        # topic holds its final states before the two are compared. Scans run only in batches,
        # and without input only the driver's ticks make batches: tick as `kafka-diode dedup` does.
        ticker, close_ticks = idle_ticker(config, writer.layout)
        try:
            settled = time.monotonic() + 3 * config.gap_emit_interval_sec + 2
            while time.monotonic() < settled:
                ticker.poll(time.monotonic(), batches_seen=writer.batches_seen, in_batch=False)
                query.awaitTermination(0.5)
        finally:
            close_ticks()
        return seconds, profile
    finally:
        query.stop()


def run_sink_passthrough(
    spark,
    bootstrap: str,
    raw: str,
    out: str,
    checkpoint: Path,
    total: int,
    source_options: dict,
    sink_options: dict,
    max_offsets: int,
):
    """Spark's Kafka source -> Spark's Kafka sink, records unchanged: seconds and CPU profile."""
    split_before = tree_cpu()
    cpu_before = sum(split_before.values())
    side = side_costs(spark, total)
    start = time.monotonic()
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", raw)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
    )
    for name, value in source_options.items():
        reader = reader.option(name, value)
    columns = ["key", "value", "headers", "partition"]
    if source_options.get("includeHeaders") == "false":
        columns.remove("headers")  # to measure what the headers cost Spark
    stream = reader.load().select(*columns)
    writer = (
        stream.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 milliseconds")
    )
    for name, value in sink_options.items():
        writer = writer.option(name, value)
    query = writer.start()
    try:
        seen: dict[int, int] = {}
        while sum(seen.values()) < total:
            if not query.isActive:
                raise RuntimeError(f"query stopped: {query.exception()}")
            query.awaitTermination(0.2)
            for progress in query.recentProgress:
                seen[progress["batchId"]] = progress.get("numInputRows") or 0
        seconds = time.monotonic() - start
        cpu_s = tree_cpu_s() - cpu_before
        split = cpu_split_per_million(split_before, total)
        beside = side()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(
            [p for p in query.recentProgress if p.get("numInputRows")]
        ) < sum(1 for n in seen.values() if n):
            query.awaitTermination(0.2)
        return seconds, {
            "cpu_s": round(cpu_s, 1),
            "cpu_s_per_million": round(cpu_s * 1e6 / total, 1),
            "cpu_s_per_million_by_process": split,
            **beside,
            "batches_with_input": sum(1 for n in seen.values() if n),
            **steady(query.recentProgress),
        }
    finally:
        query.stop()


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == PACED_WRITER:
        return paced_writer(json.loads(sys.argv[2]))
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--records", type=int, default=1_000_000, help="source records")
    parser.add_argument("--topics", type=int, default=1, help="source topics (the fan-in)")
    parser.add_argument("--run-records", type=int, default=256, help="records per run")
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument(
        "--only", choices=("both", "runs", "records"), default="both", help="layouts to dedup"
    )
    parser.add_argument("--order", choices=("records-first", "runs-first"), default="records-first")
    parser.add_argument(
        "--state-layout",
        choices=("buckets", "direct", "both"),
        default="buckets",
        help="STATE_LAYOUT of the runs' dedup; both: each over the same v2 topic, alternated",
    )
    parser.add_argument(
        "--state-partitions", type=int, default=0, help="SHUFFLE_PARTITIONS; 0: the dedup's default"
    )
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0, help="0: the default")
    parser.add_argument("--value-bytes", type=int, default=200, help="source value size")
    parser.add_argument(
        "--raw-partitions",
        type=int,
        default=PARTITIONS,
        help="partitions of each raw topic (source partition p lands in p mod this)",
    )
    parser.add_argument(
        "--clean-topics-exist",
        action="store_true",
        help="create each dedup's clean topics before it starts (a deployment past batch 1)",
    )
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="NAME=VALUE", help="Spark setting"
    )
    parser.add_argument(
        "--paced-mbps",
        type=float,
        default=0.0,
        help="also run the direct dedup live: its raw topic written at this many MB/s while it "
        "runs with its own trigger (PERSIST_INTERVAL_MS), against the single batch, alternated",
    )
    parser.add_argument(
        "--paced-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --paced-mbps: also a live run with this dedup setting (repeatable), e.g. "
        "KAFKA_SOURCE_MINOFFSETSPERTRIGGER=1600, alternated with the others",
    )
    parser.add_argument(
        "--chains",
        type=int,
        default=1,
        help="copy chains (with --only runs): buckets reads one raw topic per chain, direct one "
        "raw topic that every chain writes",
    )
    args = parser.parse_args()
    if args.chains < 1 or (args.chains > 1 and args.only != "runs"):
        parser.error("--chains takes a count >= 1, and more than 1 needs --only runs")
    if args.paced_mbps and (args.only != "runs" or args.state_layout != "direct"):
        parser.error("--paced-mbps needs --only runs --state-layout direct")
    global VALUE, RAW_PARTITIONS  # noqa: PLW0603  one setting for the whole run
    VALUE = b"v" * args.value_bytes
    if not 1 <= args.raw_partitions <= PARTITIONS:
        parser.error(f"--raw-partitions takes 1 to {PARTITIONS}")
    RAW_PARTITIONS = args.raw_partitions

    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        data_dir = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
        broker = LocalBroker("bench-dedup", free_port(), data_dir=data_dir, partitions=PARTITIONS)
        broker.start()
        bootstrap = broker.bootstrap
    try:
        return measure(args, bootstrap)
    finally:  # a failed run must not leave its broker, nor its ~1 GB of data, behind
        if broker is not None:
            broker.stop()
            shutil.rmtree(data_dir, ignore_errors=True)


def read_topic(bootstrap: str, topic: str) -> list:
    """Every committed record of ``topic`` (read_committed), from the beginning to the end now."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-read-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending, out = set(parts), []
        deadline = time.monotonic() + 300
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                elif err is None:
                    out.append(msg)
        return out
    finally:
        consumer.close()


def clean_and_gaps(bootstrap: str, tag: str, name: str, topics: int) -> tuple[Counter, dict]:
    """The clean records (topic, partition, key, value, timestamp) and the latest gap states."""
    clean: Counter = Counter()
    for t in range(topics):
        for m in read_topic(bootstrap, f"{tag}.{name}.clean.src{t}"):
            clean[(t, m.partition(), m.key(), m.value(), m.timestamp()[1])] += 1
    gaps = {}
    for m in read_topic(bootstrap, f"{tag}.{name}.gaps"):
        if m.key() and m.value():  # the latest state per gap key; times differ between runs
            g = json.loads(m.value())
            gaps[m.key()] = (g["topic"], g["partition"], g["first"], g["last"], g["state"])
    return clean, gaps


def differences(layouts: tuple[str, ...], a: tuple[Counter, dict], b: tuple[Counter, dict]) -> dict:
    """What tells the two layouts' outputs apart: counts, and a few entries only one side has."""
    only_a, only_b = a[0] - b[0], b[0] - a[0]
    gap_keys = {k for k in a[1].keys() | b[1].keys() if a[1].get(k) != b[1].get(k)}
    return {
        "clean_records": {layouts[0]: sum(a[0].values()), layouts[1]: sum(b[0].values())},
        f"clean_only_{layouts[0]}": len(only_a),
        f"clean_only_{layouts[1]}": len(only_b),
        "clean_samples": [repr(k)[:160] for k in [*list(only_a)[:3], *list(only_b)[:3]]],
        "gaps": {layouts[0]: len(a[1]), layouts[1]: len(b[1])},
        "gap_samples": [(repr(k)[:80], a[1].get(k), b[1].get(k)) for k in sorted(gap_keys)[:4]],
    }


def measure(args: argparse.Namespace, bootstrap: str) -> int:
    """Prefill both layouts, run the queries in one SparkSession, print the JSON line."""
    tag = f"bench{int(time.time())}"
    load_start = os.getloadavg()[0]
    units = plan(args.records, args.topics, args.run_records)
    t0 = time.monotonic()
    layouts = ("records", "runs") if args.only == "both" else (args.only,)
    written = {}
    now = int(time.time() * 1000)
    for layout in sorted({*layouts, "records"}):
        chained = copy_chains(units, args.chains) if layout == "runs" else units
        written[layout] = prefill(bootstrap, f"{tag}.{layout}", chained, layout, now)
    raw_records = {"records": written["records"], "runs": len(units) * args.chains}
    if args.chains > 1 and args.state_layout != "direct":  # one raw topic per chain
        for c in range(1, args.chains + 1):
            prefill(bootstrap, f"{tag}.runs.c{c}", units, "runs", now)
    prefill_s = time.monotonic() - t0
    tmp = Path(tempfile.mkdtemp(prefix="bench-dedup-ck-"))

    def raw_topics(layout: str, state_layout: str) -> str:
        if layout == "runs" and args.chains > 1 and state_layout == "buckets":
            return ",".join(f"{tag}.runs.c{c}" for c in range(1, args.chains + 1))
        return f"{tag}.{layout}"

    def config(
        name: str, layout: str, state_layout: str = "buckets", trigger_ms: int = 0, extra=()
    ):
        env = {
            "STATE_LAYOUT": state_layout,
            "RAW_TOPICS": raw_topics(layout, state_layout),
            "BOOTSTRAP_SERVERS": bootstrap,
            "STATE_DIR_CONFIG": str(tmp / name),
            "CLEAN_TOPIC": f"{tag}.{name}.clean.{{topic}}",
            "GAP_TOPIC": f"{tag}.{name}.gaps",
            "PROGRESS_TOPIC": f"{tag}.{name}.progress",
            "CONTROL_TOPIC": f"{tag}.{name}.control",
            "NEW_TOPIC_PARTITIONS": str(PARTITIONS),
            "SPARK_MASTER": "local[2]",
            "SHUFFLE_PARTITIONS": str(args.state_partitions),
            "PERSIST_INTERVAL_MS": str(trigger_ms),
        }
        # the dedup's Kafka client settings, as `kafka-diode dedup` takes them (KAFKA_CONF_*),
        # and how a direct checkpoint reads and commits (DIRECT_READER, DIRECT_TRANSACTIONS)
        passed = ("DIRECT_READER", "DIRECT_TRANSACTIONS")
        env.update({k: v for k, v in os.environ.items()
                    if k.startswith("KAFKA_CONF_") or k in passed})  # fmt: skip
        env.update(kv.split("=", 1) for kv in extra)
        if args.max_offsets_per_trigger:
            env["MAX_OFFSETS_PER_TRIGGER"] = str(args.max_offsets_per_trigger)
        elif layout == "records":
            env["MAX_OFFSETS_PER_TRIGGER"] = "200000"  # v1's default before runs
        return from_sources(env, {"spark_conf": args.spark_conf} if args.spark_conf else {})

    # the session's settings are the layout's (a direct checkpoint's file manager), as the
    # dedup's own for that layout; ``both`` takes Spark's defaults
    session_layout = args.state_layout if args.state_layout != "both" else "buckets"
    spark = job.build_session(
        config("x", "runs", session_layout), [str(p) for p in spark_connector_jars()]
    )
    results: dict[str, dict] = {}

    def passthrough(name: str) -> None:
        seconds, profile = run_sink_passthrough(
            spark, bootstrap, f"{tag}.records", f"{tag}.{name}.out", tmp / name,
            written["records"], {}, {}, 200_000,
        )  # fmt: skip
        results[name] = {"records_per_s": round(written["records"] / seconds), **profile}
        print(f"{name}: {seconds:.1f} s; {profile}", file=sys.stderr)

    def dedup(name: str, layout: str, state_layout: str = "buckets") -> None:
        paced = layout in {"paced", "paced_tuned"}
        extra = args.paced_env if layout == "paced_tuned" else ()
        if paced:  # its own raw topic, written while the query runs with its own trigger
            layout = f"{name}.raw"
            create_raw_topic(bootstrap, f"{tag}.{layout}")
            written[layout] = written["runs"]
        trigger_ms = DedupConfig.__dataclass_fields__["persist_interval_ms"].default
        c = config(name, layout, state_layout, trigger_ms if paced else 0, extra)
        if args.clean_topics_exist:
            specs = [
                kafka.TopicSpec(name=f"{tag}.{name}.clean.src{t}", partitions=PARTITIONS)
                for t in range(args.topics)
            ]  # created, and their leaders waited for, as the dedup does it
            kafka.create_missing_topics({"bootstrap.servers": bootstrap}, specs, timeout=60)
        writer = CountingWriter(writer_settings(c, WriterSettings))
        writers: list[subprocess.Popen] = []
        started = None
        if paced:

            def started() -> None:
                writers.append(start_paced_writer(bootstrap, f"{tag}.{layout}", args, now))

        try:
            seconds, profile = run_query(spark, c, writer, written[layout], started=started)
        finally:
            for proc in writers:
                if proc.wait(60) != 0:
                    raise RuntimeError(f"the paced writer exited with {proc.returncode}")
        profile["batches_committed"] = writer.committed_batches
        gb = written[layout] * len(VALUE) / 1e9
        profile["cpu_s_per_gb"] = round(profile["cpu_s"] / gb, 2)
        # what a long-running dedup pays once its JIT has settled: the compile time taken out
        jit = profile["jvm_jit_s_per_million"] * written[layout] / 1e6
        profile["cpu_s_per_gb_less_jit"] = round((profile["cpu_s"] - jit) / gb, 2)
        if paced and writer.committed_batches:  # a live run's CPU per micro-batch, by process
            millions, batches = written[layout] / 1e6, writer.committed_batches
            per_batch = {
                k: v * millions / batches
                for k, v in profile["cpu_s_per_million_by_process"].items()
            }
            per_batch["jvm_jit"] = jit / batches
            profile["cpu_s_per_batch"] = {k: round(v, 3) for k, v in per_batch.items()}
        profile["write_payload_bytes"] = writer.payload_bytes
        profile["write_record_bytes"] = writer.record_bytes
        profile["clean_records"] = writer.delivered
        profile["clean_records_per_s"] = round(writer.delivered / seconds)
        profile["cpu_s_per_million_clean"] = round(profile["cpu_s"] * 1e6 / writer.delivered, 1)
        results[name] = {"records_per_s": round(written[layout] / seconds), **profile}
        print(f"{name}: {seconds:.1f} s; {profile}", file=sys.stderr)

    measured = list(layouts) if args.order == "records-first" else list(reversed(layouts))
    # each dedup of runs in the state layouts asked for: (name, raw layout, state layout)
    kinds = {"buckets": [("runs", "buckets")], "direct": [("direct", "direct")]}
    kinds["both"] = kinds["buckets"] + kinds["direct"]
    queries = [
        (f"dedup_{name}", raw, state)
        for layout in measured
        for name, raw, state in (
            [(n, "runs", st) for n, st in kinds[args.state_layout]]
            if layout == "runs"
            else [("records", "records", "buckets")]
        )
    ]
    if args.paced_mbps:
        queries.append(("dedup_paced", "paced", "direct"))
        if args.paced_env:
            queries.append(("dedup_paced_tuned", "paced_tuned", "direct"))
    if args.state_layout == "both" or args.paced_mbps:
        queries += [(f"{name}_2", raw, state) for name, raw, state in reversed(queries)]
    try:
        passthrough("passthrough_cold")
        dedup("dedup_warmup", "runs" if "runs" in layouts else layouts[-1], queries[-1][2])
        for name, raw, state in queries:
            dedup(name, raw, state)
        passthrough("passthrough_warm")
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, object] = {
        "bench": "dedup",
        "master": "local[2]",
        "source_records": written[layouts[-1]],
        "raw_records": raw_records,
        "fan_in": args.topics,
        "copy_chains": args.chains,
        "clean_topics_exist": args.clean_topics_exist,
        "state_partitions": config("x", "runs").effective_shuffle_partitions(),
        "run_records": args.run_records,
        "raw_partitions": RAW_PARTITIONS,
        "value_bytes": len(VALUE),
        "order": measured,
        "prefill_s": round(prefill_s, 1),
        "load_average_1m_start": round(load_start, 2),
        "load_average_1m_end": round(os.getloadavg()[0], 2),
        "results": results,
    }
    base = results["passthrough_warm"]["cpu_s_per_million"]
    out["queries"] = [name for name, _, _ in queries]
    for name, _, _ in queries:
        layout = name.removeprefix("dedup_")
        r = results[name]
        out[f"{layout}_records_per_s"] = r["records_per_s"]
        out[f"{layout}_cpu_s_per_million"] = r["cpu_s_per_million"]
        out[f"{layout}_clean_records_per_s"] = r["clean_records_per_s"]
        out[f"{layout}_cpu_s_per_million_clean"] = r["cpu_s_per_million_clean"]
        out[f"{layout}_cpu_ratio_to_passthrough_warm"] = round(r["cpu_s_per_million"] / base, 3)
        if r["write_record_bytes"]:
            out[f"{layout}_write_payload_ratio"] = round(
                r["write_payload_bytes"] / r["write_record_bytes"], 3
            )
    if args.paced_mbps:
        # the live arrival against the single batch, same session (the same JIT), alternated
        single = [results[n]["cpu_s_per_gb"] for n in ("dedup_direct", "dedup_direct_2")]
        live = [results[n]["cpu_s_per_gb"] for n in ("dedup_paced", "dedup_paced_2")]
        out["paced_mbps"] = args.paced_mbps
        out["single_batch_cpu_s_per_gb"] = single
        out["paced_cpu_s_per_gb"] = live
        less_jit = {
            n: [results[f"dedup_{n}{k}"]["cpu_s_per_gb_less_jit"] for k in ("", "_2")]
            for n in ("direct", "paced")
        }
        out["single_batch_cpu_s_per_gb_less_jit"] = less_jit["direct"]
        out["paced_cpu_s_per_gb_less_jit"] = less_jit["paced"]
        out["paced_batches"] = [
            results[n]["batches_committed"] for n in ("dedup_paced", "dedup_paced_2")
        ]
        out["paced_cpu_s_per_batch"] = [
            results[n]["cpu_s_per_batch"] for n in ("dedup_paced", "dedup_paced_2")
        ]
        out["paced_to_single_batch_cpu_ratio"] = round(sum(live) / sum(single), 3)
        if args.paced_env:
            tuned = [
                results[n]["cpu_s_per_gb"] for n in ("dedup_paced_tuned", "dedup_paced_tuned_2")
            ]
            out["paced_tuned_env"] = args.paced_env
            out["paced_tuned_cpu_s_per_gb"] = tuned
            out["paced_tuned_batches"] = [
                results[n]["batches_committed"]
                for n in ("dedup_paced_tuned", "dedup_paced_tuned_2")
            ]
            out["paced_tuned_to_single_batch_cpu_ratio"] = round(sum(tuned) / sum(single), 3)
    out["passthrough_warm_cpu_s_per_million"] = base
    out["passthrough_cold_cpu_s_per_million"] = results["passthrough_cold"]["cpu_s_per_million"]
    if args.state_layout == "both":
        a, b = (
            clean_and_gaps(bootstrap, tag, f"dedup_{x}", args.topics) for x in ("runs", "direct")
        )
        out["direct_cpu_ratio_to_buckets"] = round(
            (
                results["dedup_direct"]["cpu_s_per_million"]
                + results["dedup_direct_2"]["cpu_s_per_million"]
            )
            / (
                results["dedup_runs"]["cpu_s_per_million"]
                + results["dedup_runs_2"]["cpu_s_per_million"]
            ),
            3,
        )
        out["direct_clean_rate_ratio_to_buckets"] = round(
            (
                results["dedup_direct"]["clean_records_per_s"]
                + results["dedup_direct_2"]["clean_records_per_s"]
            )
            / (
                results["dedup_runs"]["clean_records_per_s"]
                + results["dedup_runs_2"]["clean_records_per_s"]
            ),
            3,
        )
        out["direct_clean_identical"] = a[0] == b[0]
        out["direct_gaps_identical"] = a[1] == b[1]
        if not out["direct_clean_identical"] or not out["direct_gaps_identical"]:
            out["direct_differences"] = differences(("runs", "direct"), a, b)
    if len(layouts) == 2 and args.state_layout == "buckets":
        out["cpu_ratio_runs_to_records"] = round(
            results["dedup_runs"]["cpu_s_per_million"]
            / results["dedup_records"]["cpu_s_per_million"],
            3,
        )
        a, b = (clean_and_gaps(bootstrap, tag, f"dedup_{x}", args.topics) for x in layouts)
        out["clean_identical"] = a[0] == b[0]
        out["gaps_identical"] = a[1] == b[1]
        if not out["clean_identical"] or not out["gaps_identical"]:
            out["differences"] = differences(layouts, a, b)
        out["clean_records"] = sum(a[0].values())
        out["clean_duplicates"] = sum(n - 1 for n in a[0].values() if n > 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
