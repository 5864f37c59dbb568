"""The memory a service manager allows this process, against the JVM heap the dedup asks for.

systemd's ``MemoryMax=`` (and a container's memory limit) is a cgroup limit: cgroup v2's
``memory.max``, v1's ``memory.limit_in_bytes``, on the process's cgroup or any ancestor. A
local SparkSession whose heap, with what the process tree holds beside it, is larger than that
limit runs until a backlog of large records fills the heap, and is then killed by the kernel
with no word from the JVM: the dedup checks at start instead (docs/dedup.md "Settings",
Memory). Pure; the limit comes from :mod:`runtime.cgroup_memory`.
"""

from __future__ import annotations

import re
import shlex

from common.errors import ConfigError

#: What the dedup's process tree holds beside the JVM heap: the JVM's own native memory (classes,
#: compiled code, threads, RocksDB in the buckets layout), the driver's Python and two Python
#: workers. Measured: 962 MB peak Pss of the tree with a 512 MB heap, 998 MB with 747 MB (not
#: all of it filled) at 20,000 records/s (docs/benchmarks.md "Dedup").
BESIDE_HEAP_MIB = 512
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)b?\s*$", re.IGNORECASE)
_UNIT_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2, "p": 1024**3}


def spark_memory_mib(value: str) -> int:
    """A Spark memory setting (``512m``, ``2g``; a bare number is MiB, as Spark reads it)."""
    found = _SIZE.match(value)
    if found is None:
        raise ConfigError(
            "SPARK_CONF_spark_driver_memory",
            f"{value!r} is not a size",
            "give a number with k, m, g or t, e.g. 2g",
        )
    number, unit = int(found.group(1)), (found.group(2) or "m").lower()
    return int(number * _UNIT_MIB[unit])


def submitted_driver_memory(submit_args: str) -> str | None:
    """The ``--driver-memory`` of ``PYSPARK_SUBMIT_ARGS``, which Spark prefers to
    ``spark.driver.memory``; None without one."""
    try:
        words = shlex.split(submit_args)
    except ValueError:
        return None
    for index, word in enumerate(words):
        if word.startswith("--driver-memory="):
            return word.split("=", 1)[1]
        if word == "--driver-memory" and index + 1 < len(words):
            return words[index + 1]
    return None


def check_heap_fits(heap_mib: int, limit_bytes: int | None, source: str) -> str | None:
    """Raise if the heap alone reaches the limit; a WARNING line if the heap and what the process
    tree holds beside it (:data:`BESIDE_HEAP_MIB`) pass it; else None. ``source`` names what set
    the heap, for the message."""
    if limit_bytes is None:
        return None
    limit_mib = limit_bytes // (1 << 20)
    fix = (
        "raise the service's MemoryMax= (systemctl edit kafka-diode-dedup@…), or lower the heap: "
        "a smaller MAX_RECORD_SIZE, fewer local task slots (SPARK_MASTER) or "
        "SPARK_CONF_spark_driver_memory"
    )
    if heap_mib >= limit_mib:
        raise ConfigError(
            "SPARK_CONF_spark_driver_memory",
            f"the JVM heap of {heap_mib} MiB ({source}) does not fit this process's memory "
            f"limit of {limit_mib} MiB (cgroup); the kernel would kill the dedup once the heap "
            "fills",
            fix,
        )
    if heap_mib + BESIDE_HEAP_MIB > limit_mib:
        return (
            f"the JVM heap of {heap_mib} MiB ({source}) and ~{BESIDE_HEAP_MIB} MiB beside it "
            f"(native memory, Python workers) pass this process's memory limit of {limit_mib} "
            f"MiB (cgroup): a backlog of large records can get the dedup killed; {fix}"
        )
    return None
