"""Dedup throughput: raw topic -> dedup job (effectively-once writer) vs pass-through baselines.

Pre-fills a raw topic (8 partitions, 10 % duplicates, 1 % gaps, 200-byte values), then in ONE
SparkSession (local[2]) runs, each over the whole topic:

- ``passthrough``: the issue's baseline - Spark reads the topic and writes it unchanged (key,
  value, headers, partition) with Spark's own Kafka sink (at-least-once, no transaction);
- ``dedup``: the dedup query with its effectively-once writer (per-task transactions in the
  executors). With ``--warm-dedup`` a first dedup run warms the JVM and the Python workers
  *before* the pass-through, so both measured queries run warm.

The driver's own CPU (this Python process: py4j, foreachBatch) is reported separately
(``driver_python_cpu_s_per_million``); in local mode the JVM driver is also the executor.

Each rate is records read / seconds from query start to the last batch written (Spark start-up
excluded); CPU is the process tree's (driver, JVM, Python workers; not the broker), per million
raw records: the figure that survives other load on a shared machine. Load averages are taken at
start and end. Needs a broker: ``--bootstrap`` (default: start one with the project's
LocalBroker). Last line: one JSON object.

    .venv/bin/python bench/dedup.py --records 1000000
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
import tempfile  # noqa: E402
import time  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from dedup import job  # noqa: E402
from dedup.config import from_sources  # noqa: E402
from dedup.positions import pack_positions  # noqa: E402
from dedup.runner import writer_settings  # noqa: E402
from dedup.writer import (  # noqa: E402
    PartitionWriter,
    TransactionalBatchWriter,
    WriterSettings,
    ensure_topics,
)
from kafka_diode.local_kafka.broker import LocalBroker, free_port  # noqa: E402
from runtime.maven import spark_connector_jars  # noqa: E402

PARTITIONS = 8
VALUE = b"v" * 200


def prefill(
    bootstrap: str, topic: str, records: int, seed: int = 1, firsts: list | None = None
) -> tuple[int, int]:
    """Fill ``topic``; returns (raw records written, distinct offsets delivered).

    ``firsts``, if given, receives ``(partition, source offset, raw offset)`` of each first copy
    (the raw partition is the source partition; raw offsets count from 0 per partition).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
        }
    )
    rng = random.Random(seed)
    per_partition = records // PARTITIONS
    now = int(time.time() * 1000)
    written = distinct = 0
    session = b"ab" * 16
    for partition in range(PARTITIONS):
        raw_offset = 0
        for offset in range(int(per_partition / 1.09)):
            if rng.random() < 0.01:
                continue  # a gap
            distinct += 1
            copies = 2 if rng.random() < 0.1 else 1  # 10 % duplicates
            headers = [
                ("diode.key", b"key-%d" % offset),
                ("diode.timestamp", b"%d" % now),
                ("diode.timestamp-type", b"1"),
                ("diode.session", session),
            ]
            if firsts is not None:
                firsts.append((partition, offset, raw_offset))
            raw_offset += copies
            for _ in range(copies):
                while True:
                    try:
                        producer.produce(
                            topic,
                            VALUE,
                            b"src:%d:%d" % (partition, offset),
                            partition,
                            headers=headers,
                            timestamp=now,
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                written += 1
    producer.flush(120)
    return written, distinct


class CountingWriter(TransactionalBatchWriter):
    """Counts input rows of committed batches (stat rows) and the write tasks' times."""

    rows_in = 0
    fence_s = 0.0  # summed over tasks: fresh producer + init_transactions + marker read
    task_s = 0.0  # summed over tasks: the whole write task (fence, re-read, produce, commit)
    tasks = 0

    def account(self, table, batch_id):
        stats = table.filter(pc.equal(table.column("kind"), "stat"))
        if stats.num_rows:
            self.rows_in += sum(
                pc.sum(stats.column(n)).as_py() or 0 for n in ("delivered", "duplicates")
            )
        tasks = table.filter(pc.equal(table.column("kind"), "task"))
        self.fence_s += (pc.sum(tasks.column("fence_ms")).as_py() or 0) / 1000
        self.task_s += (pc.sum(tasks.column("write_ms")).as_py() or 0) / 1000
        self.tasks += tasks.num_rows
        return super().account(table, batch_id)


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of this process's threads so far, summed by thread name (the Python main
    thread is the script's name; librdkafka's are ``rdk:main``, ``rdk:broker<n>``, ...)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")].rstrip("0123456789")
        fields = text.rpartition(")")[2].split()
        out[name] = round(out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick, 2)
    return out


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its descendants alive now (the JVM, the
    Python workers, which Spark reuses; not a broker we started): robust to other load."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me, total = os.getpid(), 0.0
    for pid, seconds in cpu.items():
        walk = pid
        while walk not in (0, 1, me) and walk in parents:
            walk = parents[walk]
        if walk == me and not _is_broker(pid):
            total += seconds
    return total


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
        (p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000.0)
        for p in sorted(progresses, key=lambda p: p["batchId"])
        if p.get("numInputRows")
    ]
    later = batches[2:]
    rows, secs = sum(r for r, _ in later), sum(t for _, t in later)
    return {
        "batch_s": [round(t, 2) for _, t in batches],
        "steady_records_per_s": round(rows / secs) if secs else None,
    }


