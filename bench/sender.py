"""Sender benchmark: records/s from a pre-filled topic to a UDP socket, with a same-run baseline.

Pre-fills a topic (6 partitions, 200-byte values, 16-byte keys) on a real local broker (started
here unless ``--bootstrap`` is given), then measures, in this one process:

- ``baseline``: a bare confluent-kafka consume loop (``consume(1000)``, touching each value);
- ``sender`` with AES-256-GCM and no compression, and with gzip level 1: the real ``SenderApp``
  (uvloop, 1452-byte datagrams, no pacing) sending to a loopback UDP socket nobody reads (the
  kernel drops what overflows; the sender's cost is the same).

Timing runs from the end of the first consumed batch (its records are not counted) to the moment
every record's datagrams were handed to the socket, so the consumer group join is excluded from
every figure. On a shared machine wall-clock rates measure the scheduler as much as the code, so
each sender case also reports CPU time: per million records for the whole process, the share of
a core used by each thread kind (``thread_cpu``), how long the event loop thread waited for a CPU
(``loop_runqueue_wait_share``), and records per CPU-second of the loop thread, which bounds the
sender. Prints a table, then one JSON object as the last line.

    .venv/bin/python bench/sender.py [--records 300000] [--bootstrap HOST:PORT]
        [--compression none,gzip]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from common import settings
from common.wire import Key, KeyRing
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from runtime import key_files
from sender.app import SenderApp
from sender.config import SenderConfig

VALUE = 200
PARTITIONS = 6
_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process by thread kind, from /proc.

    ``loop``: the main thread (event loop, encoder, sockets); ``librdkafka``: the client's own
    threads (``rdk:*``: fetch, decompression); ``other``: the rest (the consumer executor thread,
    which builds the ``Message`` objects). ``loop_runqueue_wait``: seconds the loop thread was
    ready to run but waited for a CPU (a busy machine), not CPU time.
    """
    out = {"loop": 0.0, "librdkafka": 0.0, "other": 0.0, "loop_runqueue_wait": 0.0}
    me = os.getpid()
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        kind = (
            "loop" if int(task.name) == me else "librdkafka" if comm.startswith("rdk:") else "other"
        )
        out[kind] += (int(fields[11]) + int(fields[12])) / _TICK
        if kind == "loop":
            # Time runnable but not running (other processes had the CPUs), from schedstat.
            with contextlib.suppress(OSError, IndexError, ValueError):
                out["loop_runqueue_wait"] = int((task / "schedstat").read_text().split()[1]) / 1e9
    return out


