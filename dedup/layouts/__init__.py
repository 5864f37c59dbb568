"""The state layouts: how a checkpoint holds its detectors, decided once, when it is created.

- **buckets** (``dedup/layouts/buckets.py``; a new checkpoint that reads several raw topics (a
  raw topic per chain among them), a Kafka source told to split or merge raw partitions, or
  ``STATE_LAYOUT=buckets``): Spark's stateful operator groups by bucket, ``BUCKETS_PER_PARTITION``
  per state partition, each holding the detectors of many source partitions
  (``dedup/detector_set.py``), in the RocksDB state store; one write task per state partition.
- **direct** (``dedup/layouts/direct.py``; ``auto``'s choice for one raw topic read one task per
  raw partition, chains whose receivers all write it included, or ``STATE_LAYOUT=direct``): no
  stateful operator; each raw partition's records are detected and written, its detectors kept
  in the state topic, a fixed group of raw partitions in one transaction. The raw topic's
  partition count is recorded (the receiver places a source partition by it,
  ``common.raw_topic.raw_partition_of``, so it may not change), and so are the groups.

A third, **partitions** (one Spark group per source partition; every checkpoint created before
2026-11-28 has it, with or without a layout file), is retired: :func:`decide` refuses it with
the upgrade step (docs/operations.md "Upgrading", docs/dedup.md "State layout").

Spark keys a checkpoint's state by the grouping key and cannot move state between keys, so a
checkpoint keeps the layout it was created with. The choice is recorded in a small JSON file in
the checkpoint directory, next to Spark's own (``LAYOUT_FILE``). This package is the one place
that reads and writes that file (:func:`read_checkpoint`, :func:`write_layout_file`), applies
the ``auto`` rule (:func:`new_layout`) and decides (:func:`decide`); each layout's module
implements :class:`LayoutImpl`, and no module outside this package branches on a layout
(``tests/unit/test_architecture.py``).

Pure but for the file access (local, or Hadoop's file system through a Spark session's JVM); no
pyspark import here.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from common.errors import ConfigError, GapStateError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from dedup.batch_driver import TransactionalBatchWriter
    from dedup.config import DedupConfig
    from dedup.writer_settings import BatchResult, TaskSpec


log = logging.getLogger(__name__)


class Layout(StrEnum):
    """A state layout a checkpoint can have (the ``layout`` field of ``LAYOUT_FILE``)."""

    BUCKETS = "buckets"
    DIRECT = "direct"


#: ``STATE_LAYOUT``'s value that lets :func:`new_layout` choose.
AUTO: Final = "auto"
#: The values ``STATE_LAYOUT`` takes.
CHOICES: Final = (AUTO, Layout.DIRECT.value, Layout.BUCKETS.value)
#: The retired layout's name in ``LAYOUT_FILE`` (recognised only to refuse it).
RETIRED_PARTITIONS: Final = "partitions"
LAYOUT_FILE: Final = "kafka-diode-state-layout.json"
#: Buckets per state partition in a new checkpoint. More than one bounds a bucket's state (the
#: sum of its source partitions' detectors, one Spark state value: ~256 MiB round-trips, ~1.1 GiB
#: fails, measured) at a few milliseconds per bucket and batch.
BUCKETS_PER_PARTITION: Final = 8
#: Options of Spark's Kafka source that split or merge raw partitions across tasks.
SPLITTING_SOURCE_OPTIONS: Final = frozenset({"minpartitions", "maxrecordsperpartition"})

RETIRED_MESSAGE: Final = (
    "this checkpoint has the partitions state layout (one Spark group per source partition: "
    "created before 2026-11-28), which this version no longer runs. Upgrade step: let the "
    "previous release finish it (kafka-diode dedup --until-idle), then start this version on a "
    "new STATE_DIR_CONFIG that continues at the raw offsets where the old one stopped "
    '(KAFKA_SOURCE_STARTINGOFFSETS; docs/operations.md "Upgrading" gives the steps)'
)


@dataclass(frozen=True, slots=True)
class StateLayout:
    """A checkpoint's layout; ``state_partitions`` is Spark's for the checkpoint and
    ``buckets_per_partition`` how many buckets each holds (buckets only)."""

    kind: Layout
    state_partitions: int = 0
    buckets_per_partition: int = 0
    raw_partitions: int = 0
    """The raw topic's partition count when a direct checkpoint was created (direct only)."""
    transaction_groups: int = 0
    """Direct only: raw partition ``p`` commits in group ``p mod`` this, fewer than
    ``raw_partitions`` (0: each raw partition alone; every checkpoint created before groups)."""

    @property
    def buckets(self) -> int:
        return self.state_partitions * self.buckets_per_partition

    @property
    def impl(self) -> LayoutImpl:
        """The module that runs this layout."""
        return implementation(self.kind)

    def to_json(self) -> str:
        if self.kind is Layout.DIRECT:
            return json.dumps(
                {
                    "layout": self.kind.value,
                    "raw_partitions": self.raw_partitions,
                    "transaction_groups": self.transaction_groups,
                }
            )
        return json.dumps(
            {
                "layout": self.kind.value,
                "state_partitions": self.state_partitions,
                "buckets_per_partition": self.buckets_per_partition,
            }
        )


