"""Side by side with the peer, air-gap (issue 24): both systems on the same two brokers.

Takes the peer's source directory (anders-wartoft/air-gap; never vendored here), builds it as its
docs say (Go for its upstream sender and downstream receiver, Maven for its Kafka Streams dedup),
starts one upstream and one downstream single-broker KRaft cluster of our own
(``kafka_diode.local_kafka``), and runs, alternately and with fresh topics each time:

- **ours**: ``kafka-diode send``, ``receive`` and ``dedup`` (``kafka_diode.pipeline``), AES-256-GCM
  shared key, 1472-byte datagrams, direct loopback;
- **peer**: ``upstream`` and ``downstream`` built from source with AES-GCM on (RSA key exchange,
  ``encryption=true``, ``publicKeyFile`` a self-signed certificate as README.md "Keys" makes,
  ``privateKeyFiles``), payloads of 1432 bytes (what
  ``payloadSize=auto`` picks on a 1500-byte MTU NIC), downstream ``batchSize=512``, and its
  dedup jar (exactly-once v2) with ``COMMIT_INTERVAL_MS``/``PERSIST_INTERVAL_MS`` 500 as its
  "Performance Tuning" section says for high event rates; everything else at its documented
  defaults or its ``config/dedup-template.env``.

One run of one system:

1. create the topics; start the receiver and the dedup, then the sender; produce a warm-up of
   ``--warmup`` records (300 by default) and wait until they are in the clean topic
   (``read_committed``): the dedup is consuming, every client connected. 300 records do not warm
   a JVM's compiler: ``--warmup 200000`` runs a backlog of the same size through both systems
   first, so that the measured one meets what a long-lived service is (the JIT done); the wait
   ends when every warm-up record is in the clean topic, or when at least half are and none came
   for 15 s (the peer loses ~10 % of such a backlog at its socket). The brokers are JVMs too:
   ``--warm-rounds`` (2 by default) runs whole rounds first, each system's included, that are
   shown but left out of the medians and ratios, so that the measured runs meet brokers whose
   compiler has settled, as a production cluster's has (on fresh brokers the first runs cost
   the downstream broker two to three times its settled CPU per record, for either system);
2. stop the sender, pre-fill the upstream topic with the backlog (N records of ``--value-bytes``,
   3 partitions, values ``b<seq> <log-like text>``, keys ``k<i mod 1000>``, no headers: the peer
   carries none), then **release** it: start the sender again;
3. two consumers in this process count backlog records: in the raw topic by the source offsets
   in its keys (ours ``t:p:o`` and ``t:p:first-last`` runs, our control records such as
   heartbeats, keyed by the next offset, skipped; the peer's ``t_p_o``) and in the clean
   topic (``read_committed``) by the ``<seq>`` in the values, each noting when its count last
   grew. The run ends when every record is in the clean topic, or when the raw topic has not
   grown for 10 s and the clean topic holds everything it got, or after ``--stall`` s without
   progress.

Figures per run: records/s to the raw and to the clean topic (N seen / time from release to the
last new record seen); CPU seconds per million backlog records of the sender, the receiver and
the dedup (utime+stime of each process group from ``/proc``, reaped children included, from
release to the first 0.2 s sample after the last record seen in either topic: the quiet time that
tells a loss from a lag is not counted; the restarted sender's whole life), of each broker JVM, and
of the receiver and dedup over their whole life (start-up and warm-up included); the dedup's peak
RSS; records lost (backlog records never seen in the clean topic); datagrams dropped at the
receiving socket (``/proc/net/udp`` drops of the receiver's port, read before it stops) and, for
the peer, the losses its own statistics report (``SO_RXQ_OVFL_TOTAL``, ``enableRxqOvfl=true``);
the 1-minute load average before and after. For our dedup also: its CPU split between its JVM and
its own Python process and Spark's Python workers (``dedup_jvm_cpu_s_per_m``,
``dedup_driver_cpu_s_per_m``, ``dedup_workers_cpu_s_per_m``), its CPU-s per GB
of values delivered (``dedup_cpu_s_per_gb_delivered``, the unit of ``bench/dedup.py``'s
single-batch figure) and the micro-batches it committed meanwhile (``dedup_batches``, from its
``/metrics``). ``--pace-mbps`` paces our sender (its ``rate_bytes``), as a diode link is run;
``--dedup-env NAME=VALUE`` sets one of our dedup's settings, to compare them run by run.

    .venv/bin/python bench/peer.py /tmp/air-gap                     # ours, peer, ours, peer
    .venv/bin/python bench/peer.py /tmp/air-gap --value-bytes 10000  # 10 KB records, MB/s
    .venv/bin/python bench/peer.py /tmp/air-gap --order ours --rounds 1 --records 20000
    kafka-diode bench peer /tmp/air-gap --skip-build --work-dir /tmp/peer-run   # keeps logs, data

Get the peer's source with ``git clone https://github.com/anders-wartoft/air-gap`` (or from a
mirror: ``git -C MIRROR archive HEAD | tar -x -C DIR``). Not part of CI. Prints a Markdown table,
then ONE JSON object as the last line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from bench.e2e import CLK_TCK, _group_members, group_usage, machine, pid_usage, text_pool
from common.raw_run import parse_run_key
from common.raw_topic import CONTROL_HEADER, parse_raw_key
from kafka_diode.demo import scrape
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import ManagedProcess, ProcessGroup, wait_until

WARMUP = 300
#: The peer's payload per datagram: ``payloadSize=auto`` is the NIC's MTU minus 68; on a
#: 1500-byte MTU (loopback's is 65536) that is 1432. Ours: 1472-byte datagrams (its default).
PEER_PAYLOAD_SIZE = 1432
PEER_BATCH_SIZE = 512
RAW_QUIET_S = 10.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- pure helpers (tests/unit/test_bench_peer.py) ---------------------------------------------


def render_properties(settings: Mapping[str, str | int | bool], comment: str = "") -> str:
    """A ``key=value`` properties file as the peer reads it (one per line, ``#`` comments).

    Booleans are written ``true``/``false``; a key with ``=``, ``#`` or blanks, or a value
    with a line break, cannot be written and raises ValueError.
    """
    lines = [f"# {line}" for line in comment.splitlines()]
    for key, value in settings.items():
        if not key or any(c in key for c in "=# \t\r\n"):
            raise ValueError(f"property name {key!r} cannot be written")
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        if "\n" in text or "\r" in text:
            raise ValueError(f"property {key!r}: value has a line break")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def source_offsets(key: bytes | str | None, topic: str) -> tuple[int, range] | None:
    """``(partition, offsets)`` a raw-topic key carries for source ``topic``, or None.

    Ours: ``topic:partition:offset`` (raw layout v1) and ``topic:partition:first-last[/stride]``
    (v2 runs); the peer's: ``topic_partition_offset``. Control records, heartbeats, status
    messages and other topics' records give None.
    """
    if key is None:
        return None
    text = key.decode("ascii", "replace") if isinstance(key, bytes) else key
    run = parse_run_key(text)
    if run is not None:
        run_topic, partition, first, last, stride = run
        return (partition, range(first, last + 1, stride)) if run_topic == topic else None
    v1 = parse_raw_key(text)
    if v1 is not None:
        v1_topic, partition, offset = v1
        if v1_topic == topic and offset >= 0:
            return partition, range(offset, offset + 1)
        return None
    head, sep, offset_text = text.rpartition("_")
    peer_topic, sep2, partition_text = head.rpartition("_")
    if sep and sep2 and peer_topic == topic and partition_text.isdigit() and offset_text.isdigit():
        offset = int(offset_text)
        return int(partition_text), range(offset, offset + 1)
    return None


def is_control(headers: Iterable[tuple[str, object]] | Mapping[str, object] | None) -> bool:
    """Whether a raw record is one of our control records (heartbeat, withheld, reset).

    A heartbeat is keyed ``topic:partition:high_offset``, the next offset to come: counted as a
    record it would mark an offset that is lost, or not yet written, as seen.
    """
    if isinstance(headers, Mapping):
        return CONTROL_HEADER in headers
    return any(name == CONTROL_HEADER for name, _ in headers or ())


def value_seq(value: bytes | None) -> tuple[str, int] | None:
    """``("b"|"w", seq)`` of a benchmark value (``b000000042 ...``), or None."""
    if value is None or len(value) < 10 or value[:1] not in (b"b", b"w"):
        return None
    digits = value[1:10]
    if not digits.isdigit():
        return None
    return value[:1].decode(), int(digits)


def ratios(ours: Mapping[str, float], peer: Mapping[str, float]) -> dict[str, float | None]:
    """Ours over the peer: clean-topic rate, raw-topic rate, low side and dedup CPU per record."""

    def div(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    return {name: div(ours.get(key), peer.get(key)) for name, key in RATIOS.items()}


#: ratio name -> the figure it divides (ours / peer).
RATIOS = {
    "clean_rate": "clean_records_per_s",
    "raw_rate": "raw_records_per_s",
    "low_side_cpu_per_record": "low_side_cpu_s_per_m",
    "low_side_cpu_per_delivered_record": "low_side_cpu_s_per_m_delivered",
    "dedup_cpu_per_record": "dedup_cpu_s_per_m",
    "receiver_cpu_per_record": "receiver_cpu_s_per_m",
    "sender_cpu_per_record": "sender_cpu_s_per_m",
}


# -- the peer's build --------------------------------------------------------------------------


class PeerError(RuntimeError):
    """The peer could not be built or run; the message says where and why."""


@dataclass(frozen=True)
class PeerBuild:
    """The peer's binaries, built from its source."""

    upstream: Path
    downstream: Path
    dedup_jar: Path
    info: dict[str, Any] = field(default_factory=dict)


def _run_build(argv: list[str], cwd: Path, what: str, env: Mapping[str, str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise PeerError(f"{what} failed ({' '.join(argv)}, exit {proc.returncode}):\n{tail}")
    return time.monotonic() - start


def build_peer(src: Path, out: Path, *, skip_existing: bool) -> PeerBuild:
    """``go build`` the upstream and downstream, ``mvn package`` the dedup (its README's way)."""
    if not (src / "src/cmd/upstream").is_dir() or not (src / "java-streams/pom.xml").is_file():
        raise PeerError(f"{src} does not look like air-gap's source (src/cmd, java-streams)")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    info: dict[str, Any] = {"source": str(src)}
    for tool in ("go", "mvn", "java"):
        if shutil.which(tool) is None:
            raise PeerError(f"{tool} is not on PATH")
    info["go"] = subprocess.run(["go", "version"], capture_output=True, text=True,
                                check=False).stdout.strip()  # fmt: skip
    info["java"] = subprocess.run(["java", "-version"], capture_output=True, text=True,
                                  check=False).stderr.splitlines()[:1]  # fmt: skip
    if (src / ".git").exists():
        info["commit"] = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"],
                                        capture_output=True, text=True,
                                        check=False).stdout.strip()  # fmt: skip
    upstream, downstream = out / "upstream", out / "downstream"
    for name, binary in (("upstream", upstream), ("downstream", downstream)):
        if skip_existing and binary.exists():
            continue
        info[f"{name}_build_s"] = _run_build(
            ["go", "build", "-o", str(binary), f"./src/cmd/{name}"], src, f"go build {name}", env
        )
    jars = sorted((src / "java-streams/target").glob("air-gap-deduplication-fat-*.jar"))
    if not (skip_existing and jars):
        info["dedup_build_s"] = _run_build(
            ["mvn", "-B", "-q", "-DskipTests", "package"], src / "java-streams", "mvn package", env
        )
        jars = sorted((src / "java-streams/target").glob("air-gap-deduplication-fat-*.jar"))
    if not jars:
        raise PeerError("mvn package made no air-gap-deduplication-fat-*.jar")
    info["dedup_jar"] = jars[-1].name
    return PeerBuild(upstream, downstream, jars[-1], info)


def write_rsa_pair(private_path: Path, cert_path: Path, bits: int = 4096) -> None:
    """An RSA key (PKCS#8, unencrypted) and a self-signed X.509 certificate holding its public key.

    What README.md "Keys" makes with keytool + ``openssl pkcs12``: the upstream parses
    ``publicKeyFile`` as a certificate (``x509.ParseCertificate``); the bare public key that
    doc/Encryption.md's ``openssl rsa -pubout`` gives is refused ("malformed serial number").
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    private_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "airgap-downstream-bench")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


# -- workload and counting ---------------------------------------------------------------------


def produce_values(
    bootstrap: str, topic: str, *, count: int, size: int, prefix: str, partitions: int
) -> float:
    """Produce ``count`` values ``<prefix><seq:09d> text...`` of ``size`` bytes; returns seconds."""
    pool = text_pool(size)
    span = len(pool) - size
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4",
                         "queue.buffering.max.kbytes": 262_144})  # fmt: skip
    failed: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    start = time.monotonic()
    for i in range(count):
        head = b"%s%09d " % (prefix.encode(), i)
        off = (i * 7919) % span
        value = head + pool[off : off + max(0, size - len(head))]
        while True:
            try:
                producer.produce(topic, value=value, key=b"k%d" % (i % 1000),
                                 partition=i % partitions, on_delivery=on_delivery)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    if remaining or failed:
        raise RuntimeError(f"produce: {remaining} unflushed, {len(failed)} failed: {failed[:3]}")
    return time.monotonic() - start


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-peer-{uuid.uuid4()}"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1]
                for p in range(partitions)]  # fmt: skip
    finally:
        consumer.close()


class WarmupCount:
    """Distinct warm-up records seen; done when all ``target`` are, or at least half and none new
    for ``QUIET_S`` (module doc: the peer loses some of a warm-up backlog at its socket)."""

    QUIET_S = 15.0

    def __init__(self) -> None:
        self.seen = bytearray()
        self.count = 0
        self.last = 0.0

    def add(self, seq: int, now: float) -> None:
        if seq >= len(self.seen):
            self.seen.extend(bytes(seq + 1 - len(self.seen)))
        if not self.seen[seq]:
            self.seen[seq] = 1
            self.count += 1
            self.last = now

    def done(self, target: int, now: float) -> bool:
        if self.count >= target:
            return True
        return self.count >= target / 2 and now - self.last > self.QUIET_S


class Counter(threading.Thread):
    """Counts backlog records in one topic and notes when the count last grew."""

    def __init__(self, bootstrap: str, topic: str, *, committed: bool) -> None:
        super().__init__(daemon=True, name=f"count-{topic}")
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-peer-{uuid.uuid4()}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        })  # fmt: skip
        self.consumer.subscribe([topic])
        self.count = 0
        self.warmup = WarmupCount()
        self.duplicates = 0
        self.first_new = 0.0
        self.last_new = 0.0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def handle(self, key: bytes | None, value: bytes | None) -> int:
        """New backlog records in one message."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                new = 0
                for msg in self.consumer.consume(5000, 0.1):
                    if msg.error() is None and not is_control(msg.headers()):
                        new += self.handle(msg.key(), msg.value())
                if new:
                    self.count += new
                    self.last_new = time.time()
                    self.first_new = self.first_new or self.last_new
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(15)


class CleanCounter(Counter):
    """Clean topic: backlog records by the sequence number in their values."""

    def __init__(self, bootstrap: str, topic: str, records: int) -> None:
        super().__init__(bootstrap, topic, committed=True)
        self.seen = bytearray(records)

    def handle(self, key: bytes | None, value: bytes | None) -> int:
        seq = value_seq(value)
        if seq is None:
            return 0
        kind, i = seq
        if kind == "w":
            self.warmup.add(i, time.time())
            return 0
        if i < len(self.seen) and not self.seen[i]:
            self.seen[i] = 1
            return 1
        self.duplicates += 1
        return 0


class RawCounter(Counter):
    """Raw topic: backlog records by the source offsets in the keys (from ``base`` on)."""

    def __init__(self, bootstrap: str, topic: str, source_topic: str) -> None:
        super().__init__(bootstrap, topic, committed=False)
        self.source_topic = source_topic
        self.base: list[int] | None = None
        self.seen: list[bytearray] = []

    def expect(self, base: list[int], records: int) -> None:
        """Backlog offsets start at ``base[p]``; record i goes to partition i mod P."""
        n = len(base)
        self.seen = [bytearray(records // n + (1 if p < records % n else 0)) for p in range(n)]
        self.base = base

    def handle(self, key: bytes | None, value: bytes | None) -> int:
        found = source_offsets(key, self.source_topic)
        if found is None or self.base is None:
            return 0
        partition, offsets = found
        if partition >= len(self.base):
            return 0
        seen, base = self.seen[partition], self.base[partition]
        lo, hi = max(offsets.start, base) - base, min(offsets.stop, base + len(seen)) - base
        if hi <= lo:
            return 0
        if offsets.step == 1:
            new = seen[lo:hi].count(0)
            seen[lo:hi] = b"\x01" * (hi - lo)
            return new
        new = 0
        for o in range(offsets.start, offsets.stop, offsets.step):
            if base <= o < base + len(seen) and not seen[o - base]:
                seen[o - base] = 1
                new += 1
        return new


def udp_bound(port: int) -> bool:
    """Whether some socket is bound to local UDP ``port`` (/proc/net/udp*)."""
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if any(int(line.split()[1].rsplit(":", 1)[1], 16) == port for line in lines):
            return True
    return False


def udp_drops(port: int) -> int:
    """Datagrams the kernel dropped at every socket bound to local ``port`` (/proc/net/udp*)."""
    total = 0
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 12 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                total += int(fields[-1])
    return total


# -- one run -----------------------------------------------------------------------------------


@dataclass
class RunContext:
    """What every run shares."""

    bootstraps: tuple[str, str]
    broker_pids: dict[str, int]
    records: int
    value_bytes: int
    partitions: int
    stall_s: float
    work: Path
    warmup: int = WARMUP
    persist_interval_ms: int = 1000
    """Our dedup's PERSIST_INTERVAL_MS (its trigger interval; the default 1000)."""
    spark_master: str = "local[2]"
    """Our dedup's SPARK_MASTER (task slots: the direct layout's tasks per batch)."""
    rate_bytes: float = 0.0
    """Our sender's pace in bytes/s (``--rate-bytes``; 0: unpaced)."""
    dedup_env: tuple[tuple[str, str], ...] = ()
    """Extra environment of our dedup (``--dedup-env NAME=VALUE``: its settings, one at a time)."""


def _cpu(proc: ManagedProcess) -> tuple[float, int]:
    if proc.proc is None:
        return 0.0, 0
    cpu, hwm, _ = group_usage(proc.proc.pid)
    return cpu, hwm


def _cpu_all(procs: Mapping[str, ManagedProcess], brokers: Mapping[str, int]) -> dict[str, float]:
    out = {name: _cpu(proc)[0] for name, proc in procs.items()}
    out.update({b: pid_usage(pid)[0] for b, pid in brokers.items()})
    dedup = procs.get("dedup")
    if dedup is not None and dedup.proc is not None:
        for kind, cpu in cpu_by_program(dedup.proc.pid).items():
            out[f"dedup_{kind}"] = cpu
    return out


def cpu_by_program(pgid: int) -> dict[str, float]:
    """CPU seconds of group ``pgid`` and its descendants split by program: ``jvm`` (Spark's
    driver and executor), ``driver`` (the group's leader: the dedup's own Python process) and
    ``workers`` (Spark's Python daemon and workers; reaped workers count in their daemon's
    ``cutime``)."""
    out = {"jvm": 0.0, "driver": 0.0, "workers": 0.0}
    for path, fields in _group_members(pgid):
        try:
            comm = Path(path, "comm").read_text().strip()
            # the leader's reaped children are the JVM (alive while measured): its own time only
            own = fields[11:13] if int(Path(path).name) == pgid else fields[11:15]
            cpu = sum(int(x) for x in own) / CLK_TCK
        except (OSError, IndexError, ValueError):
            continue
        kind = "jvm" if comm == "java" else "driver" if int(Path(path).name) == pgid else "workers"
        out[kind] += cpu
    return out


def dedup_metric(port: int | None, family: str) -> float | None:
    """A counter of our dedup's ``/metrics`` (``kafka_diode_dedup_<family>_total``), or None."""
    if not port:
        return None
    samples = scrape(port).get(f"kafka_diode_dedup_{family}", [])
    return sum(value for _, value in samples) if samples else None


def _check(procs: Iterable[ManagedProcess], counters: Iterable[Counter]) -> None:
    for proc in procs:
        if proc.proc is not None and not proc.running:
            raise RuntimeError(f"{proc.name} exited with {proc.returncode}:\n{proc.tail()}")
    for counter in counters:
        if counter.error is not None:
            raise RuntimeError(f"counter failed: {counter.error!r}")


def measure(
    ctx: RunContext,
    *,
    procs: dict[str, ManagedProcess],
    start_sender: Callable[[], None],
    raw: RawCounter,
    clean: CleanCounter,
    receiver_port: int,
    dedup_metrics_port: int | None = None,
) -> dict[str, Any]:
    """Release the backlog (start the sender) and measure until it is through (module doc)."""
    cpu0 = {k: v for k, v in _cpu_all(procs, ctx.broker_pids).items() if k != "sender"}
    batches0 = dedup_metric(dedup_metrics_port, "batches")
    drops0 = udp_drops(receiver_port)
    load0 = os.getloadavg()[0]
    release = time.time()
    start_sender()
    last_progress, last_seen = time.monotonic(), (-1, -1)
    stalled = False
    # CPU sampled as the run goes: the figures are taken at the first sample after the last
    # record seen (raw or clean), not after the quiet time that tells a loss from a lag.
    samples: list[tuple[float, dict[str, float]]] = []
    while clean.count < ctx.records:
        time.sleep(0.2)  # polling the counters' progress, not synchronisation
        samples.append((time.time(), _cpu_all(procs, ctx.broker_pids)))
        _check(procs.values(), (raw, clean))
        now = time.monotonic()
        if (raw.count, clean.count) != last_seen:
            last_progress, last_seen = now, (raw.count, clean.count)
        raw_quiet = raw.count and time.time() - raw.last_new > RAW_QUIET_S
        if raw_quiet and clean.count >= raw.count:
            break  # everything the raw topic got is clean; the rest was lost before it
        if now - last_progress > ctx.stall_s:
            stalled = True
            break
    end = time.time()
    n = ctx.records
    usage = {name: _cpu(proc) for name, proc in procs.items()}
    batches1 = dedup_metric(dedup_metrics_port, "batches")
    samples.append((time.time(), _cpu_all(procs, ctx.broker_pids)))
    done = max(clean.last_new, raw.last_new)
    cpu1 = next(cpu for t, cpu in samples if t >= done)
    drops = udp_drops(receiver_port) - drops0
    per_m = {name: (cpu1[name] - cpu0.get(name, 0.0)) / n * 1e6 for name in cpu1}
    clean_s = clean.last_new - release if clean.count else 0.0
    raw_s = raw.last_new - release if raw.count else 0.0
    return {
        "records": n,
        "value_bytes": ctx.value_bytes,
        "raw_records": raw.count,
        "clean_records": clean.count,
        "lost": n - clean.count,
        "clean_duplicates": clean.duplicates,
        "stalled": stalled,
        "raw_s": raw_s,
        "clean_s": clean_s,
        # first backlog record seen in each topic, from release (start-up of the sender)
        "raw_first_s": raw.first_new - release if raw.count else None,
        "clean_first_s": clean.first_new - release if clean.count else None,
        "raw_records_per_s": raw.count / raw_s if raw_s > 0 else 0.0,
        "clean_records_per_s": clean.count / clean_s if clean_s > 0 else 0.0,
        "clean_mb_per_s": clean.count * ctx.value_bytes / 1e6 / clean_s if clean_s > 0 else 0.0,
        "sender_cpu_s_per_m": per_m["sender"],
        "receiver_cpu_s_per_m": per_m["receiver"],
        "dedup_cpu_s_per_m": per_m["dedup"],
        "low_side_cpu_s_per_m": per_m["receiver"] + per_m["dedup"],
        # per record that reached the clean topic: a system that loses records does less work
        "low_side_cpu_s_per_m_delivered": (per_m["receiver"] + per_m["dedup"])
        * n
        / max(clean.count, 1),
        "upstream_broker_cpu_s_per_m": per_m.get("upstream"),
        "downstream_broker_cpu_s_per_m": per_m.get("downstream"),
        # our dedup: its JVM against its Python processes, and its committed micro-batches
        "dedup_jvm_cpu_s_per_m": per_m.get("dedup_jvm"),
        "dedup_driver_cpu_s_per_m": per_m.get("dedup_driver"),
        "dedup_workers_cpu_s_per_m": per_m.get("dedup_workers"),
        # CPU-s per GB of values that reached the clean topic (the single-batch figure's unit)
        "dedup_cpu_s_per_gb_delivered": (per_m["dedup"] * n / 1e6)
        / (clean.count * ctx.value_bytes / 1e9)
        if clean.count
        else None,
        "dedup_batches": None if batches0 is None or batches1 is None else batches1 - batches0,
        "receiver_cpu_s_per_m_whole_life": cpu1["receiver"] / n * 1e6,
        "dedup_cpu_s_per_m_whole_life": cpu1["dedup"] / n * 1e6,
        "dedup_peak_rss_mb": usage["dedup"][1] / 1e6,
        "socket_drops": drops,
        "measured_s": end - release,
        "cpu_taken_at_s": next(t for t, _ in samples if t >= done) - release,
        "load_1m_before": load0,
        "load_1m_after": os.getloadavg()[0],
    }


def _warm(
    ctx: RunContext, clean: CleanCounter, procs: list[ManagedProcess], timeout: float = 900
) -> None:
    """Wait until the warm-up records are in the clean topic (the dedup consumes and commits)."""
    wait_until(lambda: clean.warmup.done(ctx.warmup, time.time()), timeout=timeout,
               interval=0.2, what="warm-up records in the clean topic", alive=procs)  # fmt: skip


def run_ours(ctx: RunContext, index: int) -> dict[str, Any]:
    """``kafka-diode send/receive/dedup`` over a pre-filled backlog (module doc)."""
    spec = PipelineSpec(records=ctx.records, topics=("bench",), partitions=ctx.partitions,
                        value_size=ctx.value_bytes, profile=None, run_dedup=True,
                        persist_interval_ms=ctx.persist_interval_ms,
                        spark_master=ctx.spark_master, rate_bytes=ctx.rate_bytes,
                        extra_env=ctx.dedup_env)  # fmt: skip
    pipe = Pipeline(spec, ctx.work / f"run{index}-ours",
                    upstream=ctx.bootstraps[0], downstream=ctx.bootstraps[1])  # fmt: skip
    source = pipe.ep.source_topics[0]
    clean_topic = pipe.ep.clean_template.replace("{topic}", source)
    with pipe:
        pipe.setup()
        pipe.start_components(receiver_first=True)
        raw = RawCounter(ctx.bootstraps[1], pipe.ep.raw_topic, source)
        clean = CleanCounter(ctx.bootstraps[1], clean_topic, ctx.records)
        raw.start()
        clean.start()
        try:
            produce_values(ctx.bootstraps[0], source, count=ctx.warmup, size=ctx.value_bytes,
                           prefix="w", partitions=ctx.partitions)  # fmt: skip
            procs = pipe.group.processes
            _warm(ctx, clean, list(procs.values()))
            # A graceful stop commits the warm-up offsets: the restarted sender ("committed")
            # finds exactly the backlog.
            procs["sender"].stop()
            raw.expect(end_offsets(ctx.bootstraps[0], source, ctx.partitions), ctx.records)
            fill_s = produce_values(ctx.bootstraps[0], source, count=ctx.records,
                                    size=ctx.value_bytes, prefix="b",
                                    partitions=ctx.partitions)  # fmt: skip
            res = measure(ctx, procs=procs, start_sender=procs["sender"].start, raw=raw,
                          clean=clean, receiver_port=pipe.ep.receiver_port,
                          dedup_metrics_port=pipe.ep.metrics.get("dedup"))  # fmt: skip
        finally:
            raw.stop()
            clean.stop()
    res.update({"system": "ours", "fill_s": fill_s,
                "settings": {"PERSIST_INTERVAL_MS": ctx.persist_interval_ms,
                             "SPARK_MASTER": ctx.spark_master, "rate_bytes": ctx.rate_bytes,
                             **dict(ctx.dedup_env)},
                "topics": {"source": source,
                "raw": pipe.ep.raw_topic, "clean": clean_topic}})  # fmt: skip
    return res


def peer_settings(
    *, bootstraps: tuple[str, str], topic: str, prefix: str, port: int, keys: Path, state: Path
) -> tuple[dict[str, str | int | bool], dict[str, str | int | bool], dict[str, str]]:
    """(upstream.properties, downstream.properties, dedup environment) for one peer run."""
    upstream: dict[str, str | int | bool] = {
        "id": "Upstream_bench", "nic": "lo", "targetIP": "127.0.0.1", "targetPort": port,
        "transport": "udp",
        "source": "kafka", "bootstrapServers": bootstraps[0], "topic": topic,
        "groupID": f"{prefix}upstream", "from": "",
        "encryption": True, "publicKeyFile": str(keys / "server.pem"),
        "generateNewSymmetricKeyEvery": 500,
        "payloadSize": PEER_PAYLOAD_SIZE, "logLevel": "INFO", "logStatistics": 5,
    }  # fmt: skip
    downstream: dict[str, str | int | bool] = {
        "id": "Downstream_bench", "nic": "lo", "targetIP": "127.0.0.1", "targetPort": port,
        "transport": "udp", "bootstrapServers": bootstraps[1], "target": "kafka",
        "privateKeyFiles": str(keys / "private*.pem"), "clientId": "downstream",
        "mtu": PEER_PAYLOAD_SIZE + 68, "batchSize": PEER_BATCH_SIZE, "logLevel": "INFO",
        "logStatistics": 5, "enableRxqOvfl": True,
    }  # fmt: skip
    dedup = {
        "RAW_TOPICS": topic, "CLEAN_TOPIC": f"{prefix}clean", "GAP_TOPIC": f"{prefix}gaps",
        "BOOTSTRAP_SERVERS": bootstraps[1], "STATE_DIR_CONFIG": str(state),
        "APPLICATION_ID": f"{prefix}dedup", "WINDOW_SIZE": "1000", "MAX_WINDOWS": "10",
        "GAP_EMIT_INTERVAL_SEC": "60", "PERSIST_INTERVAL_MS": "500", "COMMIT_INTERVAL_MS": "500",
        # One instance: the template's one standby replica could not be placed anywhere.
        "NUM_STANDBY_REPLICAS": "0", "logLevel": "INFO",
    }  # fmt: skip
    return upstream, downstream, dedup


def peer_statistics(text: str) -> dict[str, Any]:
    """The last ``STATISTICS: {json}`` line a peer process logged, or {}."""
    for line in reversed(text.splitlines()):
        _, sep, payload = line.partition("STATISTICS: ")
        if sep:
            try:
                return dict(json.loads(payload))
            except ValueError:
                continue
    return {}


def run_peer(ctx: RunContext, index: int, build: PeerBuild) -> dict[str, Any]:
    """air-gap's upstream/downstream/dedup over a pre-filled backlog (module doc)."""
    prefix = f"p{uuid.uuid4().hex[:8]}."
    work = ctx.work / f"run{index}-peer"
    keys = work / "certs"
    keys.mkdir(parents=True, exist_ok=True)
    write_rsa_pair(keys / "private1.pem", keys / "server.pem")
    topic = f"{prefix}bench"
    port = free_port()
    up, down, dedup_env = peer_settings(
        bootstraps=ctx.bootstraps, topic=topic, prefix=prefix, port=port, keys=keys,
        state=work / "dedup-state",
    )  # fmt: skip
    (work / "upstream.properties").write_text(render_properties(up, "bench/peer.py"))
    (work / "downstream.properties").write_text(render_properties(down, "bench/peer.py"))
    n = ctx.partitions
    _create(ctx.bootstraps[0], [NewTopic(topic, n, 1)])
    _create(ctx.bootstraps[1], [NewTopic(topic, n, 1), NewTopic(f"{prefix}clean", n, 1),
                                NewTopic(f"{prefix}gaps", 1, 1,
                                         config={"cleanup.policy": "compact"})])  # fmt: skip
    env = dict(os.environ)
    java = ["java", "-Xms512m", "-Xmx4g", "-jar", str(build.dedup_jar)]  # the template's JAVA_OPTS
    with ProcessGroup(work / "logs") as group:
        down_p = group.add("receiver", [str(build.downstream), str(work / "downstream.properties")],
                           env=env)  # fmt: skip
        dedup_p = group.add("dedup", java, env={**env, **dedup_env}, stop_timeout=30)
        # The low side first, as in production: the upstream's key exchange goes out once at
        # start (then every generateNewSymmetricKeyEvery s); sent before the downstream listens,
        # it is lost and nothing can be decrypted until the next one.
        wait_until(lambda: udp_bound(port), timeout=60, what="downstream to listen",
                   alive=[down_p])  # fmt: skip
        up_p = group.add("sender", [str(build.upstream), str(work / "upstream.properties")],
                         env=env)  # fmt: skip
        raw = RawCounter(ctx.bootstraps[1], topic, topic)
        clean = CleanCounter(ctx.bootstraps[1], f"{prefix}clean", ctx.records)
        raw.start()
        clean.start()
        try:
            produce_values(ctx.bootstraps[0], topic, count=ctx.warmup, size=ctx.value_bytes,
                           prefix="w", partitions=n)  # fmt: skip
            _warm(ctx, clean, [down_p, dedup_p, up_p])
            up_p.stop()  # its consumer group resumes after the warm-up (some may come again)
            # It leaves without a LeaveGroup: let the broker expire it first, so that the
            # release does not wait out the old member's session timeout (~10 s). The group is
            # groupID + "-" + the sending thread's name ("now" by default, README.md).
            wait_until(lambda: group_empty(ctx.bootstraps[0], f"{up['groupID']}-now"),
                       timeout=120, interval=0.5, what="the upstream's group to empty")  # fmt: skip
            raw.expect(end_offsets(ctx.bootstraps[0], topic, n), ctx.records)
            fill_s = produce_values(ctx.bootstraps[0], topic, count=ctx.records,
                                    size=ctx.value_bytes, prefix="b", partitions=n)  # fmt: skip
            res = measure(ctx, procs=group.processes, start_sender=up_p.start, raw=raw,
                          clean=clean, receiver_port=port)  # fmt: skip
            time.sleep(6)  # one more statistics interval (logStatistics=5) before reading them
            res["peer_reported"] = {
                "upstream": peer_statistics(up_p.log_text()),
                "downstream": peer_statistics(down_p.log_text()),
            }
        finally:
            raw.stop()
            clean.stop()
    res.update({"system": "peer", "fill_s": fill_s,
                "topics": {"source": topic, "raw": topic, "clean": f"{prefix}clean"},
                "settings": {"upstream": up, "downstream": down, "dedup": dedup_env,
                             "java": [*java[:-1], "<jar>"]}})  # fmt: skip
    return res


def group_empty(bootstrap: str, group: str) -> bool:
    """Whether consumer group ``group`` has no member left (EMPTY or DEAD)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(30)
    return description.state in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD)


def _create(bootstrap: str, topics: list[Any]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(topics).values():
        future.result(60)


# -- summary and output ------------------------------------------------------------------------

SUMMARY_KEYS = (
    "raw_records_per_s", "clean_records_per_s", "clean_mb_per_s", "sender_cpu_s_per_m",
    "receiver_cpu_s_per_m", "dedup_cpu_s_per_m", "low_side_cpu_s_per_m",
    "low_side_cpu_s_per_m_delivered",
    "upstream_broker_cpu_s_per_m", "downstream_broker_cpu_s_per_m",
    "receiver_cpu_s_per_m_whole_life", "dedup_cpu_s_per_m_whole_life", "dedup_peak_rss_mb",
    "lost", "socket_drops",
)  # fmt: skip


def summarize(runs: list[dict[str, Any]], system: str) -> dict[str, float]:
    """Median of each figure over the system's runs."""
    mine = [r for r in runs if r.get("system") == system and "error" not in r and not r.get("warm")]
    out: dict[str, float] = {"runs": float(len(mine))}
    for key in SUMMARY_KEYS:
        values = [float(r[key]) for r in mine if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    return out


def markdown(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| run | system | raw rec/s | clean rec/s | clean MB/s | CPU-s/M send · receive · dedup "
        "| low side | brokers up · down | dedup peak MB | lost | socket drops "
        "| load before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for i, r in enumerate(runs, 1):
        if "error" in r:
            error = " ".join(r["error"].split())[:160]
            rows.append(f"| {i} | {r['system']} | error: {error} |" + " |" * 10)
            continue
        label = f"{i} (warm-up)" if r.get("warm") else str(i)
        rows.append(
            f"| {label} | {r['system']} | {r['raw_records_per_s']:,.0f} | "
            f"**{r['clean_records_per_s']:,.0f}** | {r['clean_mb_per_s']:.1f} | "
            f"{r['sender_cpu_s_per_m']:.1f} · {r['receiver_cpu_s_per_m']:.1f} · "
            f"{r['dedup_cpu_s_per_m']:.1f} | **{r['low_side_cpu_s_per_m']:.1f}** | "
            f"{r['upstream_broker_cpu_s_per_m'] or 0:.1f} · "
            f"{r['downstream_broker_cpu_s_per_m'] or 0:.1f} | {r['dedup_peak_rss_mb']:,.0f} | "
            f"{r['lost']:,} | {r['socket_drops']:,} | "
            f"{r['load_1m_before']:.1f} → {r['load_1m_after']:.1f} |"
        )
    return "\n".join(rows)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("peer_src", type=Path, help="air-gap's source directory")
    ap.add_argument("--records", type=int, default=None,
                    help="backlog records (default 200,000; 30,000 from 10 KB values)")  # fmt: skip
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--order", default="ours,peer", help="systems in the order of one round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--warm-rounds", type=int, default=2,
        help="rounds run first and left out of the medians (the brokers' compiler settles)",
    )  # fmt: skip
    ap.add_argument(
        "--warmup",
        type=int,
        default=WARMUP,
        help="warm-up records through each system before the measured backlog",
    )
    ap.add_argument("--persist-interval-ms", type=int, default=1000,
                    help="our dedup's PERSIST_INTERVAL_MS (default: its own default)")  # fmt: skip
    ap.add_argument(
        "--spark-master",
        default="local[2]",
        help="our dedup's SPARK_MASTER (local[3]: a slot per raw partition)",
    )
    ap.add_argument(
        "--pace-mbps", type=float, default=0.0, help="our sender's pace, MB/s (0: unpaced)"
    )
    ap.add_argument(
        "--dedup-env", action="append", default=[], metavar="NAME=VALUE",
        help="a setting of our dedup (repeatable), e.g. MAX_OFFSETS_PER_TRIGGER=2000",
    )  # fmt: skip
    ap.add_argument("--stall", type=float, default=60.0, help="give up after S s without progress")
    ap.add_argument("--skip-build", action="store_true", help="reuse binaries already built")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="keep brokers' data, logs and configs here (default: a temporary "
                    "directory, removed at the end)")  # fmt: skip
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.warm_rounds < 0:
        ap.error("--rounds takes 1 or more, --warm-rounds 0 or more")
    # SIGTERM unwinds like Ctrl+C, so every finally below stops what it started.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    records = args.records or (30_000 if args.value_bytes >= 10_000 else 200_000)
    one_round = [s.strip() for s in args.order.split(",") if s.strip()]
    order = one_round * (args.warm_rounds + args.rounds)
    warm_runs = len(one_round) * args.warm_rounds
    if not set(order) <= {"ours", "peer"}:
        ap.error("--order takes ours and peer")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kafka-diode-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "bench": "peer", "argv": sys.argv[1:], "machine": machine(), "order": order,
        "records": records, "warmup": args.warmup, "warm_rounds": args.warm_rounds,
        "value_bytes": args.value_bytes,
        "partitions": args.partitions,
        "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True,
                                       check=False).stdout.strip(),
    }  # fmt: skip
    build: PeerBuild | None = None
    if "peer" in order:
        log(f"building the peer from {args.peer_src} ...")
        try:
            build = build_peer(args.peer_src.resolve(), work / "peer-bin",
                               skip_existing=args.skip_build)  # fmt: skip
            result["peer_build"] = build.info
        except PeerError as exc:
            result["peer_error"] = str(exc)
            log(f"peer not built: {exc}")
            order = [s for s in order if s != "peer"]
            warm_runs = len([s for s in one_round if s != "peer"]) * args.warm_rounds
    runs: list[dict[str, Any]] = []
    brokers: list[LocalBroker] = []
    try:
        pids: dict[str, int] = {}
        bootstraps = []
        for side in ("upstream", "downstream"):
            broker = LocalBroker(f"peer-{side}-{os.getpid()}", free_port(),
                                 data_dir=work / f"kafka-{side}",
                                 partitions=args.partitions)  # fmt: skip
            brokers.append(broker)  # before start: an interrupted start is stopped too
            log(f"starting {side} broker ...")
            pids[side] = broker.start().pid
            bootstraps.append(broker.bootstrap)
        ctx = RunContext((bootstraps[0], bootstraps[1]), pids, records, args.value_bytes,
                         args.partitions, args.stall, work, args.warmup,
                         args.persist_interval_ms, args.spark_master,
                         args.pace_mbps * 1e6,
                         tuple(tuple(kv.split("=", 1)) for kv in args.dedup_env))  # fmt: skip
        for i, system in enumerate(order, 1):
            log(f"run {i}/{len(order)}: {system} (load {os.getloadavg()[0]:.1f})")
            try:
                res = run_peer(ctx, i, build) if system == "peer" and build else run_ours(ctx, i)
            except (RuntimeError, TimeoutError, OSError, KafkaException) as exc:
                res = {"system": system, "error": f"{type(exc).__name__}: {exc}"[-4000:]}
            res["warm"] = i <= warm_runs
            runs.append(res)
            if "error" in res:
                log(f"  {system} failed: {res['error'][-800:]}")
            else:
                log(f"  raw {res['raw_records_per_s']:,.0f} rec/s, clean "
                    f"{res['clean_records_per_s']:,.0f} rec/s, low side "
                    f"{res['low_side_cpu_s_per_m']:.1f} CPU-s/M, lost {res['lost']:,}")  # fmt: skip
    finally:
        for broker in reversed(brokers):
            broker.stop()
        if args.work_dir is None:  # gigabytes of broker data with 10 KB records
            shutil.rmtree(work, ignore_errors=True)
    result["runs"] = runs
    result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True,
                                          check=False).stdout.strip()  # fmt: skip
    ours, peer = summarize(runs, "ours"), summarize(runs, "peer")
    result["summary"] = {"ours": ours, "peer": peer}
    result["ratios"] = ratios(ours, peer)
    clean_ratio = result["ratios"]["clean_rate"]
    low_ratio = result["ratios"]["low_side_cpu_per_record"]
    result["targets"] = {
        "clean_rate_ge_1_5x_peer": None if clean_ratio is None else clean_ratio >= 1.5,
        "low_side_cpu_below_peer": None if low_ratio is None else low_ratio < 1.0,
    }
    if args.value_bytes >= 10_000 and "clean_mb_per_s" in ours:
        result["targets"]["dedup_ge_100_mb_per_s"] = ours["clean_mb_per_s"] >= 100
    print(markdown(runs))
    line = json.dumps(result, default=str)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