def pid_cpu(pid: int | None) -> float:
    """CPU seconds of another process (the broker's JVM), 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


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
                total += len(msg.value() or b"")
                seen += 1
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    return seen / elapsed


async def run_sender(
    bootstrap: str,
    topic: str,
    count: int,
    key_file: Path,
    compression: str,
    port: int,
    broker_pid: int | None,
    fec_overhead: float = 0.0,
    datagram_size: int = 1452,
    fec_blocks: tuple[int, int] | None = None,
) -> dict[str, float]:
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
            "fec_overhead": fec_overhead,
            "max_datagram_size": datagram_size,
            **(
                {"fec_block_size": fec_blocks[0], "fec_interleave": fec_blocks[1]}
                if fec_blocks
                else {}
            ),
        },
    )
    app = SenderApp(cfg)
    await app.start()
    assert app.source is not None
    sizes: list[int] = []  # records per consumed batch (the loop's per-batch costs scale with it)
    consume = app.source.consume

    async def counting_consume() -> list[Message]:
        batch = await consume()
        sizes.append(len(batch))
        return batch

    app.source.consume = counting_consume  # type: ignore[method-assign]
    try:
        while app.records_read == 0:  # noqa: ASYNC110  polling a counter
            await asyncio.sleep(0.001)
        # The first batch was read (and encoded) before the clock starts: not counted.
        first = app.records_read
        batches = len(sizes)
        start = time.perf_counter()
        cpu0, broker0 = thread_cpu(), pid_cpu(broker_pid)
        while app.pipeline is not None and app.pipeline.records_sent < count:
            assert app.failure is None, app.failure
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - start
        cpu1, broker1 = thread_cpu(), pid_cpu(broker_pid)
    finally:
        await app.stop()
    done = count - first
    cpu = {kind: cpu1[kind] - cpu0[kind] for kind in cpu0}
    wait = cpu.pop("loop_runqueue_wait")
    out = {"records_per_s": done / elapsed, "cpu_s_per_1m": 1e6 * sum(cpu.values()) / done}
    for kind, seconds in cpu.items():
        out[f"cpu_{kind}_share"] = seconds / elapsed  # fraction of one core
    out["loop_runqueue_wait_share"] = wait / elapsed
    out["loop_records_per_cpu_s"] = done / max(cpu["loop"], 1e-9)
    out["broker_cpu_share"] = (broker1 - broker0) / elapsed
    out["mean_batch_records"] = sum(sizes[batches:]) / max(1, len(sizes) - batches)
    return out


def fec_case(spec: str) -> tuple[float, tuple[int, int] | None]:
    """``P`` or ``P:KxD`` (overhead, and block size x interleave) of ``--fec``."""
    overhead, _, blocks = spec.partition(":")
    if not blocks:
        return float(overhead), None
    k, _, d = blocks.partition("x")
    return float(overhead), (int(k), int(d))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument(
        "--compression", default="none,gzip", help="cases to run, comma-separated (none, gzip)"
    )
    parser.add_argument(
        "--fec",
        default="",
        help="also run compression none with these FEC overheads, comma-separated (e.g. 0,10,20; "
        "P:KxD sets block size K and interleave D, e.g. 20:32x1; else the defaults; rounds "
        "interleaved --fec-rounds times, best kept)",
    )
    parser.add_argument("--fec-rounds", type=int, default=2)
    parser.add_argument("--datagram-size", type=int, default=1452, help="for the --fec cases")
    args = parser.parse_args()
    broker = None
    with tempfile.TemporaryDirectory() as tmp:
        broker_pid: int | None = None
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            broker = LocalBroker(
                f"bench-sender-{os.getpid()}",
                free_port(),
                data_dir=Path(tmp) / "kafka",
                partitions=PARTITIONS,
            )
            broker_pid = broker.start().pid
            bootstrap = broker.bootstrap
        try:
            key = Key.generate()
            key_file = Path(tmp) / "key.json"
            key_files.write_keyring(KeyRing([key], active=key.key_id), key_file)
            sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sink.bind(("127.0.0.1", 0))
            port = sink.getsockname()[1]
            topic = fill(bootstrap, args.records)
            results = {"baseline_consume_records_per_s": baseline(bootstrap, topic, args.records)}
            for compression in args.compression.split(","):
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    case = runner.run(
                        run_sender(
                            bootstrap, topic, args.records, key_file, compression, port, broker_pid
                        )
                    )
                for name, value in case.items():
                    results[f"sender_aes_{compression}_{name}"] = value
                results[f"sender_aes_{compression}_mb_per_s"] = case["records_per_s"] * VALUE / 1e6
            fec_best: dict[str, dict[str, float]] = {}
            for _ in range(args.fec_rounds if args.fec else 0):
                for overhead in args.fec.split(","):
                    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                        case = runner.run(
                            run_sender(
                                bootstrap,
                                topic,
                                args.records,
                                key_file,
                                "none",
                                port,
                                broker_pid,
                                fec_case(overhead)[0],
                                args.datagram_size,
                                fec_case(overhead)[1],
                            )
                        )
                    old = fec_best.get(overhead)
                    if old is None or case["cpu_s_per_1m"] < old["cpu_s_per_1m"]:
                        fec_best[overhead] = case
            for overhead, case in fec_best.items():
                for name in ("records_per_s", "cpu_s_per_1m", "loop_records_per_cpu_s"):
                    results[f"sender_fec{overhead.replace(':', '_')}_{name}"] = case[name]
            sink.close()
        finally:
            if broker is not None:
                broker.stop()
    print(f"{'case':44} {'value':>12}")
    for name, value in results.items():
        print(f"{name:44} {value:12,.2f}")
    summary = {
        "bench": "sender",
        "records": args.records,
        "value_bytes": VALUE,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "target_records_per_s": 150_000,
        **{k: round(v, 1) if v >= 10 else round(v, 3) for k, v in results.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
