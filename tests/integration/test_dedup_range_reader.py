"""A direct task's offset range read with librdkafka (``dedup/range_reader.py``), real broker.

The range is the task's whole input: exactly ``[start, end)`` of its raw partition, in Arrow
batches bounded in bytes, ended by the consumer's position where a commit marker takes the last
offset, and records deleted before they were read either stop the task (``FAIL_ON_DATA_LOSS``)
or are passed over with a WARNING.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, TopicPartition

from common.errors import ServiceError
from dedup import range_reader
from dedup.range_reader import RangeReading, read_range
from dedup.raw_batch import RawBatch
from dedup.raw_position import consumer_conf
from runtime import kafka
from tests.kafka_helpers import Record, create_topic, produce_records

pytestmark = [pytest.mark.kafka]


@pytest.fixture(autouse=True)
def _close_kept_consumers() -> Iterator[None]:
    yield
    range_reader.close()


def reading(bootstrap: str, *, fail_on_data_loss: bool = False) -> RangeReading:
    conf = consumer_conf({"bootstrap.servers": bootstrap}, {}, group_id="test-range-reader")
    return RangeReading(conf=conf, fail_on_data_loss=fail_on_data_loss)


def offsets(batches: list[RawBatch]) -> list[int]:
    return [o for b in batches for o in b.offsets]


def test_a_range_is_read_exactly_in_batches_bounded_in_bytes(downstream_kafka) -> None:
    topic = create_topic(downstream_kafka, partitions=2)
    produce_records(downstream_kafka, topic, [
        Record(b"k%d" % i, bytes([i]) * 1000, headers=(("h", b"v%d" % i),), partition=1)
        for i in range(100)
    ])  # fmt: skip
    batches = list(read_range(reading(downstream_kafka.bootstrap), topic, 1, 10, 90,
                              max_batch_bytes=8000))  # fmt: skip
    assert offsets(batches) == list(range(10, 90))
    # at most the bound, or one record past it
    assert all(sum(len(v or b"") for v in b.values) <= 8000 + 1000 for b in batches)
    assert len(batches) >= 10
    first = batches[0]
    assert (first.topic, first.partition) == (topic, 1)
    assert (first.keys[0], first.values[0], first.offsets[0]) == (b"k10", bytes([10]) * 1000, 10)
    assert list(first.headers[0]) == [("h", b"v10")]
    # the worker's consumer reads on for the next task, in another partition too
    produce_records(downstream_kafka, topic, [Record(b"x", b"y", partition=0)] * 3)
    again = list(read_range(reading(downstream_kafka.bootstrap), topic, 0, 0, 3))
    assert offsets(again) == [0, 1, 2]
    assert len(range_reader._kept) == 1


def test_a_range_that_ends_in_a_commit_marker_ends(downstream_kafka) -> None:
    topic = create_topic(downstream_kafka, partitions=1)
    producer = kafka.producer({"bootstrap.servers": downstream_kafka.bootstrap,
                               "transactional.id": f"{topic}-writer"})  # fmt: skip
    assert isinstance(producer, Producer)
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, b"v%d" % i, partition=0)
    producer.commit_transaction(30)
    consumer = kafka.consumer({"bootstrap.servers": downstream_kafka.bootstrap,
                               "group.id": "marks"})  # fmt: skip
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.close()
    assert high == 6  # five records and the commit marker
    batches = list(read_range(reading(downstream_kafka.bootstrap), topic, 0, 0, high, stall_s=20))
    assert offsets(batches) == [0, 1, 2, 3, 4]


def test_records_deleted_before_the_read_stop_it_or_are_passed_over(
    downstream_kafka, caplog: pytest.LogCaptureFixture
) -> None:
    topic = create_topic(downstream_kafka, partitions=1)
    produce_records(downstream_kafka, topic, [Record(None, b"v%d" % i, partition=0)
                                              for i in range(10)])  # fmt: skip
    admin = kafka.admin({"bootstrap.servers": downstream_kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        future.result(30)
    strict = reading(downstream_kafka.bootstrap, fail_on_data_loss=True)
    with pytest.raises(ServiceError, match=r"records 2\.\.5 .*FAIL_ON_DATA_LOSS=true"):
        list(read_range(strict, topic, 0, 2, 10))
    with caplog.at_level(logging.WARNING):
        batches = list(read_range(reading(downstream_kafka.bootstrap), topic, 0, 2, 10))
    assert offsets(batches) == [6, 7, 8, 9]
    assert "raw records 2..5" in caplog.text
    # a range wholly deleted reads nothing
    assert list(read_range(reading(downstream_kafka.bootstrap), topic, 0, 0, 4)) == []
