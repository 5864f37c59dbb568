"""What a direct task's Python worker spends per byte, without Spark: read, classify, detect, write.

Starts a local broker, writes ``--runs`` raw records (v2 runs of ``--run-records`` records of
``--value-bytes`` random bytes, as the receiver writes them) into one raw partition, then per
round, in this process (CPU: user + system of every thread, librdkafka's included):

- ``task``: the direct layout's task as a Python worker runs it (``dedup/layouts/direct.py``:
  ``read_range`` with the dedup's consumer settings into ``DirectTransaction``: the fence, the
  state read, classification, the detectors, the clean records produced one per source record,
  the state record, one commit), a new query id each round so that every record is first seen;
- ``copy``, the baseline: the same raw records read by the same consumer and each raw record
  written as it is by a transactional producer of the same settings, one commit: reading and
  writing the bytes once through librdkafka in Python, the floor of any write task.

Rounds alternate (copy first); CPU-s per GB of record values and the task's ratio to the copy.

    .venv/bin/python bench/direct_worker.py [--runs 2000] [--value-bytes 10000] [--run-records 6]
        [--rounds 5]

Prints one line per round and one JSON object as the last line.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))  # bench.dedup_latency

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench.dedup_latency import produce_run  # noqa: E402
from common.raw_run import RunBuilder  # noqa: E402
from dedup import range_reader, state_reader  # noqa: E402
from dedup.detect import DetectParams  # noqa: E402
from dedup.direct_task import DirectTransaction  # noqa: E402
from dedup.fence import init_producer  # noqa: E402
from dedup.layouts import Layout  # noqa: E402
from dedup.range_reader import RangeReading, read_range  # noqa: E402
from dedup.raw_position import consumer_conf  # noqa: E402
from dedup.writer_settings import TaskSpec, WriterSettings  # noqa: E402
from kafka_diode.local_kafka.broker import LocalBroker, free_port  # noqa: E402

RAW, CLEAN, COPY = "raw", "clean.{topic}", "copy"
PARAMS = DetectParams(
    window_size=65_536,
    max_windows=64,
    max_expired_gaps=1000,
    max_state_bytes=8 << 20,
    scan_interval_ms=60_000,
)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fill(bootstrap: str, args: argparse.Namespace) -> int:
    """Writes the raw runs; returns the raw partition's end offset."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(t, 1, 1, config={"max.message.bytes": str(64 << 20)})
              for t in (RAW, "clean.src", COPY, "state", "gaps")]  # fmt: skip
    for future in admin.create_topics(topics).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "message.max.bytes": 64 << 20})  # fmt: skip
    value = os.urandom(args.value_bytes)
    now = time.time_ns() // 1_000_000
    for n in range(args.runs):
        first = n * args.run_records
        run = RunBuilder("src", 0, 1, first, now)
        for offset in range(first, first + args.run_records):
            run.append(offset, now, b"key-%d" % offset, value, ())
        produce_run(producer, RAW, run, 0, now)
    if producer.flush(120):
        raise RuntimeError("could not write the raw runs")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench"})
    _, end = consumer.get_watermark_offsets(TopicPartition(RAW, 0), timeout=30)
    consumer.close()
    return int(end)


def task_round(settings: WriterSettings, reading: RangeReading, end: int) -> int:
    spec = TaskSpec(
        settings=settings,
        query_id=f"bench-{uuid.uuid4()}",
        batch_id=0,
        layout=Layout.DIRECT,
        params=PARAMS,
        now_ms=time.time_ns() // 1_000_000,
        raw_partitions=1,
        reading=reading,
    )
    result = DirectTransaction(spec, RAW, 0).run(
        read_range(reading, RAW, 0, 0, end), lambda _: None
    )
    return result.records


def copy_round(settings: WriterSettings, reading: RangeReading, end: int) -> int:
    consumer = range_reader._consumer(reading.conf)  # the task's kept consumer, as it reads
    consumer.assign([TopicPartition(RAW, 0, 0)])
    producer = init_producer(settings, f"{settings.transactional_id}-copy")
    producer.begin_transaction()
    at = copied = 0
    while at < end:
        for message in consumer.consume(256, 0.1):
            if message.error() is not None:
                raise RuntimeError(str(message.error()))
            while True:
                try:
                    producer.produce(COPY, message.value(), message.key(), 0)
                    break
                except BufferError:
                    producer.poll(0.01)
            at, copied = int(message.offset() or 0) + 1, copied + 1
    consumer.unassign()
    producer.commit_transaction(120)
    producer.flush(0)
    return copied


def measure(name: str, run: Callable[[], int], gb: float) -> dict[str, float]:
    cpu, thread, wall = cpu_s(), time.thread_time(), time.monotonic()
    count = run()
    cpu, thread = cpu_s() - cpu, time.thread_time() - thread
    figures = {
        "cpu_s": round(cpu, 3),
        "wall_s": round(time.monotonic() - wall, 3),
        "cpu_s_per_gb": round(cpu / gb, 2),
        # the Python thread's own: librdkafka's threads poll busily while the broker lags
        "python_cpu_s_per_gb": round(thread / gb, 2),
    }
    print(name, count, json.dumps(figures), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--value-bytes", type=int, default=10_000)
    parser.add_argument("--run-records", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-direct-task-"))
    broker = LocalBroker("bench-direct-task", free_port(), data_dir=tmp / "kafka")
    broker.start()
    try:
        end = fill(broker.bootstrap, args)
        settings = WriterSettings(
            bootstrap_servers=broker.bootstrap,
            clean_topic=CLEAN,
            gap_topic="gaps",
            progress_topic="gaps",
            state_topic="state",
            transactional_id="bench",
            write_batch_bytes=8 << 20,
        )
        conf = consumer_conf({"bootstrap.servers": broker.bootstrap}, {}, group_id="bench")
        reading = RangeReading(conf=conf)
        gb = args.runs * args.run_records * args.value_bytes / 1e9
        measure("warm-up", lambda: task_round(settings, reading, end), gb)
        rounds: dict[str, list[dict[str, float]]] = {"copy": [], "task": []}
        for _ in range(args.rounds):
            rounds["copy"].append(measure("copy", lambda: copy_round(settings, reading, end), gb))
            rounds["task"].append(measure("task", lambda: task_round(settings, reading, end), gb))
        range_reader.close()
        state_reader.close()
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {k: statistics.median(r["cpu_s_per_gb"] for r in v) for k, v in rounds.items()}
    python = {k: statistics.median(r["python_cpu_s_per_gb"] for r in v) for k, v in rounds.items()}
    print(json.dumps({
        "bench": "direct_worker",
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "runs": args.runs,
        "value_bytes": args.value_bytes,
        "run_records": args.run_records,
        "gb": round(gb, 3),
        "rounds": rounds,
        "copy_cpu_s_per_gb": medians["copy"],
        "task_cpu_s_per_gb": medians["task"],
        "task_vs_copy": round(medians["task"] / medians["copy"], 2),
        "copy_python_cpu_s_per_gb": python["copy"],
        "task_python_cpu_s_per_gb": python["task"],
        "task_vs_copy_python": round(python["task"] / python["copy"], 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
