"""The dedup's write task against a real broker, without Spark (fast).

1. The clean records are exactly the records the ``run`` rows select, restored from the payload
   the rows carry: source key (null and empty kept), value (null kept), source headers (null
   values, a ``diode.*`` name and order kept), timestamp; records not selected are not written,
   and nothing is read back from the raw topic.
2. A run payload that does not decode fails the batch; nothing of it becomes visible.
3. A batch written for longer than ``transaction.timeout.ms`` (one transaction: the buckets
   layout) fails with the setting that lets its replay commit, and commits with it raised.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from common.errors import ServiceError
from common.raw_run import RunBuilder
from dedup import fence
from dedup.rows import COLUMN_NAMES, KIND_RUN, KIND_STAT, STAT_COLUMNS, pack_selection
from dedup.transaction import PartitionWriter
from dedup.writer_settings import WriterSettings
from tests.kafka_helpers import Record, consume_all, create_topic

pytestmark = [pytest.mark.kafka]

SOURCE = "orders.eu"
SESSION = b"ab" * 16
#: (source partition, offset) -> (key, value, headers, timestamp) of every raw_record() made
SOURCE_RECORDS: dict[tuple[int, int], tuple[bytes | None, bytes | None, tuple, int]] = {}


def raw_record(src_partition: int, offset: int, key: bytes | None, value: bytes | None,
               headers: tuple[tuple[str, bytes | None], ...], ts: int) -> Record:  # fmt: skip
    SOURCE_RECORDS[src_partition, offset] = (key, value, headers, ts)
    provenance = (
        ("diode.key", key),
        ("diode.timestamp", b"%d" % ts),
        ("diode.timestamp-type", b"1"),
        ("diode.session", SESSION),
    )
    return Record(
        key=f"{SOURCE}:{src_partition}:{offset}".encode(),
        value=value,
        headers=headers + provenance,
        partition=0,
        timestamp=ts,
    )


def decisions(rows: list[tuple[int, int, int]]) -> pa.Table:
    """As the stateful step emits them: one ``run`` row per source partition carrying the
    records ``(source partition, source offset, _)`` (made by ``raw_record``), + a stat row."""
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _ in rows:
        by_partition.setdefault(partition, []).append(offset)
    payloads, selections, counts, parts = [], [], [], sorted(by_partition)
    for p in parts:
        offsets = sorted(by_partition[p])
        first, last = offsets[0], offsets[-1]
        key, value, headers, ts = SOURCE_RECORDS[p, first]
        run = RunBuilder(SOURCE, p, 1, first, ts)
        for o in range(first, last + 1):
            key, value, headers, ts = SOURCE_RECORDS.get((p, o), (b"-", b"-", (), ts))
            run.append(o, ts, key, value, headers)
        payloads.append(run.encode())
        chosen = set(offsets)
        ranges = [(o - first, o - first) for o in range(first, last + 1) if o in chosen]
        selections.append(pack_selection(ranges))
        counts.append(len(offsets))
    n = len(parts) + 1
    columns: dict[str, Any] = {name: pa.nulls(n) for name in COLUMN_NAMES}
    columns.update(
        kind=[KIND_RUN] * len(parts) + [KIND_STAT],
        src_topic=[SOURCE] * n,
        src_partition=pa.array([*parts, 0], pa.int32()),
        src_offset=pa.nulls(n, pa.int64()),
        payload=pa.array([*payloads, None], pa.binary()),
        selection=pa.array([*selections, None], pa.binary()),
        records=pa.array([*counts, None], pa.int64()),
        gap_key=pa.nulls(n, pa.binary()),
        gap_value=pa.nulls(n, pa.binary()),
        state_bytes=pa.nulls(n, pa.int64()),
    )
    for name in STAT_COLUMNS:
        columns[name] = pa.array([None] * len(parts) + [len(rows)], pa.int64())
    return pa.table(columns)


def settings_for(bootstrap: str, raw: str, tag: str) -> WriterSettings:
    return WriterSettings(
        bootstrap_servers=bootstrap,
        clean_topic=f"clean.{tag}.{{topic}}",
        gap_topic=f"gaps.{tag}",
        progress_topic=f"progress.{tag}",
        transactional_id=f"txn.{tag}",
        new_topic_partitions=2,
        raw_topics=(raw, f"control.{tag}"),
    )


def make_writer(bootstrap: str, raw: str, tag: str, partition: int = 0) -> PartitionWriter:
    for name in (f"gaps.{tag}", f"progress.{tag}"):  # ready (led) before the fence reads it
        create_topic(bootstrap, name, partitions=1, config={"cleanup.policy": "compact"})
    return PartitionWriter(settings_for(bootstrap, raw, tag), f"query-{tag}", partition)


def test_clean_records_are_the_selected_records_restored_exactly(downstream_kafka) -> None:
    raw = create_topic(downstream_kafka, partitions=1)
    tag = raw
    source = [
        (None, b"v0", ()),
        (b"", None, (("h", None), ("diode.key", b"user"), ("h", b"2"))),
        (b"k2", b"", (("only", b"x"),)),
        (b"k3", b"v3", ()),
    ]
    records = []
    for offset, (key, value, headers) in enumerate(source):
        records.append(
            raw_record(offset % 2, offset, key, value, headers, 1_700_000_000_000 + offset)
        )
    assert len(records) == 4
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=2)

    writer = make_writer(downstream_kafka.bootstrap, raw, tag)
    try:
        # partition 0 holds 0 and 2 (1 between them is another partition's: a selection gap)
        result = writer.write_table(decisions([(o % 2, o, o) for o in range(4)]), 0)
    finally:
        writer.close()
    assert (result.records, result.skipped) == (4, False)
    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
    got = {(r.partition, r.timestamp - 1_700_000_000_000): r for r in clean}
    assert len(clean) == len(got) == 4
    for offset, (key, value, headers) in enumerate(source):
        r = got[(offset % 2, offset)]
        assert (r.key, r.value, tuple(r.headers)) == (key, value, headers), offset
        assert r.timestamp_type == 1


def test_a_run_that_does_not_decode_fails_the_batch(downstream_kafka) -> None:
    raw = create_topic(downstream_kafka, partitions=1)
    tag = raw
    for o in range(3):
        raw_record(0, o, b"k", b"v", (), 1_700_000_000_000)
    table = decisions([(0, o, o) for o in range(3)])
    payload = table.column("payload").to_pylist()
    payload[0] = payload[0][:-3]  # truncated
    table = table.set_column(
        COLUMN_NAMES.index("payload"), "payload", pa.array(payload, pa.binary())
    )
    writer = make_writer(downstream_kafka.bootstrap, raw, tag)
    try:
        with pytest.raises(ServiceError, match="no longer decodes"):
            writer.write_table(table, 0)
    finally:
        writer.close()
    assert consume_all(downstream_kafka, f"progress.{tag}", timeout=10) == []


def test_a_batch_written_past_the_transaction_timeout_names_the_setting_that_lets_it_commit(
    downstream_kafka, caplog
) -> None:
    """The broker aborts a transaction open longer than the producer's ``transaction.timeout.ms``
    (it looks every 10 s), and Spark replays the same batch after every restart: with a timeout
    of 3 s, a partition's rows taking 15.6 s to come (a large batch) log a WARNING at half the
    timeout and fail naming ``KAFKA_CONF_TRANSACTION_TIMEOUT_MS``, nothing visible; with it
    raised as the error says, the same batch commits exactly once (docs/operations.md "Known
    limitations")."""
    raw = create_topic(downstream_kafka, partitions=1)
    tag = raw
    for o in range(24):
        raw_record(0, o, b"k", b"v%d" % o, (), 1_700_000_000_000 + o)
    tables = [decisions([(0, o, o)]) for o in range(24)]

    def slow_rows() -> Iterator[pa.RecordBatch]:
        for table in tables:
            yield from table.to_batches()
            time.sleep(0.65)  # the stateful step's work on a large batch: the transaction is open

    settings = make_writer(downstream_kafka.bootstrap, raw, tag).settings  # and its topics
    short = PartitionWriter(
        dataclasses.replace(settings, kafka_conf={"transaction.timeout.ms": "3000"}),
        f"query-{tag}",
        0,
    )
    try:
        with (
            caplog.at_level(logging.WARNING, logger="dedup.commit"),
            pytest.raises(ServiceError, match="set KAFKA_CONF_TRANSACTION_TIMEOUT_MS above"),
        ):
            short.write_batches(slow_rows(), 0)
    finally:
        short.close()
    assert [r.getMessage() for r in caplog.records if "has been open" in r.getMessage()]
    assert consume_all(downstream_kafka, f"progress.{tag}", timeout=10) == []
    assert consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=10) == []

    raised = PartitionWriter(
        dataclasses.replace(settings, kafka_conf={"transaction.timeout.ms": "60000"}),
        f"query-{tag}",
        0,
    )
    try:
        result = raised.write_batches(slow_rows(), 0)
    finally:
        raised.close()
    assert (result.records, result.skipped) == (24, False)
    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", 24, timeout=30)
    assert sorted(r.value for r in clean) == sorted(b"v%d" % o for o in range(24))


