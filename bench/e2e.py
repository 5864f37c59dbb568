"""End-to-end benchmark: upstream Kafka -> sender -> UDP -> receiver -> raw topic -> dedup -> clean.

Every component is the real ``kafka-diode`` process a user runs (``kafka_diode.pipeline``), against
two real local brokers this script starts (or ``--upstream``/``--downstream``; ``--brokers 3``:
two 3-node KRaft clusters, replication 3 and ``min.insync.replicas`` 2, every node's CPU reported
and summed per side). One *case*:

1. start receiver, (relay,) sender and dedup; produce a warm-up of 200 records and wait until they
   are in the clean topic (Spark is up, every client connected), so start-up is not measured;
2. a producer process writes N records of one size (log-like text values, so compression has
   something to do; header ``bench.seq``) to the upstream topic as fast as it can, while the
   pipeline runs: this is a *live* stream, not a pre-filled backlog;
3. a consumer in this process reads the clean topic (``read_committed``) and notes, per record, its
   consume time; a sampler reads each component's Prometheus metrics and ``/proc`` (CPU and peak
   memory of each process group: the dedup's JVM and Python workers included) every 0.25 s, one
   ``/proc`` scan for every group, Pss every second (it shares the cores it measures).

Figures per case: end-to-end records/s and MB/s of payload (first produce call to the last clean
record consumed); per-stage records/s (sender sent, receiver acknowledged by Kafka, dedup forwarded:
the counter's growth over the interval where it grew); CPU seconds per million records per stage
(utime+stime of the whole process group, children reaped included; the stage
``receiver-librdkafka`` is the receiver's ``rdk:*`` threads alone, where a producer polling
busily shows); peak memory (sum of VmHWM over
the group, ``peak_rss_mb``, an upper bound; and the peak of the group's summed Pss, ``peak_pss_mb``,
what it held in RAM at once, sampled every second); datagram loss at the socket (sender datagrams
sent vs receiver datagrams read, and the receiver's kernel drop counter); latency percentiles =
clean-topic **consume time** minus the upstream record's CreateTime (set by the producer at
``produce()``; all on one host, one clock).
Exactly-once is checked on the way (every ``bench.seq`` seen once; ``kafka-diode demo``/the chaos
suite do the full record-by-record verdict).

Same-run baselines (what the machine does without us): a bare confluent-kafka produce loop and
consume loop with the same record size, a bare socket send/drain loop with the datagram size the
sender used, and (if ``bench/dedup.py`` provides it) a Spark pass-through.

Sweeps (``--sweep``): record size 100 B / 1 KB / 10 KB / ~1 MB, gzip on, copies 2, and an
offered-rate sweep (sender ``--rate-bytes``; pre-filled backlog, no dedup, the receiver acknowledged
count is the end point) that finds the highest offered rate with zero socket loss.

    .venv/bin/python bench/e2e.py                  # default: 200 B and 10 KB cases + baselines
    .venv/bin/python bench/e2e.py --sweep          # the full sweep (tens of minutes when loaded)
    .venv/bin/python bench/e2e.py --case 200:100000 --py-spy sender

Prints progress (rich), a Markdown table, then ONE JSON object as the last line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import platform
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter as Tally
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.errors import RemoteProtocolError
from common.wire.batch_decode import decode_record_groups
from kafka_diode.demo import scrape
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.local_kafka.cluster import LocalCluster
from kafka_diode.pipeline import Pipeline, PipelineSpec

CLK_TCK = os.sysconf("SC_CLK_TCK")
SEQ = "bench.seq"
WARMUP = 200
SAMPLE_S = 0.25
#: Pss is read every PSS_EVERY samples (1 s): a peak of RAM held moves slowly.
PSS_EVERY = 4
#: "1 MB" records are 990,000 bytes so record + headers stay under the broker's and librdkafka's
#: default 1,000,000-byte message limit (no broker or client reconfiguration needed).
SIZE_ALIASES = {"100B": 100, "200B": 200, "1KB": 1000, "10KB": 10_000, "1MB": 990_000}
console = Console(stderr=True)


# -- what to run ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Case:
    """One end-to-end run."""

    size: int = 200
    records: int = 100_000
    compression: str = "none"
    copies: int = 1
    rate_bytes: float = 0.0
    relay: str | None = None
    dedup: bool = True
    partitions: int = 3
    backlog: bool = False
    """Pre-fill the N records while the sender is stopped, then start it (no latency figures)."""

    @property
    def label(self) -> str:
        parts = [f"{_size_label(self.size)} x {self.records:,}"]
        if self.compression != "none":
            parts.append(self.compression)
        if self.copies != 1:
            parts.append(f"copies {self.copies}")
        if self.rate_bytes:
            parts.append(f"paced {self.rate_bytes / 1e6:g} MB/s")
        if self.relay:
            parts.append(f"relay {self.relay}")
        if not self.dedup:
            parts.append("no dedup")
        parts.append("backlog" if self.backlog else "live")
        return ", ".join(parts)


def _size_label(size: int) -> str:
    if size >= 900_000:
        return f"{size / 1e6:.2g} MB"
    if size >= 1000:
        return f"{size / 1000:g} KB"
    return f"{size} B"


# -- workload ---------------------------------------------------------------------------------


def text_pool(size: int, seed: int = 7) -> bytes:
    """Log-like text (gzip ratio ~3-4), at least 2x ``size`` long; values are slices of it."""
    rng = random.Random(seed)
    words = ["GET", "POST", "/api/v1/orders", "/health", "200", "404", "500", "user=",
             "ms=", "INFO", "WARN", "ERROR", "sensor", "plant-3", "line-7"]  # fmt: skip
    out = bytearray()
    target = max(2 * size + 4096, 65536)
    while len(out) < target:
        line = " ".join(rng.choice(words) + str(rng.randrange(10_000)) for _ in range(12))
        out += f"{time.time():.6f} {line}\n".encode()
    return bytes(out)


def produce_records(
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    count: int,
    size: int,
    seq_prefix: str = "",
) -> dict[str, float]:
    """Produce ``count`` records of ``size`` bytes as fast as possible; acks=all, flushed."""
    pool = text_pool(size)
    span = len(pool) - size
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.kbytes": 262_144,
        }
    )
    failed: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    cpu0 = time.process_time()
    first = time.time()
    for i in range(count):
        off = (i * 7919) % span
        value = pool[off : off + size]
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=b"k%d" % (i % 1000),
                    headers=[(SEQ, f"{seq_prefix}{i}".encode())],
                    partition=i % partitions,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    last = time.time()
    if remaining or failed:
        raise RuntimeError(f"{remaining} unflushed, {len(failed)} failed: {failed[:3]}")
    return {"first": first, "last": last, "cpu": time.process_time() - cpu0}


def _produce_child(args: tuple[Any, ...], out: Any) -> None:
    bootstrap, topic, partitions, count, size = args
    res = produce_records(bootstrap, topic, partitions=partitions, count=count, size=size)
    out.put(res)


# -- /proc ------------------------------------------------------------------------------------


ProcTable = dict[int, tuple[str, list[str]]]
Members = list[tuple[str, list[str]]]


def proc_table() -> ProcTable:
    """pid -> ``(/proc path, stat fields after the name)`` of every process, one scan."""
    stats: ProcTable = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        stats[int(entry.name)] = (entry.path, fields)
    return stats


def _group_members(pgid: int, stats: ProcTable | None = None) -> Members:
    """``(/proc path, stat fields after the name)`` of group ``pgid`` and of every descendant
    (from ``stats``, one ``proc_table`` scan a caller may share between groups).

    Descendants count wherever they moved: Spark's Python daemon (``pyspark/daemon.py``) makes a
    process group of its own, and its forked workers (the dedup's stateful step and write tasks)
    would otherwise be missed, live, by a group-only scan (the rounds before 2026-11-27 did so).
    """
    if stats is None:
        stats = proc_table()
    members: list[tuple[str, list[str]]] = []
    for pid, (path, fields) in stats.items():
        walk, hops = pid, 0
        while walk in stats and hops < 64:  # bounded: a parent chain cannot loop, but be sure
            if int(stats[walk][1][2]) == pgid:
                members.append((path, fields))
                break
            walk, hops = int(stats[walk][1][1]), hops + 1
    return members


#: ``kcmp(2)``'s number per machine, and its ``KCMP_VM`` (do two tasks share one address space?).
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True)


def shares_address_space(pid: int, other: int) -> bool:
    """Whether tasks ``pid`` and ``other`` share one address space (``kcmp`` ``KCMP_VM``).

    A JVM starts its child processes (Spark's ``chmod`` and ``readlink``, Kafka's) with
    ``posix_spawn``: until the child calls ``exec`` it runs in the JVM's own address space, so
    its ``smaps_rollup`` and ``VmHWM`` are the JVM's, and a scan that meets one counts the JVM
    twice (a 5,000 records/s latency run of 240 s reported a peak of 2,555 MB where the tree
    held ~1,300 MB). False when the kernel cannot tell (no ``kcmp``, no permission).
    """
    if _SYS_KCMP is None:
        return False
    return int(_libc.syscall(_SYS_KCMP, pid, other, _KCMP_VM, 0, 0)) == 0


def _in_parent_space(path: str, fields: list[str]) -> bool:
    """Whether the ``_group_members`` entry is a child still in its parent's address space."""
    return shares_address_space(int(Path(path).name), int(fields[1]))


def group_usage(pgid: int, members: Members | None = None) -> tuple[float, int, int]:
    """(CPU seconds, sum of VmHWM bytes, processes) of group ``pgid`` and its descendants.

    CPU includes ``cutime``/``cstime`` so children that already exited and were reaped still count.
    VmHWM skips a child that has not left its parent's address space yet (``shares_address_space``).
    """
    cpu = 0.0
    hwm = 0
    n = 0
    for path, fields in _group_members(pgid) if members is None else members:
        try:
            cpu += sum(int(x) for x in fields[11:15]) / CLK_TCK
            if _in_parent_space(path, fields):
                n += 1
                continue
            for line in Path(path, "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm += int(line.split()[1]) * 1024
                    break
            n += 1
        except (OSError, IndexError, ValueError):
            continue
    return cpu, hwm, n


def threads_cpu(pgid: int, prefix: str, members: Members | None = None) -> float:
    """CPU seconds of the threads named ``prefix...`` in group ``pgid`` and its descendants (the
    receiver's librdkafka threads are ``rdk:*``: a producer polling busily shows there)."""
    cpu = 0.0
    for path, _fields in _group_members(pgid) if members is None else members:
        try:
            tasks = list(os.scandir(Path(path, "task")))
        except OSError:
            continue
        for task in tasks:
            try:
                stat = Path(task.path, "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
            if name.startswith(prefix):
                fields = rest.split()
                cpu += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return cpu


def group_pss(pgid: int, members: Members | None = None) -> int:
    """Sum of the proportional set size (``Pss`` in ``smaps_rollup``) of group ``pgid`` and its
    descendants, bytes.

    What they hold in RAM now, shared pages split between the processes that share them: unlike
    a sum of VmHWM it counts the pages Spark's forked Python workers share with their daemon
    (and each other) once, not once per worker.
    """
    total = 0
    for path, fields in _group_members(pgid) if members is None else members:
        if _in_parent_space(path, fields):
            continue
        try:
            for line in Path(path, "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError, IndexError):
            continue
    return total


def pid_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, VmHWM bytes) of one process (a broker JVM)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = sum(int(x) for x in fields[11:15]) / CLK_TCK
        hwm = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
        return cpu, hwm
    except (OSError, IndexError, ValueError):
        return 0.0, 0


# -- metrics sampling -------------------------------------------------------------------------

#: stage -> (component, metric family) whose growth is that stage's record count.
STAGE_COUNTERS = {
    "sender": ("sender", "kafka_diode_sender_records_sent"),
    # Source records decoded (each is handed to the producer at once). Not produced_records:
    # a heartbeat becomes one raw record per partition it names, so subtracting the heartbeat
    # count left that counter growing until the end and "done after" meant nothing.
    "receiver": ("receiver", "kafka_diode_receiver_records"),
    "dedup": ("dedup", "kafka_diode_dedup_records_forwarded"),
}
LOSS_COUNTERS = {
    "datagrams_sent": ("sender", "kafka_diode_sender_datagrams_sent"),
    "bytes_sent": ("sender", "kafka_diode_sender_bytes_sent"),
    "records_sent": ("sender", "kafka_diode_sender_records_sent"),
    "datagrams_received": ("receiver", "kafka_diode_receiver_datagrams"),
    "kernel_drops": ("receiver", "kafka_diode_receiver_kernel_drops"),
    "relay_dropped": ("relay", "kafka_diode_netem_datagrams"),
}


def _sum(samples: list[tuple[dict[str, str], float]]) -> float:
    return sum(v for _, v in samples)


class Sampler(threading.Thread):
    """Every SAMPLE_S: component counters (Prometheus) and process-group CPU/memory (/proc)."""

    def __init__(self, pipeline: Pipeline, brokers: dict[str, int]) -> None:
        super().__init__(daemon=True, name="sampler")
        self.pipeline = pipeline
        self.brokers = brokers
        self.series: list[tuple[float, dict[str, float]]] = []
        self.peak_mem: dict[str, int] = {}
        #: peak of the group's summed Pss (``group_pss``): the RAM it really held at once
        self.peak_pss: dict[str, int] = {}
        self.stop_event = threading.Event()
        self._last: dict[str, float] = {}
        self._samples = 0

    def sample(self, *, pss: bool = False) -> dict[str, float]:
        """One sample; Pss too if ``pss`` or every PSS_EVERY samples."""
        out: dict[str, float] = {}
        scraped: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = {}
        for name, port in self.pipeline.ep.metrics.items():
            scraped[name] = scrape(port)
        for key, (component, family) in {**STAGE_COUNTERS, **LOSS_COUNTERS}.items():
            if not scraped.get(component):
                # A scrape that failed (busy or starting process) keeps the last known value.
                out[key] = self._last.get(key, 0.0)
                continue
            samples = scraped[component].get(family, [])
            if key == "relay_dropped":
                samples = [s for s in samples if s[0].get("event", "").startswith("dropped")]
            out[key] = _sum(samples)
        self._last = dict(out)
        # One /proc scan for every group, and Pss (``smaps_rollup`` walks a JVM's page tables
        # under its memory map's lock) once in PSS_EVERY samples: the sampler shares the two
        # cores with what it measures (7 scans and Pss every sample: ~3 CPU-s more per two 1 GB
        # cases, docs/benchmarks.md "End to end").
        table = proc_table()
        with_pss = pss or self._samples % PSS_EVERY == 0
        self._samples += 1
        for name, proc in self.pipeline.group.processes.items():
            if proc.proc is None or not proc.running:
                continue
            members = _group_members(proc.proc.pid, table)
            cpu, hwm, _ = group_usage(proc.proc.pid, members)
            out[f"cpu:{name}"] = cpu
            if name == "receiver":
                out["cpu:receiver-librdkafka"] = threads_cpu(proc.proc.pid, "rdk:", members)
            self.peak_mem[name] = max(self.peak_mem.get(name, 0), hwm)
            if with_pss:
                pss = group_pss(proc.proc.pid, members)
                self.peak_pss[name] = max(self.peak_pss.get(name, 0), pss)
        for name, pid in self.brokers.items():
            cpu, hwm = pid_usage(pid)
            out[f"cpu:{name}"] = cpu
            self.peak_mem[name] = max(self.peak_mem.get(name, 0), hwm)
        return out

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.series.append((time.time(), self.sample()))
            self.stop_event.wait(SAMPLE_S)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(10)
        # Pss at the end too: a JVM's heap grows as a case runs, so its peak may be the last
        self.series.append((time.time(), self.sample(pss=True)))

    def latest(self) -> dict[str, float]:
        return self.series[-1][1] if self.series else {}


def stage_rate(
    series: list[tuple[float, dict[str, float]]], key: str, t0: float | None = None
) -> dict[str, float]:
    """Growth of a counter over the interval where it grew (records/s), its peak 1 s rate, and
    when it last grew (``done_after_s``, from ``t0``). A micro-batch stage that moves everything
    in one or two jumps has a meaningless interval rate; ``done_after_s`` is the robust figure.
    """
    if len(series) < 2:
        return {"records": 0.0, "records_per_s": 0.0, "peak_records_per_s": 0.0}
    base = series[0][1].get(key, 0.0)
    end = series[-1][1].get(key, 0.0)
    # Start: the last sample still at the base; end: the first sample at the final value.
    t_start = series[0][0]
    for t, s in series:
        if s.get(key, 0.0) > base:
            break
        t_start = t
    t_end = next(t for t, s in series if s.get(key, 0.0) >= end)
    peak = 0.0
    for i in range(len(series)):
        j = i
        while j < len(series) - 1 and series[j][0] - series[i][0] < 1.0:
            j += 1
        dt = series[j][0] - series[i][0]
        if dt > 0:
            peak = max(peak, (series[j][1].get(key, 0.0) - series[i][1].get(key, 0.0)) / dt)
    delta = end - base
    rate = delta / (t_end - t_start) if t_end > t_start else 0.0
    out = {"records": delta, "records_per_s": rate, "peak_records_per_s": peak}
    if t0 is not None:
        out["done_after_s"] = t_end - t0
    return out


# -- the clean-topic consumer -----------------------------------------------------------------


class EndConsumer(threading.Thread):
    """Reads the end topic; per ``bench.seq`` record notes consume time minus upstream time."""

    def __init__(self, bootstrap: str, topic: str, count: int, *, committed: bool) -> None:
        super().__init__(daemon=True, name="end-consumer")
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-e2e-{os.urandom(4).hex()}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed" if committed else "read_uncommitted",
                "fetch.wait.max.ms": 10,
            }
        )
        meta = self.consumer.list_topics(topic, timeout=30).topics[topic]
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]
        )
        self.runs = not committed  # the raw topic: records come in runs
        self.count = count
        self.seen = bytearray(count)
        self.unique = 0
        self.duplicates = 0
        self.warmup = 0
        self.latencies_ms: list[float] = []
        self.last_time = 0.0
        self.stop_event = threading.Event()

    def _note_run(self, value: bytes | None, now: float) -> None:
        """A raw record: a run of source records (common/raw_run.py), each with its headers and
        upstream timestamp; anything else (a control record) carries no ``bench.seq``."""
        try:
            groups, _ = decode_record_groups(value or b"")
        except RemoteProtocolError:
            return
        for group in groups:
            for ts, headers in zip(group.timestamps, group.headers, strict=True):
                self._note(next((v for k, v in headers if k == SEQ), None), ts, now)

    def _note(self, seq: bytes | None, ts: int, now: float) -> None:
        if seq is None:
            return
        if seq[:1] == b"w":
            self.warmup += 1
            return
        i = int(seq)
        if 0 <= i < self.count and not self.seen[i]:
            self.seen[i] = 1
            self.unique += 1
            self.latencies_ms.append(now * 1000.0 - ts)
            self.last_time = now
        else:
            self.duplicates += 1

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                batch = self.consumer.consume(2000, 0.1)
                now = time.time()
                for msg in batch:
                    if msg.error() is not None:
                        continue
                    if self.runs:
                        self._note_run(msg.value(), now)
                        continue
                    seq = None
                    raw = msg.headers() or []
                    for k, v in raw.items() if isinstance(raw, dict) else raw:
                        if k == SEQ and isinstance(v, bytes):
                            seq = v
                    self._note(seq, msg.timestamp()[1], now)
        finally:
            self.consumer.close()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1]}


