"""How the dedup commits its state (``dedup/job.py checkpoint_conf``)."""

from __future__ import annotations

from dedup.job import CHANGELOG_CHECKPOINTING, CHECKPOINT_FILE_MANAGER, checkpoint_conf
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
