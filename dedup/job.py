"""The dedup query on Spark: raw topic(s) -> clean topic(s) + gap topic. Wiring only.

Where each step runs (docs/dedup-internals.md "How it works" has the long form):

1. **Read** (executors): Spark's Kafka source over the raw topic(s) and the control topic
   (``includeHeaders``; ``startingOffsets=earliest`` for a new checkpoint; at most
   ``MAX_OFFSETS_PER_TRIGGER`` raw records per micro-batch). Each raw payload is read here, once.
2. **Classify** (executors, JVM): ``dedup/classify_sql.py``, both raw layouts, no regex on keys.
3. **Detect** (executors, Python): ``dedup/detect.py`` in ``applyInPandasWithState`` per
   bucket (8 per state partition, each holding many source partitions' detectors:
   ``dedup/detector_set.py``), or per source (topic, partition) in a checkpoint created before the
   buckets (``dedup/state_layout.py``), state in the RocksDB state store; first-seen runs leave
   with their payload (``dedup/rows.py``).
4. **Write** (executors, same stage, no shuffle): ``dedup/batch_driver.py`` maps the stateful step's
   output with one write task per state partition, each committing one Kafka transaction
   (``dedup/transaction.py``); the driver only plans batches, starts the tasks and folds their
   counters into the metrics.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StructField,
    StructType,
)

from common.errors import GapStateError
from dedup import spark_compat
from dedup.classify_sql import classify
from dedup.config import DedupConfig
from dedup.detect import DetectParams, detect_group
from dedup.direct_state import STATE_RECORD_LIMIT
from dedup.rows import OUTPUT_DDL
from dedup.state_layout import DIRECT, LAYOUT_FILE, StateLayout, decide
from dedup.writer_settings import KAFKA_TIMEOUT_S
from runtime import kafka

if TYPE_CHECKING:
    from dedup.batch_driver import TransactionalBatchWriter

log = logging.getLogger(__name__)
spark_compat.apply()

#: Bytes of one Arrow batch handed to a Python worker (``SPARK_CONF_*`` overrides it). 16 MiB,
#: not 64: the JVM spent ~1 CPU-s more per million 200 B records building 64 MiB batches (a
#: bucket's rows fill them; docs/benchmarks.md "Dedup"), and a worker holds less.
ARROW_MAX_BYTES_PER_BATCH = 16 << 20
#: The same bound for a direct checkpoint: its task classifies, detects and writes each Arrow
#: batch as it comes, so smaller batches let the JVM read and convert the next one meanwhile
#: (at 16 MiB a task's whole input of a backlog batch was one Arrow batch, and its worker waited
#: for all of it). 4 MiB measured 4.1-4.8 CPU-s per M at a fan-in of 32 (16 MiB: 4.8-5.4),
#: 3.6-5.4 at one (16 MiB: 4.1-4.4), and 1.1x the rate to the clean topic side by side with the
#: peer (docs/benchmarks.md "Dedup").
DIRECT_ARROW_MAX_BYTES_PER_BATCH = 4 << 20

#: The Python workers' allocator (``spark.executorEnv.*``; ``--spark-conf`` overrides each).
#: Payload passes through the workers in buffers of up to an Arrow batch; with pyarrow's
#: mimalloc pool and glibc's defaults each buffer was fresh memory, handed back to the kernel
#: when freed and zeroed again at the next fault: 17 % of the workers' CPU in
#: ``clear_page_erms`` (perf, ``bench/dedup.py --topics 32``). One allocator (glibc, for Arrow
#: too) that keeps up to 256 MiB of freed memory for reuse, and serves buffers up to 32 MiB
#: (glibc's most) from its heap, not from fresh mappings.
WORKER_ALLOCATOR_ENV = {
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
}

#: JVM options of a session this process launches (local mode, or a standalone master without
#: spark-submit): Spark's ``*.defaultJavaOptions``, so that a user's ``extraJavaOptions`` add to
#: them. The parallel collector: G1's concurrent marking of Spark's large object graph, started
#: again and again by the payload's churn, was 11-29 % of the JVM's CPU in a backlog
#: (docs/benchmarks.md "Dedup").
JVM_OPTIONS = "-XX:+UseParallelGC"
#: Environment of a JVM this process launches: two glibc malloc arenas instead of eight per core
#: for the JVM's native allocations (RocksDB, the JIT, Netty): ~60 MB less Pss at a steady
#: 20,000 records/s and no measured CPU cost (docs/benchmarks.md "Dedup").
#: The Python workers the JVM starts inherit it. Set in the environment first to choose another.
JVM_ENV = {"MALLOC_ARENA_MAX": "2"}

#: The direct layout's state topic (created by the job): a record holds a raw partition's whole
#: container of detectors, and compaction keeps each key's last; segments roll every 10 minutes
#: so that the cleaner can drop the older records (one per raw partition and batch).
STATE_TOPIC_CONFIG = {
    "max.message.bytes": str(STATE_RECORD_LIMIT),
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
}

#: The heap of a JVM this process launches for a direct checkpoint (``SPARK_CONF_*`` overrides):
#: Spark's least. The direct layout streams each raw partition's records from the source through
#: its task (no shuffle, no state store), so the default 1 GB only let the collector defer work:
#: peak Pss 926 MB against 1,079 at 20,000 records/s, the same p99, and a 1.5 GB backlog of 1 KB
#: records passed (docs/benchmarks.md "Dedup").
DIRECT_DRIVER_MEMORY = "512m"

CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def checkpoint_conf() -> dict[str, str]:
    """Spark settings for how the state is committed (driver and executors).

    RocksDB commits a changelog per batch instead of uploading a snapshot of each state
    partition (a snapshot every few batches, in the background); Spark reads either form and
    switches an existing checkpoint in both directions. The checkpoint file manager stays
    Spark's: the ``FileSystem``-based one avoids ``FileContext``'s ``readlink`` processes but
    made a 32-topic backlog 19 % dearer (docs/benchmarks.md "Dedup").
    """
    return {CHANGELOG_CHECKPOINTING: "true"}


STATE_SCHEMA = StructType(
    [StructField("detector", BinaryType()), StructField("last_scan_ms", LongType())]
)


# -- session and query -----------------------------------------------------------------------


def build_session(config: DedupConfig, jars: list[str]) -> SparkSession:
    """The SparkSession with the settings docs/benchmarks.md measured; ``SPARK_CONF_*`` last.

    Under spark-submit the master and already-set options come from spark-submit.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("kafka-diode-dedup")
    launched_here = "SPARK_SUBMIT_OPTS" not in os.environ and not os.environ.get(
        "PYSPARK_GATEWAY_PORT"
    )
    if launched_here:
        builder = builder.master(config.spark_master)
        for name, value in JVM_ENV.items():  # the JVM is started with this process's environment
            os.environ.setdefault(name, value)
    direct = direct_checkpoint(config)
    conf: dict[str, str] = {
        "spark.sql.shuffle.partitions": str(config.effective_shuffle_partitions()),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.arrow_max_records_per_batch),
        # runs carry payload: a byte bound too, so that a Python worker holds at most this much
        # of a micro-batch at a time (the write tasks stream, docs/dedup.md "Settings")
        "spark.sql.execution.arrow.maxBytesPerBatch": str(
            DIRECT_ARROW_MAX_BYTES_PER_BATCH if direct else ARROW_MAX_BYTES_PER_BATCH
        ),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        # workers forked with their code already loaded and shared (dedup/worker_daemon.py)
        "spark.python.daemon.module": "dedup.worker_daemon",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        **{f"spark.executorEnv.{name}": value for name, value in WORKER_ALLOCATOR_ENV.items()},
        "spark.sql.streaming.stopTimeout": "120s",
        # no batch without input: the driver's ticks (dedup/idle_tick.py) make one per gap-scan
        # interval instead of one per trigger, each with a fixed cost (docs/dedup-internals.md
        # "How it works")
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        **checkpoint_conf(),
    }
    if launched_here:
        # under spark-submit the driver's JVM runs already and spark-defaults.conf is the
        # cluster administrator's: docs/dedup.md "Running on a Spark cluster" says what to add
        conf["spark.driver.defaultJavaOptions"] = JVM_OPTIONS
        conf["spark.executor.defaultJavaOptions"] = JVM_OPTIONS
        if direct:
            conf["spark.driver.memory"] = DIRECT_DRIVER_MEMORY
    if jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(config.spark_conf)
    for name, value in conf.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    return spark