# -- py-spy -----------------------------------------------------------------------------------


def start_py_spy(
    pid: int, seconds: float, out: Path, *, children: bool = False
) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        console.print("[yellow]py-spy not installed; no profile[/]")
        return None
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
         "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking",
         *(["--subprocesses"] if children else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def summarize_py_spy(path: Path, top: int = 15) -> list[str]:
    """Self and total sample shares per function from py-spy's collapsed stacks."""
    if not path.exists():
        return []
    own: Tally[str] = Tally()
    total_in: Tally[str] = Tally()
    n = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        n += count
        own[frames[-1]] += count
        for f in set(frames):
            total_in[f] += count
    if not n:
        return []
    lines = [f"{'self %':>7} {'total %':>8}  function (file:line)  [{n} samples]"]
    for frame, c in own.most_common(top):
        lines.append(f"{100 * c / n:7.1f} {100 * total_in[frame] / n:8.1f}  {frame}")
    return lines


# -- one case ---------------------------------------------------------------------------------


def raise_share(pid: int, nice: int) -> None:
    """Give ``pid``'s autogroup (its session: the scheduler shares the CPU between busy
    autogroups equally, whatever a process's own nice) the weight of ``nice``, as a systemd unit's
    ``CPUWeight=`` sets its cgroup's."""
    Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def run_case(
    case: Case, bootstraps: tuple[str, str], brokers: dict[str, int], work: Path,
    *, stall_s: float, py_spy: str | None, receiver_nice: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    spec = PipelineSpec(
        records=case.records, topics=("bench",), partitions=case.partitions,
        value_size=case.size, profile=case.relay, compression=case.compression,
        copies=case.copies, rate_bytes=case.rate_bytes, run_dedup=case.dedup,
    )  # fmt: skip
    pipe = Pipeline(spec, work, upstream=bootstraps[0], downstream=bootstraps[1])
    source = pipe.ep.source_topics[0]
    end_topic = (
        pipe.ep.clean_template.replace("{topic}", source) if case.dedup else pipe.ep.raw_topic
    )
    with pipe:
        pipe.setup()
        # the receiver listening first: a sender's first datagrams to a closed port are lost
        # (ECONNREFUSED), and the warm-up would wait for records that can never arrive
        pipe.start_components(receiver_first=True)
        receiver = pipe.group["receiver"].proc
        if receiver_nice is not None and receiver is not None:
            raise_share(receiver.pid, receiver_nice)
        consumer = EndConsumer(bootstraps[1], end_topic, case.records, committed=case.dedup)
        consumer.start()
        # Warm-up: Spark started, clients connected, first transaction done.
        produce_records(bootstraps[0], source, partitions=case.partitions, count=WARMUP,
                        size=min(case.size, 1000), seq_prefix="w")  # fmt: skip
        _wait(lambda: consumer.warmup >= WARMUP, pipe, 600, "warm-up records at the end topic")
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(
            target=_produce_child,
            args=((bootstraps[0], source, case.partitions, case.records, case.size), queue),
        )
        fill: dict[str, float] = {}
        if case.backlog:
            # Graceful stop commits the warm-up offsets; the restarted sender (start position
            # "committed") then finds exactly the N backlog records.
            pipe.group["sender"].stop()
            fill = produce_records(bootstraps[0], source, partitions=case.partitions,
                                   count=case.records, size=case.size)  # fmt: skip
            sampler = Sampler(pipe, brokers)
            sender_start = time.time()
            pipe.group["sender"].start()
            sampler.series.append((time.time(), sampler.sample()))
            sampler.start()
        else:
            sampler = Sampler(pipe, brokers)
            sampler.series.append((time.time(), sampler.sample()))
            sampler.start()
            child.start()
        spy = None
        spy_out = work / f"py-spy-{py_spy}.txt"
        if py_spy:
            target = pipe.group[py_spy].proc
            assert target is not None
            spy = start_py_spy(target.pid, 20, spy_out, children=py_spy == "dedup")
        stalled = False
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stages]}"), TimeElapsedColumn(),
            console=console, transient=True,
        ) as bar:  # fmt: skip
            task = bar.add_task(case.label, total=case.records, stages="")
            last_count, last_change = -1, time.monotonic()
            while consumer.unique < case.records:
                time.sleep(0.2)  # refresh period of the progress bar, not synchronisation
                now = time.monotonic()
                if consumer.unique != last_count:
                    last_count, last_change = consumer.unique, now
                elif now - last_change > stall_s:
                    stalled = True
                    break
                _check_alive(pipe)
                s = sampler.latest()
                stages = " ".join(f"{k} {int(s.get(k, 0)):,}" for k in STAGE_COUNTERS)
                bar.update(task, completed=consumer.unique, stages=stages)
        if case.backlog:
            produced = {"first": sender_start, "fill_s": fill["last"] - fill["first"],
                        "cpu": fill["cpu"]}  # fmt: skip
        else:
            produced = queue.get(timeout=600)
            child.join(30)
        time.sleep(1.0)  # let the components' metrics threads publish their final counters
        sampler.finish()
        consumer.stop_event.set()
        consumer.join(10)
        if spy is not None:
            spy.wait(60)
        res = summarize_case(case, sampler, consumer, produced, stalled, spy_out if spy else None)
        res["raw_topic"] = pipe.ep.raw_topic
        return res


