"""runtime.kafka.create_missing_topics against a real broker: creates what is missing, with the
partitions, replication and settings asked for, leaves existing topics alone, and says why it
cannot."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from common.errors import KafkaClientError
from kafka_diode.local_kafka.broker import free_port
from runtime import kafka
from runtime.kafka import TopicSpec
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records, random_name

pytestmark = pytest.mark.kafka


def _conf(broker: Any) -> dict[str, str]:
    return {"bootstrap.servers": broker.bootstrap}


def test_missing_topics_are_created_with_their_settings_and_usable_at_once(
    downstream_kafka: Any,
) -> None:
    a, b = random_name("ens-a"), random_name("ens-b")
    specs = [
        TopicSpec(name=a, partitions=4, config={"max.message.bytes": "2000000"}),
        TopicSpec(name=b, partitions=1, replication=1, config={"cleanup.policy": "compact"}),
        TopicSpec(name=a, partitions=9),  # a name given twice: the first spec wins
    ]
    ensured = kafka.create_missing_topics(_conf(downstream_kafka), specs, timeout=30)
    assert ensured.created == (a, b)
    assert dict(ensured.partitions) == {a: 4, b: 1}
    assert kafka.topic_config(_conf(downstream_kafka), a, 10)["max.message.bytes"] == "2000000"
    assert kafka.topic_config(_conf(downstream_kafka), b, 10)["cleanup.policy"] == "compact"
    # leaders are there when it returns: a produce to every partition succeeds without retry
    produce_records(downstream_kafka, a, [Record(b"k", b"v", partition=p) for p in range(4)])
    assert len(consume_all(downstream_kafka, a, expected_count=4, timeout=30)) == 4

    # again: nothing created, the partitions found reported
    again = kafka.create_missing_topics(_conf(downstream_kafka), specs, timeout=30)
    assert again.created == ()
    assert dict(again.partitions) == {a: 4, b: 1}


def test_an_existing_topic_is_left_as_it_is(downstream_kafka: Any) -> None:
    topic = create_topic(downstream_kafka, partitions=2)
    ensured = kafka.create_missing_topics(
        _conf(downstream_kafka),
        [TopicSpec(name=topic, partitions=6, config={"max.message.bytes": "5000000"})],
        timeout=30,
    )
    assert ensured.created == ()
    assert dict(ensured.partitions) == {topic: 2}
    assert kafka.topic_config(_conf(downstream_kafka), topic, 10)["max.message.bytes"] != "5000000"


def test_callers_racing_to_create_the_same_topic_all_succeed(downstream_kafka: Any) -> None:
    topic = random_name("ens-race")
    results: list[kafka.EnsuredTopics] = []
    errors: list[BaseException] = []

    def ensure() -> None:
        try:
            results.append(
                kafka.create_missing_topics(
                    _conf(downstream_kafka), [TopicSpec(name=topic, partitions=3)], timeout=30
                )
            )
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=ensure) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(len(r.created) for r in results) <= 1  # the broker created it once
    assert all(dict(r.partitions) == {topic: 3} for r in results)


def test_a_refused_creation_names_the_topic_and_the_reason(
    downstream_kafka: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topic = random_name("ens-rf")
    with (
        caplog.at_level(logging.DEBUG, logger="runtime.kafka"),
        pytest.raises(KafkaClientError) as info,
    ):
        kafka.create_missing_topics(
            _conf(downstream_kafka),
            [TopicSpec(name=topic, partitions=1, replication=3)],
            timeout=3,
        )
    # too few brokers may be a restarting one: asked again until the timeout, warned once
    tries = [r for r in caplog.records if f"cannot create topic {topic!r} yet" in r.getMessage()]
    assert len(tries) >= 2
    assert [r.levelno for r in tries].count(logging.WARNING) == 1
    assert info.value.topic == topic
    assert info.value.name == "INVALID_REPLICATION_FACTOR"
    assert f"cannot create topic {topic!r}" in str(info.value)
    listed = AdminClient(_conf(downstream_kafka)).list_topics(timeout=10).topics
    assert topic not in listed


def test_an_unreachable_cluster_is_an_error_without_a_topic() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaClientError) as info:
        kafka.create_missing_topics(
            {"bootstrap.servers": nobody, "log_level": 0},
            [TopicSpec(name="t")],
            timeout=10,
            reach_timeout=2,
        )
    assert info.value.topic is None
    assert f"cannot reach Kafka at {nobody}" in str(info.value)
