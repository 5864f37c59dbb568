"""Which layout a checkpoint keeps when the direct layout is involved (``dedup/layouts/``):
a new checkpoint takes ``STATE_LAYOUT``, an existing one keeps what it recorded, and a direct
checkpoint refuses a raw topic whose partition count changed."""

from __future__ import annotations

import json

import pytest

from common.errors import GapStateError
from dedup.config import from_sources
from dedup.layouts import (
    BUCKETS_PER_PARTITION,
    Layout,
    StateLayout,
    decide,
    direct,
    new_transaction_groups,
)

BUCKETS, DIRECT = Layout.BUCKETS, Layout.DIRECT


@pytest.mark.parametrize("raw_partitions", [1, 6, 128])
def test_a_new_checkpoint_takes_the_direct_layout_with_the_raw_partitions(
    raw_partitions: int,
) -> None:
    layout = decide(
        None, has_offsets=False, state_partitions=4, new_kind=DIRECT, raw_partitions=raw_partitions
    )
    assert layout == StateLayout(kind=DIRECT, raw_partitions=raw_partitions)
    assert layout.kind is DIRECT
    assert json.loads(layout.to_json()) == {
        "layout": "direct",
        "raw_partitions": raw_partitions,
        "transaction_groups": 0,
    }


def test_the_recorded_direct_layout_is_read_back() -> None:
    recorded = StateLayout(DIRECT, raw_partitions=6).to_json()
    layout = decide(recorded, has_offsets=True, state_partitions=4, raw_partitions=6)
    assert layout == StateLayout(DIRECT, raw_partitions=6)
    assert layout.to_json() == recorded


@pytest.mark.parametrize("new_kind", [DIRECT, BUCKETS])
def test_a_direct_checkpoint_keeps_its_layout_whatever_is_configured(new_kind: Layout) -> None:
    recorded = json.dumps({"layout": "direct", "raw_partitions": 6})
    layout = decide(
        recorded, has_offsets=True, state_partitions=4, new_kind=new_kind, raw_partitions=6
    )
    assert layout == StateLayout(DIRECT, raw_partitions=6)
    assert layout.kind is DIRECT
    assert layout.raw_partitions == 6


@pytest.mark.parametrize(("recorded_raw", "now_raw"), [(6, 8), (8, 6), (6, 1)])
def test_a_direct_checkpoint_refuses_a_changed_raw_partition_count(
    recorded_raw: int, now_raw: int
) -> None:
    recorded = json.dumps({"layout": "direct", "raw_partitions": recorded_raw})
    with pytest.raises(GapStateError) as info:
        decide(
            recorded,
            has_offsets=True,
            state_partitions=4,
            new_kind=DIRECT,
            raw_partitions=now_raw,
        )
    message = str(info.value)
    assert f"{recorded_raw} partitions" in message
    assert f"has {now_raw} now" in message
    assert "The direct layout" in message


def test_a_direct_record_without_its_count_is_refused_by_a_started_checkpoint() -> None:
    with pytest.raises(GapStateError, match="without a valid raw_partitions"):
        decide('{"layout": "direct"}', has_offsets=True, state_partitions=4, raw_partitions=3)


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_bucketed_checkpoint_stays_bucketed_when_direct_is_configured(partitions: int) -> None:
    recorded = StateLayout(BUCKETS, partitions, 5).to_json()
    layout = decide(
        recorded, has_offsets=True, state_partitions=8, new_kind=DIRECT, raw_partitions=6
    )
    assert layout == StateLayout(BUCKETS, partitions, 5)
    assert layout.kind is BUCKETS


def test_a_checkpoint_from_before_the_layout_file_is_refused_not_made_direct() -> None:
    with pytest.raises(GapStateError, match="partitions state layout"):
        decide(None, has_offsets=True, state_partitions=8, new_kind=DIRECT, raw_partitions=6)


@pytest.mark.parametrize("has_offsets", [False, True])
def test_a_partitions_record_is_refused_whatever_is_configured(has_offsets: bool) -> None:
    with pytest.raises(GapStateError, match="partitions state layout"):
        decide(
            '{"layout": "partitions"}',
            has_offsets=has_offsets,
            state_partitions=8,
            new_kind=DIRECT,
            raw_partitions=6,
        )