def _check_alive(pipe: Pipeline) -> None:
    for proc in pipe.group.processes.values():
        if proc.proc is not None and not proc.running:
            raise RuntimeError(f"{proc.name} exited with {proc.returncode}:\n{proc.tail()}")


def _wait(pred: Any, pipe: Pipeline, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        _check_alive(pipe)
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)  # polling a condition with a deadline


def summarize_case(
    case: Case, sampler: Sampler, consumer: EndConsumer, produced: dict[str, float],
    stalled: bool, spy_out: Path | None,
) -> dict[str, Any]:  # fmt: skip
    series = sampler.series
    n = consumer.unique
    # CPU up to the first sample after the last record arrived: the seconds a stalled run (lost
    # records) then waits for more are not work done for the records delivered
    until = consumer.last_time + SAMPLE_S if n else series[-1][0]
    first = series[0][1]
    last = next((v for t, v in series if t >= until), series[-1][1])
    elapsed = consumer.last_time - produced["first"] if n else 0.0
    fill_s = produced.get("fill_s", produced.get("last", 0.0) - produced["first"])
    stages: dict[str, Any] = {
        "producer": {
            "records_per_s": case.records / fill_s if fill_s > 0 else None,
            "cpu_s_per_m_records": produced["cpu"] / case.records * 1e6,
        }
    }
    for stage in STAGE_COUNTERS:
        if stage == "dedup" and not case.dedup:
            continue
        stages[stage] = stage_rate(series, stage, produced["first"])
    for key in last:
        if key.startswith("cpu:"):
            name = key[4:]
            cpu = last[key] - first.get(key, 0.0)
            stages.setdefault(name, {})["cpu_s_per_m_records"] = cpu / max(n, 1) * 1e6
            stages[name]["cpu_s"] = cpu
    for side in ("upstream", "downstream"):
        # A cluster's nodes (upstream-1, ...) also as one figure per side, like a single broker.
        nodes = [v for k, v in stages.items() if k.startswith(f"{side}-") and "cpu_s" in v]
        if nodes:
            cpu = sum(v["cpu_s"] for v in nodes)
            stages[side] = {"cpu_s": cpu, "cpu_s_per_m_records": cpu / max(n, 1) * 1e6,
                            "nodes": len(nodes)}  # fmt: skip
    for name, peak in sampler.peak_mem.items():
        stages.setdefault(name, {})["peak_rss_mb"] = peak / 1e6
    for name, peak in sampler.peak_pss.items():
        stages.setdefault(name, {})["peak_pss_mb"] = peak / 1e6
    d = {k: last.get(k, 0.0) - first.get(k, 0.0) for k in LOSS_COUNTERS}
    loss = 1 - d["datagrams_received"] / d["datagrams_sent"] if d["datagrams_sent"] else 0.0
    result: dict[str, Any] = {
        "case": asdict(case),
        "label": case.label,
        "end_point": "clean topic (consume time)" if case.dedup else "raw topic (consume time)",
        "start_point": "sender start (backlog)" if case.backlog else "first produce call",
        "records": case.records,
        "delivered": n,
        "duplicates_seen": consumer.duplicates,
        "stalled": stalled,
        "elapsed_s": elapsed,
        "records_per_s": n / elapsed if elapsed > 0 else 0.0,
        "mb_per_s": n * case.size / 1e6 / elapsed if elapsed > 0 else 0.0,
        "latency_ms": {} if case.backlog else percentiles(consumer.latencies_ms),
        "stages": stages,
        "socket": {
            "datagrams_sent": d["datagrams_sent"],
            "datagrams_received": d["datagrams_received"],
            "kernel_drops": d["kernel_drops"],
            "relay_dropped": d["relay_dropped"],
            "loss_rate": max(0.0, loss),
            "records_per_datagram": d["records_sent"] / d["datagrams_sent"] * case.copies
            if d["datagrams_sent"]
            else 0.0,
            "mean_datagram_bytes": d["bytes_sent"] / d["datagrams_sent"]
            if d["datagrams_sent"]
            else 0.0,
        },
    }
    if spy_out is not None:
        result["py_spy"] = summarize_py_spy(spy_out)
    return result


