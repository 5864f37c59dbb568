"""The dedup query on Spark: raw topic(s) -> clean topic(s) + gap topic. Wiring only.

Where each step runs (docs/dedup-internals.md "How it works" has the long form):

1. **Read** (executors): Spark's Kafka source over the raw topic(s) and the control topic
   (``includeHeaders``; ``startingOffsets=earliest`` for a new checkpoint; at most
   ``MAX_OFFSETS_PER_TRIGGER`` raw records per micro-batch). Each raw payload is read here, once.
2. **Classify** (executors, JVM): ``dedup/classify_sql.py``, both raw layouts, no regex on keys.
3. **Detect** (executors, Python): ``dedup/detect.py`` in ``applyInPandasWithState`` per
   bucket (8 per state partition, each holding many source partitions' detectors:
   ``dedup/detector_set.py``), state in the RocksDB state store; first-seen runs leave with
   their payload (``dedup/rows.py``).
4. **Write** (executors, same stage, no shuffle): ``dedup/batch_driver.py`` maps the stateful step's
   output with one write task per state partition, each committing one Kafka transaction
   (``dedup/transaction.py``); the driver only plans batches, starts the tasks and folds their
   counters into the metrics.

That is the buckets layout's plan; the direct layout's reads the raw topic alone and its tasks
classify, detect and write (``dedup/layouts/direct.py``). Which one a checkpoint runs is
``dedup/layouts/``'s to say: this module asks it (``checkpoint_layout``) and calls the layout's
``plan``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from dedup import memory_limit, spark_compat
from dedup.clean_topics import create_dedup_topics
from dedup.config import DedupConfig
from dedup.detect import DetectParams
from dedup.jvm import CHECKPOINT_MANAGER_CLASS, checkpoint_manager_jar
from dedup.layouts import LayoutImpl, checkpoint_layout, implementation, session_layout
from dedup.task_result import RESULT_DDL
from dedup.writer_settings import KAFKA_TIMEOUT_S
from runtime import cgroup_memory, kafka

if TYPE_CHECKING:
    from dedup.batch_driver import TransactionalBatchWriter

log = logging.getLogger(__name__)
spark_compat.apply()

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

CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


def checkpoint_conf(layout: LayoutImpl, *, own_manager: bool = False) -> dict[str, str]:
    """Spark settings for how the state is committed (driver and executors).

    RocksDB commits a changelog per batch instead of uploading a snapshot of each state
    partition (a snapshot every few batches, in the background); Spark reads either form and
    switches an existing checkpoint in both directions. The checkpoint file manager is the
    layout's (``LayoutImpl.CHECKPOINT_FILE_MANAGER``), or with ``own_manager`` (its jar is on the
    classpath) the dedup's own for a local checkpoint (``dedup/jvm``), where the layout has one.
    """
    conf = {CHANGELOG_CHECKPOINTING: "true"}
    if layout.CHECKPOINT_FILE_MANAGER:
        manager = CHECKPOINT_MANAGER_CLASS if own_manager else layout.CHECKPOINT_FILE_MANAGER
        conf[CHECKPOINT_FILE_MANAGER] = manager
    return conf


# -- session and query -----------------------------------------------------------------------


def launches_jvm() -> bool:
    """True when the session this process builds starts its own driver JVM (not under
    spark-submit, whose JVM runs already)."""
    return "SPARK_SUBMIT_OPTS" not in os.environ and not os.environ.get("PYSPARK_GATEWAY_PORT")


def build_session(
    config: DedupConfig, jars: list[str], raw_partitions: int = 0, jvm_options: str = ""
) -> SparkSession:
    """The SparkSession with the settings docs/benchmarks.md measured; ``SPARK_CONF_*`` last.

    ``raw_partitions`` (0: not known) bounds the tasks that run at once, for the heap
    (:func:`driver_heap_mib`). ``jvm_options`` go to the driver's JVM when this process starts
    it (the class archive's, dedup/class_archive.py). Under spark-submit the master and
    already-set options come from spark-submit.
    """
    # the interpreter of every Python worker, the executors' too: Spark starts them with the
    # driver's PYSPARK_PYTHON (spark-submit sets it from spark.pyspark.python), not with an
    # executor's environment (spark.executorEnv.PYSPARK_PYTHON does not choose it)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("kafka-diode-dedup")
    launched_here = launches_jvm()
    if launched_here:
        builder = builder.master(with_task_attempts(config.spark_master))
        for name, value in JVM_ENV.items():  # the JVM is started with this process's environment
            os.environ.setdefault(name, value)
    layout = implementation(session_layout(config.new_state_layout, config.state_dir_config))
    # the dedup's own checkpoint file manager needs its jar on the driver's classpath at launch,
    # so only in a JVM this process starts (docs/dedup.md "Settings", "Checkpoint files")
    manager_jar = (
        checkpoint_manager_jar() if launched_here and layout.CHECKPOINT_FILE_MANAGER else None
    )
    if manager_jar is not None:
        jars = [*jars, str(manager_jar)]
    conf: dict[str, str] = {
        "spark.sql.shuffle.partitions": str(config.effective_shuffle_partitions()),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.arrow_max_records_per_batch),
        # runs carry payload: a byte bound too, so that a Python worker holds at most this much
        # of a micro-batch at a time (the write tasks stream, docs/operations.md "Memory")
        "spark.sql.execution.arrow.maxBytesPerBatch": str(layout.ARROW_MAX_BYTES_PER_BATCH),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        # workers forked with their code already loaded and shared (dedup/worker_daemon.py)
        "spark.python.daemon.module": "dedup.worker_daemon",
        **{f"spark.executorEnv.{name}": value for name, value in WORKER_ALLOCATOR_ENV.items()},
        "spark.sql.streaming.stopTimeout": "120s",
        # no batch without input: the driver's ticks (dedup/idle_tick.py) make one per gap-scan
        # interval instead of one per trigger, each with a fixed cost (docs/dedup-internals.md
        # "How it works")
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        **checkpoint_conf(layout, own_manager=manager_jar is not None),
    }
    if launched_here:
        # under spark-submit the driver's JVM runs already and spark-defaults.conf is the
        # cluster administrator's: docs/dedup.md "Running on a Spark cluster" says what to add
        options = " ".join(filter(None, (JVM_OPTIONS, layout.jit_options(config))))
        conf["spark.driver.defaultJavaOptions"] = " ".join(filter(None, (options, jvm_options)))
        conf["spark.executor.defaultJavaOptions"] = options
        if layout.DRIVER_MEMORY_MIB:
            heap = driver_heap_mib(layout.DRIVER_MEMORY_MIB, config, raw_partitions)
            conf["spark.driver.memory"] = f"{heap}m"
            log.info("%s", heap_line(heap, config))
        check_memory_limit(config, conf.get("spark.driver.memory"))
    if jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(config.spark_conf)
    for name, value in conf.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    return spark


#: Heap a running task of the direct layout holds per byte of its largest raw record: Spark copies
#: the record's row into three buffers that grow by doubling (the Kafka source's converter and
#: the two generated projections before ``mapInArrow``: twice the record each), beside the
#: Kafka consumer's fetched response and deserialised value. A heap dump at an
#: ``OutOfMemoryError`` with 16 MiB records showed 7 such buffers and 8 Kafka copies for two
#: tasks (docs/dedup-internals.md "The direct layout").
HEAP_RECORDS_PER_TASK = 9
#: Records held outside the running tasks: a finished task's converter, idle partitions' polls.
HEAP_RECORDS_BESIDE = 4
#: The JVM's own live heap in local mode (classes, clients, Spark's bookkeeping): ~60 MB after
#: a full collection.
HEAP_BASE_MIB = 96
#: The share of the heap the live set may fill: the parallel collector splits the heap into a
#: young and an old generation, and a row buffer (up to twice the record) must fit whole in one.
HEAP_FILL = 0.6


def driver_heap_mib(least: int, config: DedupConfig, raw_partitions: int = 0) -> int:
    """The heap of a local-mode JVM that runs direct tasks: ``least``, or what the tasks that run
    at once need for records of ``MAX_RECORD_SIZE`` read by Spark's source if more. With 16 MiB
    records and two task slots ~750 MiB; on two slots up to ~9 MiB records the least (512)."""
    slots = local_slots(config.spark_master)
    if slots is None or config.direct_reader == "librdkafka":
        # a cluster's driver handles no record; the librdkafka reader's tasks read theirs in
        # the Python workers (dedup/range_reader.py), never in the JVM
        return least
    if raw_partitions:
        slots = min(slots, raw_partitions)
    record_mib = config.max_record_size / (1 << 20)
    live = HEAP_BASE_MIB + record_mib * (HEAP_RECORDS_PER_TASK * slots + HEAP_RECORDS_BESIDE)
    return max(least, math.ceil(live / HEAP_FILL))


def heap_line(heap_mib: int, config: DedupConfig) -> str:
    """The start-up line that names the heap: the sized one, or the operator's."""
    chosen = config.spark_conf.get("spark.driver.memory")
    limit = f"for records up to MAX_RECORD_SIZE {config.max_record_size} bytes"
    submitted = memory_limit.submitted_driver_memory(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    if submitted is not None:  # Spark prefers it to spark.driver.memory
        return f"JVM heap {submitted} (PYSPARK_SUBMIT_ARGS --driver-memory; {heap_mib} MiB {limit})"
    if chosen is None:
        return f"JVM heap {heap_mib} MiB {limit} (SPARK_CONF_spark_driver_memory sets another)"
    return f"JVM heap {chosen} (SPARK_CONF_spark_driver_memory; {heap_mib} MiB {limit})"


#: Spark's heap for a driver JVM when nothing sets ``spark.driver.memory``.
SPARK_DEFAULT_HEAP_MIB = 1024


def check_memory_limit(config: DedupConfig, sized: str | None) -> None:
    """Stop the start-up if the JVM heap cannot fit the service's memory limit, warn if the
    process tree may not (:mod:`dedup.memory_limit`)."""
    chosen = config.spark_conf.get("spark.driver.memory")
    submitted = memory_limit.submitted_driver_memory(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    if submitted is not None:
        heap, source = memory_limit.spark_memory_mib(submitted), "PYSPARK_SUBMIT_ARGS"
    elif chosen is not None:
        heap, source = memory_limit.spark_memory_mib(chosen), "SPARK_CONF_spark_driver_memory"
    elif sized is not None:
        heap, source = memory_limit.spark_memory_mib(sized), "sized for MAX_RECORD_SIZE"
    else:
        heap, source = SPARK_DEFAULT_HEAP_MIB, "Spark's default"
    limit = cgroup_memory.service_memory_limit()
    warning = memory_limit.check_heap_fits(heap, limit, source)
    if warning is not None:
        log.warning("%s", warning)


#: Attempts a task gets in local mode when the master names no count of its own: Spark gives
#: ``local[N]`` one, so a transient Kafka error in one task (a broker failing over under a
#: fresh client) would end the query and the process; 4 is Spark's ``spark.task.maxFailures`` on a
#: cluster. Each attempt fences the one before (docs/dedup-internals.md "Effectively once").
LOCAL_TASK_ATTEMPTS = 4


def with_task_attempts(master: str) -> str:
    """``master``, a local one without a count of attempts given ``LOCAL_TASK_ATTEMPTS``
    (``local[*]`` runs as ``local[*,4]``); ``local[N,F]`` and any other master unchanged."""
    if master == "local":
        return f"local[1,{LOCAL_TASK_ATTEMPTS}]"
    if master.startswith("local[") and master.endswith("]") and "," not in master:
        return f"{master[:-1]},{LOCAL_TASK_ATTEMPTS}]"
    return master


def local_slots(master: str) -> int | None:
    """The task slots of a local master (``local``, ``local[N]``, ``local[*]``, ``local[N,F]``);
    None for any other master."""
    if master == "local":
        return 1
    if not (master.startswith("local[") and master.endswith("]")):
        return None
    threads = master[len("local[") : -1].split(",", maxsplit=1)[0].strip()
    if threads == "*":
        return os.cpu_count() or 1
    return int(threads) if threads.isdigit() and int(threads) > 0 else None


#: Spark's Kafka source's ``fetch.max.wait.ms`` (Kafka's default: 500). A cached consumer of
#: the source has a fetch in flight past the end of its last task's range, which the broker holds
#: this long for data that does not come; the next task's first fetch of that partition waits
#: for it. At 500 ms a task waited ~0.5 s for its first records in most batches
#: (docs/benchmarks.md "Dedup"); a consumer polls only inside a task, so a short
#: wait costs one empty fetch per task.
SOURCE_FETCH_WAIT_MS = 10
#: Spark's Kafka source's ``max.poll.records`` (Kafka's default: 500). The source keeps each
#: raw partition's last poll between tasks (records past the task's range wait for the next
#: batch), so a poll is held per partition. Without compression a fetch of 1 MB per partition
#: holds ~16 runs; a raw topic written with lz4 or zstd whose records compress well holds
#: hundreds, and 500 runs of 64 KiB kept by each of 12 partitions filled the 512 MB heap
#: (tests/integration/test_dedup_heap.py). 32 runs are 2 MiB per partition, and a poll of
#: buffered records costs microseconds.
SOURCE_MAX_POLL_RECORDS = 32


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
        "kafka.max.poll.records": str(SOURCE_MAX_POLL_RECORDS),
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


def start_query(
    spark: SparkSession,
    config: DedupConfig,
    writer: TransactionalBatchWriter,
    transform: Callable[[DataFrame], DataFrame] | None = None,
) -> StreamingQuery:
    """Start the whole query: the layout's plan, its rows the write tasks' result cells."""
    # The control topic must exist before Spark subscribes to it (``writer.prepare`` creates
    # the gap and progress topics).
    create_dedup_topics(writer.settings, [config.control_topic], partitions=1)
    writer.prepare()
    if transform is not None:
        output = mapped(transform(raw_stream(spark, config)), writer)
    else:
        layout = checkpoint_layout(
            spark, config, raw_partition_count(config), spark.sparkContext.defaultParallelism
        )
        writer.layout = layout
        output = layout.impl.plan(spark, config, writer, layout)
    query = (
        output.writeStream.queryName("kafka-diode-dedup")
        .foreachBatch(writer)
        .option("checkpointLocation", config.state_dir_config)
        .trigger(processingTime=f"{config.persist_interval_ms} milliseconds")
        .start()
    )
    writer.bind(str(query.id))
    return query


def mapped(plan: DataFrame, writer: TransactionalBatchWriter) -> DataFrame:
    """``plan``'s rows handed to ``writer``'s write task (``mapInArrow``, planned once)."""
    return plan.mapInArrow(writer.task_function(), RESULT_DDL)


def raw_partition_count(config: DedupConfig) -> int:
    """The first raw topic's partition count (0 if it does not exist yet)."""
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    return kafka.topic_partitions(conf, config.raw_topics[0], KAFKA_TIMEOUT_S)
