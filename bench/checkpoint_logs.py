"""What a direct checkpoint's logs cost per file: Spark's file manager against the dedup's own.

Every micro-batch writes two files, its offsets and then its commit, through Spark's checkpoint
file manager. Over Hadoop's local file system without its native library (pyspark ships none)
Spark's ``FileSystemBasedCheckpointFileManager`` starts a ``chmod`` process for each file and
for its ``.crc``; the dedup's ``LocalCheckpointFileManager`` (``dedup/jvm``) starts none. One
SparkSession as the dedup builds it for a new direct checkpoint (``local[2]``, 512 MB); per round
and manager (alternated, the order flipping every round) ``--files`` files of 500 bytes, each
written as Spark's metadata log writes one (``createAtomic``, write, close: a temporary file
renamed into place) into a fresh directory. Per file: the CPU of this process tree (driver, JVM
and the processes the JVM started and reaped: ``bench/dedup.py``'s ``tree_cpu``) and the wall
time; the calls from Python cost both managers alike.

    .venv/bin/python bench/checkpoint_logs.py [--files 500] [--rounds 5]

The first round warms the JVM (printed, not summarised). Prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dedup import tree_cpu
from dedup import job
from dedup.config import from_sources
from dedup.jvm import CHECKPOINT_MANAGER_CLASS
from dedup.layouts.direct import CHECKPOINT_FILE_MANAGER as SPARKS_MANAGER

MANAGERS = {"spark": SPARKS_MANAGER, "dedup": CHECKPOINT_MANAGER_CLASS}
CONTENT = bytearray(b"v1\n" + b"x" * 496 + b"\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-logs-"))
    env = {
        "BOOTSTRAP_SERVERS": "localhost:9",  # no broker: only the session is built
        "RAW_TOPICS": "raw",
        "STATE_LAYOUT": "direct",
        "STATE_DIR_CONFIG": str(work / "state"),
        "SPARK_MASTER": "local[2]",
    }
    spark = job.build_session(from_sources(env, {}), [])
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    jvm = spark.sparkContext._jvm
    assert jvm is not None

    def manager_class(name: str):
        found = jvm
        for part in name.split("."):
            found = getattr(found, part)
        return found

    runs: dict[str, list[dict[str, float]]] = {name: [] for name in MANAGERS}
    for round_ in range(args.rounds):
        order = list(MANAGERS.items()) if round_ % 2 == 0 else list(MANAGERS.items())[::-1]
        for name, class_name in order:
            directory = work / f"{name}-{round_}"
            directory.mkdir()
            base = jvm.org.apache.hadoop.fs.Path(directory.as_uri())
            manager = manager_class(class_name)(base, conf)
            before = sum(tree_cpu().values())
            start = time.monotonic()
            for index in range(args.files):
                path = jvm.org.apache.hadoop.fs.Path(base, str(index))
                stream = manager.createAtomic(path, False)
                stream.write(CONTENT)
                stream.close()
            seconds = time.monotonic() - start
            cpu = sum(tree_cpu().values()) - before
            written = [p for p in directory.iterdir() if p.name.isdigit()]
            if len(written) != args.files or any(p.read_bytes() != CONTENT for p in written):
                raise RuntimeError(f"{name}: {len(written)} of {args.files} files written whole")
            run = {
                "cpu_ms_per_file": round(cpu * 1000 / args.files, 2),
                "wall_ms_per_file": round(seconds * 1000 / args.files, 2),
                "crc_files": sum(p.name.endswith(".crc") for p in directory.iterdir()),
            }
            print(f"round {round_} {name}: {run}", flush=True)
            if round_ > 0 or args.rounds == 1:
                runs[name].append(run)
    spark.stop()
    medians = {
        name: {key: round(statistics.median(r[key] for r in rs), 2) for key in rs[0]}
        for name, rs in runs.items()
    }
    saved = medians["spark"]["cpu_ms_per_file"] - medians["dedup"]["cpu_ms_per_file"]
    print(
        json.dumps(
            {
                "bench": "checkpoint_logs",
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "files": args.files,
                "runs": runs,
                "medians": medians,
                "cpu_ratio_spark_over_dedup": round(
                    medians["spark"]["cpu_ms_per_file"] / medians["dedup"]["cpu_ms_per_file"], 1
                ),
                "cpu_ms_saved_per_micro_batch": round(2 * saved, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
