"""The dedup writer against the downstream broker's limits (real broker, no Spark).

The per-task writer (``PartitionWriter``, what each write task runs) and the driver's start-up
check of a fixed clean topic; the count of replaced timestamps the task hands back is folded into
the metric by the driver (tests/unit/test_dedup_account.py).

1. Source timestamps far from the broker's clock (2 h ahead, 30 days behind) reach a clean topic
   the dedup creates unchanged; a pre-existing clean topic with Kafka 4's default window (one hour
   ahead) gets the record it would refuse with the dedup's time and the source timestamp in a
   header -- the batch commits, nothing is lost, no other record is affected.
2. Records of 3 MB (over librdkafka's and Kafka's 1 MB defaults) travel raw -> clean.
3. A clean topic whose max.message.bytes is below what MAX_RECORD_SIZE needs stops the writer
   with an error naming the setting, in the task and at the driver's start-up; nothing is
   written.
4. The write producers' batches fit the gap and progress topics they find: 8 MiB where the dedup
   created them, the brokers' 1 MB where they were created without a limit, where a transaction
   of 3 MB of gap records commits (and fails with 8 MiB batches).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import pytest
from confluent_kafka import KafkaException

from common.errors import ServiceError
from common.topic_limits import record_limit
from dedup.batch_driver import TransactionalBatchWriter
from dedup.clean_topics import create_dedup_topics, write_batch_bytes
from dedup.fence import WRITE_BATCH_BYTES, init_producer
from dedup.transaction import ORIGINAL_TIMESTAMP_HEADER, PartitionWriter
from dedup.writer_settings import WriterSettings
from tests.integration.test_dedup_writer import (
    SESSION,
    SOURCE,
    SOURCE_RECORDS,
    decisions,
    make_writer,
)
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka]

HOUR = 3_600_000
BIG = {"message.max.bytes": record_limit(16 * 1024 * 1024)}


def raw(offset: int, value: bytes, source_ts: int, headers=()) -> Record:
    """A raw record as the receiver writes it: receiver's time, source timestamp in the header."""
    SOURCE_RECORDS[0, offset] = (b"k%d" % offset, value, tuple(headers), source_ts)
    return Record(
        key=f"{SOURCE}:0:{offset}".encode(),
        value=value,
        headers=(
            *headers,
            ("diode.key", b"k%d" % offset),
            ("diode.timestamp", b"%d" % source_ts),
            ("diode.timestamp-type", b"1"),
            ("diode.session", SESSION),
        ),
        partition=0,
    )


def _skewed(now: int) -> list[int]:
    return [now + 2 * HOUR, now - 30 * 24 * HOUR, now, now + 2 * HOUR + 5]


def _write(downstream_kafka, records, tag_topic: str, *, precreate: dict[str, str] | None):
    produce_records(downstream_kafka, tag_topic, records, config=BIG)
    if precreate is not None:
        create_topic(
            downstream_kafka, f"clean.{tag_topic}.{SOURCE}", partitions=1, config=precreate
        )
    writer = make_writer(downstream_kafka.bootstrap, tag_topic, tag_topic)
    try:
        return writer.write_table(decisions([(0, o, o) for o in range(len(records))]), 0)
    finally:
        writer.close()


@pytest.mark.parametrize("headers", [(), (("trace", b"1"),)])  # the fast path and restore()
def test_skewed_source_timestamps_reach_a_created_clean_topic_unchanged(
    downstream_kafka, headers
) -> None:
    raw_topic = create_topic(downstream_kafka, partitions=1)
    stamps = _skewed(int(time.time() * 1000))
    records = [raw(i, b"v%d" % i, ts, headers) for i, ts in enumerate(stamps)]
    result = _write(downstream_kafka, records, raw_topic, precreate=None)
    assert (result.records, result.skipped) == (len(stamps), False)
    clean = consume_all(downstream_kafka, f"clean.{raw_topic}.{SOURCE}", timeout=30)
    assert sorted((r.value, r.timestamp) for r in clean) == sorted(
        (b"v%d" % i, ts) for i, ts in enumerate(stamps)
    )
    assert all(tuple(r.headers) == headers and r.timestamp_type == 1 for r in clean)
    assert result.replaced == 0


