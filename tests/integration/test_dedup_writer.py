"""The dedup writer's re-read path against a real broker, without Spark (fast).

1. The clean records are the raw records the decision rows name, restored exactly: source key
   (null and empty kept), value (null kept), source headers (null values, a ``diode.*`` name and
   order kept; provenance stripped), timestamp; duplicates and raw records not named are not
   written.
2. A named raw record that retention deleted before the re-read fails the batch with an error
   naming raw topic, partition and offset; nothing of the batch becomes visible.
3. A re-read raw record whose key is not the source offset the decision names (the bulk key
   check) fails the batch naming that record; nothing becomes visible.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from common.errors import ServiceError
from dedup.positions import KIND_RECORDS, pack_positions
from dedup.reread import RawRecordGoneError
from dedup.writer import PartitionWriter, WriterSettings
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka]

SOURCE = "orders.eu"
SESSION = b"ab" * 16
STAT_COLUMNS = (
    "delivered", "duplicates", "malformed", "heartbeats", "resets", "open_gaps", "state_bytes",
    "below_window", "budget_evictions", "expired_gaps",
)  # fmt: skip


def raw_record(src_partition: int, offset: int, key: bytes | None, value: bytes | None,
               headers: tuple[tuple[str, bytes | None], ...], ts: int) -> Record:  # fmt: skip
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
    """As the stateful step emits them: one packed ``records`` row per source partition (source
    partition, source offset, raw offset in raw partition 0) + a stat row."""
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for partition, offset, raw_offset in rows:
        by_partition.setdefault(partition, []).append((offset, raw_offset))
    parts = sorted(by_partition)
    blobs = [
        pack_positions(
            [
                [o for o, _ in by_partition[p]],
                [0] * len(by_partition[p]),
                [0] * len(by_partition[p]),
                [r for _, r in by_partition[p]],
            ]
        )
        for p in parts
    ]
    n = len(parts) + 1
    columns: dict[str, Any] = {
        "kind": [KIND_RECORDS] * len(parts) + ["stat"],
        "src_topic": [SOURCE] * n,
        "src_partition": pa.array([*parts, 0], pa.int32()),
        "src_offset": pa.nulls(n, pa.int64()),
        "positions": pa.array([*blobs, None], pa.binary()),
        "gap_key": pa.nulls(n, pa.binary()),
        "gap_value": pa.nulls(n, pa.binary()),
    }
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
        reread_chunk=3,  # several chunks per partition even in a small test
    )


def make_writer(bootstrap: str, raw: str, tag: str, partition: int = 0) -> PartitionWriter:
    for name in (f"gaps.{tag}", f"progress.{tag}"):  # ready (led) before the fence reads it
        create_topic(bootstrap, name, partitions=1, config={"cleanup.policy": "compact"})
    return PartitionWriter(settings_for(bootstrap, raw, tag), f"query-{tag}", partition)


def test_clean_records_are_the_named_raw_records_restored_exactly(downstream_kafka) -> None:
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
    # raw offsets 0..3 = source 0..3, raw 4 = a duplicate of source 1, raw 5 = source 9 (not named)
    records.append(records[1])
    records.append(raw_record(1, 9, b"no", b"no", (), 1))
    produce_records(downstream_kafka, raw, records)
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=2)

    writer = make_writer(downstream_kafka.bootstrap, raw, tag)
    try:
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


def test_a_raw_record_gone_before_the_reread_fails_the_batch(downstream_kafka) -> None:
    raw = create_topic(downstream_kafka, partitions=1)
    tag = raw
    produce_records(
        downstream_kafka,
        raw,
        [raw_record(0, o, b"k", b"v", (), 1_700_000_000_000) for o in range(6)],
    )
    admin = AdminClient({"bootstrap.servers": downstream_kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(raw, 0, 3)]).values():
        future.result(30)  # "retention" removed raw offsets 0..2

    writer = make_writer(downstream_kafka.bootstrap, raw, tag)
    try:
        with pytest.raises(RawRecordGoneError, match=rf"raw record {raw}:0 offset 2 is gone"):
            writer.write_table(decisions([(0, 2, 2), (0, 3, 3), (0, 4, 4)]), 0)
        # a batch naming only records that still exist is written (the writer is usable after)
        result = writer.write_table(decisions([(0, 3, 3), (0, 5, 5)]), 1)
    finally:
        writer.close()
    assert result.records == 2
    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
    # read_committed: the failed batch's records (offset 3 included) never became visible
    assert sorted(r.timestamp for r in clean) == [1_700_000_000_000] * 2
    progress = consume_all(downstream_kafka, f"progress.{tag}", timeout=30)
    assert [b'"batch_id": 1' in (r.value or b"") for r in progress] == [True]


def test_a_raw_record_that_is_not_the_chosen_one_fails_the_batch(downstream_kafka) -> None:
    # The keys are checked per chunk in bulk (writer._keys_match): a wrong key in the middle of a
    # chunk must still fail the batch, and the error must name that record.
    raw = create_topic(downstream_kafka, partitions=1)
    tag = raw
    records = [raw_record(0, o, b"k", b"v", (), 1_700_000_000_000) for o in range(5)]
    records[3] = raw_record(0, 7, b"k", b"v", (), 1_700_000_000_000)  # raw 3 carries source 7
    produce_records(downstream_kafka, raw, records)
    writer = make_writer(downstream_kafka.bootstrap, raw, tag)
    try:
        with pytest.raises(ServiceError, match=rf"raw record {raw}:0 offset 3 is not the record"):
            writer.write_table(decisions([(0, o, o) for o in range(5)]), 0)
    finally:
        writer.close()
    progress = consume_all(downstream_kafka, f"progress.{tag}", timeout=10)
    assert progress == []
