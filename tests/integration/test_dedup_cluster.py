"""The dedup on a Spark standalone cluster: a master and two workers as separate JVMs.

Started from pyspark's own launch script (``bin/spark-class ...deploy.master.Master`` and
``...deploy.worker.Worker spark://...``), each worker with one core and 512 MiB for executors (CI
has two cores). The job is submitted to ``spark://...`` (client mode: the driver is the
``kafka-diode dedup`` process); its write tasks run in the two executors. The driver is
SIGKILLed mid-run, the cluster kills its executors (a task still writing is fenced by the next
run's attempt), and the restart from the checkpoint must give the promise: every delivered
source record exactly once in the clean topic (``read_committed``), the missing ones reported as
open gaps. Then the same promise from the command docs/dedup.md gives for spark-submit, run as
written there, and stopped with a SIGTERM.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import sysconfig
import time
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


def produce_input(broker: object, raw: str, seed: int) -> None:
    """Every offset but ``MISSING``'s, 300 of each partition's twice, and a heartbeat that
    announces partition 2's missing tail."""
    rng = random.Random(seed)
    records = []
    for partition in range(3):
        present = [o for o in range(PER_PARTITION) if o not in MISSING[partition]]
        offsets = present + rng.sample(present, 300)
        records += [
            raw_record(partition, o, key=b"k%d" % o, value=b"x" * 40) for o in sorted(offsets)
        ]
    records.append(heartbeat(2, PER_PARTITION - 1))
    produce_records(broker, raw, records)


EXPECTED = {(p, b"k%d" % o) for p in range(3) for o in range(PER_PARTITION) if o not in MISSING[p]}


def open_gaps(broker: object, gap_topic: str) -> set[tuple[int, int]]:
    """(partition, offset) of every offset the gap topic's latest records report open."""
    gap_records = consume_all(broker, gap_topic, timeout=30)
    latest = {r.key: json.loads(r.value) for r in gap_records if r.value is not None}
    return {
        (g["partition"], o)
        for g in latest.values()
        if g["state"] == "open"
        for o in range(g["first"], g["last"] + 1)
    }


def assert_the_promise(broker: object, raw: str) -> None:
    """Every delivered source record exactly once in the clean topic (``read_committed``), the
    missing ones reported as open gaps."""
    clean = consume_all(broker, f"clean.{raw}.{SOURCE}", timeout=60)
    counts = Counter((r.partition, r.key) for r in clean)
    assert [k for k, n in counts.items() if n > 1] == []
    assert set(counts) == EXPECTED
    assert open_gaps(broker, f"gaps.{raw}") == {(p, o) for p, offs in MISSING.items() for o in offs}


# slow (2 min on CI's machine: a Spark master and worker beside the brokers): CI keeps the same
# SIGKILL and restart in local mode (tests/integration/test_dedup.py), the job being unchanged
@pytest.mark.slow
def test_sigkill_and_restart_on_a_standalone_cluster_keep_the_promise(
    downstream_kafka, kafka_topic, tmp_path: Path, spark_cluster: str
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=3)
    produce_input(downstream_kafka, raw, seed=17)
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
    proc = run_dedup(env)

    def executors_up() -> list[tuple[list[str], dict[str, str]]]:
        assert proc.poll() is None, "the dedup exited before its executors started"
        return executor_processes()

    # the collector a local session uses reaches the cluster's executors (docs/dedup.md)
    running = wait_until(executors_up, timeout=300, interval=0.5, message="executors")
    assert all("-XX:+UseParallelGC" in args for args, _ in running), running
    kill_once_committed(proc, downstream_kafka, clean_topic, 2_000)
    before = len(consume_all(downstream_kafka, clean_topic, timeout=10))
    assert before < 3 * PER_PARTITION - 4, "the kill came too late to test anything"

    finish(run_dedup(env, "--until-settled"))
    assert_the_promise(downstream_kafka, raw)


REPO = Path(__file__).resolve().parents[2]
#: spark-submit's line naming the application (its executors carry the id).
APP_ID = re.compile(r"Connected to Spark cluster with app ID (app-[\d-]+)")
#: Seconds spark-submit may take to exit after a SIGTERM (it took a few here).
STOP_WITHIN_S = 60


