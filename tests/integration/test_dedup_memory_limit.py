"""``kafka-diode dedup`` in a service whose memory limit cannot hold its JVM heap: it stops at
start-up with the configuration exit code (systemd's ``RestartPreventExitStatus=2``) and a
message that names the limit and the fixes, before any JVM starts (dedup/memory_limit.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cgroup_helpers import enter_then_exec, limited_cgroup, needs_memory_cgroup
from tests.kafka_helpers import bootstrap_of


@needs_memory_cgroup
def test_a_heap_beyond_the_services_memory_limit_stops_the_start_naming_the_fixes(
    downstream_kafka: object, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=2)
    env = {
        **os.environ,
        "BOOTSTRAP_SERVERS": bootstrap_of(downstream_kafka),  # type: ignore[arg-type]
        "RAW_TOPICS": raw,
        "STATE_DIR_CONFIG": str(tmp_path / "checkpoint"),
        "SPARK_MASTER": "local[2]",  # 747 MiB for the default MAX_RECORD_SIZE on 2 slots
        "DIRECT_READER": "spark",  # whose tasks hold their records in the heap (sized for them)
    }
    with limited_cgroup(700) as procs:
        done = subprocess.run(
            enter_then_exec(procs, [sys.executable, "-m", "kafka_diode", "dedup"]),
            capture_output=True, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "JVM heap of 747 MiB (sized for MAX_RECORD_SIZE)" in output
    assert "memory limit of 700 MiB" in output
    assert "MemoryMax=" in output
    assert not (tmp_path / "checkpoint" / "offsets").exists()
