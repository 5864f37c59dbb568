"""`kafka-diode demo produce` against a broker without its topics: creates them, or says why not."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from kafka_diode.local_kafka.broker import free_port
from tests.kafka_helpers import consume_all, create_topic, random_name

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_diode", "demo", "produce", "--bootstrap-servers", bootstrap,
         *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip


def _partitions(bootstrap: str, topic: str) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return len(meta.topics[topic].partitions)


def test_missing_topics_are_created_with_the_requested_partitions(upstream_kafka: Any) -> None:
    topics = [random_name("demo-a"), random_name("demo-b")]
    bootstrap = upstream_kafka.bootstrap
    result = _produce(
        bootstrap, "--topics", ",".join(topics), "--partitions", "4", "--records", "200"
    )
    assert result.returncode == 0, result.stderr
    assert f"created topics {', '.join(topics)} with 4 partitions each" in result.stdout
    assert "produced 200 records" in result.stdout
    assert "Traceback" not in result.stderr
    assert "%6|" not in result.stderr + result.stdout
    for topic in topics:
        assert _partitions(bootstrap, topic) == 4
    got = sum(len(consume_all(upstream_kafka, t, expected_count=100, timeout=60)) for t in topics)
    assert got == 200

    # a second run finds them and creates nothing
    again = _produce(bootstrap, "--topics", ",".join(topics), "--partitions", "4", "--records", "2")
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout


def test_an_existing_topic_with_fewer_partitions_is_refused_in_one_line(
    upstream_kafka: Any,
) -> None:
    topic = create_topic(upstream_kafka, partitions=1)
    result = _produce(upstream_kafka.bootstrap, "--topics", topic, "--partitions", "3")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--partitions" in lines[0]
    assert "1 partition(s)" in lines[0]
    assert "use --partitions 1" in lines[0]


def test_an_unreachable_broker_is_one_line() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    result = _produce(nobody, "--topics", "t")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"cannot reach Kafka at {nobody}" in lines[0]
