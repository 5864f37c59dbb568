"""runtime.kafka: the one Kafka client factory and error mapping (no broker needed for these)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from common.errors import ConfigError, KafkaClientError, ServiceError
from runtime import kafka


@pytest.mark.parametrize("build", [kafka.producer, kafka.consumer, kafka.admin])
def test_a_refused_property_is_a_config_error_naming_the_setting(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        build(
            {"bootstrap.servers": "localhost:1", "group.id": "g", "no.such.property": "1"},
            key="sender.kafka",
        )
    assert info.value.key == "sender.kafka"
    assert "no.such.property" in str(info.value)


def test_a_valid_configuration_builds_a_client_without_a_broker() -> None:
    client = kafka.producer({"bootstrap.servers": "localhost:1"})
    assert client.flush(0) == 0


def test_errors_keep_librdkafkas_name_and_retriable_flag() -> None:
    transport = kafka.error(KafkaException(KafkaError(KafkaError._TRANSPORT)), "reading x")
    assert isinstance(transport, KafkaClientError)
    assert isinstance(transport, ServiceError)
    assert transport.name == "_TRANSPORT"
    assert str(transport).startswith("reading x: ")
    fatal = kafka.error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "writing y")
    assert fatal.name == "TOPIC_AUTHORIZATION_FAILED"
    assert fatal.retriable is False
    retriable = kafka.error(KafkaError(KafkaError.REQUEST_TIMED_OUT, retriable=True), "z")
    assert retriable.retriable is True


def test_a_cluster_failing_over_is_retriable_although_librdkafka_does_not_flag_it() -> None:
    # an admin request's result has no retriable flag: CreateTopics during a controller's
    # failover ends in _TIMED_OUT ("Timed out waiting for controller"), NOT_CONTROLLER, ...
    for code in (KafkaError._TIMED_OUT, KafkaError.NOT_CONTROLLER, KafkaError.REQUEST_TIMED_OUT):
        moving = kafka.error(KafkaError(code), "cannot create topic 'x'", topic="x")
        assert moving.retriable is True, moving.name
    for code in (KafkaError.POLICY_VIOLATION, KafkaError.INVALID_REPLICATION_FACTOR):
        assert kafka.error(KafkaError(code), "cannot create topic 'x'").retriable is False


def test_reading_a_topic_when_no_broker_answers_is_a_service_error() -> None:
    with pytest.raises(ServiceError):
        kafka.read_to_end(
            {"bootstrap.servers": "127.0.0.1:1", "socket.timeout.ms": 100},
            "gaps",
            timeout=1.0,
            purpose="test",
        )


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"partitions": 0}, "t.partitions"),
        ({"replication": -2}, "t.replication"),
        ({"name": ""}, "topic"),
    ],
)
def test_a_topic_spec_names_the_invalid_key(changes: dict[str, object], key: str) -> None:
    fields: dict[str, object] = {"name": "t", **changes}
    with pytest.raises(ConfigError) as info:
        kafka.TopicSpec(**fields)  # type: ignore[arg-type]
    assert info.value.key == key


def test_a_topic_spec_defaults_to_the_brokers_partitions_and_replication() -> None:
    spec = kafka.TopicSpec(name="t")
    assert (spec.partitions, spec.replication, dict(spec.config)) == (-1, -1, {})


class _RefusingAdmin:
    """An admin client whose cluster has too few brokers: every creation is refused."""

    def __init__(self) -> None:
        self.tries: list[tuple[float, float]] = []  # (monotonic time, request_timeout)

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={})

    def create_topics(
        self, topics: list[Any], operation_timeout: float, request_timeout: float
    ) -> dict[str, Future[None]]:
        assert operation_timeout == request_timeout
        self.tries.append((time.monotonic(), request_timeout))
        refused: Future[None] = Future()
        refused.set_exception(KafkaException(KafkaError(KafkaError.INVALID_REPLICATION_FACTOR)))
        return {topic.topic: refused for topic in topics}


def test_each_try_of_a_refused_creation_gets_only_what_is_left_of_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _RefusingAdmin()
    monkeypatch.setattr(kafka, "admin", lambda _conf: fake)
    started = time.monotonic()
    with pytest.raises(KafkaClientError, match="cannot create topic"):
        kafka.create_missing_topics(
            {"bootstrap.servers": "k:9092"}, [kafka.TopicSpec(name="t", replication=3)], timeout=2.5
        )
    assert len(fake.tries) >= 3
    assert fake.tries[0][1] == pytest.approx(2.5, abs=0.05)
    for at, given in fake.tries[1:]:
        assert given <= max(1.0, started + 2.5 - at) + 0.05, fake.tries


def _cluster(up: list[int], replicas: dict[str, list[list[int]]]) -> Any:
    """A metadata answer: the brokers up, and each topic's partitions' replica lists."""
    return SimpleNamespace(
        brokers={b: SimpleNamespace(id=b) for b in up},
        topics={
            name: SimpleNamespace(
                partitions={i: SimpleNamespace(replicas=r) for i, r in enumerate(parts)}
            )
            for name, parts in replicas.items()
        },
    )


@pytest.mark.parametrize(
    ("up", "replicas", "known"),
    [
        ([1], {"__consumer_offsets": [[1]]}, 1),  # a single broker
        ([1, 2, 3], {}, 3),  # a new cluster, every node up, no topic yet
        ([1, 3], {"__consumer_offsets": [[1, 2, 3], [2, 3, 1]]}, 3),  # node 2 down
        ([1, 3], {"raw": [[3]], "clean": [[1]]}, 2),  # node 2 down, and it holds nothing
    ],
)
def test_a_node_that_is_down_counts_while_it_holds_replicas(
    up: list[int], replicas: dict[str, list[list[int]]], known: int
) -> None:
    assert kafka.known_brokers(_cluster(up, replicas)) == known
