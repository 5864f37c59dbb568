"""Receiver benchmark: pre-encoded datagrams blasted over loopback into the real receiver process.

A blaster process sends datagrams pre-encoded by ``common.wire.Encoder`` (AES-256-GCM, 200-byte
values, 50-byte keys) at each offered rate for a few seconds to ``kafka-diode receive`` (a real
subprocess, uvloop, default producer settings), which writes to a real downstream broker this
script starts itself. Per offered rate: records/s and datagrams/s delivered to Kafka (from the
receiver's own delivery counters), loss rate (datagrams sent but not read, kernel drops). Same-run
baselines: a bare socket drain loop (recv_into until EAGAIN, no decoding) fed by the same blaster
at the highest rate, and a bare confluent-kafka produce loop (same producer settings, no network
input). Prints a table, then one JSON object as the last line.

    .venv/bin/python bench/receiver.py [--rates 50000,100000,150000] [--seconds 3]
        [--datagram-size 8952] [--compression lz4] [--bootstrap HOST:PORT]
        [--receiver-arg=--backlog-max-records --receiver-arg=30000] [--profile]
        [--senders 2] [--workers 2] [--ports 2]

``--ports N`` makes the receiver listen on N ports (``listen_ports``) and each blaster spread its
session over them as the sender does with ``target_ports``: per message, round-robin (a datagram
with fragment index 0 starts a message and moves to the next port). With ``--workers W`` and
``--ports N`` there are W worker processes in all, W / N sockets per port.

``--flood RATES`` measures hostile traffic instead (issue #24: a flood of random and mangled
datagrams must be drained at >= 60,000 datagrams/s per core): the blaster sends datagrams that are
random bytes, authentic datagrams with one bit flipped, and authentic datagrams cut short (equal
shares; ``--flood-mix`` adds ``forged``: a valid header under the real key id with a random
session id, the dearest case, one key derivation each), at each offered rate, to a receiver whose
downstream broker does not exist (nothing reaches Kafka). Per rate: datagrams read per second,
kernel drops, the receiver's CPU seconds and datagrams per CPU-second. ``--baseline-tree DIR``
runs a receiver from another checkout (e.g. ``git worktree add --detach /tmp/old main``) beside
this one, alternating the two at every rate with the same datagrams.

    .venv/bin/python bench/receiver.py --flood 40000,80000 [--seconds 3]
        [--flood-mix random,flip,truncate] [--baseline-tree /tmp/old] [--flood-gro on,off]

``--flood-gro on,off`` runs two receivers of this tree, one with ``--udp-gro true`` and one with
``--udp-gro false``, alternated at every rate (the order flips each rate) with the same datagrams.

``--profile`` samples the receiver with py-spy (the ``bench`` extra) during the last offered rate
and prints, per stage of the socket-to-librdkafka path, its inclusive share of the sampled Python
time (native librdkafka threads are not sampled; ``produce()`` and ``poll()`` are, as C calls made
from Python). The raw collapsed stacks are kept next to the broker's data for flame graphs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from common.wire import WireConfig
from common.wire.encoder import Encoder
from common.wire.fec import FecConfig, FecEncoder
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from receiver.config import DEFAULT_KAFKA, PINNED_KAFKA
from tests.integration.receiver_process import (
    ROOT,
    ReceiverProcess,
    free_udp_port,
    write_key_file,
)
from tests.kafka_helpers import create_topic

VALUE = 200
KEY = 50


#: Records per run of one source partition: a Kafka consumer hands a sender runs of one
#: partition with consecutive offsets (bench/codec.py does the same); ``--round-robin`` instead
#: interleaves the partitions record by record (every record its own group: the worst case).
RUN = 1000
PARTITIONS = 6


def source_position(i: int, round_robin: bool) -> tuple[int, int]:
    """(source partition, offset) of the i-th record sent."""
    if round_robin:
        return i % PARTITIONS, i
    run, within = divmod(i, RUN)
    return run % PARTITIONS, (run // PARTITIONS) * RUN + within


def encode_streams(
    ring,
    count: int,
    topic: str,
    datagram_size: int,
    senders: int,
    round_robin: bool = False,
    fec_overhead: float = 0.0,
) -> list[list[bytes]]:
    """Datagrams of ``count`` records, split over ``senders`` sessions: source partition p goes
    to sender p % senders (partitions split between sender/receiver pairs, docs/receiver.md,
    scaling out). With ``fec_overhead`` each session also sends FEC repairs after each block, as
    the sender does (sources shrink to leave the repairs room)."""
    fec_config = FecConfig(overhead=fec_overhead) if fec_overhead else None
    if fec_config is not None:
        datagram_size -= fec_config.overhead_bytes
    sessions = [os.urandom(16) for _ in range(senders)]
    encoders = [
        Encoder(WireConfig(max_datagram_size=datagram_size, linger=0), ring, session_id=session)
        for session in sessions
    ]
    fecs = [
        FecEncoder(fec_config, ring, session_id=session, max_source_size=datagram_size)
        for session in sessions
        if fec_config is not None
    ]
    value = os.urandom(VALUE)
    out: list[list[bytes]] = [[] for _ in range(senders)]
    for i in range(count):
        key = (b"%050d" % i)[:KEY]
        partition, offset = source_position(i, round_robin)
        j = partition % senders
        datagrams = encoders[j].add(
            topic, partition, offset, 1_700_000_000_000 + i, 1, key, value, (), 0.0
        )
        for d in datagrams:
            out[j].append(d.data)
            if fecs:
                out[j] += fecs[j].add(d.data, 0, 0.0)
    for j, enc in enumerate(encoders):
        for d in enc.flush():
            out[j].append(d.data)
            if fecs:
                out[j] += fecs[j].add(d.data, 0, 0.0)
        if fecs:
            out[j] += [r for _, r in fecs[j].flush()]
    return out


def message_ports(datagrams: list[bytes], count: int) -> list[int]:
    """Port index per datagram: round-robin per message (sender/send_pipeline.py's rule)."""
    out = []
    target = count - 1
    for data in datagrams:
        if len(data) > 37 and not (data[36] | data[37]):  # fragment index 0: a new message
            target = (target + 1) % count
        out.append(target)
    return out


def blast(ports: list[int], datagrams: list[bytes], rate_dps: float, done) -> None:
    """Send ``datagrams`` at ``rate_dps`` datagrams/s in 1 ms slices (runs in its own process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    addrs = [("127.0.0.1", port) for port in ports]
    where = message_ports(datagrams, len(ports))
    start = time.perf_counter()
    sent = 0
    n = len(datagrams)
    while sent < n:
        due = min(n, int((time.perf_counter() - start) * rate_dps) + 1)
        while sent < due:
            try:
                sock.sendto(datagrams[sent], addrs[where[sent]])
            except BlockingIOError:
                break
            sent += 1
        if sent < due:
            continue
        time.sleep(0.0005)  # pacing the offered rate, not synchronisation
    done.value = time.perf_counter() - start
    sock.close()


def run_blaster(port: int, datagrams: list[bytes], rate_dps: float) -> float:
    return run_blasters([port], [datagrams], rate_dps)


def run_blasters(ports: list[int], streams: list[list[bytes]], rate_dps: float) -> float:
    """One blaster process (own socket, so own source port) per stream, sharing ``rate_dps``."""
    ctx = multiprocessing.get_context("fork")
    total = sum(len(s) for s in streams)
    procs = []
    for stream in streams:
        done = ctx.Value("d", 0.0)
        args = (ports, stream, rate_dps * len(stream) / total, done)
        procs.append((ctx.Process(target=blast, args=args), done))
    for proc, _ in procs:
        proc.start()
    for proc, _ in procs:
        proc.join()
    return max(float(done.value) for _, done in procs)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one metrics endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def counters(rx: ReceiverProcess, workers: int = 1) -> dict[str, float]:
    """The receiver's counters from ONE scrape of its metrics endpoint (per worker process)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for index in range(workers):
        for key, value in scrape(rx.metrics_port + index).items():
            samples[key] = samples.get(key, 0.0) + value

    def get(name: str) -> float:
        return samples.get((f"kafka_diode_receiver_{name}", ()), 0.0)

    overflow = samples.get(
        ("kafka_diode_receiver_drops_total", (("reason", "downstream_overflow"),)), 0.0
    )
    return {
        "datagrams": get("datagrams_total"),
        "records": get("records_total"),
        "delivered": get("delivered_records_total"),
        "dropped": overflow + get("delivery_errors_total"),
        "kernel_drops": get("kernel_drops_total"),
    }


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live child processes (worker processes)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if entry.name == str(pid) or fields[1] == str(pid):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def drain_baseline(datagrams: list[bytes], rate_dps: float) -> dict[str, float]:
    """The same blaster against a bare recv_into loop (no decoding, no Kafka)."""
    port = free_udp_port()
    ctx = multiprocessing.get_context("fork")
    count = ctx.Value("q", 0)
    ready = ctx.Event()

    def drain() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE, as the receiver
        sock.bind(("127.0.0.1", port))
        sock.settimeout(2.0)
        buf = bytearray(65536)
        ready.set()
        n = 0
        try:
            while True:
                sock.recv_into(buf)
                n += 1
                count.value = n
        except TimeoutError:
            pass

    proc = ctx.Process(target=drain)
    proc.start()
    ready.wait(10)
    elapsed = run_blaster(port, datagrams, rate_dps)
    proc.join(30)
    got = count.value
    return {"datagrams_per_s": got / elapsed, "loss_rate": 1 - got / len(datagrams)}


def produce_baseline(bootstrap: str, topic: str, count: int, compression: str) -> float:
    """Bare produce loop (the receiver's producer settings): records/s until all are acked."""
    producer = Producer(
        {
            **DEFAULT_KAFKA,  # the receiver's producer defaults, pinned settings on top
            **PINNED_KAFKA,
            "delivery.report.only.error": True,  # the Python client wants a bool here
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "queue.buffering.max.messages": 1000000,
        }
    )
    value = os.urandom(VALUE)
    headers = [("diode.key", b"k" * KEY), ("diode.timestamp", b"1700000000000"),
               ("diode.timestamp-type", b"1"), ("diode.session", b"0" * 32)]  # fmt: skip
    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic, value, f"t:{i % 6}:{i}", i % 3, timestamp=1, headers=headers
                )
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    return count / (time.perf_counter() - start)


