"""Dedup latency: raw-topic produce -> clean-topic visibility (read_committed), at steady rates.

Starts ``kafka-diode dedup`` (a subprocess, ``local[2]``, 1 s trigger, WINDOW_SIZE 1000,
MAX_WINDOWS 1000) on a 3-partition raw topic, waits until it delivers a first record, then
offers raw records (200 B values, as the receiver writes them: ``--layout runs``, the default, one
run per partition every 20 ms, the receiver's ``run_linger``; ``--layout records``, v1; source
timestamp = the moment the record is offered, so a run's linger counts) at each rate of
``--rates`` for ``--seconds`` each, back to back. A
``read_committed`` consumer of the clean topic takes, per record, ``now - source timestamp``:
the time the dedup adds between a record's arrival in the raw topic and its visibility to a
reader of the clean topic (the sender/receiver add their own, see bench/e2e.py). Per rate:
p50, p99, max and the achieved rate. ``--source-partitions N`` spreads the records over N source
partitions (source partition p in raw partition p mod 3, as the receiver maps them): what a
link of many topics or partitions costs per micro-batch. Records produced in the first second
of each phase count for it (a phase change is a step, not a backlog). Then ``--idle-seconds``
with no input: the dedup's CPU when idle (``dedup_idle_cores``; with ``--idle-heartbeat-s``, a
live sender's heartbeats arrive meanwhile). Needs a broker: ``--bootstrap`` (default:
start one). Last line: one JSON object.

    .venv/bin/python bench/dedup_latency.py --rates 1000,5000,20000 --seconds 30
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))  # bench.e2e

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import BinaryIO  # noqa: E402

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench.e2e import group_pss, group_usage  # noqa: E402
from common import raw_topic  # noqa: E402
from common.raw_run import RunBuilder  # noqa: E402
from common.wire.events import Heartbeat  # noqa: E402
from dedup.config import from_sources  # noqa: E402
from kafka_diode.local_kafka.broker import LocalBroker, free_port  # noqa: E402
from receiver.config import DEFAULT_HEARTBEAT_REPEAT_INTERVAL  # noqa: E402
from receiver.heartbeat_repeats import HeartbeatRepeats  # noqa: E402

PARTITIONS = 3
VALUE = b"v" * 200
SESSION = b"ab" * 16


class CleanWatcher(threading.Thread):
    """Reads the clean topic (read_committed) and keeps (source timestamp, latency) per record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"latency-{time.time_ns()}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.subscribe([topic])
        self.samples: list[tuple[int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(10_000, 0.05):
                if msg.error() is not None:
                    continue
                now = time.time_ns() // 1_000_000
                self.samples.append((msg.timestamp()[1], now - msg.timestamp()[1]))
        self.consumer.close()


def heartbeat(
    producer: Producer, topic: str, next_offset: list[int], repeats: HeartbeatRepeats
) -> None:
    """A sender's heartbeat of every source partition, written as the receiver writes it: one
    control record per partition that ``repeats`` (the receiver's own filter) lets through."""
    now = time.time_ns() // 1_000_000
    beat = Heartbeat(
        session_id=bytes.fromhex(SESSION.decode()),
        sequence=0,
        sender_id="bench",
        started_at_ms=0,
        sent_at_ms=now,
        high_offsets=tuple(("src", p, o - 1) for p, o in enumerate(next_offset)),
        low_offsets=tuple(("src", p, 0) for p in range(len(next_offset))),
        counters=(),
    )
    selected = repeats.select(beat, time.monotonic())
    if selected is None:
        return
    for _topic, partition, key, value in raw_topic.heartbeat_records(selected):
        producer.produce(topic, value, key.encode(), partition % PARTITIONS,
                         headers=raw_topic.HEARTBEAT_HEADERS)  # fmt: skip
    producer.flush(5)


class Runs:
    """Raw layout v2 as the receiver writes it: one run per partition, produced when it is
    ``linger`` seconds old (the receiver's ``run_linger``, 20 ms) or at the end."""

    def __init__(self, producer: Producer, topic: str, linger: float = 0.02) -> None:
        self.producer, self.topic, self.linger = producer, topic, linger
        self.open: dict[int, tuple[RunBuilder, float]] = {}

    def add(self, partition: int, offset: int, now_ms: int) -> None:
        if partition not in self.open:
            builder = RunBuilder("src", partition, 1, offset, now_ms)
            self.open[partition] = (builder, time.monotonic())
        self.open[partition][0].append(offset, now_ms, b"key-%d" % offset, VALUE, ())

    def flush(self, *, all_runs: bool = False) -> None:
        now = time.monotonic()
        for partition, (run, opened) in list(self.open.items()):
            if all_runs or now - opened >= self.linger:
                del self.open[partition]
                produce_run(self.producer, self.topic, run, partition % PARTITIONS)


def produce_run(
    producer: Producer, topic: str, run: RunBuilder, partition: int, timestamp: int = 0
) -> None:
    """``run`` as the receiver writes it (v2 raw record, its session header), waiting while the
    producer's queue is full; ``timestamp`` 0: the producer's clock."""
    while True:
        try:
            producer.produce(topic, run.encode(), run.key().encode(), partition,
                             headers=[("diode.session", SESSION)], timestamp=timestamp)  # fmt: skip
            return
        except BufferError:
            producer.poll(0.01)


def produce_at(
    producer: Producer,
    topic: str,
    rate: int,
    seconds: float,
    next_offset: list[int],
    layout: str = "runs",
):
    """Offer ``rate`` records/s for ``seconds`` (10 ms ticks) in ``layout`` (``runs``: v2, as
    the receiver writes; ``records``: v1); returns (records, seconds)."""
    tick = 0.01
    sent = 0
    runs = Runs(producer, topic) if layout == "runs" else None
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        # what is owed by now (not per tick: a late wake-up must not lower the rate)
        owed = rate * elapsed - sent
        while owed >= 1:
            partition = sent % len(next_offset)
            offset = next_offset[partition]
            next_offset[partition] += 1
            now = time.time_ns() // 1_000_000
            if runs is not None:
                runs.add(partition, offset, now)
                owed -= 1
                sent += 1
                continue
            headers = [
                ("diode.key", b"key-%d" % offset),
                ("diode.timestamp", b"%d" % now),
                ("diode.timestamp-type", b"1"),
                ("diode.session", SESSION),
            ]
            while True:
                try:
                    producer.produce(topic, VALUE, b"src:%d:%d" % (partition, offset),
                                     partition % PARTITIONS, headers=headers,
                                     timestamp=now)  # fmt: skip
                    break
                except BufferError:
                    producer.poll(0.01)
            owed -= 1
            sent += 1
        if runs is not None:
            runs.flush()
        producer.poll(0)
        sleep = start + (int(elapsed / tick) + 1) * tick - time.monotonic()
        if sleep > 0:
            time.sleep(sleep)
    if runs is not None:
        runs.flush(all_runs=True)
    producer.flush(30)
    return sent, time.monotonic() - start


def batch_profile(log: Path) -> dict[str, object]:
    """Medians over the dedup's batches with records (its DEBUG lines): wall, fence, write."""
    walls, fences, writes = [], [], []
    for line in log.read_text(errors="replace").splitlines():
        match = re.search(r"batch \d+: (\d+) records, \d+ gaps in ([\d.]+)s \(tasks: fence max "
                          r"(\d+) ms, write max (\d+) ms\)", line)  # fmt: skip
        if match and int(match.group(1)):
            walls.append(round(float(match.group(2)) * 1000))
            fences.append(int(match.group(3)))
            writes.append(int(match.group(4)))
    return {
        "with_records": len(walls),
        "wall_ms_p50": percentile(walls, 0.5),
        "task_fence_ms_p50": percentile(fences, 0.5),
        "task_write_ms_p50": percentile(writes, 0.5),
    }


class MemoryWatch(threading.Thread):
    """Peak memory of a process group, sampled every second: summed Pss and summed VmHWM."""

    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid = pgid
        self.peak_pss = self.peak_hwm = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.peak_pss = max(self.peak_pss, group_pss(self.pgid))
            self.peak_hwm = max(self.peak_hwm, group_usage(self.pgid)[1])


def percentile(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def raise_on_sigterm(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, raise_on_sigterm)  # the finally below stops dedup and broker
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--rates", default="1000,5000,20000")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--trigger-ms", type=int, default=1000)
    parser.add_argument(
        "--idle-heartbeat-s",
        type=float,
        default=0.0,
        help="in the idle phase, a heartbeat per partition every this many s (0: a silent link)",
    )
    parser.add_argument(
        "--heartbeat-repeat-s",
        type=float,
        default=DEFAULT_HEARTBEAT_REPEAT_INTERVAL,
        help="the receiver's heartbeat_repeat_interval for the idle heartbeats (0: every one)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=20.0,
        help="after the rates, this long with no input: the dedup's CPU when idle (0: skip)",
    )
    parser.add_argument(
        "--state-partitions", type=int, default=0, help="SHUFFLE_PARTITIONS; 0: the dedup's default"
    )
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument(
        "--source-partitions",
        type=int,
        default=PARTITIONS,
        help="source partitions the records are spread over (raw partition: p mod 3)",
    )
    parser.add_argument(
        "--layout",
        choices=("runs", "records"),
        default="runs",
        help="raw layout offered: v2 runs (the receiver's, 20 ms linger) or v1",
    )
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    broker = None
    bootstrap = args.bootstrap
    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    if bootstrap is None:
        broker = LocalBroker("bench-latency", free_port(), data_dir=tmp / "kafka", partitions=3)
        broker.start()
        bootstrap = broker.bootstrap
    try:  # whatever fails or is interrupted from here on, the broker stops
        result = _measure(args, rates, bootstrap, tmp)
    finally:
        if broker is not None:
            broker.stop()
        # the broker's data and the checkpoints (hundreds of MB a run); the dedup's log stays
        shutil.rmtree(tmp / "kafka", ignore_errors=True)
        shutil.rmtree(tmp / "checkpoint", ignore_errors=True)
    print(json.dumps(result))
    return 0


def _measure(
    args: argparse.Namespace, rates: list[int], bootstrap: str, tmp: Path
) -> dict[str, object]:
    """Start the dedup on ``bootstrap``, offer each rate, and return the bench's result."""
    tag = f"lat{int(time.time())}"
    raw, clean = f"{tag}.raw", f"{tag}.clean.src"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(raw, PARTITIONS, 1), NewTopic(clean, PARTITIONS, 1)]
    ).values():
        future.result(30)
    env = {
        **os.environ,
        "RAW_TOPICS": raw,
        "BOOTSTRAP_SERVERS": bootstrap,
        "STATE_DIR_CONFIG": str(tmp / "checkpoint"),
        "CLEAN_TOPIC": f"{tag}.clean.{{topic}}",
        "GAP_TOPIC": f"{tag}.gaps",
        "PROGRESS_TOPIC": f"{tag}.progress",
        "CONTROL_TOPIC": f"{tag}.control",
        "SPARK_MASTER": args.spark_master,
        "SHUFFLE_PARTITIONS": str(args.state_partitions),
        "PERSIST_INTERVAL_MS": str(args.trigger_ms),
        "WINDOW_SIZE": "1000",
        "MAX_WINDOWS": "1000",
        "LOG_LEVEL": "DEBUG",  # per-batch lines: wall time, the write tasks' fence and write
    }
    log = (tmp / "dedup.log").open("wb")
    dedup = start_dedup(env, log)
    memory = MemoryWatch(dedup.pid)
    memory.start()
    watcher = CleanWatcher(bootstrap, clean)
    watcher.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    load_start = os.getloadavg()[0]
    next_offset = [0] * args.source_partitions
    result: dict[str, object] = {
        "bench": "dedup_latency",
        "trigger_ms": args.trigger_ms,
        "source_partitions": args.source_partitions,
        "state_partitions": from_sources(env).effective_shuffle_partitions(),
    }
    try:
        # warm-up: the query is up and has delivered (Spark start, first batches)
        first, _ = produce_at(producer, raw, 100, 1.0, next_offset, args.layout)
        deadline = time.monotonic() + 600  # a loaded 2-core machine: Spark starts slowly
        while len(watcher.samples) < first:
            if dedup.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dedup did not start; see {tmp / 'dedup.log'}")
            time.sleep(0.2)
        produce_at(producer, raw, rates[0], 10.0, next_offset, args.layout)  # JIT, workers warm
        phases = []
        cpu_start = group_usage(dedup.pid)[0]
        for rate in rates:
            begin = time.time_ns() // 1_000_000
            sent, took = produce_at(producer, raw, rate, args.seconds, next_offset, args.layout)
            phases.append((rate, begin, time.time_ns() // 1_000_000, sent, took))
        total = sum(next_offset)
        offered = sum(sent for _, _, _, sent, _ in phases)
        deadline = time.monotonic() + 180
        while len(watcher.samples) < total and time.monotonic() < deadline:
            time.sleep(0.2)
        watcher.stop.set()
        watcher.join(10)
        cpu_s = group_usage(dedup.pid)[0] - cpu_start
        # idle: nothing arrives; what the dedup burns anyway (no-data micro-batches, timers)
        idle_start = group_usage(dedup.pid)[0]
        idle_end_at = time.monotonic() + args.idle_seconds
        next_beat = time.monotonic()
        repeats = HeartbeatRepeats(args.heartbeat_repeat_s)
        while time.monotonic() < idle_end_at and dedup.poll() is None:
            if args.idle_heartbeat_s and time.monotonic() >= next_beat:
                # a live sender's heartbeat, as the receiver writes it
                heartbeat(producer, raw, next_offset, repeats)
                next_beat += args.idle_heartbeat_s
            time.sleep(0.1)  # a fixed measuring window, not a synchronisation
        idle_cpu = group_usage(dedup.pid)[0] - idle_start
        samples = list(watcher.samples)
        per_rate = {}
        for rate, begin, end, sent, took in phases:
            lat = [lat for ts, lat in samples if begin <= ts < end]
            per_rate[str(rate)] = {
                "offered_per_s": round(sent / took),
                "records": sent,
                "seen": len(lat),
                "p50_ms": percentile(lat, 0.5),
                "p99_ms": percentile(lat, 0.99),
                "max_ms": max(lat) if lat else None,
            }
        result |= {
            "per_rate": per_rate,
            "batches": batch_profile(tmp / "dedup.log"),
            "layout": args.layout,
            "dedup_peak_pss_mb": round(memory.peak_pss / 1e6),
            # the dedup's process tree over the measured phases (and until the last is seen)
            "dedup_cpu_s": round(cpu_s, 1),
            "dedup_cpu_s_per_million": round(cpu_s / offered * 1e6, 1) if offered else None,
            "dedup_peak_hwm_sum_mb": round(memory.peak_hwm / 1e6),
            "idle_seconds": args.idle_seconds,
            "idle_heartbeat_s": args.idle_heartbeat_s,
            "heartbeat_repeat_s": args.heartbeat_repeat_s,
            "dedup_idle_cores": round(idle_cpu / max(args.idle_seconds, 1e-9), 3),
            "records_total": total,
            "seen_total": len(samples),
            "load_average_1m_start": round(load_start, 2),
            "load_average_1m_end": round(os.getloadavg()[0], 2),
        }
    finally:
        watcher.stop.set()
        memory.stop.set()
        stop_dedup(dedup)
        log.close()
    return result


def start_dedup(env: dict[str, str], log: BinaryIO) -> subprocess.Popen[bytes]:
    """``kafka-diode dedup`` with ``env``, its output into ``log``, in its own process group
    (what the CPU and memory figures sum)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kafka_diode", "dedup"],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def stop_dedup(dedup: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the dedup's graceful stop), then SIGKILL if it has not exited within 60 s."""
    if dedup.poll() is None:
        dedup.send_signal(signal.SIGTERM)
        try:
            dedup.wait(60)
        except subprocess.TimeoutExpired:
            dedup.kill()
            dedup.wait()


if __name__ == "__main__":
    sys.exit(main())
