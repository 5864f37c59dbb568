"""The run size and batch size defaults against the dedup's default heap (slow: ~3 minutes).

A backlog of 1.5 GB of 1 KB records in runs cut at the receiver's default ``run_max_bytes``,
deduped by ``kafka-diode dedup`` with its own defaults (``local[2]``, the direct layout's heap,
``MAX_OFFSETS_PER_TRIGGER``): every record reaches the clean topic once. With the receiver's
earlier default (1 MB runs) the same backlog made batches of ~1.5 GB, Arrow could not allocate a
group's buffers (``OutOfMemoryException``) and the JVM exited (docs/benchmarks.md "Dedup").

And ~600 MB of records of 16 MiB (each a run of one, the receiver's default ``max_record_size``),
all of it in the first micro-batch: ``MAX_OFFSETS_PER_TRIGGER`` bounds a batch in records, not
bytes, and the direct layout's heap holds no batch whole (a task streams its raw partition's
records in Arrow batches of at most 4 MiB or one record). What a task does hold through Spark's
source is ~9 copies of the record it handles (its row buffers and Kafka's), so with
``DIRECT_READER=spark`` the heap the dedup starts grows with ``max_record_size`` and the tasks at
once (``dedup.job.driver_heap_mib``): with the least, 512 MB, two tasks of 16 MiB records ran out
of heap. The librdkafka reader's tasks read their records in the Python workers: the least.
"""

from __future__ import annotations

from collections import Counter

import pytest

from common.raw_run import RunBuilder
from dedup.config import DedupConfig, from_sources
from dedup.job import driver_heap_mib
from receiver.config import DEFAULT_RUN_MAX_BYTES
from tests.integration.test_dedup import (
    BASE_TS,
    SESSION,
    SOURCE,
    finish,
    job_env,
    run_dedup,
)
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

VALUE_BYTES = 1000
RECORDS_PER_PARTITION = 500_000
PARTITIONS = 3
MAX_RECORD_SIZE = DedupConfig.__dataclass_fields__["max_record_size"].default


def runs(partition: int) -> list[Record]:
    """One partition's backlog as the receiver writes it: runs as full as ``run_max_bytes``."""
    out: list[Record] = []
    run: RunBuilder | None = None
    size = 0
    for offset in range(RECORDS_PER_PARTITION):
        key, value = b"k%d" % offset, b"%d:" % offset + b"v" * VALUE_BYTES
        if run is not None and size + len(key) + len(value) + 64 > DEFAULT_RUN_MAX_BYTES:
            out.append(_record(run, partition))
            run = None
        if run is None:
            run, size = RunBuilder(SOURCE, partition, 1, offset, BASE_TS + offset), 0
        run.append(offset, BASE_TS + offset, key, value, ())
        size += len(key) + len(value) + 64
    assert run is not None
    out.append(_record(run, partition))
    return out


def _record(run: RunBuilder, partition: int, limit: int = DEFAULT_RUN_MAX_BYTES) -> Record:
    value = run.encode()
    assert len(value) <= limit
    return Record(
        key=run.key().encode(),
        value=value,
        headers=(("diode.session", SESSION.hex().encode()),),
        partition=partition,
    )


def test_a_backlog_of_1kb_records_passes_the_default_heap(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=PARTITIONS)
    for partition in range(PARTITIONS):
        produce_records(downstream_kafka, raw, runs(partition), timeout=300)
    clean_topic = f"clean.{raw}.{SOURCE}"
    create_topic(downstream_kafka, clean_topic, partitions=PARTITIONS)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw)
    # the defaults under test: no MAX_OFFSETS_PER_TRIGGER, no heap setting; windows for 200k
    env |= {"WINDOW_SIZE": "65536", "MAX_WINDOWS": "16", "PERSIST_INTERVAL_MS": "1000"}
    finish(run_dedup(env, "--until-settled"), timeout=900)

    total = PARTITIONS * RECORDS_PER_PARTITION
    clean = consume_all(downstream_kafka, clean_topic, expected_count=total, timeout=300)
    seen = Counter((r.partition, r.timestamp - BASE_TS) for r in clean)
    assert len(seen) == total
    assert max(seen.values()) == 1
    assert {(p, o) for p, o in seen if o >= RECORDS_PER_PARTITION} == set()


#: Record sizes of the large-record backlog, cycled: the largest record a receiver writes by
#: default (``max_record_size`` 16 MiB, less the run's framing), so that both tasks hold one at
#: once.
LARGE_SIZES = ((16 << 20) - 4096,)
LARGE_PER_PARTITION = 12


