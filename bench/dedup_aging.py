"""How a live dedup's cost per micro-batch changes as it ages: the JIT's share, minute by minute.

Starts a local broker and ``kafka-diode dedup`` (a subprocess, as an operator runs it: the
defaults, ``local[2]``, 1 s trigger) on a raw topic of ``--raw-partitions`` partitions, and writes
runs of ``--run-records`` records of ``--value-bytes`` random bytes into it at ``--mbps`` (raw
layout v2, uncompressed, as the receiver writes a paced link's records) for ``--minutes``. Every
``--interval`` seconds it samples the dedup's process group (CPU, user + system, the JVM and the
Python workers), the CPU of the JVM's JIT compiler threads, and the dedup's own ``batches_total``
and ``records_forwarded_total`` (its metrics endpoint). Per interval: micro-batches, MB forwarded,
CPU-s per batch (all, the JVM's, the JIT's) and CPU-s per GB. At the end it waits until every
record written was forwarded (each exactly once: the dedup's counters).

    .venv/bin/python bench/dedup_aging.py [--minutes 20] [--mbps 10] [--value-bytes 10000]
        [--run-records 6] [--raw-partitions 8] [--interval 60]

Prints one line per interval and one JSON object as the last line.
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
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench.dedup_latency import produce_run, raise_on_sigterm, start_dedup, stop_dedup  # noqa: E402
from bench.e2e import group_usage  # noqa: E402
from common.raw_run import RunBuilder  # noqa: E402
from kafka_diode import status  # noqa: E402
from kafka_diode.local_kafka.broker import LocalBroker, free_port  # noqa: E402


class PacedRuns(threading.Thread):
    """Writes runs round robin over the raw partitions (source partition p into raw partition
    p), no faster than ``--mbps`` MB of record values a second, until ``stop`` is set."""

    def __init__(self, bootstrap: str, topic: str, args: argparse.Namespace) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 64 << 20}
        )
        self.topic, self.args = topic, args
        self.value = os.urandom(args.value_bytes)
        self.next_offset = [0] * args.raw_partitions
        self.stop = threading.Event()
        self.error: BaseException | None = None

    @property
    def written(self) -> int:
        return sum(self.next_offset)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        args = self.args
        run_bytes = args.run_records * args.value_bytes
        start = time.monotonic()
        sent_bytes = 0
        partition = 0
        while not self.stop.is_set():
            ahead = sent_bytes / (args.mbps * 1e6) - (time.monotonic() - start)
            if ahead > 0:
                self.producer.poll(0)
                time.sleep(ahead)  # the link's pace, not a synchronisation
                continue
            first = self.next_offset[partition]
            now = time.time_ns() // 1_000_000
            run = RunBuilder("src", partition, 1, first, now)
            for offset in range(first, first + args.run_records):
                run.append(offset, now, b"key-%d" % offset, self.value, ())
            produce_run(self.producer, self.topic, run, partition, now)
            self.next_offset[partition] += args.run_records
            sent_bytes += run_bytes
            partition = (partition + 1) % args.raw_partitions
        if self.producer.flush(60):
            raise RuntimeError("the paced writer could not flush its last runs")


def jvm_pid(pgid: int) -> int | None:
    """Spark's JVM in the dedup's process group (driver and executor in local mode), not the
    short-lived launcher JVM that builds its command line."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[2]) == pgid and b"org.apache.spark.deploy.SparkSubmit" in command:
            return int(entry)
    return None


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of one process: the JVM's share of the group."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compiler_cpu_s(pid: int) -> float:
    """CPU seconds of the JVM's JIT compiler threads (``C1 CompilerThread0``, ``C2 ...``; their
    names cut to 15 characters in /proc). On 2 cores HotSpot runs one of each, and they never
    exit, so the sum over the live threads is the compilers' whole CPU."""
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        if re.match(r"C\d CompilerThre", stat[stat.index("(") + 1 :]):
            fields = stat.rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def dedup_counters(port: int) -> dict[str, float]:
    """``batches_total`` and ``records_forwarded_total`` from the dedup's metrics endpoint
    (``kafka-diode status``'s scrape).

    Raises:
        OSError: the endpoint does not answer.
    """
    metrics = status.scrape(f"127.0.0.1:{port}", timeout=10)
    if metrics is None:
        raise OSError(f"the dedup's metrics endpoint on port {port} does not answer")
    names = ("batches_total", "records_forwarded_total")
    return {name: metrics.get(f"kafka_diode_dedup_{name}", 0.0) for name in names}


def main() -> int:
    signal.signal(signal.SIGTERM, raise_on_sigterm)  # the finally below stops dedup and broker
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=10.0, help="MB/s of record values")
    parser.add_argument("--value-bytes", type=int, default=10_000)
    parser.add_argument("--run-records", type=int, default=6)
    parser.add_argument("--raw-partitions", type=int, default=8)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per sample")
    args = parser.parse_args()
    if args.minutes * 60 < 2 * args.interval or args.mbps <= 0:
        parser.error("--minutes must span at least two --interval, and --mbps be positive")
    tmp = Path(tempfile.mkdtemp(prefix="bench-aging-"))
    broker = LocalBroker("bench-aging", free_port(), data_dir=tmp / "kafka")
    broker.start()
    try:
        result = _measure(args, broker.bootstrap, tmp)
    finally:
        broker.stop()
        shutil.rmtree(tmp / "kafka", ignore_errors=True)  # GBs of raw and clean records
        shutil.rmtree(tmp / "checkpoint", ignore_errors=True)
    print(json.dumps(result))
    return 0