#: Stages of the receive path for --profile: (label, Python function that starts it, or None) and
#: (label, text of the source line a C call is made from: py-spy sees no frame for a C function,
#: so a sample whose innermost frame sits on that line is time inside the call). Inclusive shares;
#: nested stages overlap their parents.
PROFILE_STAGES = (
    ("datagram handling (all)", "_on_datagram"),
    ("  decode (Decoder.receive_datagram)", "receive_datagram"),
    ("  sink.write_batch", "write_batch"),
    ("service after a burst", "_after_burst"),
    ("socket drain loop (all)", "_drain"),
)
PROFILE_C_CALLS = (
    ("  producer.poll() (C, leaf)", ".poll("),
    ("  producer.produce() (C, leaf)", "produce("),
    ("  AES-GCM decrypt (C, leaf)", ".decrypt("),
    ("  recv_into / recvmsg_into (C, leaf)", "recv"),
)


def _frame(text: str) -> tuple[str, str, int]:
    """``Class.method (path:line)`` -> (method, path, line)."""
    name, _, where = text.partition(" (")
    path, _, line = where.rstrip(")").rpartition(":")
    return name.rsplit(".", 1)[-1], path, int(line) if line.isdigit() else 0


def _source_line(path: str, line: int, cache: dict[str, list[str]]) -> str:
    if path not in cache:
        file = Path(__file__).resolve().parents[1] / path
        cache[path] = file.read_text().splitlines() if file.is_file() else []
    lines = cache[path]
    return lines[line - 1] if 0 < line <= len(lines) else ""


