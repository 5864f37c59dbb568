"""The dedup on a Spark standalone cluster: a master and two workers as separate JVMs.

Started from pyspark's own launch script (``bin/spark-class ...deploy.master.Master`` and
``...deploy.worker.Worker spark://...``), each worker with one core and 512 MiB for executors (CI
has two cores). The job is submitted to ``spark://...`` (client mode: the driver is the
``kafka-diode dedup`` process); its write tasks run in the two executors. The driver is
SIGKILLed mid-run, the cluster kills its executors (a task still writing is fenced by the next
run's attempt), and the restart from the checkpoint must give the promise: every delivered
source record exactly once in the clean topic (``read_committed``), the missing ones reported as
open gaps.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from kafka_diode.local_kafka.broker import free_port
from tests.integration.test_dedup import (
    SOURCE,
    finish,
    heartbeat,
    job_env,
    kill_once_committed,
    raw_record,
    run_dedup,
)
from tests.kafka_helpers import consume_all, produce_records, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PER_PARTITION = 4_000
MISSING = {0: {100, 101}, 1: {2_000}, 2: {3_999}}  # 3_999: a tail, announced by a heartbeat


def _daemon(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(spark_class), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stopped with its children below
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[str]:
    """``spark://127.0.0.1:<port>`` of a running master with two registered workers."""
    port, ui = free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_LOG_DIR": str(tmp_path / "spark-logs"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    procs = [
        _daemon(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            tmp_path / "master.log",
            env,
        )
    ]
    master = f"spark://127.0.0.1:{port}"
    try:
        for i in range(2):
            work = tmp_path / f"worker{i}"
            work.mkdir()
            procs.append(
                _daemon(
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        master,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "1",
                        "--memory",
                        "640m",
                        "--work-dir",
                        str(work),
                        "--webui-port",
                        str(free_port()),
                    ],
                    tmp_path / f"worker{i}.log",
                    env,
                )
            )

        def two_workers_alive() -> bool:
            for proc in procs:
                if proc.poll() is not None:
                    raise AssertionError(f"a Spark daemon exited: {proc.args}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    state = json.load(r)
            except (OSError, ValueError):
                # A master still starting may answer with an empty or partial body.
                return False
            return sum(w.get("state") == "ALIVE" for w in state.get("workers", [])) == 2

        wait_until(two_workers_alive, timeout=120, interval=0.5)
        yield master
    finally:
        for proc in reversed(procs):
            _stop(proc)


# slow (2 min on CI's machine: a Spark master and worker beside the brokers): CI keeps the same
# SIGKILL and restart in local mode (tests/integration/test_dedup.py), the job being unchanged
@pytest.mark.slow
def test_sigkill_and_restart_on_a_standalone_cluster_keep_the_promise(
    downstream_kafka, kafka_topic, tmp_path: Path, spark_cluster: str
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=3)
    rng = random.Random(17)
    records = []
    for partition in range(3):
        present = [o for o in range(PER_PARTITION) if o not in MISSING[partition]]
        offsets = present + rng.sample(present, 300)
        records += [
            raw_record(partition, o, key=b"k%d" % o, value=b"x" * 40) for o in sorted(offsets)
        ]
    records.append(heartbeat(2, PER_PARTITION - 1))
    produce_records(downstream_kafka, raw, records)
    env = {
        **job_env(downstream_kafka.bootstrap, raw, tmp_path, raw),
        "SPARK_MASTER": spark_cluster,
        "SHUFFLE_PARTITIONS": "2",  # one write task per executor core
        "MAX_OFFSETS_PER_TRIGGER": "3000",
        "PERSIST_INTERVAL_MS": "0",
        "SPARK_CONF_SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_CONF_SPARK_EXECUTOR_CORES": "1",
        "SPARK_CONF_SPARK_CORES_MAX": "2",
    }
    clean_topic = f"clean.{raw}.{SOURCE}"
    kill_once_committed(run_dedup(env), downstream_kafka, clean_topic, 2_000)
    before = len(consume_all(downstream_kafka, clean_topic, timeout=10))
    assert before < 3 * PER_PARTITION - 4, "the kill came too late to test anything"

    finish(run_dedup(env, "--until-idle", "10"))
    clean = consume_all(downstream_kafka, clean_topic, timeout=60)
    counts = Counter((r.partition, r.key) for r in clean)
    assert [k for k, n in counts.items() if n > 1] == []
    expected = {
        (p, b"k%d" % o) for p in range(3) for o in range(PER_PARTITION) if o not in MISSING[p]
    }
    assert set(counts) == expected
    gap_records = consume_all(downstream_kafka, f"gaps.{raw}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gap_records if r.value is not None}
    open_offsets = {
        (g["partition"], o)
        for g in latest.values()
        if g["state"] == "open"
        for o in range(g["first"], g["last"] + 1)
    }
    assert open_offsets == {(p, o) for p, offs in MISSING.items() for o in offs}
