"""A sender meeting a backlog: the prefetch queue's refetch backoff, librdkafka's against ours.

The sender bounds librdkafka's prefetch queue (``queued.max.messages.kbytes``, 16 MiB). When it
is full librdkafka postpones the partition's next fetch by ``fetch.queue.backoff.ms`` (its
default 1,000 ms); an unpaced sender drains 16 MiB far sooner, then waits for the rest of it.
Two local brokers; per round and case (alternated, the order flipping every round) a fresh
pipeline of the real processes (``kafka-diode receive`` and ``send``, AES-256-GCM, no dedup):
a warm-up of 1,000 records, the sender stopped, ``--records`` records of ``--value-bytes``
produced upstream into 3 partitions, the sender started again. Case ``librdkafka`` passes
``fetch.queue.backoff.ms=1000`` through the sender's ``kafka`` table; ``ours`` runs the
sender's own setting. Per case: seconds from the sender's start to the last record the receiver
decoded, MB/s over that, the new sender's and the receiver's CPU per GB, and the datagrams the
kernel dropped at the receiver's socket. ``--rate-bytes`` paces the sender.

    .venv/bin/python bench/sender_fetch.py [--records 30000] [--value-bytes 10000] [--rounds 3]

Prints one line per run, then one JSON object as the last line.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import group_usage
from bench.peer import produce_values
from kafka_diode.demo import scrape
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import wait_until
from sender.config import FETCH_QUEUE_BACKOFF_MS

PARTITIONS = 3
WARMUP = 1000
CASES = {"librdkafka": (("DIODE_SENDER_KAFKA__FETCH_QUEUE_BACKOFF_MS", "1000"),), "ours": ()}


def counter(port: int, family: str) -> float:
    return sum(value for _labels, value in scrape(port).get(family, []))


def one_run(
    case: str, bootstraps: tuple[str, str], work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    spec = PipelineSpec(records=args.records, topics=("bench",), partitions=PARTITIONS,
                        value_size=args.value_bytes, profile=None, run_dedup=False,
                        rate_bytes=args.rate_bytes, extra_env=CASES[case])  # fmt: skip
    with Pipeline(spec, work, upstream=bootstraps[0], downstream=bootstraps[1]) as pipe:
        pipe.setup()
        pipe.start_components(receiver_first=True)
        source = pipe.ep.source_topics[0]
        port = pipe.ep.metrics["receiver"]
        procs = list(pipe.group.processes.values())

        def decoded() -> float:
            return counter(port, "kafka_diode_receiver_records")

        produce_values(bootstraps[0], source, count=WARMUP, size=args.value_bytes, prefix="w",
                       partitions=PARTITIONS)  # fmt: skip
        wait_until(lambda: decoded() >= WARMUP, timeout=120, what="the warm-up", alive=procs)
        sender = pipe.group.processes["sender"]
        sender.stop()
        produce_values(bootstraps[0], source, count=args.records, size=args.value_bytes,
                       prefix="b", partitions=PARTITIONS)  # fmt: skip
        receiver = pipe.group.processes["receiver"]
        assert receiver.proc is not None
        base = decoded()
        drops0 = counter(port, "kafka_diode_receiver_kernel_drops")
        receiver_cpu0 = group_usage(receiver.proc.pid)[0]
        start = time.monotonic()
        sender.start()
        last, seen = start, base
        deadline = start + args.timeout
        while seen < base + args.records and time.monotonic() < deadline:
            now_seen = decoded()
            if now_seen > seen:
                last, seen = time.monotonic(), now_seen
            if now_seen == seen and time.monotonic() - last > 10:
                break  # nothing new for 10 s: the rest was lost at the socket
            time.sleep(0.05)
        assert sender.proc is not None
        sender_cpu = group_usage(sender.proc.pid)[0]
        receiver_cpu = group_usage(receiver.proc.pid)[0] - receiver_cpu0
        drops = counter(port, "kafka_diode_receiver_kernel_drops") - drops0
    gb = args.records * args.value_bytes / 1e9
    seconds = last - start
    return {"case": case, "records": int(seen - base), "seconds": round(seconds, 2),
            "mb_per_s": round(gb * 1000 / seconds, 1),
            "sender_cpu_s_per_gb": round(sender_cpu / gb, 2),
            "receiver_cpu_s_per_gb": round(receiver_cpu / gb, 2),
            "kernel_drops": int(drops)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--records", type=int, default=30_000)
    ap.add_argument("--value-bytes", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate-bytes", type=float, default=0.0, help="sender pacing (0: unpaced)")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up on a run after S s")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kafka-diode-sender-fetch-") as tmp:
        work = Path(tmp)
        brokers = [LocalBroker(f"fetch-{side}-{os.getpid()}", free_port(),
                               data_dir=work / f"kafka-{side}", partitions=PARTITIONS)
                   for side in ("upstream", "downstream")]  # fmt: skip
        try:
            for broker in brokers:
                broker.start()
            bootstraps = (brokers[0].bootstrap, brokers[1].bootstrap)
            for rnd in range(args.rounds):
                order = list(CASES) if rnd % 2 == 0 else list(CASES)[::-1]
                for case in order:
                    run = one_run(case, bootstraps, work / f"r{rnd}-{case}", args)
                    run["round"] = rnd
                    print(json.dumps(run), flush=True)
                    runs.append(run)
        finally:
            for broker in brokers:
                broker.stop()
    summary: dict[str, dict[str, float]] = {}
    for case in CASES:
        mine = [r for r in runs if r["case"] == case]
        summary[case] = {key: statistics.median(r[key] for r in mine)
                         for key in ("seconds", "mb_per_s", "sender_cpu_s_per_gb",
                                     "receiver_cpu_s_per_gb", "kernel_drops")}  # fmt: skip
    ratio = summary["ours"]["mb_per_s"] / summary["librdkafka"]["mb_per_s"]
    print(json.dumps({"bench": "sender_fetch", "argv": sys.argv[1:],
                      "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                  "loadavg": os.getloadavg()},
                      "ours_backoff_ms": FETCH_QUEUE_BACKOFF_MS, "runs": runs,
                      "summary": summary,
                      "ours_over_librdkafka_mb_per_s": round(ratio, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