@pytest.mark.parametrize("headers", [(), (("trace", b"1"),)])
def test_a_clean_topic_with_the_default_window_gets_the_dedups_time_and_loses_nothing(
    downstream_kafka, headers
) -> None:
    raw_topic = create_topic(downstream_kafka, partitions=1)
    now = int(time.time() * 1000)
    stamps = _skewed(now)
    records = [raw(i, b"v%d" % i, ts, headers) for i, ts in enumerate(stamps)]
    # {} = the broker's defaults: Kafka 4 refuses CreateTime more than an hour ahead
    result = _write(downstream_kafka, records, raw_topic, precreate={})
    assert (result.records, result.skipped) == (len(stamps), False)
    clean = consume_all(downstream_kafka, f"clean.{raw_topic}.{SOURCE}", timeout=30)
    by_value = {r.value: r for r in clean}
    assert len(clean) == len(by_value) == len(stamps)
    after = int(time.time() * 1000)
    for i, ts in enumerate(stamps):
        r = by_value[b"v%d" % i]
        if ts > now + HOUR:  # refused by the topic: the dedup's time, the source one in a header
            assert now <= r.timestamp <= after
            assert tuple(r.headers) == (*headers, (ORIGINAL_TIMESTAMP_HEADER, b"%d" % ts))
        else:
            assert r.timestamp == ts
            assert tuple(r.headers) == headers
    assert result.replaced == 2


def test_records_of_3_mb_travel_raw_to_clean(downstream_kafka) -> None:
    raw_topic = create_topic(downstream_kafka, partitions=1)
    values = [os.urandom(3 * 1024 * 1024 + i) for i in range(3)]
    now = int(time.time() * 1000)
    records = [raw(i, v, now + i) for i, v in enumerate(values)]
    result = _write(downstream_kafka, records, raw_topic, precreate=None)
    assert result.records == 3
    clean = consume_all(downstream_kafka, f"clean.{raw_topic}.{SOURCE}", timeout=60)
    assert sorted(r.value for r in clean) == sorted(values)


def test_a_clean_topic_too_small_for_max_record_size_stops_the_writer(downstream_kafka) -> None:
    raw_topic = create_topic(downstream_kafka, partitions=1)
    clean = create_topic(downstream_kafka, partitions=1, config={"max.message.bytes": "1048588"})
    for name in (f"gaps.{raw_topic}", f"progress.{raw_topic}"):
        create_topic(downstream_kafka, name, partitions=1, config={"cleanup.policy": "compact"})
    produce_records(downstream_kafka, raw_topic, [raw(0, b"v", int(time.time() * 1000))])
    settings = WriterSettings(
        bootstrap_servers=downstream_kafka.bootstrap,
        clean_topic=clean,
        gap_topic=f"gaps.{raw_topic}",
        progress_topic=f"progress.{raw_topic}",
        transactional_id=f"txn.{raw_topic}",
        raw_topics=(raw_topic, f"control.{raw_topic}"),
    )
    task = PartitionWriter(settings, f"query-{raw_topic}", 0)
    try:
        with pytest.raises(ServiceError, match=r"max\.message\.bytes=16781312") as info:
            task.write_table(decisions([(0, 0, 0)]), 0)
    finally:
        task.close()
    assert "MAX_RECORD_SIZE" in str(info.value)
    # the driver checks a fixed clean topic at start-up, before any task runs
    driver = TransactionalBatchWriter(settings)
    with pytest.raises(ServiceError, match=r"max\.message\.bytes=16781312"):
        driver.prepare()
    assert consume_all(downstream_kafka, clean, timeout=5) == []


