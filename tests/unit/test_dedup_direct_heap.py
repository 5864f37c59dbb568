"""Which checkpoints get the direct layout's smaller heap (``dedup.layouts.session_layout``):
decided before Spark starts, from the checkpoint directory alone, and no on any doubt."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup.config import from_sources
from dedup.job import HEAP_FILL, driver_heap_mib, heap_line, local_slots
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


@pytest.mark.parametrize(
    ("master", "slots"),
    [("local", 1), ("local[2]", 2), ("local[8,3]", 8), ("local[ 4 ]", 4), ("local[0]", None),
     ("local[x]", None), ("spark://host:7077", None), ("local-cluster[2,1,1024]", None),
     ("yarn", None)],
)  # fmt: skip
def test_the_task_slots_of_a_local_master(master: str, slots: int | None) -> None:
    assert local_slots(master) == slots


def test_local_star_has_a_slot_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert local_slots("local[*]") == 6
    assert local_slots("local[*,2]") == 6


def test_the_heap_grows_with_the_largest_record_and_the_tasks_at_once() -> None:
    """The 512 MiB least ran out of heap with 16 MiB records on two slots (the slow
    tests/integration/test_dedup_heap.py); each task slot holds ~9 copies of the record."""
    default = config("/tmp/x", SPARK_MASTER="local[2]", DIRECT_READER="spark")
    heap = driver_heap_mib(512, default)
    assert 700 <= heap <= 800  # 16 MiB records on two slots: 512 ran out of heap, 700 passed
    assert driver_heap_mib(512, default, raw_partitions=1) < heap  # one task at a time
    assert driver_heap_mib(512, default, raw_partitions=12) == heap  # the slots bound it
    four = config("/tmp/x", SPARK_MASTER="local[4]", DIRECT_READER="spark")
    assert driver_heap_mib(512, four) - heap == pytest.approx(2 * 9 * 16 / HEAP_FILL, abs=1)
    small = config("/tmp/x", SPARK_MASTER="local[2]", MAX_RECORD_SIZE=str(1 << 20),
                   DIRECT_READER="spark")  # fmt: skip
    assert driver_heap_mib(512, small) == 512  # the least, up to records of a few MiB
    cluster = config("/tmp/x", SPARK_MASTER="spark://host:7077", DIRECT_READER="spark")
    assert driver_heap_mib(512, cluster) == 512  # its driver handles no record
    # the librdkafka reader's records never enter the JVM (tests/integration/test_dedup_heap.py)
    assert driver_heap_mib(512, config("/tmp/x", SPARK_MASTER="local[2]")) == 512


def test_the_start_up_line_names_the_heap_in_use() -> None:
    sized = heap_line(747, config("/tmp/x"))
    assert sized.startswith("JVM heap 747 MiB for records up to MAX_RECORD_SIZE 16777216 bytes")
    own = heap_line(747, config("/tmp/x", SPARK_CONF_spark_driver_memory="2g"))
    assert own.startswith("JVM heap 2g (SPARK_CONF_spark_driver_memory; 747 MiB for records")
