"""``kafka-diode receive`` in a service whose memory limit cannot hold what its settings let it
buffer: it stops at start-up with the configuration exit code (systemd's
``RestartPreventExitStatus=2``) and a message naming the settings and the drop-in
(receiver/memory_bound.py), instead of being killed by the kernel in the next long outage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cgroup_helpers import enter_then_exec, limited_cgroup, needs_memory_cgroup
from tests.integration.receiver_process import write_key_file


def check_config_in_a_1g_cgroup(tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    key = tmp_path / "link.key"
    if not key.exists():
        write_key_file(key)
    argv = [
        sys.executable, "-m", "kafka_diode", "receive", "--bootstrap-servers", "127.0.0.1:9092",
        "--raw-topic", "diode.raw", "--listen-port", "9471", "--key-file", str(key),
        "--check-config", *settings,
    ]  # fmt: skip
    with limited_cgroup(1024) as procs:  # the shipped unit's MemoryMax=1G
        return subprocess.run(
            enter_then_exec(procs, argv), capture_output=True, text=True, timeout=60, check=False
        )


@needs_memory_cgroup
def test_the_defaults_start_in_the_shipped_units_limit(tmp_path: Path) -> None:
    done = check_config_in_a_1g_cgroup(tmp_path)
    assert done.returncode == 0, done.stderr


@needs_memory_cgroup
@pytest.mark.parametrize(
    "settings",
    [
        ("--buffer-max-bytes", str(1 << 30)),
        ("--listen-ports", "9472", "--worker-processes", "true"),
    ],
    ids=["raised-buffer", "two-worker-processes"],
)
def test_buffers_beyond_the_limit_stop_the_start_naming_the_fixes(
    tmp_path: Path, settings: tuple[str, ...]
) -> None:
    done = check_config_in_a_1g_cgroup(tmp_path, *settings)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "buffer_max_bytes" in done.stderr
    assert "memory limit (cgroup, MemoryMax=) is 1024 MiB" in done.stderr
    assert "drop-in" in done.stderr
