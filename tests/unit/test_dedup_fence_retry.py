"""A read of the progress or state topic outlasts a failover, and nothing else
(``dedup.fence.retrying``): the state read of a direct task whose partition leader was killed
ends in ``_DESTROY_BROKER`` once the metadata drops the broker; a new consumer finds the new
leader."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from dedup.fence import retrying


def failing(codes: list[int], value: str = "state"):
    calls: list[int] = []

    def read() -> str:
        calls.append(1)
        if len(calls) <= len(codes):
            raise KafkaException(KafkaError(codes[len(calls) - 1]))
        return value

    return read, calls


def test_a_broker_gone_from_the_metadata_is_tried_again_with_a_new_read() -> None:
    read, calls = failing([KafkaError._DESTROY_BROKER, KafkaError._TIMED_OUT])
    assert retrying(read, "reading state", within=10, pause=0) == "state"
    assert len(calls) == 3


def test_an_error_that_is_not_transient_is_raised_at_once() -> None:
    read, calls = failing([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException) as raised:
        retrying(read, "reading state", within=10, pause=0)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert len(calls) == 1


def test_the_last_transient_error_is_raised_when_the_time_is_spent() -> None:
    read, calls = failing([KafkaError._DESTROY_BROKER] * 100)
    with pytest.raises(KafkaException) as raised:
        retrying(read, "reading state", within=0.05, pause=0.01)
    assert raised.value.args[0].code() == KafkaError._DESTROY_BROKER
    assert 1 <= len(calls) < 100
