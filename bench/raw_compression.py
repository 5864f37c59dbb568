"""Raw producer compression: does ``compression.type`` pay for itself on the raw topic? (issue 45)

The receiver writes runs (raw layout v2: one raw record per run of up to ``run_max_bytes`` of
consecutive records) with the producer defaults of ``receiver.config.DEFAULT_KAFKA``, whose
``compression.type`` is none (this benchmark is why). Here the same producer settings write the
same kind of raw values to a local broker this script starts, with each codec in turn (interleaved,
the order flipping every round), for two payloads: random bytes (incompressible, what an encrypted
or compressed upstream carries) and log-like text (``bench/e2e.py``'s ``text_pool``). Per case: the
producing process's CPU (user + system, librdkafka's threads included) per GB of record values, the
broker's CPU per GB (from /proc), and the bytes the topic takes on the broker's disk per byte of
value.

    .venv/bin/python bench/raw_compression.py [--codecs none,lz4,zstd] [--megabytes 200]
        [--value-bytes 10000] [--rounds 2]

Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer

from bench.e2e import text_pool
from common.raw_run import RunBuilder
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from receiver.config import DEFAULT_KAFKA, DEFAULT_RUN_MAX_BYTES
from tests.kafka_helpers import create_topic


def runs(kind: str, value_bytes: int, megabytes: float) -> list[tuple[str, bytes]]:
    """Raw (key, value) pairs: runs of ``value_bytes`` records, each run under the default cap."""
    count = int(megabytes * 1e6 / value_bytes)
    # every record its own bytes: no value repeats, so runs compress only as much as one value
    total = count * value_bytes
    pool = os.urandom(total) if kind == "random" else text_pool(total // 2 + 1)[:total]
    per_run = max(1, DEFAULT_RUN_MAX_BYTES // (value_bytes + 64))
    out = []
    offset = 0
    while offset < count:
        builder = RunBuilder("src", 0, 0, offset, 1_700_000_000_000 + offset)
        for i in range(offset, min(count, offset + per_run)):
            start = i * value_bytes
            builder.append(
                i, 1_700_000_000_000 + i, b"k%d" % i, pool[start : start + value_bytes], ()
            )
        offset += builder.count
        out.append((builder.key(), builder.encode()))
    return out


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def topic_bytes(data_dir: Path, topic: str) -> int:
    total = 0
    for entry in data_dir.rglob(f"{topic}-*/*.log"):
        total += entry.stat().st_size
    return total


def case(broker: LocalBroker, data_dir: Path, codec: str, raw: list[tuple[str, bytes]],
         value_bytes_total: int) -> dict[str, Any]:  # fmt: skip
    topic = f"raw-{codec}-{os.urandom(4).hex()}"
    create_topic(broker.bootstrap, topic, partitions=1)
    producer = Producer(
        {
            **DEFAULT_KAFKA,
            "compression.type": codec,
            "bootstrap.servers": broker.bootstrap,
            "message.timeout.ms": "120000",
        }
    )
    broker_pid = broker._process.pid if broker._process is not None else 0
    b0 = proc_cpu(broker_pid) if broker_pid else 0.0
    c0, t0 = time.process_time(), time.monotonic()
    for key, value in raw:
        while True:
            try:
                producer.produce(topic, value, key.encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    time.sleep(1.0)  # let the broker finish its writes before its CPU and disk are read
    broker_cpu = (proc_cpu(broker_pid) - b0) if broker_pid else float("nan")
    gb = value_bytes_total / 1e9
    return {
        "codec": codec,
        "producer_cpu_s_per_gb": round(cpu / gb, 2),
        "broker_cpu_s_per_gb": round(broker_cpu / gb, 2),
        "mb_per_s": round(value_bytes_total / 1e6 / wall, 1),
        "disk_bytes_per_value_byte": round(topic_bytes(data_dir, topic) / value_bytes_total, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", default="none,lz4,zstd")
    parser.add_argument("--payloads", default="random,text")
    parser.add_argument("--megabytes", type=float, default=200.0)
    parser.add_argument("--value-bytes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-rawcomp-"))
    broker = LocalBroker(f"bench-rawcomp-{os.getpid()}", free_port(), data_dir=work / "kafka")
    broker.start()
    cases: list[dict[str, Any]] = []
    try:
        for kind in args.payloads.split(","):
            raw = runs(kind, args.value_bytes, args.megabytes)
            total = int(args.megabytes * 1e6 / args.value_bytes) * args.value_bytes
            for r in range(args.rounds):
                for codec in codecs if r % 2 == 0 else codecs[::-1]:
                    result = {
                        "payload": kind,
                        "round": r,
                        **case(broker, work / "kafka", codec, raw, total),
                    }
                    cases.append(result)
                    print(json.dumps(result), file=sys.stderr)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'payload':>8} {'codec':>6} {'producer CPU-s/GB':>18} {'broker CPU-s/GB':>16} "
          f"{'MB/s':>7} {'disk/value':>10}")  # fmt: skip
    summary: dict[str, Any] = {}
    for kind in args.payloads.split(","):
        for codec in codecs:
            mine = [c for c in cases if c["payload"] == kind and c["codec"] == codec]
            row = {
                key: statistics.median(c[key] for c in mine)
                for key in ("producer_cpu_s_per_gb", "broker_cpu_s_per_gb", "mb_per_s",
                            "disk_bytes_per_value_byte")
            }  # fmt: skip
            summary[f"{kind}_{codec}"] = row
            print(f"{kind:>8} {codec:>6} {row['producer_cpu_s_per_gb']:>18.2f} "
                  f"{row['broker_cpu_s_per_gb']:>16.2f} {row['mb_per_s']:>7.1f} "
                  f"{row['disk_bytes_per_value_byte']:>10.3f}")  # fmt: skip
    print(
        json.dumps(
            {
                "bench": "raw-compression",
                "value_bytes": args.value_bytes,
                "megabytes": args.megabytes,
                "rounds": args.rounds,
                "machine": f"{platform.machine()} {os.cpu_count()} cpu",
                "load_average": [round(x, 1) for x in os.getloadavg()],
                **summary,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
