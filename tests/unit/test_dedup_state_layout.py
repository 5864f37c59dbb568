"""Which state layout a checkpoint keeps (``dedup/layouts/``)."""

from __future__ import annotations

import json

import pytest

from common.errors import GapStateError
from dedup.layouts import (
    BUCKETS_PER_PARTITION,
    RETIRED_MESSAGE,
    Layout,
    StateLayout,
    decide,
    last_offsets,
)

BUCKETS = Layout.BUCKETS


def test_a_new_checkpoint_is_bucketed_with_the_configured_partitions() -> None:
    layout = decide(None, has_offsets=False, state_partitions=4)
    assert layout == StateLayout(BUCKETS, 4, BUCKETS_PER_PARTITION)
    assert layout.kind is Layout.BUCKETS
    assert layout.buckets == 4 * BUCKETS_PER_PARTITION


def test_a_checkpoint_from_before_the_buckets_is_refused_with_the_upgrade_step() -> None:
    """The partitions layout is retired: its checkpoints (no layout file) stop the start."""
    with pytest.raises(GapStateError) as info:
        decide(None, has_offsets=True, state_partitions=4)
    assert str(info.value) == RETIRED_MESSAGE
    assert "KAFKA_SOURCE_STARTINGOFFSETS" in RETIRED_MESSAGE
    assert "Upgrading" in RETIRED_MESSAGE


def test_a_recorded_layout_wins_over_the_configured_partitions() -> None:
    recorded = StateLayout(BUCKETS, 2, 3).to_json()
    assert decide(recorded, has_offsets=True, state_partitions=8) == StateLayout(BUCKETS, 2, 3)
    with pytest.raises(GapStateError, match="partitions state layout"):
        decide('{"layout": "partitions"}', has_offsets=True, state_partitions=8)


def test_a_checkpoint_without_a_planned_batch_takes_the_configured_partitions() -> None:
    recorded = StateLayout(BUCKETS, 2, 3).to_json()
    expected = StateLayout(BUCKETS, 8, BUCKETS_PER_PARTITION)
    assert decide(recorded, has_offsets=False, state_partitions=8) == expected


def test_a_new_checkpoint_may_no_longer_ask_for_one_group_per_partition() -> None:
    with pytest.raises(GapStateError, match="remove the file"):
        decide('{"layout": "partitions"}', has_offsets=False, state_partitions=8)


@pytest.mark.parametrize(
    ("recorded", "match"),
    [
        ("not json", "unreadable"),
        ('{"state_partitions": 2}', "unreadable"),
        ('{"layout": "columns", "state_partitions": 2}', "does not know"),
        ('{"layout": "buckets", "state_partitions": 0}', "does not know"),
        ('{"layout": "buckets", "state_partitions": 2, "buckets_per_partition": 0}', "not know"),
    ],
)
def test_an_unknown_record_stops_the_start_with_the_way_out(recorded: str, match: str) -> None:
    with pytest.raises(GapStateError, match=match) as info:
        decide(recorded, has_offsets=True, state_partitions=2)
    assert "State layout" in str(info.value)


def test_the_upgrade_step_reads_where_the_old_checkpoint_stopped(tmp_path) -> None:
    """``last_offsets``: the last planned batch's end offsets, for the topics the new checkpoint
    reads (the direct layout: the raw topic alone), as ``startingOffsets`` JSON."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch, raw in ((1, 90), (10, 150), (2, 100)):
        planned = {"raw": {"0": raw, "1": 60}, "control": {"0": 3}}
        (offsets / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(planned)}\n')
    (offsets / ".10.crc").write_text("")
    assert last_offsets(str(tmp_path), ("raw",)) == '{"raw":{"0":150,"1":60}}'
    assert last_offsets(f"file://{tmp_path}", ("raw", "control")) == (
        '{"raw":{"0":150,"1":60},"control":{"0":3}}'
    )
    assert last_offsets(str(tmp_path), ("other",)) is None
    assert last_offsets(str(tmp_path / "none"), ("raw",)) is None
    assert last_offsets("hdfs://namenode/dedup", ("raw",)) is None