# -- rate sweep (backlog, no dedup) -----------------------------------------------------------


def run_rate_point(
    case: Case, bootstraps: tuple[str, str], brokers: dict[str, int], work: Path, stall_s: float
) -> dict[str, Any]:
    """Pre-fill N records, then sender (paced) -> receiver; loss at the socket, achieved rate."""
    spec = PipelineSpec(
        records=case.records, topics=("bench",), partitions=case.partitions,
        value_size=case.size, profile=None, compression=case.compression, copies=case.copies,
        rate_bytes=case.rate_bytes, run_dedup=False,
    )  # fmt: skip
    pipe = Pipeline(spec, work, upstream=bootstraps[0], downstream=bootstraps[1])
    source = pipe.ep.source_topics[0]
    with pipe:
        pipe.setup()
        produce_records(
            bootstraps[0], source, partitions=case.partitions, count=case.records, size=case.size
        )
        env = pipe._env()
        pipe.group.add("receiver", pipe.receiver_argv(), env=env)
        _wait(lambda: scrape(pipe.ep.metrics["receiver"]) != {}, pipe, 120, "receiver metrics")
        sampler = Sampler(pipe, brokers)
        sampler.series.append((time.time(), sampler.sample()))
        pipe.group.add("sender", pipe.sender_argv(), env=env)
        _wait(lambda: scrape(pipe.ep.metrics["sender"]) != {}, pipe, 120, "sender metrics")
        sampler.start()
        last, changed = -1.0, time.monotonic()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:  # fmt: skip
            task = bar.add_task(case.label, total=case.records)
            while True:
                time.sleep(0.2)  # progress refresh period
                got = sampler.latest().get("receiver", 0.0)
                bar.update(task, completed=int(got))
                if got >= case.records:
                    break
                if got != last:
                    last, changed = got, time.monotonic()
                elif time.monotonic() - changed > stall_s:
                    break
                _check_alive(pipe)
        time.sleep(1.0)  # final metrics publication
        sampler.finish()
    series = sampler.series
    d = {k: series[-1][1].get(k, 0.0) - series[0][1].get(k, 0.0) for k in LOSS_COUNTERS}
    sent = stage_rate(series, "sender")
    loss = 1 - d["datagrams_received"] / d["datagrams_sent"] if d["datagrams_sent"] else 0.0
    return {
        "offered_mb_per_s": case.rate_bytes / 1e6,
        "sender_records_per_s": sent["records_per_s"],
        "sender_mb_per_s": sent["records_per_s"] * case.size / 1e6,
        "receiver_records_per_s": stage_rate(series, "receiver")["records_per_s"],
        "datagrams_sent": d["datagrams_sent"],
        "datagrams_received": d["datagrams_received"],
        "kernel_drops": d["kernel_drops"],
        "loss_rate": max(0.0, loss),
    }