def start_profile(pid: int, path: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` into collapsed stacks at ``path``; None if py-spy is missing."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        print("--profile: py-spy not found (pip install py-spy)", file=sys.stderr)
        return None
    cmd = [exe, "record", "-p", str(pid), "-r", "250", "-f", "raw", "-o", str(path)]
    cmd += ["--nonblocking", "--subprocesses"]  # no pauses (they lose datagrams); workers too
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profile(proc: subprocess.Popen[bytes], path: Path) -> dict[str, float]:
    """Stop py-spy (it writes its file on SIGINT) and return the stage shares in percent."""
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    total = 0
    labels = [label for label, _ in (*PROFILE_STAGES, *PROFILE_C_CALLS)]
    hits = dict.fromkeys(labels, 0)
    cache: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack.split(";")]
        functions = {name for name, _, _ in frames}
        if "_drain" not in functions and "_service" not in functions:
            continue  # other threads (metrics server, metadata lookups), idle loop frames
        total += count
        for label, function in PROFILE_STAGES:
            if function in functions:
                hits[label] += count
        leaf_text = _source_line(frames[-1][1], frames[-1][2], cache)
        for label, text in PROFILE_C_CALLS:
            if text in leaf_text:
                hits[label] += count
                break
    return {label: round(100 * n / total, 1) if total else 0.0 for label, n in hits.items()}


FLOOD_KINDS = ("random", "flip", "truncate", "forged")


def hostile_datagrams(ring, count: int, kinds: list[str], seed: int = 24) -> list[bytes]:
    """``count`` hostile datagrams, the ``kinds`` in turn (module docstring, ``--flood``)."""
    rnd = random.Random(seed)
    encoder = Encoder(WireConfig(linger=0), ring, session_id=os.urandom(16))
    value = os.urandom(VALUE)
    authentic: list[bytes] = []
    offset = 0
    while len(authentic) < 500:
        authentic += [
            d.data
            for d in encoder.add("flood", offset % 3, offset, 0, 1, b"k" * KEY, value, (), now=0.0)
        ]
        offset += 1
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        data = bytearray(rnd.choice(authentic))
        if kind == "random":
            data = bytearray(rnd.randbytes(rnd.randint(1, len(data))))
        elif kind == "flip":
            at = rnd.randrange(len(data))
            data[at] ^= 1 << rnd.randrange(8)
        elif kind == "truncate":
            data = data[: rnd.randrange(1, len(data))]
        else:  # forged: a fresh session id under the real key id
            data[8:24] = rnd.randbytes(16)
        out.append(bytes(data))
    return out


def flood_main(args: argparse.Namespace) -> int:
    """``--flood``: hostile datagrams only, this tree against ``--baseline-tree``, alternating."""
    kinds = args.flood_mix.split(",")
    if not kinds or any(kind not in FLOOD_KINDS for kind in kinds):
        raise SystemExit(f"--flood-mix: choose from {','.join(FLOOD_KINDS)}")
    work = Path(tempfile.mkdtemp(prefix="bench-receiver-flood-"))
    key_file = work / "keys.json"
    ring = write_key_file(key_file)
    dead = f"127.0.0.1:{free_port()}"  # no broker: nothing hostile reaches Kafka anyway
    # (name, tree, extra receiver arguments): alternated at every rate with the same datagrams
    variants: list[tuple[str, Path, list[str]]] = []
    gro_modes = args.flood_gro.split(",") if args.flood_gro else [""]
    if any(mode not in ("", "on", "off") for mode in gro_modes):
        raise SystemExit("--flood-gro: on, off or on,off")
    for mode in gro_modes:
        gro = ["--udp-gro", "true" if mode == "on" else "false"] if mode else []
        variants.append((f"this{'-gro-' + mode if mode else ''}", ROOT, gro))
        if args.baseline_tree:
            name = f"base{'-gro-' + mode if mode else ''}"
            variants.append((name, Path(args.baseline_tree).resolve(), gro))
    receivers = {
        name: ReceiverProcess(
            dead,
            "raw",
            work,
            key_file=key_file,
            root=root,
            extra=["--metadata-timeout", "0.5", *args.receiver_arg, *gro],
        )
        for name, root, gro in variants
    }
    runs = []
    try:
        for rx in receivers.values():
            rx.start()
        for rate in (int(r) for r in args.flood.split(",")):
            datagrams = hostile_datagrams(ring, int(rate * args.seconds), kinds)
            order = list(receivers.items())
            for name, rx in order if len(runs) // len(order) % 2 == 0 else order[::-1]:
                base = counters(rx)
                cpu0 = cpu_seconds(rx.pid)
                sent_for = run_blaster(rx.port, datagrams, rate)
                deadline = time.monotonic() + 30
                now, last = counters(rx), -1.0
                while now["datagrams"] != last and time.monotonic() < deadline:
                    last = now["datagrams"]
                    time.sleep(0.2)  # polling until the socket is drained, under a deadline
                    now = counters(rx)
                cpu = cpu_seconds(rx.pid) - cpu0
                read = now["datagrams"] - base["datagrams"]
                runs.append(
                    {
                        "tree": name,
                        "offered_datagrams_per_s": rate,
                        "datagrams_per_s": round(read / sent_for),
                        "loss_rate": round(1 - read / len(datagrams), 4),
                        "kernel_drops": int(now["kernel_drops"] - base["kernel_drops"]),
                        "receiver_cpu_s": round(cpu, 2),
                        "datagrams_per_cpu_s": round(read / cpu) if cpu else None,
                    }
                )
                print(json.dumps(runs[-1]), file=sys.stderr)
    finally:
        for rx in receivers.values():
            if rx.proc is not None:
                rx.terminate()
    print(f"flood of {'/'.join(kinds)} datagrams (no downstream broker)")
    print(
        f"{'tree':>13} {'offered/s':>10} {'read/s':>8} {'loss':>7} {'cpu-s':>6} {'per cpu-s':>10}"
    )
    for r in runs:
        print(
            f"{r['tree']:>13} {r['offered_datagrams_per_s']:>10,} {r['datagrams_per_s']:>8,} "
            f"{r['loss_rate']:>7.4f} {r['receiver_cpu_s']:>6} {r['datagrams_per_cpu_s'] or 0:>10,}"
        )
    result = {
        "bench": "receiver-flood",
        "mix": kinds,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "runs": runs,
    }
    print(json.dumps(result))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--rates", default="50000,100000,150000", help="offered records/s, comma-separated"
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--datagram-size", type=int, default=8952)
    parser.add_argument(
        "--round-robin",
        action="store_true",
        help="interleave the 6 source partitions record by record (default: runs of 1000)",
    )
    parser.add_argument(
        "--compression",
        default="none",
        help="producer compression.type (none: the receiver's default, docs/receiver.md)",
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument(
        "--receiver-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for kafka-diode receive (repeat; e.g. --receiver-arg=--sockets)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the receiver during the last rate"
    )
    parser.add_argument(
        "--senders",
        type=int,
        default=1,
        help="blaster processes, each its own session and source port, partitions split",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="receiver --sockets N --worker-processes true (one process per socket)",
    )
    parser.add_argument(
        "--ports",
        type=int,
        default=1,
        help="receiver ports (listen_ports); blasters spread messages over them round-robin",
    )
    parser.add_argument(
        "--fec",
        default="0",
        help="FEC overheads to run each rate with, comma-separated (e.g. 0,10,20; one port only)",
    )
    parser.add_argument(
        "--flood",
        metavar="RATES",
        help="hostile datagrams/s, comma-separated: measure the drop path instead (no broker)",
    )
    parser.add_argument(
        "--flood-mix",
        default="random,flip,truncate",
        help=f"hostile kinds sent in turn, from {','.join(FLOOD_KINDS)}",
    )
    parser.add_argument(
        "--flood-gro",
        metavar="MODES",
        help="with --flood: receivers with --udp-gro on and/or off (on,off: alternated)",
    )
    parser.add_argument(
        "--baseline-tree",
        metavar="DIR",
        help="with --flood: also run the receiver of this checkout, alternating with this one",
    )
    args = parser.parse_args()
    if args.flood:
        return flood_main(args)
    fec_cases = [float(f) for f in args.fec.split(",")]
    if any(fec_cases) and args.ports != 1:
        parser.error("--fec needs --ports 1 (the bench does not split blocks per port)")
    if args.ports < 1 or (args.workers > 1 and args.workers % args.ports):
        parser.error("--workers must be a multiple of --ports")
    extra_ports = [free_udp_port() for _ in range(args.ports - 1)]
    layout: list[str] = []
    if extra_ports:
        layout += ["--listen-ports", ",".join(map(str, extra_ports))]
    if args.workers > 1:
        layout += ["--sockets", str(args.workers // args.ports), "--worker-processes", "true"]
    rates = [int(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        broker = LocalBroker(
            f"bench-rx-{os.getpid()}", free_port(), data_dir=work / "kafka", partitions=3
        )
        broker.start()
        bootstrap = broker.bootstrap
    key_file = work / "keys.json"
    ring = write_key_file(key_file)
    runs = []
    profile: dict[str, float] = {}
    try:
        rx = ReceiverProcess(
            bootstrap, "bench.{topic}", work, key_file=key_file,
            extra=["--kafka", f"compression.type={args.compression}", *args.receiver_arg,
                   *layout],
        )  # fmt: skip
        rx.start()
        deadline = time.monotonic() + 60
        while rx.log().count("receiving on") < args.workers and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition under a deadline
        last_datagrams = None
        try:
            for fec, rate in [(f, r) for r in rates for f in fec_cases]:
                count = int(rate * args.seconds)
                topic = f"r{rate}-f{fec:g}-{os.getpid()}"
                create_topic(bootstrap, f"bench.{topic}", partitions=3)
                streams = encode_streams(
                    ring, count, topic, args.datagram_size, args.senders, args.round_robin, fec
                )
                datagrams = [d for stream in streams for d in stream]
                last_datagrams = (datagrams, rate, count)
                per_datagram = count / len(datagrams)
                base = counters(rx, args.workers)
                cpu0 = cpu_seconds(rx.pid)
                spy = None
                if args.profile and rate == rates[-1]:
                    spy = start_profile(rx.pid, work / "profile.txt")
                t0 = time.perf_counter()
                sent_for = run_blasters([rx.port, *extra_ports], streams, rate / per_datagram)
                # Wait until every record read is accounted for: delivered, or dropped by the
                # receiver (overflow, refused). One scrape per poll, 10 per second: each scrape
                # costs the receiver ~1.4 ms of CPU under its GIL, and an earlier version of this
                # loop scraped 150 times a second -- and, counting only deliveries, waited out
                # its whole 60 s deadline whenever a record had been dropped, so the rate it
                # printed was the deliveries divided by 63 s (a "collapse" that was the bench's).
                deadline = time.monotonic() + 60
                last, last_change = -1.0, t0
                now = counters(rx, args.workers)
                while time.monotonic() < deadline:
                    delivered = now["delivered"] - base["delivered"]
                    if delivered != last:
                        last, last_change = delivered, time.perf_counter()
                    settled = delivered + now["dropped"] - base["dropped"]
                    if delivered >= count or (
                        settled >= now["records"] - base["records"]
                        and time.perf_counter() - last_change > 1.0
                    ):
                        break
                    time.sleep(0.1)  # polling a condition under a deadline
                    now = counters(rx, args.workers)
                cpu = cpu_seconds(rx.pid) - cpu0
                per_worker = [
                    scrape(rx.metrics_port + i).get(("kafka_diode_receiver_datagrams_total", ()), 0)
                    for i in range(args.workers)
                ]
                if spy is not None:
                    profile = stop_profile(spy, work / "profile.txt")
                got_d = now["datagrams"] - base["datagrams"]
                delivered = now["delivered"] - base["delivered"]
                active = max(last_change - t0, sent_for)  # first datagram to last delivery
                runs.append(
                    {
                        "fec_overhead": fec,
                        "offered_records_per_s": rate,
                        "sent_seconds": round(sent_for, 2),
                        "records_per_s": round(delivered / active),
                        "datagrams_per_s": round(got_d / active),
                        "mb_per_s": round(delivered * VALUE / active / 1e6, 1),
                        "records_per_datagram": round(per_datagram, 1),
                        "loss_rate": round(1 - got_d / len(datagrams), 5),
                        "undelivered_records": int(count - delivered),
                        "kernel_drops": int(now["kernel_drops"] - base["kernel_drops"]),
                        "receiver_drops": int(now["dropped"] - base["dropped"]),
                        "receiver_cpu_s": round(cpu, 2),
                        "records_per_cpu_s": round(delivered / cpu) if cpu else None,
                        "datagrams_per_worker_total": [int(d) for d in per_worker],
                    }
                )
                print(json.dumps(runs[-1]), file=sys.stderr)
        finally:
            rx.terminate()
        assert last_datagrams is not None
        datagrams, rate, count = last_datagrams
        drain = drain_baseline(datagrams, rate / (count / len(datagrams)))
        drain_max = drain_baseline(datagrams, 1e9)  # unpaced: as fast as one sender can send
        produce = produce_baseline(
            bootstrap, f"bench.base-{os.getpid()}", min(300_000, count), args.compression
        )
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work / "kafka", ignore_errors=True)  # hundreds of MB a run; the profile stays
    zero_loss = [r for r in runs if r["loss_rate"] == 0 and r["undelivered_records"] == 0]
    print(
        f"{'offered rec/s':>14} {'rec/s':>9} {'dgram/s':>8} {'loss':>8} {'rx drops':>9} "
        f"{'rec/cpu-s':>10}"
    )
    for r in runs:
        print(
            f"{r['offered_records_per_s']:>14,} {r['records_per_s']:>9,} "
            f"{r['datagrams_per_s']:>8,} {r['loss_rate']:>8.4f} {r['receiver_drops']:>9,} "
            f"{r['records_per_cpu_s'] or 0:>10,}"
        )
    rate_text = f"{drain['datagrams_per_s']:,.0f} datagrams/s, loss {drain['loss_rate']:.4f}"
    print(f"baseline bare drain loop at the last offered rate: {rate_text}")
    rate_text = (
        f"{drain_max['datagrams_per_s']:,.0f} datagrams/s, loss {drain_max['loss_rate']:.4f}"
    )
    print(f"baseline bare drain loop, unpaced sender: {rate_text}")
    print(f"baseline bare produce loop: {produce:,.0f} records/s")
    if profile:
        print(f"profile of the last rate (share of sampled main-thread time; {work}/profile.txt):")
        for label, share in profile.items():
            print(f"  {share:5.1f} %  {label}")
    result = {
        "bench": "receiver",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "datagram_bytes": args.datagram_size,
        "round_robin": args.round_robin,
        "value_bytes": VALUE,
        "producer_compression": args.compression,
        "senders": args.senders,
        "receiver_workers": args.workers,
        "receiver_ports": args.ports,
        "cipher": "aes-256-gcm",
        "max_zero_loss_records_per_s": max((r["records_per_s"] for r in zero_loss), default=0),
        "runs": runs,
        "baseline_drain_datagrams_per_s": round(drain["datagrams_per_s"]),
        "baseline_drain_loss_rate": round(drain["loss_rate"], 5),
        "baseline_drain_unpaced_datagrams_per_s": round(drain_max["datagrams_per_s"]),
        "baseline_drain_unpaced_loss_rate": round(drain_max["loss_rate"], 5),
        "baseline_produce_records_per_s": round(produce),
    }
    if profile:
        result["profile_percent"] = profile
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
