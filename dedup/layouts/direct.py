"""The direct layout: each raw partition is detected, written and keeps its own state by itself.

Plan (driver): the one raw topic alone, through ``dedup/raw_ranges.py``'s source (one row per raw
partition with input: its offset range; ``DIRECT_READER=librdkafka``, the default) or Spark's
Kafka source (its rows as they come; ``DIRECT_READER=spark``); no projection, no shuffle, no
stateful operator; the state topic gets one partition per raw partition.
Tasks (executors): one per transaction group with input (raw partition ``p`` is in group ``p mod``
the checkpoint's ``transaction_groups``), reading its raw partitions' ranges one after another
(``dedup/range_reader.py``); without groups (a checkpoint created before them, or
``DIRECT_TRANSACTIONS`` at least the partition count) as many as Spark runs at once, or one per
raw partition taking Spark's source's rows. A group's records are classified, detected and
committed in one transaction, each raw partition with its own detectors' state record
(``dedup/direct_task.py``). Ticks go into every raw partition, since each raw partition's task
runs its gap scans; a reset goes into the raw partition its source partition lands in
(``common.raw_topic.raw_partition_of``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from common.errors import GapStateError, ServiceError
from common.raw_topic import raw_partition_of
from dedup.direct_state import STATE_RECORD_LIMIT
from dedup.direct_task import DirectTransaction, group_of
from dedup.layouts import ResetTopics, StateLayout, TaskRun
from dedup.range_reader import RangeReading, read_range
from dedup.raw_batch import RawBatch, source_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from dedup.batch_driver import TransactionalBatchWriter
    from dedup.config import DedupConfig
    from dedup.writer_settings import TaskSpec

log = logging.getLogger(__name__)

#: Spark's ``arrow.maxBytesPerBatch`` for a direct checkpoint: its task classifies, detects and
#: writes each Arrow batch as it comes, so smaller batches let the JVM read and convert the next
#: one meanwhile (at 16 MiB a task's whole input of a backlog batch was one Arrow batch, and its
#: worker waited for all of it). 4 MiB measured 4.1-4.8 CPU-s per M at a fan-in of 32 (16 MiB:
#: 4.8-5.4), 3.6-5.4 at one (16 MiB: 4.1-4.4), and 1.1x the rate to the clean topic side by side
#: with the peer (docs/benchmarks.md "Dedup").
ARROW_MAX_BYTES_PER_BATCH: Final = 4 << 20
#: The heap of a JVM this process launches for a direct checkpoint (``SPARK_CONF_*`` overrides):
#: Spark's least. The direct layout streams each raw partition's records from the source through
#: its task (no shuffle, no state store), so the default 1 GB only let the collector defer work:
#: peak Pss 926 MB against 1,079 at 20,000 records/s, the same p99, and a 1.5 GB backlog of 1 KB
#: records passed (docs/benchmarks.md "Dedup"). Records larger than a few MiB raise it
#: (``job.driver_heap_mib``).
DRIVER_MEMORY_MIB: Final = 512
#: the raw topic must exist before a new checkpoint's first start (its count is recorded)
NEEDS_RAW_TOPIC: Final = True
#: Spark's checkpoint file manager over Hadoop's ``FileSystem`` API, not ``FileContext``: for a
#: local path without Hadoop's native library (pyspark ships none) ``FileContext`` starts a
#: ``readlink`` process per path of every rename, 16 per batch for the offset and commit logs,
#: ~55 ms of CPU per micro-batch outside the JVM (docs/benchmarks.md "Dedup"). A direct
#: checkpoint is local (``session_layout``) and holds only those logs (its state is in Kafka);
#: on a local disk neither manager's rename is atomic (each checks that the file is new first),
#: and the effectively-once argument rests on the fence, not on it (``dedup/commit.py``).
CHECKPOINT_FILE_MANAGER: Final = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

#: The state topic (created by the job): a record holds a raw partition's whole container of
#: detectors, and compaction keeps each key's last; segments roll every 10 minutes so that the
#: cleaner can drop the older records (one per raw partition and batch).
STATE_TOPIC_CONFIG: Final = {
    "max.message.bytes": str(STATE_RECORD_LIMIT),
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
}


#: The JIT's C1 compiler alone, for a checkpoint read with librdkafka (``DIRECT_READER``'s
#: default), where the JVM plans, schedules and logs offsets and handles no record: C2 kept
#: compiling that per-batch code for minutes (0.02-0.04 CPU-s a batch at minutes 4-6 live); with
#: C1 alone the JVM's CPU per batch fell by a third live at 10 MB/s, and a 200 B backlog ran at
#: the same rate and CPU (docs/benchmarks.md "Dedup"). C1's frames are larger: a query's stop
#: once overflowed a thread's default 1 MiB stack in Spark's regular expressions.
JIT_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -Xss4m"


def jit_options(config: DedupConfig) -> str:
    """C1 alone with the librdkafka reader; Spark's source carries every record through the JVM
    and keeps tiered compilation."""
    return JIT_OPTIONS if config.direct_reader == "librdkafka" else ""


def plan(
    spark: SparkSession,
    config: DedupConfig,
    writer: TransactionalBatchWriter,
    layout: StateLayout,
) -> DataFrame:
    """The write tasks over the raw topic's offset ranges (the range source's ``read`` runs
    them), or over its rows as they come from Spark's Kafka source (``DIRECT_READER``; each
    task classifies its own), after readying the state topic and ``writer`` (``ready``)."""
    from dedup import job  # noqa: PLC0415  imports pyspark (the driver only)

    ready(writer, config, layout)
    if config.direct_reader == "spark":
        return job.mapped(job.raw_stream(spark, config, source_topics(config)), writer)
    return range_stream(spark, config, writer, layout)


#: The group id of the tasks' consumers: they never join it nor commit (assign, read, unassign).
READER_GROUP: Final = "kafka-diode-dedup.raw-reader"
#: librdkafka's prefetch per assigned raw partition, in KiB: what it fetched past a range's end
#: is dropped at the task's end (and fetched again by the next batch's task), so the queue holds
#: two of the task's Arrow batches, not the retention probe's 32 MiB.
READER_QUEUE_KBYTES: Final = 8192


def range_stream(
    spark: SparkSession,
    config: DedupConfig,
    writer: TransactionalBatchWriter,
    layout: StateLayout,
) -> DataFrame:
    """``dedup/raw_ranges.py``'s source over the raw topic, one task per transaction group of
    ``layout`` (or as many as Spark runs at once), each running ``writer``'s write task, which
    reads the ranges with the consumer settings the retention probe has
    (``raw_position.consumer_conf``)."""
    from dedup import raw_ranges  # noqa: PLC0415  imports pyspark (the driver only)
    from dedup.raw_position import consumer_conf  # noqa: PLC0415

    base = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    conf = consumer_conf(
        base, config.kafka_source, group_id=READER_GROUP, max_record_size=config.max_record_size
    )
    if "queued.max.messages.kbytes" not in config.kafka_conf:
        conf["queued.max.messages.kbytes"] = READER_QUEUE_KBYTES
    writer.reading = RangeReading(conf=conf, fail_on_data_loss=config.fail_on_data_loss)
    options = raw_ranges.source_options(
        config.raw_topics[0],
        conf,
        base,
        max_offsets=config.max_offsets_per_trigger,
        fail_on_data_loss=config.fail_on_data_loss,
        kafka_source=config.kafka_source,
        task=writer.task_function(),
        tasks=spark.sparkContext.defaultParallelism,
        groups=layout.transaction_groups,
    )
    spark.dataSource.register(raw_ranges.RawRangesSource)
    return spark.readStream.format(raw_ranges.SOURCE_NAME).options(**options).load()


def source_topics(config: DedupConfig) -> tuple[str, ...]:
    """The one raw topic alone: ticks and resets go into its partitions."""
    return config.raw_topics


def ready(writer: TransactionalBatchWriter, config: DedupConfig, layout: StateLayout) -> None:
    """Ready a direct checkpoint's run: its state topic, one partition per raw partition, and
    ``writer``'s detector settings.

    Raises:
        GapStateError: several raw topics, a raw topic that does not exist yet, a checkpoint
            with transaction groups read by Spark's source, or a state topic with fewer
            partitions than the raw topic.
    """
    from dedup import job  # noqa: PLC0415
    from dedup.clean_topics import create_dedup_topics  # noqa: PLC0415

    if len(config.raw_topics) != 1:
        raise GapStateError(
            f"this checkpoint has the direct layout, which reads one raw topic, and RAW_TOPICS "
            f"names {len(config.raw_topics)}: set RAW_TOPICS back to its one topic "
            '(docs/dedup.md "The direct layout")'
        )
    if layout.raw_partitions < 1:
        raise GapStateError(
            f"raw topic {config.raw_topics[0]!r} does not exist yet, and the direct layout takes "
            "its partition count at the first start: start the receiver first (it creates the "
            'topic) or create it (docs/dedup.md "The direct layout")'
        )
    if layout.transaction_groups and config.direct_reader == "spark":
        raise GapStateError(
            f"this direct checkpoint commits its raw partitions in {layout.transaction_groups} "
            "transaction groups, and Spark's Kafka source (DIRECT_READER=spark) makes a task per "
            "raw partition, which cannot share a group's transaction: set DIRECT_READER back to "
            'librdkafka (docs/dedup.md "The direct layout")'
        )
    found = create_dedup_topics(
        writer.settings,
        [config.state_topic],
        compact=True,
        partitions=layout.raw_partitions,
        config=STATE_TOPIC_CONFIG,
    )
    if found.get(config.state_topic, 0) < layout.raw_partitions:
        raise GapStateError(
            f"state topic {config.state_topic!r} has {found.get(config.state_topic)} partitions "
            f"and the raw topic {layout.raw_partitions}: it needs one per raw partition (delete "
            "it while no dedup runs, or name another STATE_TOPIC for a new checkpoint)"
        )
    writer.params = job.detect_params(config)
    log.info(
        "state layout: direct (%s of %s, %d partitions; state in %s; raw records read by %s)",
        f"{layout.transaction_groups} transactions a batch, raw partition p in p mod "
        f"{layout.transaction_groups}"
        if layout.transaction_groups
        else "a transaction per raw partition",
        config.raw_topics[0],
        layout.raw_partitions,
        config.state_topic,
        "each task with librdkafka" if config.direct_reader == "librdkafka" else "Spark's source",
    )


def run_task(
    spec: TaskSpec, partition: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[TaskRun]:
    """The raw records of each transaction group the task was given, detected and committed
    (``DirectTransaction``), one after another; nothing without input (no fence, no state read,
    nothing written).

    Raises:
        ServiceError: offset ranges without the reader's settings (nothing is written).
    """
    del partition  # Spark's task number: the raw partitions come with the rows
    first = next(batches, None)
    if first is None:
        return
    if "start" not in first.schema.names:
        raw_topic, raw_partition = source_of(first)
        group = group_of(raw_partition, spec.transaction_groups)
        rows = map(RawBatch.from_arrow, itertools.chain((first,), batches))
        yield _run(spec, raw_topic, group, rows)
        return
    if spec.reading is None:
        raise ServiceError(
            "a direct task got offset ranges without the reader's settings: nothing is written"
        )
    reading = spec.reading
    ranges = [r for b in itertools.chain((first,), batches) for r in b.to_pylist()]
    by_group: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for one in ranges:
        key = (str(one["topic"]), group_of(int(one["partition"]), spec.transaction_groups))
        by_group.setdefault(key, []).append(one)
    for (raw_topic, group), found in by_group.items():
        records = itertools.chain.from_iterable(
            read_range(reading, raw_topic, int(r["partition"]), r["start"], r["end"]) for r in found
        )
        yield _run(spec, raw_topic, group, records)


def _run(spec: TaskSpec, raw_topic: str, group: int, records: Iterator[RawBatch]) -> TaskRun:
    """One transaction group's records, detected and committed."""
    task = DirectTransaction(spec, raw_topic, group)
    stats: list[pa.RecordBatch] = []
    result = task.run(records, stats.append)
    return TaskRun(group, result, task.fence_ms, stats)


def tick_targets(config: DedupConfig, layout: StateLayout) -> list[tuple[str, int]]:
    """Every partition of the raw topic: each raw partition's own task runs its gap scans."""
    return [(config.raw_topics[0], p) for p in range(layout.raw_partitions)]


def reset_target(
    config: ResetTopics, source_partition: int, raw_partition_count: Callable[[str], int]
) -> tuple[str, int]:
    """The raw partition ``source_partition`` lands in: its task holds the partition's state.

    Raises:
        GapStateError: the raw topic does not exist.
    """
    raw = config.raw_topics[0]
    count = raw_partition_count(raw)
    if count < 1:
        raise GapStateError(f"raw topic {raw!r} does not exist")
    return raw, raw_partition_of(source_partition, count)