# -- baselines --------------------------------------------------------------------------------


def baseline_kafka(bootstrap: str, size: int, count: int, partitions: int = 3) -> dict[str, float]:
    """Bare produce loop then bare consume loop (same record size, same producer settings)."""
    topic = f"bench-baseline-{os.urandom(4).hex()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    p = produce_records(bootstrap, topic, partitions=partitions, count=count, size=size)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, i, OFFSET_BEGINNING) for i in range(partitions)])
    got = 0
    nbytes = 0
    cpu0 = time.process_time()
    start = time.time()
    deadline = time.monotonic() + 300
    while got < count and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, 0.5):
            if msg.error() is None:
                got += 1
                nbytes += len(msg.value() or b"")
    elapsed = time.time() - start
    cpu = time.process_time() - cpu0
    consumer.close()
    admin.delete_topics([topic])
    return {
        "size": size,
        "records": count,
        "produce_records_per_s": count / (p["last"] - p["first"]),
        "produce_mb_per_s": count * size / 1e6 / (p["last"] - p["first"]),
        "consume_records_per_s": got / elapsed,
        "consume_mb_per_s": nbytes / 1e6 / elapsed,
        "consume_cpu_s_per_m_records": cpu / max(got, 1) * 1e6,
    }


def _drain(port: int, ready: Any, out: Any) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE, as the receiver does
    sock.bind(("127.0.0.1", port))
    sock.settimeout(1.0)
    buf = bytearray(65536)
    ready.set()
    n = 0
    first = last = 0.0
    try:
        while True:
            sock.recv_into(buf)
            last = time.time()
            if not n:
                first = last
            n += 1
    except TimeoutError:
        pass
    out.put((n, first, last))


