"""What the dedup's SparkSession gives its Python workers, seen from inside a real worker.

The allocator settings (``dedup/job.py WORKER_ALLOCATOR_ENV``), the heap freeze carried with
a task's function (``dedup/worker_heap.py``) and the daemon that forks the workers with their code
loaded (``dedup/worker_daemon.py``) only matter in Spark's forked Python workers, so they are
checked there: a ``mapInArrow`` task reports its process's state back to the driver.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pyarrow as pa
import pytest

from dedup import job
from dedup.config import from_sources
from dedup.detect import DetectParams
from dedup.layouts import buckets as buckets_layout
from dedup.layouts import direct as direct_layout
from tests.kafka_helpers import wait_until

pytestmark = [pytest.mark.spark]

PARAMS = DetectParams(
    window_size=1000,
    max_windows=10,
    max_expired_gaps=10,
    max_state_bytes=1 << 20,
    scan_interval_ms=10_000,
)


def report(params: DetectParams, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In the worker: its Arrow pool, allocator environment, frozen objects and its parent."""
    import gc  # noqa: PLC0415
    import os  # noqa: PLC0415

    from dedup import state_reader, worker_daemon  # noqa: PLC0415

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict(
        {
            "window_size": [params.window_size],
            "pool": [pa.default_memory_pool().backend_name],
            "mmap_threshold": [os.environ.get("MALLOC_MMAP_THRESHOLD_", "")],
            "trim_threshold": [os.environ.get("MALLOC_TRIM_THRESHOLD_", "")],
            "frozen": [gc.get_freeze_count()],
            "preloaded_by": [worker_daemon.preloaded_by or 0],
            "parent": [os.getppid()],
            "shared": [str(state_reader.shared_dir or "")],
            "shared_mode": [
                state_reader.shared_dir.stat().st_mode & 0o777 if state_reader.shared_dir else 0
            ],
        }
    )


def test_the_python_workers_run_with_the_dedups_allocator_and_a_frozen_heap(tmp_path) -> None:
    config = from_sources(
        {
            "BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "RAW_TOPICS": "raw",
            "STATE_DIR_CONFIG": str(tmp_path / "state"),
            "SPARK_MASTER": "local[1]",
        }
    )
    spark = job.build_session(config, [])
    try:
        rows = (
            spark.range(4, numPartitions=2)
            .mapInArrow(
                functools.partial(report, PARAMS),
                "window_size long, pool string, mmap_threshold string, trim_threshold string, "
                "frozen long, preloaded_by long, parent long, shared string, shared_mode long",
            )
            .collect()
        )
    finally:
        spark.stop()
    assert len(rows) == 2
    for row in rows:
        assert row.window_size == PARAMS.window_size  # the params arrived intact
        assert row.pool == "system"
        assert row.mmap_threshold == job.WORKER_ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]
        assert row.trim_threshold == job.WORKER_ALLOCATOR_ENV["MALLOC_TRIM_THRESHOLD_"]
        # unpickling the params froze the worker's loaded code (pandas, pyarrow, pyspark)
        assert row.frozen > 10_000
        # the worker was forked by our daemon after it had imported the workers' code: the module
        # came with the fork (a worker importing it itself would see no preload, 0 here)
        assert row.preloaded_by == row.parent
        # the daemon made the directory its workers share state records through, private
        assert row.shared.startswith(tempfile.gettempdir())
        assert row.shared_mode == 0o700
    assert len({row.shared for row in rows}) == 1
    # removed by the daemon as it stops, which spark.stop() asks without waiting for it
    wait_until(lambda: not os.path.exists(rows[0].shared), message="the shared directory gone")


GC_PROBE = """
import json, os, sys
from dedup import job
from dedup.config import from_sources
config = from_sources({**os.environ, "BOOTSTRAP_SERVERS": "127.0.0.1:1", "RAW_TOPICS": "raw",
                       "STATE_DIR_CONFIG": sys.argv[1], "SPARK_MASTER": "local[1]"})
spark = job.build_session(config, [])
try:
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    names = [b.getName() for b in beans.getGarbageCollectorMXBeans()]
    args = list(beans.getRuntimeMXBean().getInputArguments())
    with open(f"/proc/{beans.getRuntimeMXBean().getPid()}/environ", "rb") as f:
        environ = dict(e.decode().split("=", 1) for e in f.read().split(b"\\0") if b"=" in e)
    arenas = environ.get("MALLOC_ARENA_MAX")
    arrow = spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch")
    print(json.dumps({"collectors": names, "args": args, "arenas": arenas, "arrow": arrow}))
finally:
    spark.stop()
"""


@pytest.mark.parametrize(("extra", "layout"), [("", "auto"), ("-Xss4m", "buckets")])
def test_a_session_the_dedup_launches_collects_with_the_parallel_collector_and_two_arenas(
    tmp_path, extra: str, layout: str
) -> None:
    """In its own process (a JVM already running in this one would keep its flags), with and
    without a user's ``extraJavaOptions``, which add to the dedup's defaults. A new checkpoint
    of the direct layout (``auto``, one raw topic) gets a 512 MB heap and 4 MiB Arrow batches, a
    buckets one Spark's heap and 16 MiB."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARK_CONF_", "PYSPARK_")) and k != "MALLOC_ARENA_MAX"
    }
    if extra:
        env["SPARK_CONF_spark_driver_extraJavaOptions"] = extra
    env["STATE_LAYOUT"] = layout
    done = subprocess.run(
        [sys.executable, "-c", GC_PROBE, str(tmp_path / "state")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # the parallel collector's beans (G1's are "G1 Young Generation" / "G1 Old Generation")
    assert sorted(seen["collectors"]) == ["PS MarkSweep", "PS Scavenge"], seen
    assert job.JVM_OPTIONS in seen["args"]
    # a direct checkpoint read with librdkafka: C1 alone (dedup/layouts/direct.py jit_options)
    c1 = [a for a in seen["args"] if a.startswith("-XX:TieredStopAtLevel")]
    assert c1 == (["-XX:TieredStopAtLevel=1"] if layout == "auto" else []), seen["args"]
    if extra:
        assert extra in seen["args"]
    # and with fewer malloc arenas (dedup/job.py JVM_ENV)
    assert seen["arenas"] == job.JVM_ENV["MALLOC_ARENA_MAX"]
    heap = [a for a in seen["args"] if a.startswith("-Xmx")]
    assert heap == (["-Xmx512m"] if layout == "auto" else ["-Xmx1g"]), seen["args"]
    # a direct task's input comes in smaller Arrow batches (read while the last one is written)
    direct = layout == "auto"
    arrow = (direct_layout if direct else buckets_layout).ARROW_MAX_BYTES_PER_BATCH
    assert int(seen["arrow"]) == arrow == (4 << 20 if direct else 16 << 20)