def python_without_kafka_diode(venv: Path) -> Path:
    """A python with kafka-diode's dependencies but not kafka-diode, as on an executor node whose
    venv has only the third-party packages: the job's own code can come only from
    ``--py-files``. This venv's packages are added by path, not installed, so the editable
    install's finder (run by a ``.pth`` file there) is not. Each start of this python appends its
    working directory to ``<venv>/started``: where it ran."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    Path(site, "started.pth").write_text(
        f"import os; open({str(venv / 'started')!r}, 'a').write(os.getcwd() + '\\n')\n"
    )
    probe = "import confluent_kafka, pandas, pyarrow, pyroaring, pyspark; import dedup"
    found = subprocess.run(
        [str(python), "-c", probe], check=False, cwd=venv, capture_output=True, text=True
    )
    assert "No module named 'dedup'" in found.stderr, found.stderr
    (venv / "started").unlink()
    return python


def executor_processes(app: str | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """The command line and environment of each executor JVM on this host (of ``app`` only,
    when given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in args:
                continue
            if app is not None and app not in args:
                continue
            pairs = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        env = dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
        found.append((args, env))
    return found


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


# slow (a Spark master, two workers, spark-submit's driver and two executors beside the
# brokers: ~1 min here)
@pytest.mark.slow
def test_the_documented_spark_submit_command_runs_the_job_on_the_cluster(
    downstream_kafka, kafka_topic, tmp_path: Path, spark_cluster: str
) -> None:
    """docs/dedup.md "Running on a Spark cluster", its commands as written there: the zip, and
    spark-submit with the connector jars, the zip, the executors' python and the confs it
    advises. The executors' python has the dependencies but not kafka-diode."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    produce_input(downstream_kafka, raw, seed=23)
    venv_python = python_without_kafka_diode(tmp_path / "venv")
    # the docs' "python": kafka-diode's own venv, activated
    shell = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    zip_name = "kafka_diode_py.zip"
    subprocess.run(
        ["python", "-m", "zipfile", "-c", str(tmp_path / zip_name),
         "common", "dedup", "kafka_diode", "runtime"],
        cwd=REPO, env=shell, check=True,
    )  # fmt: skip
    jars = subprocess.run(
        ["python", "-c",
         'from runtime.maven import spark_connector_jars as j; print(",".join(map(str, j())))'],
        cwd=REPO, env=shell, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    env = {
        **shell,
        **job_env(downstream_kafka.bootstrap, raw, tmp_path, raw),  # SPARK_MASTER local[2]: ignored
        "MAX_OFFSETS_PER_TRIGGER": "3000",
        "PERSIST_INTERVAL_MS": "0",
    }
    log = tmp_path / "spark-submit.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
                "--master", spark_cluster,
                "--jars", jars,
                "--py-files", str(tmp_path / zip_name),
                "--conf", f"spark.pyspark.python={venv_python}",
                "--conf", f"spark.executorEnv.PYTHONPATH={zip_name}",
                "--conf", "spark.executor.extraJavaOptions=-XX:+UseParallelGC",
                "--driver-java-options", "-XX:+UseParallelGC",
                "--conf", "spark.executorEnv.MALLOC_ARENA_MAX=2",
                # one one-core executor in each worker's 640 MiB
                "--executor-memory", "512m",
                "--total-executor-cores", "2",
                "dedup/spark_main.py",
            ],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # the group of spark-submit and its Python driver
        )  # fmt: skip
    missing = {(p, o) for p, offs in MISSING.items() for o in offs}
    try:

        def delivered_and_reported() -> bool:
            if proc.poll() is not None:
                raise AssertionError(log.read_text(errors="replace")[-6000:])
            try:
                clean = consume_all(downstream_kafka, f"clean.{raw}.{SOURCE}", timeout=10)
                return (
                    len(clean) >= len(EXPECTED)
                    and open_gaps(downstream_kafka, f"gaps.{raw}") >= missing
                )
            except RuntimeError:  # a topic not created yet
                return False

        wait_until(delivered_and_reported, timeout=600, interval=2.0, message="all delivered")
        # the collector and the malloc arenas the page advises reached both executors
        connected = APP_ID.search(log.read_text())
        assert connected, log.read_text(errors="replace")[-6000:]
        app = connected[1]
        running = executor_processes(app)
        assert len(running) == 2, running
        for args, executor_env in running:
            assert "-XX:+UseParallelGC" in args, args
            assert executor_env.get("MALLOC_ARENA_MAX") == "2", sorted(executor_env)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # as an operator (or systemd) stops it
        proc.wait(STOP_WITHIN_S)
        took = time.monotonic() - began
        wait_until(lambda: group_gone(proc.pid), timeout=STOP_WITHIN_S, message="driver gone")
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    print(f"spark-submit exited {proc.returncode} {took:.1f} s after SIGTERM")
    assert proc.returncode == 128 + signal.SIGTERM, "the JVM's exit on SIGTERM"

    assert_the_promise(downstream_kafka, raw)
    # the tasks ran on the cluster's executors, in this app, with the executors' python and the
    # job's code from the zip (that python has no other): its starts are in the executors'
    # working directories, <worker>/<app id>/<executor id>
    starts = set((tmp_path / "venv" / "started").read_text().split())
    executors = {Path(d).relative_to(tmp_path).parts[:2] for d in starts if f"/{app}/" in d}
    assert executors, starts
    assert all(w.startswith("worker") for w, _ in executors), starts
    finished = [
        p for p in tmp_path.glob(f"worker*/{app}/*/stderr") if "Finished task" in p.read_text()
    ]
    assert finished, "no executor of the app ran a task"
