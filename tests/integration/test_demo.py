"""`kafka-diode demo`: the verdict from the topics, and Ctrl+C leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_diode.processes import wait_until

DEMO = [sys.executable, "-m", "kafka_diode", "demo", "--no-live"]


def _ours(work_dir: Path) -> list[int]:
    """Pids whose command line or environment mentions this demo's work dir.

    Brokers and most components carry it in their arguments; the dedup (and its JVM) only in
    STATE_DIR_CONFIG.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
        if str(work_dir) in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def _env(tmp_path: Path) -> dict[str, str]:
    # a private broker index, so this demo's broker names cannot meet another run's
    return dict(os.environ, KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"), PYTHONUNBUFFERED="1")


@pytest.mark.kafka
@pytest.mark.spark
def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*DEMO, "--records", "200000", "--rate", "500", "--work-dir", str(work)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(tmp_path),
        )
    try:
        # interrupt once every component runs (the sender's log exists once it was started)
        wait_until(
            lambda: (work / "logs" / "dedup.log").exists() or proc.poll() is not None,
            timeout=300,
            what="components started",
        )
        assert proc.poll() is None, log.read_text()
        assert _ours(work), "expected running brokers/components before the interrupt"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(180) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until(lambda: not _ours(work), timeout=60, what="no process of the demo left")


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.slow
def test_demo_prints_the_exactly_once_verdict(tmp_path: Path) -> None:
    result = subprocess.run(
        [*DEMO, "--records", "3000", "--rate", "2000", "--work-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().splitlines()[-1] == (
        "3000/3000 records delivered exactly once; 0 open gaps"
    )
    assert not _ours(tmp_path / "demo")


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.slow
def test_make_demo_output_is_clean_and_finished(tmp_path: Path) -> None:
    """What `make demo` prints (the live table, not --no-live): no raw librdkafka line, no
    WARNING while the brokers start, and a final table whose rate column is filled."""
    result = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "demo", "--records", "3000",
         "--work-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_env(tmp_path),
        check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    lines = out.splitlines()
    assert not [line for line in lines if line.startswith("%")], out  # %6|…|BGQUEUE|…
    assert not [line for line in lines if " WARNING " in line], out
    assert "per second (peak)" in out
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) >= 10, out
    assert all(line.rstrip("│ ").rsplit("│", 1)[-1].strip() for line in rows), out
    assert lines[-1] == "3000/3000 records delivered exactly once; 0 open gaps"


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.slow
def test_demo_on_three_node_clusters_prints_the_exactly_once_verdict(tmp_path: Path) -> None:
    """`kafka-diode demo --brokers 3` (issue 25): two replicated KRaft clusters, the demo's lossy
    link, resend until nothing is missing, the verdict, and no process left behind."""
    result = subprocess.run(
        [*DEMO, "--brokers", "3", "--records", "3000", "--rate", "2000",
         "--work-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_env(tmp_path),
        check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "starting two Kafka clusters of 3 nodes (upstream, downstream)" in result.stdout
    # the console wraps long lines: read the two bootstrap lists from the text's words
    words = " ".join(result.stdout.split())
    endpoints = re.search(r"upstream (\S+), downstream (\S+)", words)
    assert endpoints is not None, result.stdout
    for bootstrap in endpoints.groups():
        assert len(bootstrap.split(",")) == 3, endpoints.group(0)
    assert result.stdout.rstrip().splitlines()[-1] == (
        "3000/3000 records delivered exactly once; 0 open gaps"
    )
    assert not _ours(tmp_path / "demo")
