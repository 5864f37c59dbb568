"""How the dedup commits its state (``dedup/job.py checkpoint_conf``)."""

from __future__ import annotations

from dedup.job import CHANGELOG_CHECKPOINTING, checkpoint_conf


def test_the_state_commits_as_changelogs_and_spark_keeps_its_file_manager() -> None:
    conf = checkpoint_conf()
    assert conf[CHANGELOG_CHECKPOINTING] == "true"
    # docs/benchmarks.md "Dedup": the FileSystem-based manager made a
    # 32-topic backlog 19 % dearer
    assert "spark.sql.streaming.checkpointFileManagerClass" not in conf
