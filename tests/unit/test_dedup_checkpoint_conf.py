"""How the dedup's checkpoint files are written (``dedup/job.py checkpoint_conf``)."""

from __future__ import annotations

import pytest

from dedup.job import CHANGELOG_CHECKPOINTING as CHANGELOG
from dedup.job import FILESYSTEM_CHECKPOINT_MANAGER, checkpoint_conf

MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


@pytest.mark.parametrize("state_dir", ["/var/lib/dedup", "file:///var/lib/dedup", "rel/dir"])
def test_a_local_checkpoint_is_written_without_filecontext(state_dir: str) -> None:
    conf = checkpoint_conf(state_dir)
    assert conf[MANAGER] == FILESYSTEM_CHECKPOINT_MANAGER
    assert conf[CHANGELOG] == "true"


@pytest.mark.parametrize("state_dir", ["hdfs://nn:8020/dedup", "s3a://bucket/dedup"])
def test_a_remote_checkpoint_keeps_sparks_choice_of_manager(state_dir: str) -> None:
    conf = checkpoint_conf(state_dir)
    assert MANAGER not in conf
    assert conf[CHANGELOG] == "true"
