"""How the dedup commits its state (``dedup/job.py checkpoint_conf``)."""

from __future__ import annotations

from types import SimpleNamespace

from dedup.job import CHANGELOG_CHECKPOINTING, CHECKPOINT_FILE_MANAGER, checkpoint_conf
from dedup.jvm import CHECKPOINT_MANAGER_CLASS
from dedup.layouts import buckets, direct


def test_a_buckets_checkpoint_commits_changelogs_through_sparks_own_file_manager() -> None:
    conf = checkpoint_conf(buckets)
    assert conf[CHANGELOG_CHECKPOINTING] == "true"
    # docs/benchmarks.md "Dedup": the FileSystem-based manager made a 32-topic backlog of
    # this layout 19 % dearer
    assert CHECKPOINT_FILE_MANAGER not in conf


def test_a_direct_checkpoint_writes_its_logs_without_readlink_processes() -> None:
    conf = checkpoint_conf(direct)
    assert conf[CHECKPOINT_FILE_MANAGER].endswith(".FileSystemBasedCheckpointFileManager")


def test_with_its_jar_a_direct_checkpoint_writes_its_logs_without_chmod_processes() -> None:
    assert checkpoint_conf(direct, own_manager=True)[CHECKPOINT_FILE_MANAGER] == (
        CHECKPOINT_MANAGER_CLASS
    )
    # the buckets layout keeps Spark's default manager (its state may be on HDFS)
    assert CHECKPOINT_FILE_MANAGER not in checkpoint_conf(buckets, own_manager=True)


def test_the_jit_is_c1_alone_only_where_the_jvm_handles_no_record() -> None:
    """docs/dedup-internals.md "The JVM's garbage collector": a direct checkpoint read with
    librdkafka; Spark's source and the buckets layout carry every record through the JVM."""
    librdkafka = SimpleNamespace(direct_reader="librdkafka")
    spark = SimpleNamespace(direct_reader="spark")
    assert direct.jit_options(librdkafka).split() == ["-XX:TieredStopAtLevel=1", "-Xss4m"]  # type: ignore[arg-type]
    assert direct.jit_options(spark) == ""  # type: ignore[arg-type]
    assert buckets.jit_options(librdkafka) == ""  # type: ignore[arg-type]