def run_query(spark, config, writer, total: int, transform=None) -> tuple[float, dict]:
    """Seconds to read ``total`` rows, and where the micro-batches' time went (query progress)."""
    cpu_before = tree_cpu_s()
    driver_before = time.process_time()
    start = time.monotonic()
    query = job.start_query(spark, config, writer, transform=transform)
    try:
        while writer.rows_in < total:
            if not query.isActive:
                raise RuntimeError(f"query stopped: {query.exception()}")
            query.awaitTermination(0.2)
        seconds = time.monotonic() - start
        cpu_s = tree_cpu_s() - cpu_before
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
    cpu_before = tree_cpu_s()
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
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(
            [p for p in query.recentProgress if p.get("numInputRows")]
        ) < sum(1 for n in seen.values() if n):
            query.awaitTermination(0.2)
        return seconds, {
            "cpu_s": round(cpu_s, 1),
            "cpu_s_per_million": round(cpu_s * 1e6 / total, 1),
            "batches_with_input": sum(1 for n in seen.values() if n),
            **steady(query.recentProgress),
        }
    finally:
        query.stop()


def driver_only(args: argparse.Namespace, bootstrap: str) -> int:
    """The writer alone (no Spark): re-read + restore + produce of every first-seen record.

    Batches of ``--max-offsets-per-trigger`` raw records, one transaction each, as the dedup's
    ``foreachBatch`` would write them. CPU is this process's (Python + librdkafka threads).
    """
    tag = f"bench{int(time.time())}"
    raw = f"{tag}.raw"
    firsts: list[tuple[int, int, int]] = []
    load_start = os.getloadavg()[0]
    written, distinct = prefill(bootstrap, raw, args.records, firsts=firsts)
    settings = WriterSettings(
        bootstrap_servers=bootstrap,
        clean_topic=f"{tag}.clean",
        gap_topic=f"{tag}.gaps",
        progress_topic=f"{tag}.progress",
        transactional_id=f"{tag}.writer",
        new_topic_partitions=PARTITIONS,
        raw_topics=(raw,),
    )
    ensure_topics(settings, [settings.clean_topic])
    ensure_topics(settings, [settings.gap_topic, settings.progress_topic], compact=True)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30  # new topics: wait for their leaders
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=10).topics
        parts = [p for t in (settings.progress_topic, settings.clean_topic) if t in meta
                 for p in meta[t].partitions.values()]  # fmt: skip
        if parts and all(p.leader >= 0 and p.error is None for p in parts):
            break
        time.sleep(0.2)
    names = [f.name for f in job.OUTPUT_SCHEMA.fields]
    types = {"kind": pa.string(), "src_topic": pa.string(), "src_partition": pa.int32()}
    types |= {"positions": pa.binary(), "gap_key": pa.binary(), "gap_value": pa.binary()}
    schema = pa.schema([(n, types.get(n, pa.int64())) for n in names])
    per_batch = max(1, round(args.max_offsets_per_trigger * distinct / written))
    tables = []
    for start in range(0, len(firsts), per_batch):
        chunk = firsts[start : start + per_batch]
        rows: dict[int, list[tuple[int, int, int]]] = {}
        for partition, src, raw_offset in chunk:
            rows.setdefault(partition, []).append((src, 0, partition, raw_offset))
        data = {n: [None] * len(rows) for n in names}
        data["kind"] = ["records"] * len(rows)
        data["src_topic"] = ["src"] * len(rows)
        data["src_partition"] = list(rows)
        data["positions"] = [pack_positions(list(zip(*r, strict=True))) for r in rows.values()]
        tables.append(pa.table(data, schema=schema))
    cpu0, t0 = time.process_time(), time.monotonic()
    produced = 0
    for batch_id, table in enumerate(tables):
        # a fresh writer per batch, as each write task attempt has (fence included)
        writer = PartitionWriter(settings, tag, 0)
        produced += writer.write_table(table, batch_id).records
        writer.close()
    seconds, cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    threads = thread_cpu_s()
    print(
        json.dumps(
            {
                "bench": "dedup_driver",
                "raw_records": written,
                "clean_records": produced,
                "batches": len(tables),
                "seconds": round(seconds, 2),
                "records_per_s": round(produced / seconds),
                "cpu_s": round(cpu_s, 2),
                "cpu_us_per_record": round(cpu_s * 1e6 / produced, 2),
                # whole-run CPU by thread name (prefill included for rdk threads of its clients)
                "thread_cpu_s": threads,
                "load_average_1m_start": round(load_start, 2),
                "load_average_1m_end": round(os.getloadavg()[0], 2),
            }
        )
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=200_000)
    parser.add_argument("--arrow-max-records-per-batch", type=int, default=100_000)
    parser.add_argument(
        "--driver-only",
        action="store_true",
        help="no Spark: time the writer's re-read + restore + produce of the first-seen records",
    )
    parser.add_argument(
        "--only", choices=("all", "passthrough", "dedup"), default="all", help="queries to run"
    )
    parser.add_argument(
        "--source-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="option of Spark's Kafka source for every query (e.g. minPartitions=2)",
    )
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="option of Spark's Kafka sink in the pass-through (e.g. kafka.linger.ms=50)",
    )
    parser.add_argument(
        "--warm-dedup",
        action="store_true",
        help="run the dedup query once before the measured run (JVM JIT and Python workers warm)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE,sink:NAME=VALUE",
        help="one more Spark-sink pass-through with these source (and sink:) options",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Spark setting (e.g. spark.sql.shuffle.partitions=1)",
    )
    parser.add_argument("--value-bytes", type=int, default=200, help="raw record value size")
    args = parser.parse_args()
    global VALUE  # noqa: PLW0603  one setting for the whole run
    VALUE = b"v" * args.value_bytes

    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        data_dir = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
        broker = LocalBroker("bench-dedup", free_port(), data_dir=data_dir, partitions=PARTITIONS)
        broker.start()
        bootstrap = broker.bootstrap
    try:
        return driver_only(args, bootstrap) if args.driver_only else measure(args, bootstrap)
    finally:  # a failed run must not leave its broker behind
        if broker is not None:
            broker.stop()


