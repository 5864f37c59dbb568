"""Throughput of the netem relay on loopback, and of the pure Impairer.

Runs ``kafka-diode netem relay`` as its own process (as in use), offers datagrams at fixed rates
from this process and counts what reaches a sink socket drained by a thread. Baseline in the same
run: the same sender and sink without the relay. Short (a few seconds); the last line is JSON.

    .venv/bin/python bench/netem_relay.py [--count 100000] [--size 200]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from netem.impair import Impairer  # noqa: E402
from netem.profile import NAMED_PROFILES  # noqa: E402


class Sink:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # 33: SO_RCVBUFFORCE
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.count = 0
        self.last = 0.0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = bytearray(65536)
        while not self._stop:
            try:
                self.sock.recv_into(buf)
            except TimeoutError:
                continue
            self.count += 1
            self.last = time.perf_counter()

    def reset(self) -> None:
        self.count = 0

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def offer(target: tuple[str, int], sink: Sink, count: int, size: int, rate: float) -> dict:
    """Send ``count`` datagrams at ``rate``/s (0: as fast as possible); wait for the tail."""
    sink.reset()
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * size
    start = time.perf_counter()
    burst = 50
    for i in range(0, count, burst):
        if rate:
            due = start + i / rate
            while time.perf_counter() < due:
                pass
        for _ in range(burst):
            out.sendto(payload, target)
    sent_end = time.perf_counter()
    quiet_until = time.perf_counter() + 0.5
    seen = -1
    while time.perf_counter() < quiet_until or sink.count != seen:
        if sink.count != seen:
            seen, quiet_until = sink.count, time.perf_counter() + 0.5
        time.sleep(0.05)
    out.close()
    elapsed = max(sink.last, sent_end) - start
    return {
        "offered_pps": round(count / (sent_end - start)),
        "delivered_pps": round(sink.count / elapsed),
        "loss_pct": round(100 * (1 - sink.count / count), 2),
    }


def impairer_rate(profile_name: str, count: int) -> int:
    impairer = Impairer(NAMED_PROFILES[profile_name], seed=1)
    payload = b"x" * 200
    start = time.perf_counter()
    for i in range(count):
        now = i * 1e-5
        impairer.submit(payload, now)
        impairer.due(now)
    impairer.flush()
    return round(count / (time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rates", default="20000,50000,0", help="offered rates, 0 = flood")
    parser.add_argument("--event-loop", default="uvloop", choices=["uvloop", "asyncio"])
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    sink = Sink()
    results: dict[str, object] = {"bench": "netem_relay", "count": args.count, "size": args.size}
    try:
        results["baseline_direct"] = [
            {"rate": r, **offer(sink.sock.getsockname(), sink, args.count, args.size, r)}
            for r in rates
        ]
        host, port = sink.sock.getsockname()
        relay = subprocess.Popen(
            [sys.executable, "-m", "kafka_diode", "netem", "relay", "--listen", "127.0.0.1:0",
             "--forward", f"{host}:{port}", "--profile", "clean", "--seed", "1",
             "--event-loop", args.event_loop, "--log-level", "WARNING"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            assert relay.stdout is not None
            listen = json.loads(relay.stdout.readline())["listen"]
            rhost, rport = listen.rsplit(":", 1)
            results[f"relay_clean_{args.event_loop}"] = [
                {"rate": r, **offer((rhost, int(rport)), sink, args.count, args.size, r)}
                for r in rates
            ]
        finally:
            relay.terminate()
            relay.communicate(timeout=10)
        results["impairer_datagrams_per_s"] = {
            name: impairer_rate(name, 100_000) for name in ("clean", "lossy-5", "hostile")
        }
    finally:
        sink.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
