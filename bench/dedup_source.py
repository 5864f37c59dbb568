"""What carrying the payload through Spark costs, against a task that reads its range itself.

The direct layout's tasks get each raw record's bytes from Spark's Kafka source (the JVM fetches,
copies into rows, converts to Arrow and pipes to the Python worker). The alternative measured here:
Spark carries only ``partition`` and ``offset`` and each task reads its offset range with a
librdkafka consumer. One SparkSession (the dedup's own settings, ``local[2]``), one local broker,
a topic of ``--records`` values of ``--value-bytes`` random bytes in ``--partitions`` partitions,
read whole by a batch query into ``mapInArrow``; per round and case (alternated, the order
flipping every round): the CPU of the dedup's process tree (driver, JVM, Python workers;
``bench/dedup.py``'s accounting) per GB of values, the JIT's share of it, the broker's CPU per GB
and the wall time. Each task checks that it saw every value's bytes, so both cases do the same
work.

    .venv/bin/python bench/dedup_source.py [--records 10000] [--value-bytes 60000]
        [--partitions 8] [--rounds 3]

The first round warms the JVM (its figures are printed, not summarised). Prints one JSON object
as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
from confluent_kafka import Producer

from bench.dedup import broker_cpu_s, jit_s, tree_cpu
from dedup import job
from dedup.config import from_sources
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from runtime.maven import spark_connector_jars
from tests.kafka_helpers import create_topic

TOPIC = "source-bench"


def fill(bootstrap: str, records: int, value_bytes: int, partitions: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "message.max.bytes": 2 * value_bytes}
    )
    value = os.urandom(value_bytes)
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, value, b"k%d" % i, i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise RuntimeError("the topic was not filled")


def value_bytes_through_spark(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The payload as the direct layout gets it: in the rows."""
    total = 0
    for batch in batches:
        total += sum(len(v) for v in batch.column("value").to_pylist())
    yield pa.RecordBatch.from_pydict({"n": [total]})


def value_bytes_read_in_task(bootstrap: str) -> Callable[[Iterator[pa.RecordBatch]], Any]:
    """Offsets in the rows; the task reads each partition's range with librdkafka."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # imported here: cloudpickle ships a script's functions by value, with their globals
        from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for batch in batches:
            for part, off in zip(
                batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(),
                strict=True,
            ):
                first[part] = min(first.get(part, off), off)
                last[part] = max(last.get(part, off), off)
        total = 0
        for part, start in first.items():
            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "dedup-source-bench",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 10,
                }
            )
            consumer.assign([TopicPartition(TOPIC, part, start)])
            offset = start - 1
            deadline = time.monotonic() + 120
            while offset < last[part]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"partition {part} not read to {last[part]}")
                for message in consumer.consume(1000, 1.0):
                    if message.error() is None and message.offset() <= last[part]:
                        offset = message.offset()
                        total += len(message.value() or b"")
            consumer.close()
        yield pa.RecordBatch.from_pydict({"n": [total]})

    return task


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=60_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gigabytes = args.records * args.value_bytes / 1e9
    work = Path(tempfile.mkdtemp(prefix="bench-dedup-source-"))
    broker = LocalBroker("bench-source", free_port(), data_dir=work / "kafka")
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, partitions=args.partitions)
        fill(broker.bootstrap, args.records, args.value_bytes, args.partitions)
        env = {
            "BOOTSTRAP_SERVERS": broker.bootstrap,
            "RAW_TOPICS": TOPIC,
            "STATE_DIR_CONFIG": str(work / "state"),
            "SPARK_MASTER": "local[2]",
        }
        spark = job.build_session(
            from_sources(env, {"spark_conf": {"spark.driver.memory": "512m"}}),
            [str(p) for p in spark_connector_jars()],
        )
        cases = {
            "through_spark": (["partition", "offset", "value"], value_bytes_through_spark),
            "read_in_task": (["partition", "offset"], value_bytes_read_in_task(broker.bootstrap)),
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        for round_ in range(args.rounds):
            # The order flips every round, so neither case always inherits the other's warm-up.
            order = list(cases.items()) if round_ % 2 == 0 else list(cases.items())[::-1]
            for name, (columns, task) in order:
                frame = (
                    spark.read.format("kafka")
                    .option("kafka.bootstrap.servers", broker.bootstrap)
                    .option("subscribe", TOPIC)
                    .option("startingOffsets", "earliest")
                    .option("endingOffsets", "latest")
                    .load()
                    .select(*columns)
                )
                before, broker_before, jit_before = tree_cpu(), broker_cpu_s(), jit_s(spark)
                start = time.monotonic()
                seen = sum(row["n"] for row in frame.mapInArrow(task, "n long").collect())
                seconds = time.monotonic() - start
                after = tree_cpu()
                if seen != args.records * args.value_bytes:
                    raise RuntimeError(f"{name}: saw {seen} bytes of values, not all of them")
                run = {
                    "cpu_s_per_gb": (sum(after.values()) - sum(before.values())) / gigabytes,
                    "jit_s_per_gb": (jit_s(spark) - jit_before) / gigabytes,
                    "broker_cpu_s_per_gb": (broker_cpu_s() - broker_before) / gigabytes,
                    "seconds": seconds,
                }
                run = {k: round(v, 2) for k, v in run.items()}
                print(f"round {round_} {name}: {run}", flush=True)
                if round_ > 0 or args.rounds == 1:
                    runs[name].append(run)
        spark.stop()
    finally:
        broker.stop()
    medians = {
        name: {key: round(statistics.median(r[key] for r in rs), 2) for key in rs[0]}
        for name, rs in runs.items()
        if rs
    }
    print(
        json.dumps(
            {
                "bench": "dedup_source",
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "records": args.records,
                "value_bytes": args.value_bytes,
                "partitions": args.partitions,
                "runs": runs,
                "medians": medians,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