def measure(args: argparse.Namespace, bootstrap: str) -> int:
    """Prefill, run the queries in one SparkSession, print the JSON line."""
    tag = f"bench{int(time.time())}"
    raw = f"{tag}.raw"
    load_start = os.getloadavg()[0]
    t0 = time.monotonic()
    written, distinct = prefill(bootstrap, raw, args.records)
    prefill_s = time.monotonic() - t0
    tmp = Path(tempfile.mkdtemp(prefix="bench-dedup-ck-"))

    def pairs(items: list[str]) -> dict[str, str]:
        return dict(item.split("=", 1) for item in items)

    def config(name: str):
        flags = {"kafka_source": args.source_option, "spark_conf": args.spark_conf}
        return from_sources(
            {
                "RAW_TOPICS": raw,
                "BOOTSTRAP_SERVERS": bootstrap,
                "STATE_DIR_CONFIG": str(tmp / name),
                "CLEAN_TOPIC": f"{tag}.{name}.clean",
                "GAP_TOPIC": f"{tag}.{name}.gaps",
                "PROGRESS_TOPIC": f"{tag}.{name}.progress",
                "CONTROL_TOPIC": f"{tag}.{name}.control",
                "NEW_TOPIC_PARTITIONS": str(PARTITIONS),
                "SPARK_MASTER": "local[2]",
                "SHUFFLE_PARTITIONS": "2",
                "PERSIST_INTERVAL_MS": "0",
                "MAX_OFFSETS_PER_TRIGGER": str(args.max_offsets_per_trigger),
                "ARROW_MAX_RECORDS_PER_BATCH": str(args.arrow_max_records_per_batch),
            },
            {k: v for k, v in flags.items() if v},
        )

    cfg = config("dedup")
    t0 = time.monotonic()
    spark = job.build_session(cfg, [str(p) for p in spark_connector_jars()])
    spark_start_s = time.monotonic() - t0

    results = {}
    try:
        if args.warm_dedup and args.only != "passthrough":
            # JIT and Python workers warm before either measured query
            c = config("dedup_warmup")
            writer = CountingWriter(writer_settings(c, WriterSettings))
            seconds, profile = run_query(spark, c, writer, written)
            results["dedup_warmup"] = {
                "records_per_s": round(written / seconds),
                "profile": profile,
            }
            print(f"dedup_warmup: {seconds:.1f} s; {profile}", file=sys.stderr)
        if args.only != "dedup":
            seconds, profile = run_sink_passthrough(
                spark, bootstrap, raw, f"{tag}.sink.out", tmp / "sink", written,
                pairs(args.source_option), pairs(args.sink_option), args.max_offsets_per_trigger,
            )  # fmt: skip
            results["passthrough"] = {"records_per_s": round(written / seconds), "profile": profile}
            print(f"passthrough (Kafka sink): {seconds:.1f} s; {profile}", file=sys.stderr)
        for i, variant in enumerate(args.variant):
            # NAME:source.k=v,sink:k=v,... - one more pass-through query in the same session
            label, _, spec = variant.partition(":")
            source, sink = pairs(args.source_option), pairs(args.sink_option)
            for item in filter(None, spec.split(",")):
                if item.startswith("sink:"):
                    sink |= pairs([item[5:]])
                else:
                    source |= pairs([item])
            offsets = int(source.pop("maxOffsetsPerTrigger", args.max_offsets_per_trigger))
            seconds, profile = run_sink_passthrough(
                spark, bootstrap, raw, f"{tag}.v{i}.out", tmp / f"v{i}", written,
                source, sink, offsets,
            )  # fmt: skip
            results[f"variant {label}"] = {
                "records_per_s": round(written / seconds),
                "profile": profile,
                "source": source,
                "sink": sink,
            }
            print(f"variant {label}: {seconds:.1f} s; {profile}", file=sys.stderr)
        runs = ["dedup"] if args.only != "passthrough" else []
        for name in runs:
            c = config(name)
            writer = CountingWriter(writer_settings(c, WriterSettings))
            seconds, profile = run_query(spark, c, writer, written)
            results[name] = {"records_per_s": round(written / seconds), "profile": profile}
            print(f"{name}: {written} records in {seconds:.1f} s; {profile}", file=sys.stderr)
    finally:
        spark.stop()
    out = {
        "bench": "dedup",
        "master": "local[2]",
        "raw_records": written,
        "distinct_records": distinct,
        "value_bytes": len(VALUE),
        "dedup_payload_mb_per_s": round(results["dedup"]["records_per_s"] * len(VALUE) / 1e6, 1)
        if "dedup" in results
        else None,
        "partitions": PARTITIONS,
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "arrow_max_records_per_batch": args.arrow_max_records_per_batch,
        "source_options": pairs(args.source_option),
        "sink_options": pairs(args.sink_option),
        "spark_conf": pairs(args.spark_conf),
        "prefill_s": round(prefill_s, 1),
        "spark_start_s": round(spark_start_s, 1),
        "load_average_1m_start": round(load_start, 2),
        "load_average_1m_end": round(os.getloadavg()[0], 2),
        "target_records_per_s": 150_000,
    }
    dedup, base = results.get("dedup"), results.get("passthrough")
    if dedup is not None:
        out["dedup_records_per_s"] = dedup["records_per_s"]
        out["dedup_cpu_s_per_million"] = dedup["profile"]["cpu_s_per_million"]
        out["dedup_profile_s"] = dedup["profile"]
    if base is not None:
        out["passthrough_records_per_s"] = base["records_per_s"]
        out["passthrough_cpu_s_per_million"] = base["profile"]["cpu_s_per_million"]
        out["passthrough_profile_s"] = base["profile"]
    out["variants"] = {
        k[8:]: {"records_per_s": v["records_per_s"], **v["profile"]}
        for k, v in results.items()
        if k.startswith("variant ")
    }
    if "dedup_warmup" in results:
        warm = results["dedup_warmup"]
        out["dedup_warmup_records_per_s"] = warm["records_per_s"]
        out["dedup_warmup_cpu_s_per_million"] = warm["profile"]["cpu_s_per_million"]
    if dedup is not None and base is not None:
        out["ratio_to_passthrough"] = round(dedup["records_per_s"] / base["records_per_s"], 3)
        out["cpu_ratio_to_passthrough"] = round(
            dedup["profile"]["cpu_s_per_million"] / base["profile"]["cpu_s_per_million"], 3
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
