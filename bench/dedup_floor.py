"""The floor of a single-stage dedup, against today's dedup and Spark's pass-through (issue 24).

Today's dedup is two steps in one Spark stage after a shuffle: the stateful step
(``applyInPandasWithState`` per bucket, state in RocksDB) and the write task, the payload carried
through both (docs/dedup-internals.md "How it works"). The design this bench prices instead
has no shuffle and no stateful operator: one task per raw partition (Spark's Kafka source makes
one per topic-partition), which would detect, write and keep its detectors' state in its own Kafka
transaction, as a Kafka Streams task keeps its changelog. Its **floor** is what that task cannot
avoid: read the raw partition, hand the runs to one Python worker (``mapInArrow``), decode every
run and produce every record it holds into one transaction per task, commit. It detects nothing
(so it writes the copies too, a little more than a dedup writes) and keeps no state: the design's
detection is per run, not per record, and its state write one record per task and batch.

One broker (``--bootstrap`` or one of its own), the same synthetic raw topics as
``bench/dedup.py`` (``plan``, ``prefill``: runs of ``--run-records`` records, 10 % whole copies,
2 % partly overlapping resends, 8 raw partitions), one SparkSession (``local[2]``, the dedup's own
``build_session``), in this order: Spark's pass-through of the v1 topic (cold, not a baseline),
floor and dedup warm-ups, then floor, dedup, floor, dedup (measured), then the pass-through again
(warm: the baseline, as in ``bench/dedup.py``). CPU is the process tree's per million source
records, brokers excluded; memory the peak summed Pss of the same tree (sampled every 0.5 s
while a query runs). ``--only floor`` or ``--only dedup`` runs one kind of query (warm-up and
two measured) in a session of its own, without the pass-throughs: each one's memory without the
other's leftovers in the heap. Last line: one JSON object.

    .venv/bin/python bench/dedup_floor.py --records 1000000
    .venv/bin/python bench/dedup_floor.py --records 60000 --value-bytes 10000 --run-records 6
    .venv/bin/python bench/dedup_floor.py --records 1000000 --only floor    # and --only dedup
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and bench/dedup.py would shadow
# the ``dedup`` package; drop it, and put the repository first (``bench.dedup``).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pyarrow as pa  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from pyspark import TaskContext  # noqa: E402

import bench.dedup as bd  # noqa: E402
from common.raw_run import check_run, parse_run_key  # noqa: E402
from dedup import job  # noqa: E402
from dedup.config import DedupConfig, from_sources  # noqa: E402
from dedup.detector import DetectorConfig, PartitionDetector  # noqa: E402
from dedup.fence import init_producer  # noqa: E402
from dedup.runner import writer_settings  # noqa: E402
from dedup.transaction import _produce_run, gc_paused  # noqa: E402
from dedup.writer_settings import WriterSettings  # noqa: E402

#: The dedup's default detector limits (docs/configuration.md).
DETECTOR = DetectorConfig()
#: Every timestamp is accepted: the floor never replaces one (the dedup's window check is per run).
ANY_TIME = (0, 2**62)


def tree_pss_mb() -> float:
    """Summed Pss (``smaps_rollup``) of ``bench.dedup.tree_members``, MB."""
    total = 0
    for pid, _, _ in bd.tree_members():
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            continue
    return total / 1024


class PeakPss(threading.Thread):
    """The highest ``tree_pss_mb`` seen, sampled every half second while a query runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.peak = max(self.peak, tree_pss_mb())

    def __enter__(self) -> PeakPss:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def floor_writer(settings: WriterSettings, out: str) -> Any:
    """The ``mapInArrow`` function of the single-stage task (runs in a Python worker).

    Per raw record: parse the run key, check the run (one decode), ask the source partition's
    detector (``PartitionDetector.observe_run``, as the stateful step does) and produce the
    first-seen records of it, in one transaction per task; at the end, one state record per
    source partition (its detector's bytes) in the same transaction. Not done: reading the state
    back at the task's start (a read of one compacted partition, like today's marker read), gap
    scans, control records.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = TaskContext.get()
        partition = task.partitionId() if task is not None else 0
        target = (out, partition % bd.PARTITIONS, ANY_TIME)
        detectors: dict[tuple[str, int], PartitionDetector] = {}
        producer = None
        produced = seen = 0
        now = int(time.time() * 1000)
        for batch in batches:
            if producer is None:
                producer = init_producer(settings, f"floor-{out}-{partition}")
                producer.begin_transaction()
            with gc_paused():
                for key, payload in zip(
                    batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True
                ):
                    parsed = parse_run_key(key)
                    if parsed is None:
                        continue
                    topic, source_partition, first, last, stride = parsed
                    group = check_run(payload, topic, source_partition, first, last, stride)
                    seen += len(group.offsets)
                    detector = detectors.get((topic, source_partition))
                    if detector is None:
                        detector = PartitionDetector(topic, source_partition, DETECTOR)
                        detectors[topic, source_partition] = detector
                    for a, b in detector.observe_run(first, last, now):
                        _produce_run(producer, group, a - first, b - first + 1, target)
                        produced += b - a + 1
        if producer is not None:
            for (topic, source_partition), detector in detectors.items():
                state_key = f"state:{topic}:{source_partition}".encode()
                producer.produce(out, detector.to_bytes(), state_key, target[1])
            producer.commit_transaction(120)
        yield pa.RecordBatch.from_pydict({"seen": [seen], "produced": [produced]})

    return write


def run_floor(spark: Any, config: DedupConfig, out: str, total: int) -> tuple[float, dict]:
    """Seconds and CPU of the floor query over the whole raw topic (``total`` source records)."""
    settings = writer_settings(config, WriterSettings)
    write = floor_writer(settings, out)
    seen = [0]
    produced = [0]

    def each(frame: Any, batch_id: int) -> None:
        rows = frame.select("key", "value").mapInArrow(write, "seen long, produced long").collect()
        seen[0] += sum(row.seen for row in rows)
        produced[0] += sum(row.produced for row in rows)

    split_before = bd.tree_cpu()
    cpu_before = sum(split_before.values())
    start = time.monotonic()
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.bootstrap_servers)
        .option("subscribe", ",".join(config.raw_topics))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
        .load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", config.state_dir_config)
        .trigger(processingTime="0 milliseconds")
        .start()
    )
    try:
        while seen[0] < total:
            if not query.isActive:
                raise RuntimeError(f"query stopped: {query.exception()}")
            query.awaitTermination(0.2)
        seconds = time.monotonic() - start
        cpu_s = bd.tree_cpu_s() - cpu_before
        return seconds, {
            "cpu_s": round(cpu_s, 1),
            "cpu_s_per_million": round(cpu_s * 1e6 / total, 1),
            "cpu_s_per_million_by_process": bd.cpu_split_per_million(split_before, total),
            "seen": seen[0],
            "produced": produced[0],
        }
    finally:
        query.stop()


def measure(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """Prefill, run the queries in one session, return the JSON object."""
    tag = f"floor{int(time.time())}"
    units = bd.plan(args.records, 1, args.run_records)
    now = int(time.time() * 1000)
    written = {layout: bd.prefill(bootstrap, f"{tag}.{layout}", units, layout, now)
               for layout in ("records", "runs")}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench-dedup-ck-"))
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def config(name: str) -> DedupConfig:
        env = {
            "RAW_TOPICS": f"{tag}.runs", "BOOTSTRAP_SERVERS": bootstrap,
            "STATE_DIR_CONFIG": str(tmp / name), "CLEAN_TOPIC": f"{tag}.{name}.clean.{{topic}}",
            "GAP_TOPIC": f"{tag}.{name}.gaps", "PROGRESS_TOPIC": f"{tag}.{name}.progress",
            "CONTROL_TOPIC": f"{tag}.{name}.control", "NEW_TOPIC_PARTITIONS": str(bd.PARTITIONS),
            "SPARK_MASTER": "local[2]", "PERSIST_INTERVAL_MS": "0",
            # the stateful design the floor was measured against (bench/dedup.py --state-layout
            # both measures the direct layout built on it)
            "STATE_LAYOUT": "buckets",
        }  # fmt: skip
        return from_sources(env, {"spark_conf": args.spark_conf} if args.spark_conf else {})

    spark = job.build_session(config("x"), [str(p) for p in bd.spark_connector_jars()])
    results: dict[str, dict[str, Any]] = {}
    total = written["runs"]

    def floor(name: str) -> None:
        out = f"{tag}.{name}.out"
        for future in admin.create_topics([NewTopic(out, bd.PARTITIONS, 1)]).values():
            future.result(60)
        with PeakPss() as pss:
            seconds, profile = run_floor(spark, config(name), out, total)
        profile["peak_pss_mb"] = round(pss.peak)
        if profile["seen"] != total:
            raise RuntimeError(f"{name}: saw {profile['seen']} of {total} records")
        results[name] = {"records_per_s": round(total / seconds), **profile}
        print(f"{name}: {seconds:.1f} s; {results[name]}", file=sys.stderr, flush=True)

    def dedup(name: str) -> None:
        c = config(name)
        writer = bd.CountingWriter(writer_settings(c, WriterSettings))
        with PeakPss() as pss:
            seconds, profile = bd.run_query(spark, c, writer, total)
        results[name] = {
            "records_per_s": round(total / seconds),
            "peak_pss_mb": round(pss.peak),
            "cpu_s_per_million": profile["cpu_s_per_million"],
            "cpu_s_per_million_by_process": profile["cpu_s_per_million_by_process"],
        }
        print(f"{name}: {seconds:.1f} s; {results[name]}", file=sys.stderr, flush=True)

    def passthrough(name: str) -> None:
        seconds, profile = bd.run_sink_passthrough(
            spark, bootstrap, f"{tag}.records", f"{tag}.{name}.out", tmp / name,
            written["records"], {}, {}, 200_000,
        )  # fmt: skip
        results[name] = {"records_per_s": round(written["records"] / seconds), **profile}
        print(f"{name}: {seconds:.1f} s; {results[name]}", file=sys.stderr, flush=True)

    queries = {"floor": floor, "dedup": dedup}
    chosen = ("floor", "dedup") if args.only == "both" else (args.only,)
    try:
        if args.only == "both":
            passthrough("passthrough_cold")
        for kind in chosen:
            queries[kind](f"{kind}_warmup")
        for i in (1, 2):
            for kind in chosen:
                queries[kind](f"{kind}_{i}")
        if args.only == "both":
            passthrough("passthrough_warm")
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def mean(prefix: str) -> float:
        return sum(results[f"{prefix}_{i}"]["cpu_s_per_million"] for i in (1, 2)) / 2

    out: dict[str, Any] = {
        "bench": "dedup_floor",
        "master": "local[2]",
        "source_records": total,
        "raw_records": {"records": written["records"], "runs": len(units)},
        "value_bytes": args.value_bytes,
        "run_records": args.run_records,
        "load_average_1m_end": round(os.getloadavg()[0], 2),
        "results": results,
    }
    for kind in chosen:
        out[f"{kind}_cpu_s_per_million"] = round(mean(kind), 1)
        out[f"{kind}_peak_pss_mb"] = max(v["peak_pss_mb"] for k, v in results.items()
                                          if k.startswith(kind))  # fmt: skip
    if args.only == "both":
        base = results["passthrough_warm"]["cpu_s_per_million"]
        out["passthrough_warm_cpu_s_per_million"] = base
        out["floor_to_dedup"] = round(mean("floor") / mean("dedup"), 3)
        out["floor_to_passthrough_warm"] = round(mean("floor") / base, 3)
        out["dedup_to_passthrough_warm"] = round(mean("dedup") / base, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--records", type=int, default=1_000_000, help="source records")
    parser.add_argument("--run-records", type=int, default=256, help="records per run")
    parser.add_argument("--value-bytes", type=int, default=200, help="source value size")
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument(
        "--only",
        choices=("both", "floor", "dedup"),
        default="both",
        help="one kind of query in its own session (its memory: the peak Pss of the tree)",
    )
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="NAME=VALUE", help="Spark setting"
    )
    args = parser.parse_args()
    bd.VALUE = b"v" * args.value_bytes
    broker = None
    bootstrap = args.bootstrap
    data_dir = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
    if bootstrap is None:
        broker = bd.LocalBroker("bench-floor", bd.free_port(), data_dir=data_dir,
                                partitions=bd.PARTITIONS)  # fmt: skip
        broker.start()
        bootstrap = broker.bootstrap
    try:
        print(json.dumps(measure(args, bootstrap)))
        return 0
    finally:  # a failed run must not leave its broker, nor its data, behind
        if broker is not None:
            broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