def baseline_socket(datagram_size: int, count: int) -> dict[str, float]:
    """Bare sendto loop -> bare recv_into drain loop, two processes, one loopback socket."""
    ctx = multiprocessing.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    drain = ctx.Process(target=_drain, args=(port, ready, out))
    drain.start()
    ready.wait(10)
    payload = os.urandom(max(1, datagram_size))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    addr = ("127.0.0.1", port)
    start = time.time()
    for _ in range(count):
        sock.sendto(payload, addr)
    sent_s = time.time() - start
    sock.close()
    received, _first, last = out.get(timeout=60)
    drain.join(10)
    span = max(last - start, 1e-9)
    return {
        "datagram_bytes": datagram_size,
        "send_datagrams_per_s": count / sent_s,
        "drain_datagrams_per_s": received / span,
        "drain_mb_per_s": received * datagram_size / 1e6 / span,
        "loss_rate": 1 - received / count,
    }


def baseline_spark(bootstrap: str, topic: str) -> dict[str, Any]:
    """Spark pass-through over a raw topic of this run, in its own process (see spark_main)."""
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, __file__, "--spark-passthrough", bootstrap, topic],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"skipped": f"spark pass-through failed ({proc.returncode}): {proc.stderr[-500:]}"}
    out = dict(json.loads(lines[-1]))
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    out["cpu_s_incl_startup"] = cpu
    out["cpu_s_per_m_records_incl_startup"] = cpu / max(out["records"], 1) * 1e6
    return out


def spark_passthrough(bootstrap: str, topic: str) -> dict[str, Any]:
    """Kafka source -> mapInArrow(identity) -> noop sink, availableNow; the dedup's skeleton.

    Same source options and session settings as the dedup (local[2], Arrow, UI off), no state, no
    Kafka output: what Spark costs before any dedup work. Start-up is excluded from the rate.
    """
    from pyspark.sql import SparkSession  # noqa: PLC0415  only in this child process

    from runtime.maven import spark_connector_jars  # noqa: PLC0415

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-passthrough")
        .config("spark.jars", ",".join(str(p) for p in spark_connector_jars()))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value", "headers", "topic", "partition", "offset", "timestamp")
    )

    def identity(batches: Any) -> Any:
        yield from batches

    out = df.mapInArrow(identity, df.schema)
    with tempfile.TemporaryDirectory() as cp:
        start = time.time()
        query = (
            out.writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", cp)
            .start()
        )
        query.awaitTermination()
        elapsed = time.time() - start
        rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
        batches = len(query.recentProgress)
    spark.stop()
    return {
        "records": rows,
        "micro_batches": batches,
        "records_per_s": rows / elapsed if elapsed > 0 else 0.0,
        "elapsed_s": elapsed,
    }