def test_a_write_task_hands_librdkafka_at_most_four_batches_per_clean_partition(
    downstream_kafka, monkeypatch
) -> None:
    """``dedup.fence.QUEUED_BATCHES``: an idempotent producer's broker thread polls busily while
    a ready batch waits behind 5 requests in flight to its partition, so a task producing 24 MB
    into 2 clean partitions with 64 KiB batches holds at most 4 batches per partition (and a
    run: the bound is checked between runs), not the 128 MiB its queue admits; every record is
    written once."""
    raw = create_topic(downstream_kafka, partitions=1)
    tag = raw
    value = bytes(range(250)) * 40  # 10,000 B
    for p in (0, 1):
        for o in range(1_200):
            raw_record(p, o, b"k", value, (), 1_700_000_000_000 + o)
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=2)
    held: list[int] = []

    class Watched(Producer):
        def produce(self, *args: Any, **kwargs: Any) -> None:
            held.append(len(self))
            super().produce(*args, **kwargs)

    monkeypatch.setattr(fence.kafka, "producer", Watched)

    def runs() -> Iterator[pa.RecordBatch]:
        for first in range(0, 1_200, 6):
            rows = [(p, o, o) for p in (0, 1) for o in range(first, first + 6)]
            yield from decisions(rows).to_batches()

    settings = make_writer(downstream_kafka.bootstrap, raw, tag).settings  # and its topics
    batch = 65_536
    writer = PartitionWriter(
        dataclasses.replace(settings, kafka_conf={"batch.size": str(batch)}), f"query-{tag}", 0
    )
    try:
        result = writer.write_batches(runs(), 0)
    finally:
        writer.close()
    assert (result.records, result.skipped) == (2_400, False)
    allowed = (2 * fence.QUEUED_BATCHES * batch + 12 * len(value)) // len(value)
    assert len(held) >= 2_400
    assert max(held) <= allowed, (max(held), allowed)
    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", 2_400, timeout=60)
    assert sorted((r.partition, r.timestamp) for r in clean) == sorted(
        (p, 1_700_000_000_000 + o) for p in (0, 1) for o in range(1_200)
    )
