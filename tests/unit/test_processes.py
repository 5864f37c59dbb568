"""ManagedProcess: graceful stop, crash kill, restart, and no process left behind."""

import os
import sys
from pathlib import Path

import pytest

from kafka_diode.processes import ManagedProcess, ProcessGroup, wait_until

SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " print('ready', flush=True); time.sleep(600)",
]


def _ready_lines(proc: ManagedProcess) -> int:
    # the log's header repeats the argv, which contains the word too: count whole lines
    return proc.log_text().splitlines().count("ready")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); reaped processes do not
    return False


def test_stop_terminates_and_reports_exit_code(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", SLEEPER, log_dir=tmp_path)
    proc.start()
    wait_until(lambda: _ready_lines(proc) >= 1, timeout=20, what="ready line")
    code = proc.stop()
    assert code == -15
    assert not proc.running


def test_stubborn_process_is_killed_after_the_deadline(tmp_path: Path) -> None:
    proc = ManagedProcess("stubborn", STUBBORN, log_dir=tmp_path, stop_timeout=0.5)
    proc.start()
    wait_until(lambda: _ready_lines(proc) >= 1, timeout=20, what="ready line")
    assert proc.stop() == -9


def test_kill_then_restart_appends_to_the_log(tmp_path: Path) -> None:
    proc = ManagedProcess("crashy", SLEEPER, log_dir=tmp_path)
    proc.start()
    wait_until(lambda: _ready_lines(proc) >= 1, timeout=20, what="first ready")
    first_pid = proc.proc.pid  # type: ignore[union-attr]
    proc.kill()
    assert _gone(first_pid)
    proc.start()
    wait_until(lambda: _ready_lines(proc) == 2, timeout=20, what="second ready")
    assert proc.starts == 2
    proc.stop()


def test_wait_until_fails_fast_when_a_watched_process_dies(tmp_path: Path) -> None:
    proc = ManagedProcess("dies", [sys.executable, "-c", "raise SystemExit(3)"], log_dir=tmp_path)
    proc.start()
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_until(lambda: False, timeout=30, alive=[proc], what="never")


def test_group_stops_everything_even_when_the_body_fails(tmp_path: Path) -> None:
    pids: list[int] = []

    def body() -> None:
        with ProcessGroup(tmp_path) as group:
            for name in ("a", "b"):
                pids.append(group.add(name, SLEEPER).proc.pid)  # type: ignore[union-attr]
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        body()
    assert all(_gone(pid) for pid in pids)