# -- output -----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "| case | e2e rec/s | e2e MB/s | sender rec/s | receiver rec/s | dedup rec/s "
        "| done after s: sender / receiver / dedup "
        "| CPU s/M rec: producer / sender / receiver / dedup / brokers | peak MB: sender / "
        "receiver / dedup | socket loss | latency p50 / p99 ms | delivered |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        st = c["stages"]

        def r(name: str, st: dict[str, Any] = st) -> str:
            return (
                f"{st[name]['records_per_s']:,.0f}" if "records_per_s" in st.get(name, {}) else "-"
            )

        def cpu(name: str, st: dict[str, Any] = st) -> str:
            v = st.get(name, {}).get("cpu_s_per_m_records")
            return "-" if v is None else f"{v:.1f}"

        def done(name: str, st: dict[str, Any] = st) -> str:
            v = st.get(name, {}).get("done_after_s")
            return "-" if v is None else f"{v:.1f}"

        def mem(name: str, st: dict[str, Any] = st) -> str:
            v = st.get(name, {}).get("peak_rss_mb")
            return "-" if v is None else f"{v:,.0f}"

        brokers = sum(
            st.get(b, {}).get("cpu_s_per_m_records", 0.0) for b in ("upstream", "downstream")
        )
        lat = c["latency_ms"]
        sock = c["socket"]
        rows.append(
            f"| {c['label']} | **{c['records_per_s']:,.0f}** | {c['mb_per_s']:.1f} | "
            f"{r('sender')} | {r('receiver')} | {r('dedup')} | "
            f"{done('sender')} / {done('receiver')} / {done('dedup')} | "
            f"{cpu('producer')} / {cpu('sender')} / {cpu('receiver')} / {cpu('dedup')} / "
            f"{brokers:.1f} | {mem('sender')} / {mem('receiver')} / {mem('dedup')} | "
            f"{100 * sock['loss_rate']:.2f} % ({sock['kernel_drops']:.0f} kernel drops) | "
            f"{lat.get('p50', 0):,.0f} / {lat.get('p99', 0):,.0f} | "
            f"{c['delivered']:,}/{c['records']:,}{' STALLED' if c['stalled'] else ''} |"
        )
    out = "\n".join(rows)
    if result.get("baselines"):
        out += "\n\n| baseline (same run) | figure |\n|---|---|\n"
        for name, figs in result["baselines"].items():
            text = ", ".join(
                f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in figs.items()
            )
            out += f"| {name} | {text} |\n"
    if result.get("rate_sweep"):
        out += "\n| offered MB/s (0 = unpaced) | sender rec/s | sender MB/s | datagrams sent "
        out += "| received | kernel drops | loss |\n|---|---|---|---|---|---|---|\n"
        for p in result["rate_sweep"]:
            out += (
                f"| {p['offered_mb_per_s']:g} | {p['sender_records_per_s']:,.0f} | "
                f"{p['sender_mb_per_s']:.1f} | {p['datagrams_sent']:,.0f} | "
                f"{p['datagrams_received']:,.0f} | {p['kernel_drops']:,.0f} | "
                f"{100 * p['loss_rate']:.2f} % |\n"
            )
    return out


# -- main -------------------------------------------------------------------------------------


def parse_case(text: str) -> Case:
    """``SIZE[:RECORDS[:none|gzip[:COPIES]]][@backlog]``, SIZE in bytes or 100B/1KB/10KB/1MB."""
    text, _, mode = text.partition("@")
    parts = text.split(":")
    size = SIZE_ALIASES.get(parts[0].upper()) or int(parts[0])
    case = Case(size=size, records=int(parts[1]) if len(parts) > 1 else 100_000)
    if len(parts) > 2:
        case = replace(case, compression=parts[2])
    if len(parts) > 3:
        case = replace(case, copies=int(parts[3]))
    return replace(case, backlog=mode == "backlog")


