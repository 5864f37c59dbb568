"""Child processes for the demo, the chaos suite and the end-to-end benchmark.

A ``ManagedProcess`` runs one ``kafka-diode`` command (or any argv) in its own process group with
its output in a log file, and stops it the way our systemd units do (``KillMode=mixed``): SIGTERM
to the main process, a deadline, then SIGKILL of the whole group, so nothing is left behind.
``kill()`` is the crash (SIGKILL) that chaos scenarios use. A ``ProcessGroup`` stops everything
it started, in reverse order, also when the caller fails half-way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


def diode_command(*args: str) -> list[str]:
    """argv that runs ``kafka-diode ARGS`` with this interpreter (no need for it on PATH)."""
    return [sys.executable, "-m", "kafka_diode", *args]


class ManagedProcess:
    """One child process with a log file; start, stop (graceful), kill (crash), restart."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start (or start again after a stop or kill), appending to the log file."""
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"\n=== start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.starts += 1
        log.debug("%s started as pid %d", self.name, self.proc.pid)

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit code once it ended."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM the main process, wait up to ``timeout``, SIGKILL the group; returns the code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            # Like systemd's KillMode=mixed (our units use it): SIGTERM to the main process only,
            # so a child such as the dedup's JVM stays up while the main process shuts it down.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM; killing it", self.name)
                self._signal(signal.SIGKILL)
                self.proc.wait(10)
        self._signal(signal.SIGKILL)  # stray grandchildren in the group, if any
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group at once: a crash, for chaos scenarios."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def log_text(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        return "\n".join(self.log_text().splitlines()[-lines:])


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    alive: Sequence[ManagedProcess] = (),
) -> None:
    """Poll ``predicate`` until true; fail early when a process in ``alive`` dies."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        for proc in alive:
            if proc.proc is not None and not proc.running:
                raise RuntimeError(
                    f"{proc.name} exited with {proc.returncode} while waiting for {what}:\n"
                    + proc.tail()
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class ProcessGroup:
    """Processes started together and stopped together, last started first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: dict[str, ManagedProcess] = {}

    def add(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        start: bool = True,
        stop_timeout: float = 30.0,
    ) -> ManagedProcess:
        """Register (and by default start) a process."""
        proc = ManagedProcess(name, argv, log_dir=self.log_dir, env=env, stop_timeout=stop_timeout)
        self.processes[name] = proc
        if start:
            proc.start()
        return proc

    def __getitem__(self, name: str) -> ManagedProcess:
        return self.processes[name]

    def stop_all(self) -> dict[str, int | None]:
        """Stop every process, newest first; returns exit codes by name."""
        codes: dict[str, int | None] = {}
        for name, proc in reversed(list(self.processes.items())):
            codes[name] = proc.stop()
        return codes

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()
