"""What a dedup write task's producer costs per GB: librdkafka's 1 MB batches against the dedup's.

A write task writes its whole share of a micro-batch inside one Kafka transaction, as fast as it
can produce. One local broker; per round and batch size (alternated, the order flipping every
round) one transactional producer built as the tasks build theirs (``dedup.fence.writer_conf``:
linger, queue bound, ``WriterSettings.write_batch_bytes``) writes ``--transactions`` transactions
of ``--mb`` MB of ``--value-bytes`` records round robin into ``--partitions`` partitions, making
room in a full queue as the task does (``dedup.fence.wait_for_room``). Per GB: the CPU of this
process (its librdkafka threads included) and the wall time.

    .venv/bin/python bench/write_batch.py [--mb 50] [--partitions 2] [--transactions 4] [--rounds 3]

The first round warms the broker (printed, not summarised). Prints one JSON object last.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dedup.fence import WRITE_BATCH_BYTES, wait_for_room, writer_conf
from dedup.writer_settings import LIBRDKAFKA_BATCH_BYTES, WriterSettings
from kafka_diode.local_kafka.broker import LocalBroker, free_port

TOPIC = "bench.write-batch"


def one_round(bootstrap: str, batch_bytes: int, args: argparse.Namespace) -> dict[str, float]:
    settings = WriterSettings(
        bootstrap_servers=bootstrap,
        clean_topic=TOPIC,
        gap_topic="unused",
        progress_topic="unused",
        transactional_id="bench-write-batch",
        write_batch_bytes=batch_bytes,
    )
    producer = Producer(writer_conf(settings, f"bench-write-batch-{batch_bytes}"))
    producer.init_transactions(30)
    value = os.urandom(args.value_bytes)
    records = int(args.mb * 1e6 / args.value_bytes)
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(args.transactions):
        producer.begin_transaction()
        for i in range(records):
            while True:
                try:
                    producer.produce(TOPIC, value, partition=i % args.partitions)
                    break
                except BufferError:
                    wait_for_room(producer)
            producer.poll(0)
        producer.commit_transaction(120)
    gb = args.mb * args.transactions / 1000
    result = {
        "cpu_s_per_gb": (time.process_time() - cpu) / gb,
        "wall_s_per_gb": (time.monotonic() - wall) / gb,
    }
    producer.flush(30)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--mb", type=float, default=50.0, help="MB per transaction")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--transactions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = {"librdkafka": LIBRDKAFKA_BATCH_BYTES, "dedup": WRITE_BATCH_BYTES}
    broker = LocalBroker("bench-write-batch", free_port(), data_dir=Path(tempfile.mkdtemp()))
    broker.start()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in sizes}
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic = NewTopic(TOPIC, args.partitions, 1, config={"max.message.bytes": str(64 << 20)})
        for future in admin.create_topics([topic]).values():
            future.result(30)
        for n in range(args.rounds + 1):
            order = list(sizes) if n % 2 == 0 else list(reversed(sizes))
            for name in order:
                row = one_round(broker.bootstrap, sizes[name], args)
                print(f"round {n} {name}: {json.dumps(row)}", flush=True)
                if n > 0:  # round 0 warms the broker
                    rows[name].append(row)
    finally:
        broker.stop()
    median = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rows.items()
    }
    print(
        json.dumps(
            {
                "bench": "write_batch",
                "machine": platform.machine(),
                "cores": os.cpu_count(),
                "mb_per_transaction": args.mb,
                "partitions": args.partitions,
                "batch_bytes": sizes,
                "median": median,
                "cpu_ratio_dedup_to_librdkafka": median["dedup"]["cpu_s_per_gb"]
                / median["librdkafka"]["cpu_s_per_gb"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