def build_plan(args: argparse.Namespace) -> tuple[list[Case], list[Case]]:
    relay = args.relay
    if args.case:
        cases = [parse_case(c) for c in args.case]
    elif args.sweep:
        backlog = [
            Case(size=100, records=200_000),
            Case(size=200, records=200_000),
            Case(size=1000, records=100_000),
            Case(size=10_000, records=30_000),
            Case(size=990_000, records=300),
            Case(size=200, records=200_000, compression="gzip"),
            Case(size=200, records=200_000, copies=2),
            Case(size=10_000, records=30_000, compression="gzip"),
        ]
        cases = [Case(size=200, records=100_000)]
        cases += [replace(c, backlog=True) for c in backlog]
    else:
        # Live (latency; the producer runs alongside) and backlog (the pipeline's own pace).
        cases = [
            Case(size=200, records=100_000),
            Case(size=200, records=100_000, backlog=True),
            Case(size=10_000, records=10_000, backlog=True),
        ]
    cases = [replace(c, relay=relay, dedup=not args.no_dedup) for c in cases]
    if args.pace_mbps:
        cases = [replace(c, rate_bytes=args.pace_mbps * 1e6) for c in cases]
    rates: list[Case] = []
    if args.sweep or args.rate_sweep:
        size = 200
        mbps = [float(x) for x in args.rates.split(",")]
        rates = [Case(size=size, records=args.rate_records, rate_bytes=m * 1e6, dedup=False)
                 for m in mbps]  # fmt: skip
    return cases, rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    ap.add_argument(
        "--case", action="append", help="SIZE[:RECORDS[:none|gzip[:COPIES]]][@backlog]; repeatable"
    )
    ap.add_argument(
        "--sweep", action="store_true", help="the full sweep (sizes, gzip, copies, rates)"
    )
    ap.add_argument("--rate-sweep", action="store_true", help="only add the offered-rate sweep")
    ap.add_argument("--rates", default="0,5,10,20,40,80",
                    help="offered MB/s for the rate sweep (0 = unpaced)")  # fmt: skip
    ap.add_argument("--rate-records", type=int, default=200_000)
    ap.add_argument("--pace-mbps", type=float, default=0.0,
                    help="the sender's rate_bytes for every case, MB/s (0: unpaced)")  # fmt: skip
    ap.add_argument("--relay", default=None, help="netem profile for a relay (default: direct)")
    ap.add_argument("--no-dedup", action="store_true", help="end at the raw topic")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--baseline-records", type=int, default=200_000)
    ap.add_argument("--py-spy", choices=["sender", "receiver", "relay", "dedup"], default=None,
                    help="profile this component of the first case (20 s)")  # fmt: skip
    ap.add_argument(
        "--receiver-autogroup-nice",
        type=int,
        default=None,
        metavar="N",
        help="the receiver's autogroup at nice N (e.g. -10: a larger CPU share)",
    )
    ap.add_argument("--stall", type=float, default=60.0, help="give up after S s without progress")
    ap.add_argument(
        "--brokers", type=int, default=1,
        help="nodes of each side's own Kafka: 1, or 3 (replication 3, min.insync.replicas 2)",
    )  # fmt: skip
    ap.add_argument("--upstream", default=None, help="use this broker instead of starting one")
    ap.add_argument("--downstream", default=None)
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="an empty or new directory for the brokers' data, logs and the dedup's "
                    "checkpoint, kept at the end (default: a temporary one, removed)")  # fmt: skip
    ap.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--spark-passthrough", nargs=2, metavar=("BOOTSTRAP", "TOPIC"),
                    help=argparse.SUPPRESS)  # fmt: skip
    args = ap.parse_args(argv)
    if args.spark_passthrough:
        print(json.dumps(spark_passthrough(*args.spark_passthrough)))
        return 0

    if args.work_dir is not None and args.work_dir.is_dir() and any(args.work_dir.iterdir()):
        # its brokers would start on the last run's data and its dedup read on from the last
        # run's checkpoint: the runs would not be comparable
        ap.error(f"--work-dir {args.work_dir} is not empty: give an empty or new directory")
    cases, rates = build_plan(args)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kafka-diode-e2e-"))
    result: dict[str, Any] = {"bench": "e2e", "machine": machine(), "argv": sys.argv[1:]}
    started: list[LocalBroker | LocalCluster] = []
    broker_pids: dict[str, int] = {}
    result["brokers_per_side"] = args.brokers
    try:
        bootstraps = []
        for side in ("upstream", "downstream"):
            given = getattr(args, side)
            if given:
                bootstraps.append(given)
                continue
            name = f"e2e-{side}-{os.getpid()}"
            console.print(f"starting {side} Kafka ({args.brokers} node(s)) ...")
            if args.brokers > 1:
                cluster = LocalCluster(name, ports=tuple(free_port() for _ in range(args.brokers)),
                                       brokers=args.brokers, data_dir=work / f"kafka-{side}",
                                       partitions=3)  # fmt: skip
                started.append(cluster)
                cluster.start()
                for i, node in enumerate(cluster.nodes, start=1):
                    state = node.state
                    assert state is not None, f"{node.name} has no state after start"
                    broker_pids[f"{side}-{i}"] = state.pid
                bootstraps.append(cluster.bootstrap)
                continue
            broker = LocalBroker(name, free_port(), data_dir=work / f"kafka-{side}", partitions=3)
            started.append(broker)
            state = broker.start()
            broker_pids[side] = state.pid
            bootstraps.append(broker.bootstrap)
        bs = (bootstraps[0], bootstraps[1])
        result["cases"] = []
        for i, case in enumerate(cases):
            console.print(
                f"[bold]case {i + 1}/{len(cases)}: {case.label}[/] (load {os.getloadavg()[0]:.1f})"
            )
            res = run_case(case, bs, broker_pids, work / f"case-{i}", stall_s=args.stall,
                           py_spy=args.py_spy if i == 0 else None,
                           receiver_nice=args.receiver_autogroup_nice)  # fmt: skip
            res["loadavg_1m"] = os.getloadavg()[0]
            result["cases"].append(res)
            console.print(
                f"  e2e {res['records_per_s']:,.0f} rec/s, {res['mb_per_s']:.1f} MB/s; "
                f"socket loss {100 * res['socket']['loss_rate']:.2f} %; "
                f"delivered {res['delivered']:,}/{res['records']:,}"
            )
        result["rate_sweep"] = []
        for i, case in enumerate(rates):
            console.print(f"[bold]rate {i + 1}/{len(rates)}: {case.label}[/]")
            point = run_rate_point(case, bs, broker_pids, work / f"rate-{i}", args.stall)
            result["rate_sweep"].append(point)
            console.print(
                f"  sent {point['sender_mb_per_s']:.1f} MB/s, loss {100 * point['loss_rate']:.2f} %"
            )
        if result["rate_sweep"]:
            clean = [
                p for p in result["rate_sweep"] if p["loss_rate"] == 0 and not p["kernel_drops"]
            ]
            result["max_zero_loss_sender_mb_per_s"] = max(
                (p["sender_mb_per_s"] for p in clean), default=0.0
            )
        if not args.no_baselines:
            console.print("baselines ...")
            base: dict[str, Any] = {}
            for size in sorted({c.size for c in cases}):
                count = min(args.baseline_records, max(300, int(2e9 / size / 10)))
                base[f"kafka {_size_label(size)}"] = baseline_kafka(bs[0], size, count)
            dsize = int(next((c["socket"]["mean_datagram_bytes"] for c in result["cases"]
                              if c["socket"]["mean_datagram_bytes"]), 1472))  # fmt: skip
            base["socket"] = baseline_socket(dsize, 300_000)
            raw = next(
                (c["raw_topic"] for c in reversed(result["cases"]) if c.get("raw_topic")), None
            )
            if raw:
                console.print(f"spark pass-through over {raw} ...")
                base["spark pass-through"] = baseline_spark(bs[1], raw)
            result["baselines"] = base
            for c in result["cases"]:
                k = base.get(f"kafka {_size_label(c['case']['size'])}", {})
                sk = base["socket"]
                c["ratios"] = {
                    "e2e_vs_bare_produce": c["records_per_s"] / k["produce_records_per_s"]
                    if k
                    else None,
                    "sender_vs_bare_consume": c["stages"]["sender"]["records_per_s"]
                    / k["consume_records_per_s"]
                    if k
                    else None,
                    "sender_datagrams_vs_bare_socket": c["stages"]["sender"]["records_per_s"]
                    / max(c["socket"]["records_per_datagram"], 1e-9)
                    / sk["drain_datagrams_per_s"],
                }
        result["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    finally:
        for started_kafka in reversed(started):
            started_kafka.stop()
        if args.work_dir is None:  # hundreds of MB of broker data per run
            shutil.rmtree(work, ignore_errors=True)
    print(markdown(result))
    line = json.dumps(result, default=str)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