def large_runs(partition: int) -> list[Record]:
    """One partition's backlog of large records: each a run of one (larger than run_max_bytes)."""
    out: list[Record] = []
    for offset in range(LARGE_PER_PARTITION):
        size = LARGE_SIZES[(offset + partition) % len(LARGE_SIZES)]
        run = RunBuilder(SOURCE, partition, 1, offset, BASE_TS + offset)
        value = b"%d:%d:" % (partition, offset)
        run.append(
            offset, BASE_TS + offset, b"k%d" % offset, value + b"x" * (size - len(value)), ()
        )
        out.append(_record(run, partition, limit=MAX_RECORD_SIZE + (1 << 16)))
    return out


@pytest.mark.parametrize("reader", ["librdkafka", "spark"])
def test_a_backlog_of_records_up_to_max_record_size_passes_the_default_heap(
    downstream_kafka, kafka_topic, tmp_path, reader
) -> None:
    """~600 MB of 16 MiB records, all in the first batch by the offset limit alone
    (``MAX_OFFSETS_PER_TRIGGER`` 10,000), through the heap the dedup sizes for them."""
    raw = kafka_topic(downstream_kafka, partitions=PARTITIONS)
    big = {"message.max.bytes": 64 << 20, "linger.ms": 0}
    for partition in range(PARTITIONS):
        produce_records(downstream_kafka, raw, large_runs(partition), timeout=300, config=big)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw)
    env |= {"WINDOW_SIZE": "65536", "MAX_WINDOWS": "16", "PERSIST_INTERVAL_MS": "1000"}
    env["DIRECT_READER"] = reader
    proc = run_dedup(env, "--until-settled")
    finish(proc, timeout=900)
    heap = driver_heap_mib(512, from_sources(env), raw_partitions=PARTITIONS)
    assert heap > 512 if reader == "spark" else heap == 512
    assert f"JVM heap {heap} MiB" in proc.log_path.read_text()  # type: ignore[attr-defined]

    total = PARTITIONS * LARGE_PER_PARTITION
    clean = consume_all(
        downstream_kafka, f"clean.{raw}.{SOURCE}", expected_count=total, timeout=300,
        config={"fetch.max.bytes": 64 << 20, "receive.message.max.bytes": 80 << 20},
    )  # fmt: skip
    seen = Counter(r.value[: r.value.index(b":", r.value.index(b":") + 1)] for r in clean)
    assert len(seen) == total
    assert max(seen.values()) == 1
    assert sorted(len(r.value) for r in clean) == sorted(
        LARGE_SIZES[(o + p) % len(LARGE_SIZES)]
        for p in range(PARTITIONS)
        for o in range(LARGE_PER_PARTITION)
    )


#: The compressible backlog: raw partitions, and runs (of six 10 KB records) per partition.
COMPRESSIBLE_PARTITIONS = 12
COMPRESSIBLE_RUNS = 1_000


def compressible_runs(partition: int) -> list[Record]:
    """Runs of six 10 KB records that lz4 shrinks ~200-fold (a sensor's zeros, a repeated log)."""
    out: list[Record] = []
    for first in range(0, 6 * COMPRESSIBLE_RUNS, 6):
        run = RunBuilder(SOURCE, partition, 1, first, BASE_TS + first)
        for offset in range(first, first + 6):
            value = b"%d:%d:" % (partition, offset)
            run.append(offset, BASE_TS + offset, b"k%d" % offset, value + b"v" * 10_000, ())
        out.append(_record(run, partition))
    return out


def test_a_compressed_backlog_of_compressible_records_passes_the_default_heap(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    """~730 MB of runs written with lz4 (a receiver with ``kafka.compression.type=lz4``) that
    compress ~200-fold: a fetch of the source's 1 MB per partition holds ~200 MB of runs. Spark's
    Kafka source keeps each partition's last poll between tasks, so at the consumer's 500 records
    per poll twelve partitions kept ~30 MB each and the 512 MB heap ran out (the source's
    ``kafka.max.poll.records``, dedup/job.py)."""
    raw = kafka_topic(downstream_kafka, partitions=COMPRESSIBLE_PARTITIONS)
    lz4 = {"compression.type": "lz4", "linger.ms": 50}
    for partition in range(COMPRESSIBLE_PARTITIONS):
        produce_records(
            downstream_kafka, raw, compressible_runs(partition), timeout=300, config=lz4
        )
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw)
    env |= {"WINDOW_SIZE": "65536", "MAX_WINDOWS": "16", "PERSIST_INTERVAL_MS": "1000"}
    finish(run_dedup(env, "--until-settled"), timeout=900)

    total = COMPRESSIBLE_PARTITIONS * COMPRESSIBLE_RUNS * 6
    clean = consume_all(
        downstream_kafka, f"clean.{raw}.{SOURCE}", expected_count=total, timeout=300
    )
    seen = Counter(r.value[: r.value.index(b":", r.value.index(b":") + 1)] for r in clean)
    assert len(seen) == total
    assert max(seen.values()) == 1
