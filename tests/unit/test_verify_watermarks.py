"""kafka_diode.verify asks a partition's watermarks again while its leadership moves (a cluster
node restarted a moment ago), and gives up on anything else at once."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kafka_diode.verify import _watermarks


class _Answers:
    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)

    def get_watermark_offsets(self, _tp: TopicPartition, timeout: float) -> tuple[int, int]:
        del timeout
        answer = self.answers.pop(0)
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        assert isinstance(answer, tuple)
        return answer


@pytest.mark.parametrize(
    "code",
    # the leader restarted a moment ago; or it is down, and its handle was dropped under the ask
    [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._DESTROY_BROKER],
)
def test_a_moving_leader_is_asked_again(code: int) -> None:
    consumer = _Answers(KafkaError(code), (0, 42))
    assert _watermarks(consumer, TopicPartition("t", 0), time.monotonic() + 10) == (0, 42)


def test_other_errors_are_raised_at_once() -> None:
    consumer = _Answers(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), (0, 42))
    with pytest.raises(KafkaException):
        _watermarks(consumer, TopicPartition("t", 0), time.monotonic() + 10)
