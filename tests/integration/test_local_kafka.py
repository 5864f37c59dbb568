"""``kafka-diode local-kafka`` against real brokers: start, round-trip, two at once, stop, offline.

Brokers started here by the CLI use their own run dir (``KAFKA_DIODE_RUN_DIR``) so ``status`` only
sees them; the jar cache is the user's (``make jars`` filled it).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_diode.local_kafka import broker as broker_module
from kafka_diode.local_kafka import cli
from kafka_diode.local_kafka.broker import (
    CMDLINE_NAME_PROP,
    LocalBroker,
    free_port,
    is_our_broker,
    pid_cmdline,
    read_state,
)
from runtime import maven as artifacts
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records, wait_until

CLI = [sys.executable, "-m", "kafka_diode", "local-kafka"]


def _our_java_pids(marker: str) -> list[int]:
    """Pids of live processes whose command line carries ``marker`` (our broker name property)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = pid_cmdline(int(entry.name))
            if argv and marker in argv:
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for CLI subprocesses: a private run dir; brokers it names are stopped after."""
    env = dict(os.environ, KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"))
    yield env
    for index in (tmp_path / "run").glob("*.json"):
        subprocess.run([*CLI, "stop", "--name", index.stem], env=env, check=False, timeout=60)


def _run(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.kafka
def test_cli_start_roundtrips_10000_records_and_stop_leaves_nothing(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    port = free_port()
    data_dir = tmp_path / "up-data"
    started = _run(
        cli_env, "start", "--name", "up", "--port", str(port), "--data-dir", str(data_dir)
    )
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip().splitlines()[-1]
    assert bootstrap == f"127.0.0.1:{port}"
    # The CLI process has exited; the broker it started lives on in its own session.
    state = read_state(data_dir)
    assert state is not None
    assert is_our_broker(state.pid, "up", data_dir)
    assert os.getsid(state.pid) != os.getsid(0)

    topic = create_topic(bootstrap, partitions=3)
    records = [
        Record(
            key=f"k{i}".encode(),
            value=os.urandom(i % 200) if i % 1000 else None,  # tombstones are records too
            headers=[("h", str(i).encode()), ("empty", None)] if i % 7 == 0 else (),
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(10_000)
    ]
    positions = produce_records(bootstrap, topic, records)
    assert len(positions) == 10_000
    got = consume_all(bootstrap, topic, expected_count=10_000, timeout=60)
    assert len(got) == 10_000
    by_position = {(r.partition, r.offset): r for r in got}
    for record, position in zip(records, positions, strict=True):
        back = by_position[position]
        assert (back.key, back.value, back.timestamp) == (
            record.key,
            record.value,
            record.timestamp,
        )
        assert list(back.headers) == list(record.headers)

    status = _run(cli_env, "status")
    assert status.returncode == 0
    assert any(
        line.split()[:2] == ["up", "running"] and bootstrap in line
        for line in status.stdout.splitlines()
    ), status.stdout

    stopped = _run(cli_env, "stop", "--name", "up")
    assert stopped.returncode == 0, stopped.stderr
    assert not is_our_broker(state.pid, "up", data_dir)
    assert _our_java_pids(f"{CMDLINE_NAME_PROP}up") == []
    assert "no local Kafka brokers known" in _run(cli_env, "status").stdout


@pytest.mark.kafka
def test_restart_reuses_storage_and_keeps_records(tmp_path: Path) -> None:
    env = dict(os.environ, KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"))
    broker = LocalBroker("restart", free_port(), data_dir=tmp_path / "data", env=env)
    try:
        first = broker.start()
        topic = create_topic(broker, partitions=1)
        produce_records(broker, topic, [b"before-restart"])
        assert broker.stop()
        second = broker.start()
        assert second.cluster_id == first.cluster_id
        assert [r.value for r in consume_all(broker, topic)] == [b"before-restart"]
        # Starting a running name on the same port is idempotent.
        assert broker.start().pid == second.pid
    finally:
        broker.stop()
    assert not broker.is_running()


@pytest.mark.kafka
def test_cluster_id_starting_with_a_dash_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # base64 ids start with "-" one time in 64; the storage tool must not read it as a flag
    monkeypatch.setattr(broker_module, "new_cluster_id", lambda: "-" + "A" * 21)
    env = dict(os.environ, KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"))
    broker = LocalBroker("dash-id", free_port(), data_dir=tmp_path / "data", env=env)
    try:
        assert broker.start().cluster_id == "-" + "A" * 21
    finally:
        broker.stop()


@pytest.mark.kafka
def test_two_brokers_run_side_by_side(upstream_kafka, downstream_kafka) -> None:
    assert upstream_kafka.bootstrap != downstream_kafka.bootstrap
    assert upstream_kafka.state.pid != downstream_kafka.state.pid
    name = f"same-name-{os.getpid()}"
    for broker in (upstream_kafka, downstream_kafka):
        create_topic(broker, name=name, partitions=2)
    produce_records(upstream_kafka, name, [(b"k", b"from-up")])
    produce_records(downstream_kafka, name, [(b"k", b"from-down-1"), (b"k", b"from-down-2")])
    assert [r.value for r in consume_all(upstream_kafka, name)] == [b"from-up"]
    assert [r.value for r in consume_all(downstream_kafka, name)] == [
        b"from-down-1",
        b"from-down-2",
    ]


@pytest.mark.kafka
def test_fixtures_topic_factory_and_group_ids(upstream_kafka, kafka_topic, group_id) -> None:
    topic = kafka_topic(upstream_kafka, partitions=4)
    other = kafka_topic(upstream_kafka.bootstrap, partitions=1)
    assert topic != other
    assert group_id.startswith("g-")
    produce_records(upstream_kafka, topic, [Record(key=None, value=b"x", partition=3)])
    [record] = consume_all(upstream_kafka, topic)
    assert (record.partition, record.value) == (3, b"x")


@pytest.mark.kafka
def test_transactional_producer_commits_and_aborts(upstream_kafka, kafka_topic) -> None:
    topic = kafka_topic(upstream_kafka, partitions=2)
    producer = Producer(
        {"bootstrap.servers": upstream_kafka.bootstrap, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(100):
        producer.produce(topic, key=b"%d" % i, value=b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.flush(30)  # on the broker, so the abort has something to hide
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-last")
    producer.commit_transaction(30)

    committed = consume_all(upstream_kafka, topic, isolation_level="read_committed")
    assert sorted(r.value for r in committed) == [b"committed"] * 100 + [b"committed-last"]
    uncommitted = consume_all(upstream_kafka, topic, isolation_level="read_uncommitted")
    assert b"aborted" in {r.value for r in uncommitted}


def test_port_in_use_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_DIODE_RUN_DIR", str(tmp_path / "run"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = cli.main(
            ["start", "--name", "busy", "--port", str(port), "--data-dir", str(tmp_path)]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("kafka-diode local-kafka: error: ")
    assert f"port {port}" in err[-1]
    assert "already in use" in err[-1]


def test_missing_maven_when_not_cached_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_DIODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KAFKA_DIODE_MVN", str(tmp_path / "no-such-mvn"))
    assert cli.main(["fetch"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "Maven is needed" in err
    assert "KAFKA_DIODE_MVN" in err


def test_failed_download_never_looks_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KAFKA_DIODE_CACHE", str(cache))
    monkeypatch.setenv("KAFKA_DIODE_MVN", shutil.which("false") or "/bin/false")
    # A leftover set without its completion marker (an interrupted copy) is not trusted.
    leftover = artifacts.jar_dir(artifacts.KAFKA_BROKER_JARS)
    leftover.mkdir(parents=True)
    (leftover / "kafka_2.13-4.1.1.jar").write_bytes(b"truncated")
    assert artifacts.cached_jars(artifacts.KAFKA_BROKER_JARS) is None
    assert cli.main(["fetch"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "failed" in err
    assert "repo1.maven.org" in err
    assert artifacts.cached_jars(artifacts.KAFKA_BROKER_JARS) is None
    assert [p.name for p in leftover.parent.iterdir()] == [leftover.name]  # no staging dirs left


def test_old_java_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    java = tmp_path / "jdk11" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    monkeypatch.setenv("KAFKA_DIODE_RUN_DIR", str(tmp_path / "run"))
    code = cli.main(
        ["start", "--name", "old", "--port", str(free_port()), "--data-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert "needs Java 17+" in err[-1]
    assert "JAVA_HOME" in err[-1]


@pytest.mark.kafka
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_cached_jars_start_a_broker_without_network_or_maven(tmp_path: Path) -> None:
    """In a fresh network namespace (loopback only) with Maven replaced by /bin/false, ``fetch``
    succeeds from the cache and a broker starts, round-trips a record and stops."""
    artifacts.ensure_kafka_jars()
    artifacts.spark_connector_jars()
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root or user namespaces)")
    port = free_port()
    script = textwrap.dedent(
        f"""
        set -e
        ip link set lo up
        {" ".join(CLI)} fetch
        {" ".join(CLI)} start --name offline --port {port} --data-dir {tmp_path / "data"}
        {sys.executable} -c "
        import sys; sys.path.insert(0, {str(Path.cwd())!r})
        from tests.kafka_helpers import consume_all, produce_records
        produce_records('127.0.0.1:{port}', 'offline', [b'no-network'])
        print([r.value for r in consume_all('127.0.0.1:{port}', 'offline', 1)])
        "
        {" ".join(CLI)} stop --name offline
        """
    )
    env = dict(
        os.environ,
        KAFKA_DIODE_MVN=shutil.which("false") or "/bin/false",
        KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"),
    )
    try:
        result = subprocess.run(
            ["unshare", "-n", "sh", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        state = read_state(tmp_path / "data")
        if state is not None and is_our_broker(state.pid, "offline", tmp_path / "data"):
            os.kill(state.pid, 9)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[b'no-network']" in result.stdout
    assert str(artifacts.jar_dir(artifacts.KAFKA_BROKER_JARS)) in result.stdout
    assert _our_java_pids(f"{CMDLINE_NAME_PROP}offline") == []


def test_spark_connector_set_is_minimal() -> None:
    """Only the connector and the three jars pyspark lacks; nothing pyspark already ships."""
    if artifacts.cached_jars(artifacts.SPARK_CONNECTOR_JARS) is None:
        pytest.skip("spark connector jars not cached yet (run 'make jars')")
    names = sorted(p.name for p in artifacts.spark_connector_jars())
    assert names == [
        "commons-pool2-2.13.1.jar",
        "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
        "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
    ]
    assert importlib.metadata.version("pyspark") == artifacts.SPARK_VERSION
    marker = json.loads(
        (artifacts.jar_dir(artifacts.SPARK_CONNECTOR_JARS) / "COMPLETE").read_text()
    )
    assert marker["version"] == artifacts.SPARK_VERSION


def test_wait_until_returns_value_and_times_out() -> None:
    assert wait_until(lambda: 42, timeout=1) == 42
    with pytest.raises(TimeoutError, match="never"):
        wait_until(lambda: 0, timeout=0.3, interval=0.05, message="never")
