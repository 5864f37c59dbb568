"""The buckets layout: Spark's stateful operator holds the detectors, grouped by bucket.

Plan (driver): Spark's Kafka source over the raw topic(s) and the control topic, classified in
the JVM (``dedup/classify_sql.py``), grouped by bucket (``BUCKETS_PER_PARTITION`` per state
partition, each holding many source partitions' detectors: ``dedup/detector_set.py``) into
``applyInPandasWithState`` (``dedup/detect.py``), state in the RocksDB state store. Tasks
(executors): one per state partition, mapped over the stateful step's output with no shuffle
(``dedup/transaction.py``). Ticks and resets go to the control topic, which every state
partition reads.

Chains with a raw topic per receiver need this layout: a source partition's input may come from
any of those topics, and only a shuffle brings it to one detector. Chains whose receivers all
write one raw topic run on the direct layout (docs/dedup.md "State layout", "Chains and the
direct layout").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from dedup.layouts import ResetTopics, StateLayout, TaskRun
from dedup.transaction import PartitionWriter

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.state import GroupState

    from dedup.batch_driver import TransactionalBatchWriter
    from dedup.config import DedupConfig
    from dedup.writer_settings import TaskSpec

log = logging.getLogger(__name__)

#: Bytes of one Arrow batch handed to a Python worker (``SPARK_CONF_*`` overrides it). 16 MiB,
#: not 64: the JVM spent ~1 CPU-s more per million 200 B records building 64 MiB batches (a
#: bucket's rows fill them; docs/benchmarks.md "Dedup"), and a worker holds less.
ARROW_MAX_BYTES_PER_BATCH: Final = 16 << 20
#: Spark's default driver heap.
DRIVER_MEMORY_MIB: Final = 0
#: the raw topic may come later (the query subscribes to it by name)
NEEDS_RAW_TOPIC: Final = False
#: Spark's own (Hadoop's ``FileContext``): the ``FileSystem``-based manager, which this layout's
#: RocksDB files go through as well, made a 32-topic backlog 19 % dearer (13.1 against 10.9
#: CPU-s per M records, why was not found).
CHECKPOINT_FILE_MANAGER: Final = ""


def jit_options(config: DedupConfig) -> str:
    """Tiered compilation: every record passes through the JVM (Spark's source, the state store)."""
    del config
    return ""


def plan(
    spark: SparkSession,
    config: DedupConfig,
    writer: TransactionalBatchWriter,
    layout: StateLayout,
) -> DataFrame:
    """The query up to ``foreachBatch``: source, classification, the stateful step, the write
    task over each state partition's output."""
    from dedup import job  # noqa: PLC0415  imports pyspark (the driver only)
    from dedup.classify_sql import classify  # noqa: PLC0415

    topics = source_topics(config)
    keys = bucket_keys(spark, layout)
    log.info(
        "state layout: buckets (%d buckets in each of %d state partitions)",
        layout.buckets_per_partition,
        layout.state_partitions,
    )
    raw = job.raw_stream(spark, config, topics)
    stateful = detected(classify(raw, topics, keys, layout.state_partitions), config)
    return job.mapped(stateful, writer)


def source_topics(config: DedupConfig) -> tuple[str, ...]:
    """The raw topic(s) and the control topic (ticks and resets)."""
    return (*config.raw_topics, config.control_topic)


def run_task(
    spec: TaskSpec,
    partition: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[TaskRun]:
    """State partition ``partition``'s output rows of the batch, committed
    (``PartitionWriter``)."""
    writer = PartitionWriter(spec.settings, spec.query_id, partition, windows=spec.windows)
    stats: list[pa.RecordBatch] = []
    try:
        result = writer.write_batches(batches, spec.batch_id, on_stats=stats.append)
    finally:
        writer.close()
    yield TaskRun(partition, result, writer.fence_ms, stats)


def tick_targets(config: DedupConfig, layout: StateLayout) -> list[tuple[str, int]]:
    """The control topic: every state partition's task reads it."""
    del layout
    return [(config.control_topic, -1)]


def reset_target(
    config: ResetTopics, source_partition: int, raw_partition_count: Callable[[str], int]
) -> tuple[str, int]:
    """The control topic: the classification routes a reset to its source partition's bucket."""
    del source_partition, raw_partition_count
    return config.control_topic, -1


def detected(classified: DataFrame, config: DedupConfig) -> DataFrame:
    """The stateful step: per bucket, the detectors over each batch."""
    from pyspark.sql.streaming.state import GroupStateTimeout  # noqa: PLC0415
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType  # noqa: PLC0415

    from dedup import job  # noqa: PLC0415
    from dedup.detect import detect_group  # noqa: PLC0415
    from dedup.rows import OUTPUT_DDL  # noqa: PLC0415

    params = job.detect_params(config)
    state_schema = StructType(
        [StructField("detector", BinaryType()), StructField("last_scan_ms", LongType())]
    )

    def func(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        return detect_group(params, key, frames, state)

    return classified.groupBy("g_topic", "g_partition").applyInPandasWithState(
        func,
        outputStructType=OUTPUT_DDL,
        stateStructType=state_schema,
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def bucket_keys(spark: SparkSession, layout: StateLayout) -> list[int]:
    """The group key ``("", j)`` of each bucket: bucket ``s * per + k`` (``per`` buckets per state
    partition) is one that Spark places in state partition ``s``.

    Spark places a group by ``pmod(hash(key), partitions)`` (Murmur3, the SQL ``hash``), so the
    buckets of a state partition run in its task, and a source partition lands in the state
    partition ``pmod(hash(topic, partition), partitions)`` (``classify``). Computed by Spark
    itself, not re-implemented.

    Raises:
        GapStateError: no keys found for some state partition.
    """
    from common.errors import GapStateError  # noqa: PLC0415

    partitions, per = layout.state_partitions, layout.buckets_per_partition
    found: dict[int, list[int]] = {s: [] for s in range(partitions)}
    tried = 0
    while any(len(js) < per for js in found.values()) and tried < layout.buckets * 1024:
        rows = (
            spark.range(tried, tried + layout.buckets * 64)
            .selectExpr(
                "cast(id as int) as j", f"pmod(hash('', cast(id as int)), {partitions}) as s"
            )
            .collect()
        )
        for row in rows:
            if len(found[int(row.s)]) < per:
                found[int(row.s)].append(int(row.j))
        tried += layout.buckets * 64
    if any(len(js) < per for js in found.values()):
        raise GapStateError(f"no bucket keys found for each of {partitions} state partitions")
    return [j for s in range(partitions) for j in found[s]]