def _measure(args: argparse.Namespace, bootstrap: str, tmp: Path) -> dict[str, object]:
    raw = "aging.raw"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(raw, args.raw_partitions, 1, config={"max.message.bytes": str(64 << 20)})
    for future in admin.create_topics([topic]).values():
        future.result(30)
    port = free_port()
    env = {
        **os.environ,
        "RAW_TOPICS": raw,
        "BOOTSTRAP_SERVERS": bootstrap,
        "STATE_DIR_CONFIG": str(tmp / "checkpoint"),
        "CLEAN_TOPIC": "aging.clean.{topic}",
        "GAP_TOPIC": "aging.gaps",
        "PROGRESS_TOPIC": "aging.progress",
        "CONTROL_TOPIC": "aging.control",
        "SPARK_MASTER": "local[2]",
        "METRICS_PORT": str(port),
    }
    log = (tmp / "dedup.log").open("wb")
    dedup = start_dedup(env, log)
    writer = PacedRuns(bootstrap, raw, args)
    load_start = os.getloadavg()[0]
    try:
        deadline = time.monotonic() + 600  # Spark starts slowly on a loaded 2-core machine
        jvm = None
        # started: the JVM has compiled something and the dedup serves its metrics
        while jvm is None or not _ready(jvm, port):
            if dedup.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dedup did not start; see {tmp / 'dedup.log'}")
            jvm = jvm_pid(dedup.pid)
            time.sleep(0.5)  # polling a condition with a deadline
        writer.start()
        # the first interval starts with the first batch of records (a batch needs input)
        while dedup_counters(port)["records_forwarded_total"] == 0:
            if dedup.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dedup forwarded nothing; see {tmp / 'dedup.log'}")
            time.sleep(0.2)  # polling a condition with a deadline
        started = time.monotonic()
        intervals: list[dict[str, object]] = []
        previous = sample(dedup.pid, jvm, port)
        # a count, not an end time: sampling takes a moment, so each interval ends a little late
        for _ in range(int(args.minutes * 60 / args.interval)):
            wake = previous[0] + args.interval
            while (left := wake - time.monotonic()) > 0:
                if dedup.poll() is not None or writer.error is not None:
                    raise RuntimeError(f"stopped: {writer.error!r}; see {tmp / 'dedup.log'}")
                time.sleep(min(left, 1.0))  # a fixed measuring window, not a synchronisation
            now = sample(dedup.pid, jvm, port)
            batches = now[4]["batches_total"] - previous[4]["batches_total"]
            records = now[4]["records_forwarded_total"] - previous[4]["records_forwarded_total"]
            gigabytes = records * args.value_bytes / 1e9
            cpu_s, jvm_s, jit_s = (now[i] - previous[i] for i in (1, 2, 3))
            driver_s = now[5] - previous[5]
            row = {
                "minute": round((now[0] - started) / 60, 1),
                "batches": int(batches),
                "mb": round(gigabytes * 1e3, 1),
                "cpu_s": round(cpu_s, 1),
                "jvm_cpu_s": round(jvm_s, 1),
                "jit_s": round(jit_s, 1),
                "driver_cpu_s": round(driver_s, 1),
                "cpu_s_per_batch": round(cpu_s / batches, 3) if batches else None,
                "jvm_cpu_s_per_batch": round(jvm_s / batches, 3) if batches else None,
                "jit_s_per_batch": round(jit_s / batches, 3) if batches else None,
                "cpu_s_per_gb": round(cpu_s / gigabytes, 1) if gigabytes else None,
            }
            intervals.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            previous = now
        writer.stop.set()
        writer.join(120)
        if writer.error is not None:
            raise RuntimeError(f"the paced writer failed: {writer.error!r}")
        written = writer.written
        deadline = time.monotonic() + 300
        while (forwarded := dedup_counters(port)["records_forwarded_total"]) < written:
            if dedup.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"forwarded {forwarded:.0f} of {written} records")
            time.sleep(1.0)  # polling a condition with a deadline
        if forwarded != written:
            raise RuntimeError(f"forwarded {forwarded:.0f} records, {written} written")
    finally:
        writer.stop.set()
        stop_dedup(dedup)
        log.close()
    rows = intervals
    return {
        "bench": "dedup_aging",
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "minutes": args.minutes,
        "mbps": args.mbps,
        "value_bytes": args.value_bytes,
        "run_records": args.run_records,
        "raw_partitions": args.raw_partitions,
        "interval_s": args.interval,
        "records": written,
        "forwarded": int(forwarded),
        "intervals": rows,
        "first": rows[0],
        "last": rows[-1],
        "load_average_1m_start": round(load_start, 2),
        "load_average_1m_end": round(os.getloadavg()[0], 2),
    }


def sample(
    pgid: int, jvm: int, port: int
) -> tuple[float, float, float, float, dict[str, float], float]:
    """(now, the group's CPU, the JVM's CPU, its compilers' CPU, the dedup's counters, the CPU of
    the dedup's own Python process: the driver's side of ``foreachBatch``)."""
    return (time.monotonic(), group_usage(pgid)[0], process_cpu_s(jvm), compiler_cpu_s(jvm),
            dedup_counters(port), process_cpu_s(pgid))  # fmt: skip


def _ready(jvm: int, port: int) -> bool:
    """The dedup's JVM runs its compiler threads and the dedup serves its metrics."""
    try:
        if not compiler_cpu_s(jvm):
            return False
        dedup_counters(port)
    except OSError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