@dataclass(frozen=True, slots=True)
class TaskRun:
    """What a layout's write task did for one partition: the partition (for the result rows),
    the result, the milliseconds of its fence, and its ``stat`` rows."""

    partition: int
    result: BatchResult
    fence_ms: int
    stats: list[pa.RecordBatch]


class LayoutImpl(Protocol):
    """What each layout's module implements (``dedup/layouts/buckets.py``, ``direct.py``)."""

    #: Spark's ``arrow.maxBytesPerBatch`` for its Python workers
    ARROW_MAX_BYTES_PER_BATCH: int
    #: the least driver heap in MiB of a JVM this process launches in local mode, raised for the
    #: largest record (``job.driver_heap_mib``); 0: Spark's default
    DRIVER_MEMORY_MIB: int
    #: the raw topic must exist before a new checkpoint's first start (``dedup/runner.py`` waits)
    NEEDS_RAW_TOPIC: bool
    #: Spark's ``checkpointFileManagerClass`` for a local checkpoint ("": Spark's own)
    CHECKPOINT_FILE_MANAGER: str

    def source_topics(self, config: DedupConfig) -> tuple[str, ...]:
        """The topics the query's Kafka source subscribes to."""
        ...

    def jit_options(self, config: DedupConfig) -> str:
        """JVM options for the JIT of a session this process launches, beside
        ``job.JVM_OPTIONS`` ("": the JVM's tiered compilation)."""
        ...

    def plan(
        self,
        spark: SparkSession,
        config: DedupConfig,
        writer: TransactionalBatchWriter,
        layout: StateLayout,
    ) -> DataFrame:
        """Plan the query: the DataFrame ``foreachBatch`` hands the writer (readied here, before
        its ``task_function``), one result cell per write task."""
        ...

    def run_task(
        self,
        spec: TaskSpec,
        partition: int,
        batches: Iterator[pa.RecordBatch],
    ) -> Iterator[TaskRun]:
        """Run one write task (``partition``: Spark's) over its non-empty Arrow batches: one
        run per partition it committed (none if it had nothing to do), each as it ends."""
        ...

    def tick_targets(self, config: DedupConfig, layout: StateLayout) -> list[tuple[str, int]]:
        """Where the driver's idle ticks go: (topic, partition; -1 for any)."""
        ...

    def reset_target(
        self,
        config: ResetTopics,
        source_partition: int,
        raw_partition_count: Callable[[str], int],
    ) -> tuple[str, int]:
        """Where ``dedup reset`` of ``source_partition`` writes its record (topic, partition;
        -1 for any).

        Raises:
            GapStateError: the raw topic it needs does not exist.
        """
        ...


class ResetTopics(Protocol):
    """The settings ``reset_target`` reads (``DedupConfig`` and the tools' config have them)."""

    @property
    def raw_topics(self) -> tuple[str, ...]: ...

    @property
    def control_topic(self) -> str: ...


def implementation(kind: Layout) -> LayoutImpl:
    """The module of layout ``kind`` (imported on first use: the tools need only this one)."""
    module: Any = importlib.import_module(f"dedup.layouts.{kind.value}")
    return module  # type: ignore[no-any-return]


# -- the auto rule ---------------------------------------------------------------------------


