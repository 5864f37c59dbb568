"""The netem relay over real UDP sockets on loopback (netem/relay.py, netem/cli.py)."""

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.errors import ServiceError
from common.metrics import CollectorRegistry
from netem.impair import apply
from netem.profile import NAMED_PROFILES, Profile, parse_netem
from netem.relay import Relay, RelayThread
from runtime import service

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def numbered(n: int) -> list[bytes]:
    return [b"dgram-%08d" % i + b"." * 50 for i in range(n)]


@pytest.fixture
def sink() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5.0)
    yield sock
    sock.close()


@pytest.fixture
def source() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    yield sock
    sock.close()


class Collector:
    """Drains a socket on a thread while the test sends (a full socket buffer would drop)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.got: list[bytes] = []
        self._stop = threading.Event()
        sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.got.append(self.sock.recv(65535))
            except TimeoutError:
                continue
            except OSError:
                return

    def wait(self, count: int, quiet: float = 0.3) -> list[bytes]:
        """Wait for ``count`` datagrams, then check nothing more arrives within ``quiet`` s."""
        wait_for(lambda: len(self.got) >= count, what=f"{count} datagrams")
        seen = len(self.got)
        deadline = time.monotonic() + quiet
        while time.monotonic() < deadline:
            time.sleep(0.01)
            if len(self.got) != seen:  # more than predicted: keep collecting to report it
                seen, deadline = len(self.got), time.monotonic() + quiet
        self._stop.set()
        self._thread.join()
        return list(self.got)


def receive(sock: socket.socket, count: int) -> list[bytes]:
    """Read ``count`` datagrams (sent before: they must fit in the socket buffer)."""
    return Collector(sock).wait(count)


def send_paced(
    source: socket.socket, relay: RelayThread, data: list[bytes], chunk: int = 200
) -> None:
    """Send in chunks, each after the relay has read the previous one (no kernel drops)."""
    target = relay.listen_address
    for start in range(0, len(data), chunk):
        for d in data[start : start + chunk]:
            source.sendto(d, target)
        sent = min(start + chunk, len(data))
        wait_for(lambda sent=sent: relay.stats["received"] >= sent, what="relay to read")


def test_lossy_relay_forwards_exactly_what_the_pure_impairer_predicts(
    sink: socket.socket, source: socket.socket
) -> None:
    profile = NAMED_PROFILES["lossy-5"]
    data = numbered(5000)
    expected = apply(profile, data, seed=1)
    with RelayThread(("127.0.0.1", 0), sink.getsockname(), profile, seed=1) as relay:
        collector = Collector(sink)
        send_paced(source, relay, data)
        got = collector.wait(len(expected))
        stats = relay.stats
    assert stats["received"] == len(data)
    assert got == expected
    assert stats["dropped_loss"] == len(data) - len(expected)
    assert stats["forwarded"] == len(expected)


def test_same_seed_repeats_the_run_exactly(sink: socket.socket, source: socket.socket) -> None:
    profile = Profile(loss=10, duplicate=5, corrupt=2)
    data = numbered(2000)
    runs = []
    for _ in range(2):
        with RelayThread(("127.0.0.1", 0), sink.getsockname(), profile, seed=77) as relay:
            collector = Collector(sink)
            send_paced(source, relay, data)
            runs.append(collector.wait(relay.stats["forwarded"]))
    assert runs[0] == runs[1]
    assert runs[0] == apply(profile, data, seed=77)


def test_clean_profile_loses_nothing_at_moderate_rate(
    sink: socket.socket, source: socket.socket
) -> None:
    data = numbered(20_000)
    with RelayThread(("127.0.0.1", 0), sink.getsockname(), Profile(), seed=0) as relay:
        collector = Collector(sink)
        send_paced(source, relay, data, chunk=1000)
        got = collector.wait(len(data))
        assert relay.stats["send_errors"] == 0
    assert got == data


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_delay_profile_delays(sink: socket.socket, source: socket.socket, use_uvloop: bool) -> None:
    delay_ms = 50
    with RelayThread(
        ("127.0.0.1", 0), sink.getsockname(), Profile(delay=delay_ms), use_uvloop=use_uvloop
    ) as relay:
        latencies = []
        for i in range(20):
            sent_at = time.monotonic()
            source.sendto(b"%d" % i, relay.listen_address)
            assert sink.recv(100) == b"%d" % i
            latencies.append(time.monotonic() - sent_at)
        assert relay.stats["delayed"] == 20
    assert min(latencies) >= (delay_ms - 1) / 1000
    assert max(latencies) < 1.0


def test_reordering_profile_reorders_and_loses_nothing(
    sink: socket.socket, source: socket.socket
) -> None:
    # A burst of 2000 arrives faster than the 5-10 ms delay releases it: raise netem's limit.
    profile = dataclasses.replace(NAMED_PROFILES["reorder-heavy"], limit=10_000)
    data = numbered(2000)
    with RelayThread(("127.0.0.1", 0), sink.getsockname(), profile, seed=3) as relay:
        collector = Collector(sink)
        for d in data:
            source.sendto(d, relay.listen_address)
        got = collector.wait(len(data))
        assert relay.stats["reordered"] > 0
        assert relay.stats["dropped_queue_full"] == 0
    assert sorted(got) == data
    assert got != data


def test_async_relay_on_plain_asyncio_with_metrics() -> None:
    async def scenario() -> tuple[list[bytes], CollectorRegistry]:
        loop = asyncio.get_running_loop()
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.bind(("127.0.0.1", 0))
        sink.setblocking(False)
        registry = CollectorRegistry()
        profile = Profile(corrupt=100)
        try:
            async with Relay(
                ("127.0.0.1", 0), sink.getsockname(), profile, 5, registry=registry
            ) as relay:
                out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                for i in range(10):
                    out.sendto(bytes(16) + bytes([i]), relay.listen_address)
                out.close()
                got = [await asyncio.wait_for(loop.sock_recv(sink, 100), 5) for _ in range(10)]
            await relay.stop()  # idempotent
        finally:
            sink.close()
        return got, registry

    got, registry = asyncio.run(scenario())
    for i, d in enumerate(got):
        sent = bytes(16) + bytes([i])
        assert sum(bin(a ^ b).count("1") for a, b in zip(sent, d, strict=True)) == 1
    value = registry.get_sample_value("kafka_diode_netem_datagrams_total", {"event": "corrupted"})
    assert value == 10


def test_cli_relay_runs_reports_and_exits_cleanly_on_sigterm(
    sink: socket.socket, source: socket.socket
) -> None:
    host, port = sink.getsockname()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafka_diode", "netem", "relay", "--listen", "127.0.0.1:0",
         "--forward", f"{host}:{port}", "--profile", "lossy-5", "--seed", "1",
         "--stats-interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        listening = json.loads(proc.stdout.readline())
        assert listening["event"] == "listening"
        assert listening["seed"] == 1
        stats_line = json.loads(proc.stdout.readline())
        assert stats_line["event"] == "stats"
        assert stats_line["received"] == 0
        relay_host, relay_port = listening["listen"].rsplit(":", 1)
        data = numbered(500)
        for d in data:
            source.sendto(d, (relay_host, int(relay_port)))
        expected = apply(NAMED_PROFILES["lossy-5"], data, seed=1)
        assert receive(sink, len(expected)) == expected
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["event"] == "summary"
    assert summary["received"] == 500
    assert summary["forwarded"] == len(expected)
    assert summary["seed"] == 1


def test_relay_thread_reports_a_busy_port(sink: socket.socket) -> None:
    busy = sink.getsockname()
    relay = RelayThread(busy, busy, Profile())
    with pytest.raises(ServiceError, match="cannot bind"):
        relay.start()
    relay.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")
@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_a_stalled_relay_models_the_link_at_the_arrival_times_not_its_read_times(
    use_uvloop: bool,
) -> None:
    """A source paced at 87 % of the link's rate; the relay's loop blocked for 0.5 s meanwhile
    (a descheduled process on a busy host), so ~250 datagrams wait in its socket. The link's
    queue (``limit 50``) never holds more than a few of them at their real arrival times: none
    may be dropped as queue-full, and all arrive. Stamped with the time the relay read them,
    they would arrive together and ~200 would be dropped."""
    count, size, spacing = 750, 1000, 0.002
    profile = parse_netem("rate 4800kbit limit 50")  # a 1,042-byte frame every 1.74 ms

    def paced_source(target: tuple[str, int]) -> None:
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        start = time.monotonic()
        for i in range(count):
            ahead = start + i * spacing - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing the source, not waiting for a result
            out.sendto(b"%08d" % i + bytes(size - 8), target)
        out.close()

    async def scenario() -> tuple[dict[str, int], int]:
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        sink.bind(("127.0.0.1", 0))
        collector = Collector(sink)
        try:
            async with Relay(("127.0.0.1", 0), sink.getsockname(), profile, 1) as relay:
                source = threading.Thread(target=paced_source, args=(relay.listen_address,))
                source.start()
                deadline = time.monotonic() + 30
                while relay.stats["received"] < count // 3:
                    assert time.monotonic() < deadline, relay.stats
                    await asyncio.sleep(0.01)
                time.sleep(0.5)  # noqa: ASYNC251  the stall under test: the loop runs nothing
                while source.is_alive() or relay.stats["held"]:
                    assert time.monotonic() < deadline, relay.stats
                    await asyncio.sleep(0.01)
                stats = relay.stats
            got = len(collector.wait(stats["forwarded"]))
        finally:
            sink.close()
        return stats, got

    loop = service.new_loop("uvloop" if use_uvloop else "asyncio")
    try:
        stats, got = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert stats["received"] == count, stats
    assert stats["dropped_queue_full"] == 0, stats
    assert got == count
