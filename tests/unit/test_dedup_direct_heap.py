"""Which checkpoints get the direct layout's smaller heap (``dedup.layouts.session_layout``):
decided before Spark starts, from the checkpoint directory alone, and no on any doubt."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup.config import from_sources
from dedup.layouts import LAYOUT_FILE, Layout, session_layout

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092"}


def config(state_dir: str, **env: str):
    return from_sources({**BASE, "STATE_DIR_CONFIG": state_dir, **env})


def direct_checkpoint(config) -> bool:
    return session_layout(config.new_state_layout, config.state_dir_config) is Layout.DIRECT


@pytest.mark.parametrize(
    ("layout_file", "offsets", "expected"),
    [
        (None, False, True),  # a new checkpoint: auto gives it the direct layout
        ('{"layout": "direct", "raw_partitions": 3}', True, True),
        ('{"layout": "buckets", "state_partitions": 1}', True, False),
        (None, True, False),  # offsets without a layout file: from before the buckets
        ("not json", True, False),
    ],
)
def test_a_local_checkpoint_is_read(tmp_path: Path, layout_file, offsets, expected) -> None:
    if layout_file is not None:
        (tmp_path / LAYOUT_FILE).write_text(layout_file)
    if offsets:
        (tmp_path / "offsets").mkdir()
        (tmp_path / "offsets" / "0").write_text("v1")
    assert direct_checkpoint(config(str(tmp_path))) is expected
    assert direct_checkpoint(config(f"file://{tmp_path}")) is expected


def test_no_smaller_heap_where_the_layout_cannot_be_direct_or_is_unknown(tmp_path: Path) -> None:
    assert not direct_checkpoint(config(str(tmp_path), STATE_LAYOUT="buckets"))
    assert not direct_checkpoint(config(str(tmp_path), RAW_TOPICS="chain-1,chain-2"))
    assert not direct_checkpoint(config("hdfs://namenode/dedup"))
    assert direct_checkpoint(config(str(tmp_path / "not-yet-created")))