def new_layout(choice: str, raw_topics: Sequence[str], kafka_source: Mapping[str, str]) -> Layout:
    """The layout a new checkpoint gets: ``STATE_LAYOUT`` (``choice``), with ``auto`` resolved:
    direct for one raw topic read one task per partition, else buckets."""
    if choice != AUTO:
        return Layout(choice)
    splitting = any(k.lower() in SPLITTING_SOURCE_OPTIONS for k in kafka_source)
    return Layout.DIRECT if len(raw_topics) == 1 and not splitting else Layout.BUCKETS


def check_choice(choice: str, raw_topics: Sequence[str], kafka_source: Mapping[str, str]) -> None:
    """Refuse a ``STATE_LAYOUT`` the other settings cannot run (``auto`` never is: it picks
    buckets where direct would be refused).

    Raises:
        ConfigError: naming the key.
    """
    if choice not in CHOICES:
        raise ConfigError(
            "STATE_LAYOUT", f"is {choice!r}", "use auto (the default), direct or buckets"
        )
    if choice != Layout.DIRECT:
        return
    if len(raw_topics) != 1:
        raise ConfigError(
            "STATE_LAYOUT",
            f"direct reads one raw topic, and RAW_TOPICS names {len(raw_topics)} "
            "(a raw topic per chain is merged by the buckets layout)",
            "use STATE_LAYOUT=buckets, or let every chain's receiver write one raw topic",
        )
    split = sorted(k for k in kafka_source if k.lower() in SPLITTING_SOURCE_OPTIONS)
    if split:
        raise ConfigError(
            "KAFKA_SOURCE_" + split[0],
            "splits or merges raw partitions across Spark tasks, and the direct layout needs "
            "each raw partition's records in one task",
            "remove it",
        )


# -- the layout file -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    """What a checkpoint directory says about its layout."""

    recorded: str | None
    """``LAYOUT_FILE``'s text (None: absent)."""
    has_offsets: bool
    """Spark has planned a batch in it."""

    @property
    def recorded_kind(self) -> str | None:
        """The ``layout`` field of the file (None: absent or unreadable)."""
        try:
            fields = json.loads(self.recorded or "null")
            return str(fields["layout"]) if isinstance(fields, dict) else None
        except (ValueError, KeyError):
            return None


def local_path(state_dir: str) -> Path | None:
    """``state_dir`` as a local path (None: a Hadoop URI, read only through Spark)."""
    path = state_dir.removeprefix("file://")
    return None if not path or "://" in path else Path(path)


def read_checkpoint(state_dir: str, spark: SparkSession | None = None) -> CheckpointFiles | None:
    """Read the layout file and whether Spark planned a batch: through Hadoop's file system when
    ``spark`` is given (as Spark reads the checkpoint: local, HDFS, object stores), else from a
    local path (None for a Hadoop URI).

    Raises:
        OSError: a local file could not be read.
    """
    if spark is not None:
        return _read_hadoop(spark, state_dir)
    root = local_path(state_dir)
    if root is None:
        return None
    try:
        recorded: str | None = (root / LAYOUT_FILE).read_text()
    except FileNotFoundError:
        recorded = None
    offsets = root / "offsets"
    return CheckpointFiles(recorded, offsets.is_dir() and any(offsets.iterdir()))


def _hadoop(spark: SparkSession, state_dir: str) -> tuple[Any, Any, Any]:
    jvm: Any = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(state_dir)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return jvm, fs, root


def _read_hadoop(spark: SparkSession, state_dir: str) -> CheckpointFiles:
    jvm, fs, root = _hadoop(spark, state_dir)
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
    return CheckpointFiles(recorded, has_offsets)


def write_layout_file(spark: SparkSession, state_dir: str, layout: StateLayout) -> None:
    """Record a new checkpoint's layout (through Hadoop's file system)."""
    jvm, fs, root = _hadoop(spark, state_dir)
    out = fs.create(jvm.org.apache.hadoop.fs.Path(root, LAYOUT_FILE), True)
    try:
        out.write(bytearray(layout.to_json().encode()))
    finally:
        out.close()


def recorded_layout(state_dir: str) -> Layout | None:
    """The layout a local checkpoint records (None: a Hadoop URI, no file, or unreadable)."""
    try:
        found = read_checkpoint(state_dir)
    except OSError:
        return None
    kind = found.recorded_kind if found is not None else None
    return Layout(kind) if kind in CHOICES[1:] else None


