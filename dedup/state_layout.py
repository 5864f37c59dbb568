"""Which state layout a checkpoint uses: decided once, when the checkpoint is created.

- **buckets** (a new checkpoint that reads several raw topics, share chains among them, or
  ``STATE_LAYOUT=buckets``): the stateful step groups by bucket, ``BUCKETS_PER_PARTITION`` per
  state partition, each holding the detectors of many source partitions
  (``dedup/detector_set.py``).
- **partitions** (checkpoints created before the buckets): one group per source (topic,
  partition), the detector's bytes as the state value.
- **direct** (a new checkpoint that reads one raw topic, one task per raw partition: ``auto``'s
  choice, ``DedupConfig.new_state_layout``; or ``STATE_LAYOUT=direct``): no stateful step; one
  task per raw partition keeps its detectors in the state topic (``dedup/direct.py``). The raw
  topic's partition count is recorded: the receiver places a source partition by it
  (``common.raw_topic.raw_partition_of``), so it may not change.

Spark keys a checkpoint's state by the grouping key and cannot move state between keys, so a
checkpoint keeps the layout it was created with. The choice is recorded in a small JSON file in
the checkpoint directory, next to Spark's own (``LAYOUT_FILE``); a checkpoint with Spark offsets
and no such file is from before it, so it keeps per-partition groups. An operator who wants a new
checkpoint with per-partition groups writes ``{"layout": "partitions"}`` there before its first
start (docs/dedup.md "State layout").

Pure: the decision and the file's format. ``dedup/job.py`` reads and writes the file through
Hadoop's file system (the checkpoint may be on HDFS or an object store), on the **driver**.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from common.errors import GapStateError

LAYOUT_FILE: Final = "kafka-diode-state-layout.json"
BUCKETS: Final = "buckets"
PARTITIONS: Final = "partitions"
DIRECT: Final = "direct"
#: Buckets per state partition in a new checkpoint. More than one bounds a bucket's state (the
#: sum of its source partitions' detectors, one Spark state value: ~256 MiB round-trips, ~1.1 GiB
#: fails, measured) at a few milliseconds per bucket and batch.
BUCKETS_PER_PARTITION: Final = 8


@dataclass(frozen=True, slots=True)
class StateLayout:
    """A checkpoint's layout; ``state_partitions`` is Spark's for the checkpoint and
    ``buckets_per_partition`` how many buckets each holds (buckets only)."""

    kind: str
    state_partitions: int = 0
    buckets_per_partition: int = 0
    raw_partitions: int = 0
    """The raw topic's partition count when a direct checkpoint was created (direct only)."""

    @property
    def direct(self) -> bool:
        return self.kind == DIRECT

    @property
    def bucketed(self) -> bool:
        return self.kind == BUCKETS

    @property
    def buckets(self) -> int:
        return self.state_partitions * self.buckets_per_partition

    def to_json(self) -> str:
        if self.direct:
            return json.dumps({"layout": DIRECT, "raw_partitions": self.raw_partitions})
        return json.dumps(
            {
                "layout": self.kind,
                "state_partitions": self.state_partitions,
                "buckets_per_partition": self.buckets_per_partition,
            }
        )


def decide(
    recorded: str | None,
    *,
    has_offsets: bool,
    state_partitions: int,
    new_kind: str = BUCKETS,
    raw_partitions: int = 0,
) -> StateLayout:
    """The layout of a checkpoint.

    ``recorded`` is ``LAYOUT_FILE``'s text (None if absent), ``has_offsets`` whether Spark has
    planned a batch in it, ``state_partitions`` the configured ``SHUFFLE_PARTITIONS`` (Spark
    fixes it for a checkpoint at its first batch, so it counts only for a new one).
    ``new_kind`` is ``STATE_LAYOUT`` (for a new checkpoint) and ``raw_partitions`` the raw
    topic's partition count now.

    Raises:
        GapStateError: the file exists but is not one this version wrote.
    """
    new = (
        StateLayout(DIRECT, raw_partitions=raw_partitions)
        if new_kind == DIRECT
        else StateLayout(BUCKETS, state_partitions, BUCKETS_PER_PARTITION)
    )
    if recorded is None:
        # a checkpoint with offsets and no record is from before this file
        return StateLayout(PARTITIONS) if has_offsets else new
    try:
        fields = json.loads(recorded)
        kind, partitions = fields["layout"], int(fields.get("state_partitions", 0))
        per_partition = int(fields.get("buckets_per_partition", 1))
    except (ValueError, TypeError, KeyError) as exc:
        raise GapStateError(
            f"{LAYOUT_FILE} in the checkpoint is unreadable ({exc}): restore it from a backup "
            f'of STATE_DIR, or write {{"layout": "partitions"}} if this checkpoint was created '
            'before the bucketed layout (docs/dedup.md "State layout")'
        ) from exc
    if kind == PARTITIONS:
        return StateLayout(PARTITIONS)
    if kind == DIRECT:
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
        return StateLayout(DIRECT, raw_partitions=recorded_raw)
    if kind == BUCKETS and partitions >= 1 and per_partition >= 1:
        # before its first planned batch, Spark takes the configured count, so the record does
        return StateLayout(BUCKETS, partitions, per_partition) if has_offsets else new
    raise GapStateError(
        f"{LAYOUT_FILE} in the checkpoint names layout {kind!r} with {partitions} state "
        "partitions, which this version does not know: a checkpoint of a newer version "
        '(docs/dedup.md "State layout")'
    )