def test_a_fixed_clean_topic_is_checked_by_the_driver_and_its_window_shipped_to_the_tasks(
    downstream_kafka,
) -> None:
    raw_topic = create_topic(downstream_kafka, partitions=1)
    clean = create_topic(downstream_kafka, partitions=1, config={})  # Kafka 4: 1 h ahead at most
    for name in (f"gaps.{raw_topic}", f"progress.{raw_topic}"):
        create_topic(downstream_kafka, name, partitions=1, config={"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    stamps = _skewed(now)
    produce_records(
        downstream_kafka, raw_topic, [raw(i, b"v%d" % i, ts) for i, ts in enumerate(stamps)]
    )
    settings = WriterSettings(
        bootstrap_servers=downstream_kafka.bootstrap,
        clean_topic=clean,
        gap_topic=f"gaps.{raw_topic}",
        progress_topic=f"progress.{raw_topic}",
        transactional_id=f"txn.{raw_topic}",
        raw_topics=(raw_topic, f"control.{raw_topic}"),
    )
    driver = TransactionalBatchWriter(settings)
    driver.prepare()
    task = pickle.loads(pickle.dumps(driver.task_function()))  # as Spark ships it to executors
    spec = task.args[0].in_batch(f"query-{raw_topic}", 0, now)
    assert spec.windows[clean].after_ms == HOUR
    task = PartitionWriter(settings, spec.query_id, 0, windows=spec.windows)
    try:
        result = task.write_table(decisions([(0, o, o) for o in range(len(stamps))]), 0)
    finally:
        task.close()
    assert (result.records, result.replaced) == (len(stamps), 2)
    got = {r.value: r for r in consume_all(downstream_kafka, clean, timeout=30)}
    assert len(got) == len(stamps)
    for i, ts in enumerate(stamps):
        replaced = dict(got[b"v%d" % i].headers).get(ORIGINAL_TIMESTAMP_HEADER)
        assert replaced == (b"%d" % ts if ts > now + HOUR else None)


def test_the_write_batches_fit_the_gap_and_progress_topics_they_find(downstream_kafka) -> None:
    """docs/dedup-internals.md "A task's fixed cost": librdkafka has one batch size for every
    topic a producer writes, and the broker refuses a batch over a topic's max.message.bytes."""
    tag = create_topic(downstream_kafka, partitions=1)  # a fresh name
    ours = WriterSettings(
        bootstrap_servers=downstream_kafka.bootstrap,
        clean_topic=f"clean.{tag}",
        gap_topic=f"gaps.{tag}",
        progress_topic=f"progress.{tag}",
        transactional_id=f"txn.{tag}",
        # the batch leaves whole at the commit, however slowly a loaded host produces it
        kafka_conf={"linger.ms": "30000"},
    )
    create_dedup_topics(ours, [ours.gap_topic, ours.progress_topic], compact=True)
    assert write_batch_bytes(ours) == WRITE_BATCH_BYTES
    theirs = dataclasses.replace(ours, gap_topic=f"their-gaps.{tag}")
    # created elsewhere on a broker with Kafka's default limit (this test broker's is larger)
    kafka_default = {"cleanup.policy": "compact", "max.message.bytes": "1048588"}
    create_topic(downstream_kafka, theirs.gap_topic, partitions=1, config=kafka_default)
    found = write_batch_bytes(theirs)
    assert found == 1_048_588
    committed = {}
    for batch_bytes in (found, WRITE_BATCH_BYTES):
        producer = init_producer(
            dataclasses.replace(theirs, write_batch_bytes=batch_bytes), f"txn.{tag}.{batch_bytes}"
        )
        producer.begin_transaction()
        for i in range(3_000):  # 3 MB of gap-record-sized records in one partition
            producer.produce(theirs.gap_topic, b"g" * 1_000, b"%d" % i, partition=0)
            producer.poll(0)
        try:
            producer.commit_transaction(60)
        except KafkaException:
            committed[batch_bytes] = False
            producer.abort_transaction(60)
        else:
            committed[batch_bytes] = True
    assert committed == {found: True, WRITE_BATCH_BYTES: False}
    assert len(consume_all(downstream_kafka, theirs.gap_topic, timeout=10)) == 3_000
