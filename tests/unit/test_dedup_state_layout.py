"""Which state layout a checkpoint keeps (``dedup/state_layout.py``)."""

from __future__ import annotations

import pytest

from common.errors import GapStateError
from dedup.state_layout import BUCKETS, BUCKETS_PER_PARTITION, PARTITIONS, StateLayout, decide


def test_a_new_checkpoint_is_bucketed_with_the_configured_partitions() -> None:
    layout = decide(None, has_offsets=False, state_partitions=4)
    assert layout == StateLayout(BUCKETS, 4, BUCKETS_PER_PARTITION)
    assert layout.bucketed
    assert layout.buckets == 4 * BUCKETS_PER_PARTITION


def test_a_checkpoint_from_before_the_buckets_keeps_one_group_per_partition() -> None:
    layout = decide(None, has_offsets=True, state_partitions=4)
    assert layout == StateLayout(PARTITIONS)
    assert not layout.bucketed


def test_a_recorded_layout_wins_over_the_configured_partitions() -> None:
    recorded = StateLayout(BUCKETS, 2, 3).to_json()
    assert decide(recorded, has_offsets=True, state_partitions=8) == StateLayout(BUCKETS, 2, 3)
    recorded = StateLayout(PARTITIONS).to_json()
    assert decide(recorded, has_offsets=True, state_partitions=8) == StateLayout(PARTITIONS)


def test_a_checkpoint_without_a_planned_batch_takes_the_configured_partitions() -> None:
    recorded = StateLayout(BUCKETS, 2, 3).to_json()
    expected = StateLayout(BUCKETS, 8, BUCKETS_PER_PARTITION)
    assert decide(recorded, has_offsets=False, state_partitions=8) == expected


def test_an_operator_may_ask_a_new_checkpoint_for_one_group_per_partition() -> None:
    recorded = '{"layout": "partitions"}'
    assert decide(recorded, has_offsets=False, state_partitions=8) == StateLayout(PARTITIONS)


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
