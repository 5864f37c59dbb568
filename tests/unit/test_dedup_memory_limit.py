"""The dedup's JVM heap against the service's memory limit (dedup/memory_limit.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.errors import ConfigError
from dedup import job
from dedup.config import from_sources
from dedup.memory_limit import (
    BESIDE_HEAP_MIB,
    check_heap_fits,
    spark_memory_mib,
    submitted_driver_memory,
)
from runtime.cgroup_memory import Reader, read_memory_limit
from tests.cgroup_helpers import MIB, enter_then_exec, limited_cgroup, needs_memory_cgroup


def reader(files: dict[str, str]) -> Reader:
    return files.get


def test_v2_takes_the_smallest_limit_on_the_path_to_the_root() -> None:
    files = {
        "/proc/self/cgroup": "0::/system.slice/kafka-diode-dedup@a.service\n",
        "/sys/fs/cgroup/system.slice/kafka-diode-dedup@a.service/memory.max": f"{4096 * MIB}\n",
        "/sys/fs/cgroup/system.slice/memory.max": f"{3000 * MIB}\n",
        "/sys/fs/cgroup/memory.max": "max\n",
    }
    assert read_memory_limit(reader(files)) == 3000 * MIB


def test_v1_reads_the_memory_hierarchy_and_ignores_its_unlimited_value() -> None:
    files = {
        "/proc/self/cgroup": "9:pids:/x\n4:memory:/svc/dedup\n1:cpu,cpuacct:/\n0::/\n",
        "/sys/fs/cgroup/memory/svc/dedup/memory.limit_in_bytes": f"{2048 * MIB}",
        "/sys/fs/cgroup/memory/svc/memory.limit_in_bytes": "9223372036854771712",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
    }
    assert read_memory_limit(reader(files)) == 2048 * MIB


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "max\n"},
        {"/proc/self/cgroup": "0::/a\n"},
    ],
)
def test_no_limit_is_none(files: dict[str, str]) -> None:
    assert read_memory_limit(reader(files)) is None


@pytest.mark.parametrize(
    ("value", "mib"), [("512m", 512), ("2g", 2048), ("747", 747), ("1T", 1 << 20), ("2048k", 2)]
)
def test_spark_sizes(value: str, mib: int) -> None:
    assert spark_memory_mib(value) == mib


def test_a_size_spark_cannot_read_names_the_key() -> None:
    with pytest.raises(ConfigError, match="SPARK_CONF_spark_driver_memory"):
        spark_memory_mib("lots")


def test_a_heap_that_reaches_the_limit_stops_the_start_naming_the_fixes() -> None:
    with pytest.raises(ConfigError) as raised:
        check_heap_fits(1024, 1024 * MIB, "Spark's default")
    message = str(raised.value)
    assert "1024 MiB (Spark's default)" in message
    assert "MemoryMax=" in message
    assert "MAX_RECORD_SIZE" in message


def test_a_heap_with_too_little_beside_it_warns_and_one_with_room_passes() -> None:
    warning = check_heap_fits(747, (747 + BESIDE_HEAP_MIB - 1) * MIB, "sized for MAX_RECORD_SIZE")
    assert warning is not None
    assert "747 MiB (sized for MAX_RECORD_SIZE)" in warning
    assert "MemoryMax=" in warning
    assert check_heap_fits(747, (747 + BESIDE_HEAP_MIB) * MIB, "x") is None
    assert check_heap_fits(1 << 20, None, "x") is None


def test_the_heap_in_effect_is_the_operators_then_the_sized_then_sparks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    seen: list[tuple[int, str]] = []

    def fits(heap: int, _limit: int | None, source: str) -> None:
        seen.append((heap, source))

    monkeypatch.setattr(job.memory_limit, "check_heap_fits", fits)
    base = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/tmp/x"}
    operators = from_sources({**base, "SPARK_CONF_spark_driver_memory": "3g"})
    job.check_memory_limit(operators, "747m")
    job.check_memory_limit(from_sources(base), "747m")
    job.check_memory_limit(from_sources(base), None)
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 12g pyspark-shell")
    job.check_memory_limit(operators, "747m")
    assert job.heap_line(747, operators).startswith("JVM heap 12g (PYSPARK_SUBMIT_ARGS")
    assert seen == [
        (3072, "SPARK_CONF_spark_driver_memory"),
        (747, "sized for MAX_RECORD_SIZE"),
        (1024, "Spark's default"),
        (12288, "PYSPARK_SUBMIT_ARGS"),
    ]


@pytest.mark.parametrize(
    ("args", "value"),
    [
        ("--driver-memory 12g pyspark-shell", "12g"),
        ("--master local[2] --driver-memory=3g pyspark-shell", "3g"),
        ("pyspark-shell", None),
        ("--driver-memory", None),
        ("'unbalanced", None),
    ],
)
def test_driver_memory_from_submit_args(args: str, value: str | None) -> None:
    assert submitted_driver_memory(args) == value


@needs_memory_cgroup
def test_a_process_in_a_real_limited_cgroup_reads_its_limit() -> None:
    """The reader against the kernel: a child moved into a new cgroup with a 700 MiB limit."""
    code = "from runtime import cgroup_memory; print(cgroup_memory.service_memory_limit())"
    with limited_cgroup(700) as procs:
        done = subprocess.run(
            enter_then_exec(procs, [sys.executable, "-c", code]),
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    assert int(done.stdout.split()[-1]) == 700 * MIB