def session_layout(choice: Layout, state_dir: str) -> Layout:
    """The layout the query will run, as far as the driver can tell before Spark starts (for the
    session's settings): direct if a new checkpoint would get it (``choice``) and the checkpoint
    is a local path that is new (no offsets) or records it. Any doubt (a Hadoop URI, an
    unreadable file) says buckets."""
    if choice is not Layout.DIRECT:
        return Layout.BUCKETS
    try:
        found = read_checkpoint(state_dir)
    except OSError:
        return Layout.BUCKETS
    if found is None:
        return Layout.BUCKETS
    if found.recorded is None:
        return Layout.BUCKETS if found.has_offsets else choice
    return Layout.DIRECT if found.recorded_kind == Layout.DIRECT else Layout.BUCKETS


def checkpoint_layout(
    spark: SparkSession, config: DedupConfig, raw_partitions: int = 0, parallelism: int = 0
) -> StateLayout:
    """The checkpoint's layout (:func:`decide`), recorded for a new checkpoint (on the driver);
    ``parallelism`` (Spark's tasks at once) gives a new direct checkpoint's transaction groups
    unless ``DIRECT_TRANSACTIONS`` does (:func:`new_transaction_groups`).

    Through Hadoop's file system, as Spark reads the checkpoint (local, HDFS, object stores).

    Raises:
        GapStateError: the checkpoint's layout is retired or unknown.
    """
    found = read_checkpoint(config.state_dir_config, spark)
    assert found is not None  # read through Spark: any path
    try:
        layout = decide(
            found.recorded,
            has_offsets=found.has_offsets,
            state_partitions=config.effective_shuffle_partitions(),
            new_kind=config.new_state_layout,
            raw_partitions=raw_partitions,
            transaction_groups=new_transaction_groups(
                config.direct_transactions or parallelism, raw_partitions, config.direct_reader
            ),
        )
    except GapStateError as exc:
        topics = implementation(config.new_state_layout).source_topics(config)
        offsets = str(exc) == RETIRED_MESSAGE and last_offsets(config.state_dir_config, topics)
        if offsets:
            raise GapStateError(
                f"{exc}. For this checkpoint: KAFKA_SOURCE_STARTINGOFFSETS='{offsets}'"
            ) from None
        raise
    if found.has_offsets and config.state_layout not in {AUTO, layout.kind}:
        log.warning(
            "STATE_LAYOUT=%s applies to new checkpoints; this one keeps its layout, %s",
            config.state_layout,
            layout.kind,
        )
    if not found.has_offsets:
        write_layout_file(spark, config.state_dir_config, layout)
    return layout


def last_offsets(state_dir: str, topics: Sequence[str]) -> str | None:
    """The end offsets of the last batch Spark planned in a local checkpoint, for ``topics``, as
    Spark's ``startingOffsets`` JSON: where a new checkpoint continues an old one that ran until
    idle (the upgrade step of the retired partitions layout). None: not a local checkpoint,
    no batch, or a topic missing from it."""
    root = local_path(state_dir)
    offsets = root / "offsets" if root is not None else None
    try:
        batches = [int(p.name) for p in offsets.iterdir() if p.name.isdigit()] if offsets else []
        if not batches or offsets is None:
            return None
        lines = (offsets / str(max(batches))).read_text().splitlines()
        planned = json.loads(lines[2])  # v1, the batch's metadata, then the source's offsets
    except (OSError, ValueError, IndexError):
        return None
    if not isinstance(planned, dict) or not all(t in planned for t in topics):
        return None
    return json.dumps({t: planned[t] for t in topics}, separators=(",", ":"))


# -- the decision ----------------------------------------------------------------------------


def new_transaction_groups(wanted: int, raw_partitions: int, reader: str) -> int:
    """A new direct checkpoint's transaction groups: ``wanted`` (``DIRECT_TRANSACTIONS``, or
    Spark's parallelism) if fewer than the raw partitions, else 0 (each raw partition alone).

    One transaction per group and batch instead of one per raw partition: each fence (a new
    producer and ``init_transactions``) and commit saved is ~7 ms of CPU a batch, measured live
    (docs/dedup-internals.md "Transaction groups"). Spark's Kafka source
    (``DIRECT_READER=spark``) makes a task per raw partition, which cannot share a
    ``transactional.id``: 0."""
    if reader == "spark" or wanted <= 0 or wanted >= raw_partitions:
        return 0
    return wanted


