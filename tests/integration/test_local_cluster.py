"""``kafka-diode local-kafka start --brokers 3``: a real KRaft cluster replicated as production
clusters are, and one node stopped, killed and restarted by name while writes go on (slow: three
JVMs start, ~15-30 s here)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from kafka_diode.local_kafka.broker import CMDLINE_NAME_PROP, free_port, pid_cmdline, port_in_use
from kafka_diode.local_kafka.cluster import LocalCluster
from runtime import kafka
from tests.chaos.failover import coordinator_partition, group_coordinator
from tests.kafka_helpers import Record, consume_all, produce_records, random_name, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CLI = [sys.executable, "-m", "kafka_diode", "local-kafka"]


def _run(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _consecutive_free_ports(count: int) -> int:
    for _ in range(100):
        first = free_port()
        if all(not port_in_use(first + i) for i in range(1, count)) and first + count < 65536:
            return first
    raise RuntimeError("no consecutive free ports")


def _live(marker: str) -> list[int]:
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and marker in (pid_cmdline(int(e.name)) or [])
    ]


@pytest.fixture
def cluster_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = dict(os.environ, KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"))
    yield env
    _run(env, "stop", "--name", "c", timeout=120)


def _status(env: dict[str, str]) -> dict[str, list[str]]:
    out = _run(env, "status").stdout.splitlines()
    return {line.split()[0]: line.split() for line in out[1:] if line.strip()}


def _replicas(bootstrap: str, topic: str) -> list[tuple[int, list[int], list[int]]]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return [
        (p.leader, list(p.replicas), list(p.isrs)) for p in meta.topics[topic].partitions.values()
    ]


def test_a_three_node_cluster_replicates_and_survives_one_node_down(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    port = _consecutive_free_ports(3)
    started = _run(
        cluster_env, "start", "--name", "c", "--brokers", "3", "--port", str(port),
        "--data-dir", str(tmp_path / "c"),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip().splitlines()[-1]
    assert bootstrap == ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    rows = _status(cluster_env)
    assert {name: row[1] for name, row in rows.items()} == {
        "c-1": "running", "c-2": "running", "c-3": "running"
    }  # fmt: skip
    assert [rows[f"c-{i}"][4] for i in (1, 2, 3)] == ["c#1", "c#2", "c#3"]
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    assert sorted(AdminClient(conf).list_topics(timeout=10).brokers) == [1, 2, 3]

    # topics created with the cluster's defaults: 3 replicas, 2 in sync
    topic = random_name("cl")
    kafka.create_missing_topics(conf, [kafka.TopicSpec(name=topic, partitions=3)], timeout=60)
    assert all(len(r) == 3 for _, r, _ in _replicas(bootstrap, topic))
    assert kafka.topic_config(conf, topic, 10)["min.insync.replicas"] == "2"
    # transaction state replicated three times too
    producer = Producer({**conf, "transactional.id": random_name("tx")})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"in a transaction", partition=0)
    producer.commit_transaction(60)
    assert all(len(r) == 3 for _, r, _ in _replicas(bootstrap, "__transaction_state"))
    # a consumer group's coordinator is where Kafka's hashing rule says (the failover chaos
    # finds the dedup's transaction coordinator by the same rule)
    group = random_name("g")
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    wait_until(lambda: consumer.poll(0.5) is not None, 60, message="a record")
    consumer.commit(asynchronous=False)
    predicted = _replicas(bootstrap, "__consumer_offsets")
    leader = sorted(
        AdminClient(conf)
        .list_topics("__consumer_offsets", timeout=10)
        .topics["__consumer_offsets"]
        .partitions.items()
    )[coordinator_partition(group)][1].leader
    assert group_coordinator(bootstrap, group) == leader, predicted
    consumer.close()

    produce_records(
        bootstrap, topic, [Record(b"k", b"before", partition=i % 3) for i in range(300)]
    )

    # one node killed: writes with acks=all still succeed (2 in sync), leaders move
    killed = _run(cluster_env, "kill", "--name", "c-2")
    assert killed.returncode == 0, killed.stderr
    assert _live(f"{CMDLINE_NAME_PROP}c-2") == []
    assert _status(cluster_env)["c-2"][1] == "stopped"
    wait_until(
        lambda: all(leader in (1, 3) for leader, _, _ in _replicas(bootstrap, topic)),
        60,
        message="leaders moved off the killed node",
    )
    produce_records(
        bootstrap, topic, [Record(b"k", b"during", partition=i % 3) for i in range(300)]
    )

    # restarted by name: rejoins and catches up (every partition's ISR is whole again)
    restarted = _run(cluster_env, "start", "--name", "c-2")
    assert restarted.returncode == 0, restarted.stderr
    wait_until(
        lambda: all(sorted(isr) == [1, 2, 3] for _, _, isr in _replicas(bootstrap, topic)),
        120,
        message="the restarted node back in sync",
    )
    # stopped gracefully by name, then started again
    assert _run(cluster_env, "stop", "--name", "c-3").returncode == 0
    assert _status(cluster_env)["c-3"][1] == "stopped"
    assert _run(cluster_env, "start", "--name", "c-3").returncode == 0

    got = consume_all(bootstrap, topic, expected_count=601, timeout=60)
    values = sorted(r.value or b"" for r in got)
    assert values.count(b"before") == 300
    assert values.count(b"during") == 300
    assert values.count(b"in a transaction") == 1

    # the cluster's name stops every node and forgets them
    assert _run(cluster_env, "stop", "--name", "c").returncode == 0
    assert _live(f"{CMDLINE_NAME_PROP}c-") == []
    assert "no local Kafka brokers known" in _run(cluster_env, "status").stdout


def test_a_secured_cluster_talks_sasl_ssl_between_its_nodes_and_to_clients(
    tmp_path: Path,
) -> None:
    env = dict(os.environ, KAFKA_DIODE_RUN_DIR=str(tmp_path / "run"))
    cluster = LocalCluster(
        "sc",
        ports=tuple(free_port() for _ in range(3)),
        data_dir=tmp_path / "sc",
        env=env,
        security="sasl_ssl",
    )
    try:
        cluster.start()
        conf: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap, **cluster.client_conf()}
        assert conf["security.protocol"] == "SASL_SSL"
        topic = random_name("sec")
        kafka.create_missing_topics(conf, [kafka.TopicSpec(name=topic, partitions=3)], timeout=60)
        assert all(len(r) == 3 for _, r, _ in _replicas_with(conf, topic))  # replicated over TLS
        producer = Producer({**conf, "acks": "all"})
        for i in range(30):
            producer.produce(topic, str(i).encode(), partition=i % 3)
        assert producer.flush(60) == 0
        got = consume_all(cluster.bootstrap, topic, expected_count=30, timeout=60, config=conf)
        assert sorted(int(r.value or b"") for r in got) == list(range(30))
        with pytest.raises(KafkaException):  # no PLAINTEXT client gets in
            AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0}).list_topics(
                timeout=5
            )
    finally:
        cluster.stop()


def _replicas_with(conf: dict[str, Any], topic: str) -> list[tuple[int, list[int], list[int]]]:
    meta = AdminClient(conf).list_topics(topic, timeout=10)
    return [
        (p.leader, list(p.replicas), list(p.isrs)) for p in meta.topics[topic].partitions.values()
    ]
