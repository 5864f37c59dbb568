"""Sender benchmark: records/s from a pre-filled topic to a UDP socket, with a same-run baseline.

Pre-fills a topic (6 partitions, 200-byte values, 16-byte keys) on a real local broker (started
here unless ``--bootstrap`` is given), then measures, in this one process:

- ``baseline``: a bare confluent-kafka consume loop (``consume(1000)``, touching each value);
- ``sender`` with AES-256-GCM and no compression, and with gzip level 1: the real ``SenderApp``
  (uvloop, 1452-byte datagrams, no pacing) sending to a loopback UDP socket nobody reads (the
  kernel drops what overflows; the sender's cost is the same).

Timing runs from the first record read to the moment every record's datagrams were handed to the
socket, so the consumer group join is excluded from every figure. Prints a table, then one JSON
object as the last line.

    .venv/bin/python bench/sender.py [--records 300000] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from common import settings
from common.wire import Key, KeyRing
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from sender.app import SenderApp
from sender.config import SenderConfig

VALUE = 200
PARTITIONS = 6


def fill(bootstrap: str, count: int) -> str:
    topic = f"bench-sender-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "compression.type": "lz4",
        }
    )
    value = os.urandom(VALUE)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, b"%016d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return topic


def baseline(bootstrap: str, topic: str, count: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen = total = 0
    start = None
    while seen < count:
        for msg in consumer.consume(1000, 1.0):
            if msg.error() is None:
                if start is None:
                    start = time.perf_counter()
                total += len(msg.value())
                seen += 1
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    return seen / elapsed


async def run_sender(
    bootstrap: str, topic: str, count: int, key_file: Path, compression: str, port: int
) -> float:
    cfg = settings.build(
        SenderConfig,
        file_values={
            "bootstrap_servers": bootstrap,
            "target": f"127.0.0.1:{port}",
            "topics": [topic],
            "group_id": f"bench-{uuid.uuid4().hex}",
            "start_position": "earliest",
            "key_file": str(key_file),
            "compression": compression,
        },
    )
    app = SenderApp(cfg)
    await app.start()
    try:
        while app.records_read == 0:  # noqa: ASYNC110  polling a counter
            await asyncio.sleep(0.001)
        start = time.perf_counter()
        while app.pipeline is not None and app.pipeline.records_sent < count:
            assert app.failure is None, app.failure
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
    finally:
        await app.stop()
    return count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    args = parser.parse_args()
    broker = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            broker = LocalBroker(
                f"bench-sender-{os.getpid()}",
                free_port(),
                data_dir=Path(tmp) / "kafka",
                partitions=PARTITIONS,
            )
            broker.start()
            bootstrap = broker.bootstrap
        try:
            key = Key.generate()
            key_file = Path(tmp) / "key.json"
            KeyRing([key], active=key.key_id).write(key_file)
            sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sink.bind(("127.0.0.1", 0))
            port = sink.getsockname()[1]
            topic = fill(bootstrap, args.records)
            results = {"baseline_consume_records_per_s": baseline(bootstrap, topic, args.records)}
            for compression in ("none", "gzip"):
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    rate = runner.run(
                        run_sender(bootstrap, topic, args.records, key_file, compression, port)
                    )
                results[f"sender_aes_{compression}_records_per_s"] = rate
                results[f"sender_aes_{compression}_mb_per_s"] = rate * VALUE / 1e6
            sink.close()
        finally:
            if broker is not None:
                broker.stop()
    print(f"{'case':40} {'records/s':>12}")
    for name, value in results.items():
        if name.endswith("records_per_s"):
            print(f"{name:40} {value:12,.0f}")
    summary = {
        "bench": "sender",
        "records": args.records,
        "value_bytes": VALUE,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "target_records_per_s": 150_000,
        **{k: round(v, 1) for k, v in results.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