#: Spark's Kafka source's ``fetch.max.wait.ms`` (Kafka's default: 500). A cached consumer of
#: the source has a fetch in flight past the end of its last task's range, which the broker holds
#: this long for data that does not come; the next task's first fetch of that partition waits
#: for it. At 500 ms a task waited ~0.5 s for its first records in most batches
#: (docs/benchmarks.md "Dedup"); a consumer polls only inside a task, so a short
#: wait costs one empty fetch per task.
SOURCE_FETCH_WAIT_MS = 10


def raw_stream(
    spark: SparkSession, config: DedupConfig, topics: tuple[str, ...] | None = None
) -> DataFrame:
    """Spark's Kafka source over ``topics``: the raw topic(s) and the control topic by default
    (the direct layout reads its raw topic alone)."""
    if topics is None:
        topics = (*config.raw_topics, config.control_topic)
    reader = spark.readStream.format("kafka")
    for name, value in source_options(config, topics).items():
        reader = reader.option(name, value)
    return reader.load()


def source_options(config: DedupConfig, topics: tuple[str, ...]) -> dict[str, str]:
    """The options of Spark's Kafka source; ``KAFKA_SOURCE_<NAME>`` wins over each default."""
    return {
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "subscribe": ",".join(topics),
        "includeHeaders": "true",
        "startingOffsets": "earliest",
        "failOnDataLoss": str(config.fail_on_data_loss).lower(),
        "maxOffsetsPerTrigger": str(config.max_offsets_per_trigger),
        "kafka.fetch.max.wait.ms": str(SOURCE_FETCH_WAIT_MS),
        **config.kafka_source,
    }