@pytest.mark.parametrize(
    ("new_kind", "expected"),
    [
        (DIRECT, StateLayout(DIRECT, raw_partitions=9)),
        (BUCKETS, StateLayout(BUCKETS, 8, BUCKETS_PER_PARTITION)),
    ],
)
def test_a_direct_record_never_planned_takes_the_configured_layout(
    new_kind: Layout, expected: StateLayout
) -> None:
    """Before its first planned batch a checkpoint has no state: the record is rewritten."""
    recorded = json.dumps({"layout": "direct", "raw_partitions": 6})
    layout = decide(
        recorded, has_offsets=False, state_partitions=8, new_kind=new_kind, raw_partitions=9
    )
    assert layout == expected


def test_a_bucketed_record_never_planned_takes_the_direct_layout() -> None:
    recorded = StateLayout(BUCKETS, 2, 3).to_json()
    layout = decide(
        recorded, has_offsets=False, state_partitions=8, new_kind=DIRECT, raw_partitions=4
    )
    assert layout == StateLayout(DIRECT, raw_partitions=4)


@pytest.mark.parametrize(
    ("wanted", "raw_partitions", "reader", "groups"),
    [
        (2, 8, "librdkafka", 2),  # local[2]: two transactions a batch
        (8, 8, "librdkafka", 0),  # as many as raw partitions: each alone
        (16, 8, "librdkafka", 0),
        (0, 8, "librdkafka", 0),
        (2, 8, "spark", 0),  # Spark's source makes a task per raw partition
        (1, 1, "librdkafka", 0),
    ],
)
def test_a_new_direct_checkpoint_groups_its_raw_partitions_by_the_parallelism(
    wanted: int, raw_partitions: int, reader: str, groups: int
) -> None:
    assert new_transaction_groups(wanted, raw_partitions, reader) == groups
    layout = decide(None, has_offsets=False, state_partitions=4, new_kind=DIRECT,
                    raw_partitions=raw_partitions, transaction_groups=groups)  # fmt: skip
    assert layout == StateLayout(DIRECT, raw_partitions=raw_partitions, transaction_groups=groups)
    # recorded: the checkpoint keeps its groups whatever the parallelism of a later start
    again = decide(layout.to_json(), has_offsets=True, state_partitions=4, new_kind=DIRECT,
                   raw_partitions=raw_partitions, transaction_groups=1)  # fmt: skip
    assert again == layout


def test_a_direct_checkpoint_without_groups_commits_each_raw_partition_alone() -> None:
    """Every direct checkpoint created before groups: its ``transactional.id`` per raw partition
    stays, so a restart fences what an older release left open."""
    recorded = json.dumps({"layout": "direct", "raw_partitions": 6})
    layout = decide(recorded, has_offsets=True, state_partitions=4, new_kind=DIRECT,
                    raw_partitions=6, transaction_groups=2)  # fmt: skip
    assert layout.transaction_groups == 0


@pytest.mark.parametrize("groups", [-1, 6, 7, "2", 1.5])
def test_a_direct_checkpoint_refuses_groups_it_cannot_have(groups: object) -> None:
    recorded = json.dumps({"layout": "direct", "raw_partitions": 6, "transaction_groups": groups})
    with pytest.raises(GapStateError, match="transaction_groups"):
        decide(recorded, has_offsets=True, state_partitions=4, raw_partitions=6)


def test_a_checkpoint_with_groups_refuses_spark_s_source_before_it_writes() -> None:
    """Spark's source makes a task per raw partition: two of one group would fence each other."""
    config = from_sources({"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092",
                           "STATE_DIR_CONFIG": "/var/lib/d", "DIRECT_READER": "spark"})  # fmt: skip
    grouped = StateLayout(DIRECT, raw_partitions=8, transaction_groups=2)
    with pytest.raises(GapStateError, match="set DIRECT_READER back to librdkafka"):
        direct.ready(None, config, grouped)  # type: ignore[arg-type]  # refused before any use
