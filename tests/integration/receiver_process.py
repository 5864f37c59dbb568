"""Run ``kafka-diode receive`` as a real subprocess for tests and the benchmark.

The receiver is started with ``python -m receiver`` (the same code path as the console script),
its stderr goes to a file (so a chatty process cannot block on a full pipe), readiness is the
"receiving on" log line, and its Prometheus endpoint is scraped for counters.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from common.wire import Key, KeyRing
from runtime import key_files

ROOT = Path(__file__).resolve().parents[2]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_tcp_port(count: int = 1) -> int:
    """A free TCP port ``p`` such that ``p .. p + count - 1`` are all free now.

    The receiver's worker process ``i`` serves its metrics on ``port + i``: a port whose neighbour
    is some client's ephemeral port would fail that worker's start-up.
    """
    for _ in range(100):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port + count - 1 > 65535:
                continue
            held: list[socket.socket] = []
            try:
                for neighbour in range(port + 1, port + count):
                    s = socket.socket()
                    held.append(s)
                    s.bind(("127.0.0.1", neighbour))
            except OSError:
                continue
            finally:
                for s in held:
                    s.close()
            return port
    raise RuntimeError(f"no {count} consecutive free TCP ports")


def write_key_file(path: Path) -> KeyRing:
    ring = KeyRing([Key.generate()])
    key_files.write_keyring(ring, path)
    return ring


class ReceiverProcess:
    """``kafka-diode receive`` in a subprocess; use as a context manager."""

    def __init__(
        self,
        bootstrap: str,
        raw_topic: str,
        workdir: Path,
        *,
        key_file: Path | None = None,
        extra: Sequence[str] = (),
        root: Path = ROOT,
    ) -> None:
        self.port = free_udp_port()
        self.metrics_port = free_tcp_port(count=4)  # room for worker processes
        self.stderr_path = workdir / f"receiver-{self.port}.log"
        self.stdout_path = workdir / f"receiver-{self.port}.out"
        args = [
            sys.executable,
            "-m",
            "receiver",
            "--bootstrap-servers",
            bootstrap,
            "--raw-topic",
            raw_topic,
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            "--overflow-report-interval",
            "1",
        ]
        if key_file is not None:
            args += ["--key-file", str(key_file)]
        self.args = [*args, *extra]
        #: the source tree the receiver runs from (a benchmark may compare another checkout)
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> ReceiverProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIODE_RECEIVER_")}
        env["PYTHONPATH"] = str(self.root)
        with self.stderr_path.open("wb") as err, self.stdout_path.open("wb") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=err, env=env, cwd=self.root)
        deadline = time.monotonic() + timeout
        while "receiving on" not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"receiver exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"receiver not ready:\n{self.log()}")
            time.sleep(0.05)  # polling a condition under a deadline
        return self

    def __enter__(self) -> ReceiverProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        self.kill()
        if exc_type is not None:  # pytest shows captured stderr with the failure
            print(f"receiver log (tail):\n{self.log()[-6000:]}", file=sys.stderr)

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of the metrics endpoint: (name, sorted labels) -> value."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        full = f"kafka_diode_receiver_{name}"
        return self.metrics().get((full, tuple(sorted(labels.items()))), 0.0)

    def drops(self) -> dict[str, int]:
        return {
            dict(labels)["reason"]: int(value)
            for (name, labels), value in self.metrics().items()
            if name == "kafka_diode_receiver_drops_total" and value  # every reason is exported
        }

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_sender(
    upstream: str, port: int, topic: str, group_id: str, key_file: Path, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """A real ``python -m sender`` reading ``topic`` from the start and sending to ``port``.

    The caller stops it (SIGTERM) and waits; its stderr goes to ``log``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIODE_SENDER_")}
    env["PYTHONPATH"] = str(ROOT)
    with log.open("wb") as sink:
        return subprocess.Popen(
            [
                sys.executable, "-m", "sender",
                "--bootstrap-servers", upstream,
                "--target", f"127.0.0.1:{port}",
                "--topics", topic,
                "--group-id", group_id,
                "--start-position", "earliest",
                "--key-file", str(key_file),
                *extra,
            ],
            stdout=subprocess.DEVNULL, stderr=sink, env=env, cwd=ROOT,
        )  # fmt: skip