def detect_params(config: DedupConfig) -> DetectParams:
    """The detectors' settings, as the executors get them."""
    return DetectParams(
        window_size=config.window_size,
        max_windows=config.max_windows,
        max_expired_gaps=config.max_expired_gaps,
        max_state_bytes=config.max_state_bytes,
        scan_interval_ms=max(1, round(config.gap_emit_interval_sec * 1000)),
    )


def detected(classified: DataFrame, config: DedupConfig, layout: StateLayout) -> DataFrame:
    """The stateful step: per bucket (or per source partition), the detector over each batch."""
    params = detect_params(config)

    def func(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        return detect_group(params, key, frames, state)

    keys = ("g_topic", "g_partition") if layout.bucketed else ("src_topic", "src_partition")
    return classified.groupBy(*keys).applyInPandasWithState(
        func,
        outputStructType=OUTPUT_DDL,
        stateStructType=STATE_SCHEMA,
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def start_query(
    spark: SparkSession,
    config: DedupConfig,
    writer: TransactionalBatchWriter,
    transform: Callable[[DataFrame], DataFrame] | None = None,
) -> StreamingQuery:
    """Start the whole query; ``writer`` is bound to the query id before its first batch runs."""
    # The control topic must exist before Spark subscribes to it; the gap and progress topics
    # are compacted (latest gap state per key; markers are small either way).
    writer.ensure_topics([config.control_topic], partitions=1)
    writer.ensure_topics([config.gap_topic, config.progress_topic], compact=True)
    topics = (*config.raw_topics, config.control_topic)
    if transform is not None:
        output = transform(raw_stream(spark, config))
    else:
        layout = state_layout(spark, config, raw_partition_count(config))
        if layout.direct:
            start_direct(writer, config, layout)
            # the source's rows as they come: each task classifies its own (dedup/direct.py)
            output = raw_stream(spark, config, config.raw_topics)
        else:
            keys = bucket_keys(spark, layout) if layout.bucketed else None
            raw = raw_stream(spark, config)
            output = detected(classify(raw, topics, keys, layout.state_partitions), config, layout)
    query = (
        output.writeStream.queryName("kafka-diode-dedup")
        .foreachBatch(writer)
        .option("checkpointLocation", config.state_dir_config)
        .trigger(processingTime=f"{config.persist_interval_ms} milliseconds")
        .start()
    )
    writer.bind(str(query.id))
    return query


# -- the checkpoint's state layout (driver) ----------------------------------------------------


def direct_checkpoint(config: DedupConfig) -> bool:
    """Whether the query will run in the direct layout, as far as the driver can tell before
    Spark starts: the checkpoint is a local path that is new (no offsets) or records the direct
    layout, and a new one would get it. Any doubt (a Hadoop URI, an unreadable file) says no."""
    if config.new_state_layout != DIRECT:
        return False
    path = config.state_dir_config.removeprefix("file://")
    if "://" in path:
        return False
    root = Path(path)
    try:
        return bool(json.loads((root / LAYOUT_FILE).read_text()).get("layout") == DIRECT)
    except FileNotFoundError:
        offsets = root / "offsets"
        return not (offsets.is_dir() and any(offsets.iterdir()))
    except (OSError, ValueError, AttributeError):
        return False


def raw_partition_count(config: DedupConfig) -> int:
    """The first raw topic's partition count (0 if it does not exist yet)."""
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    return kafka.topic_partitions(conf, config.raw_topics[0], KAFKA_TIMEOUT_S)


def start_direct(
    writer: TransactionalBatchWriter, config: DedupConfig, layout: StateLayout
) -> None:
    """Ready a direct checkpoint's run: its state topic, one partition per raw partition, and the
    writer mapping batches with the direct task (``dedup/direct.py``).

    Raises:
        GapStateError: several raw topics, a raw topic that does not exist yet, or a state
            topic with fewer partitions than the raw topic.
    """
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
    found = writer.ensure_topics(
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
    writer.direct = detect_params(config)
    writer.direct_partitions = layout.raw_partitions
    log.info(
        "state layout: direct (one task per partition of %s, %d partitions; state in %s)",
        config.raw_topics[0],
        layout.raw_partitions,
        config.state_topic,
    )


def state_layout(spark: SparkSession, config: DedupConfig, raw_partitions: int = 0) -> StateLayout:
    """The checkpoint's layout (``dedup/state_layout.py``), recorded for a new checkpoint.

    Through Hadoop's file system, as Spark reads the checkpoint (local, HDFS, object stores).
    """
    jvm: Any = spark.sparkContext._jvm
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(config.state_dir_config)
    fs = root.getFileSystem(hadoop_conf)
    offsets = jvm.org.apache.hadoop.fs.Path(root, "offsets")
    has_offsets = bool(fs.exists(offsets)) and len(fs.listStatus(offsets)) > 0
    marker = jvm.org.apache.hadoop.fs.Path(root, LAYOUT_FILE)
    recorded = None
    if fs.exists(marker):
        stream = fs.open(marker)
        try:
            recorded = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode()
        finally:
            stream.close()
    layout = decide(
        recorded,
        has_offsets=has_offsets,
        state_partitions=config.effective_shuffle_partitions(),
        new_kind=config.new_state_layout,
        raw_partitions=raw_partitions,
    )
    if has_offsets and config.state_layout not in {"auto", layout.kind}:
        log.warning(
            "STATE_LAYOUT=%s applies to new checkpoints; this one keeps its layout, %s",
            config.state_layout,
            layout.kind,
        )
    if not has_offsets:
        out = fs.create(marker, True)
        try:
            out.write(bytearray(layout.to_json().encode()))
        finally:
            out.close()
    if layout.direct:
        return layout  # logged by start_direct
    log.info(
        "state layout: %s%s",
        layout.kind,
        f" ({layout.buckets_per_partition} buckets in each of {layout.state_partitions} state "
        "partitions)"
        if layout.bucketed
        else " (one group per source partition: a checkpoint created before the buckets, "
        'docs/dedup.md "State layout")',
    )
    return layout


def bucket_keys(spark: SparkSession, layout: StateLayout) -> list[int]:
    """The group key ``("", j)`` of each bucket: bucket ``s * per + k`` (``per`` buckets per state
    partition) is one that Spark places in state partition ``s``.

    Spark places a group by ``pmod(hash(key), partitions)`` (Murmur3, the SQL ``hash``), so the
    buckets of a state partition run in its task, and a source partition lands in the state
    partition it had in the per-partition layout (``classify``). Computed by Spark itself, not
    re-implemented.
    """
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