def decide(
    recorded: str | None,
    *,
    has_offsets: bool,
    state_partitions: int,
    new_kind: Layout = Layout.BUCKETS,
    raw_partitions: int = 0,
    transaction_groups: int = 0,
) -> StateLayout:
    """The layout of a checkpoint.

    ``recorded`` is ``LAYOUT_FILE``'s text (None if absent), ``has_offsets`` whether Spark has
    planned a batch in it, ``state_partitions`` the configured ``SHUFFLE_PARTITIONS`` (Spark
    fixes it for a checkpoint at its first batch, so it counts only for a new one).
    ``new_kind`` is the layout a new checkpoint gets (:func:`new_layout`) and ``raw_partitions``
    the raw topic's partition count now, ``transaction_groups`` a new direct checkpoint's
    (:func:`new_transaction_groups`).

    Raises:
        GapStateError: the file exists but is not one this version wrote, or the checkpoint has
            the retired partitions layout (the message names the upgrade step).
    """
    new = (
        StateLayout(
            Layout.DIRECT, raw_partitions=raw_partitions, transaction_groups=transaction_groups
        )
        if new_kind is Layout.DIRECT
        else StateLayout(Layout.BUCKETS, state_partitions, BUCKETS_PER_PARTITION)
    )
    if recorded is None:
        # a checkpoint with offsets and no record is from before this file: partitions
        if has_offsets:
            raise GapStateError(RETIRED_MESSAGE)
        return new
    try:
        fields = json.loads(recorded)
        kind, partitions = fields["layout"], int(fields.get("state_partitions", 0))
        per_partition = int(fields.get("buckets_per_partition", 1))
    except (ValueError, TypeError, KeyError) as exc:
        raise GapStateError(
            f"{LAYOUT_FILE} in the checkpoint is unreadable ({exc}): restore it from a backup "
            'of STATE_DIR_CONFIG (docs/dedup.md "State layout")'
        ) from exc
    if kind == RETIRED_PARTITIONS:
        if has_offsets:
            raise GapStateError(RETIRED_MESSAGE)
        raise GapStateError(
            f"{LAYOUT_FILE} in the checkpoint asks for the partitions state layout, which this "
            f"version no longer has: remove the file (a new checkpoint gets {new.kind.value}; "
            'docs/dedup.md "State layout")'
        )
    if kind == Layout.DIRECT:
        if not has_offsets:
            return new
        recorded_raw = fields.get("raw_partitions")
        if type(recorded_raw) is not int or recorded_raw < 1:
            raise GapStateError(
                f"{LAYOUT_FILE} in the checkpoint names the direct layout without a valid "
                f"raw_partitions ({recorded_raw!r}): restore it from a backup of STATE_DIR, or "
                "write the raw topic's partition count there if it never changed"
            )
        if recorded_raw != raw_partitions:
            raise GapStateError(
                f"this direct checkpoint was created for a raw topic of {recorded_raw} "
                f"partitions, and it has {raw_partitions} now: the receiver places each source "
                "partition by that count, so each raw partition's state no longer holds its "
                "source partitions. Give the raw topic its old partition count back, or start a "
                'new checkpoint (docs/dedup.md "The direct layout")'
            )
        groups = fields.get("transaction_groups", 0)
        if type(groups) is not int or not 0 <= groups < recorded_raw:
            raise GapStateError(
                f"{LAYOUT_FILE} in the checkpoint names the direct layout with "
                f"transaction_groups {groups!r}, not a whole number below its raw_partitions "
                f"({recorded_raw}): restore it from a backup of STATE_DIR"
            )
        return StateLayout(Layout.DIRECT, raw_partitions=recorded_raw, transaction_groups=groups)
    if kind == Layout.BUCKETS and partitions >= 1 and per_partition >= 1:
        # before its first planned batch, Spark takes the configured count, so the record does
        return StateLayout(Layout.BUCKETS, partitions, per_partition) if has_offsets else new
    raise GapStateError(
        f"{LAYOUT_FILE} in the checkpoint names layout {kind!r} with {partitions} state "
        "partitions, which this version does not know: a checkpoint of a newer version "
        '(docs/dedup.md "State layout")'
    )
