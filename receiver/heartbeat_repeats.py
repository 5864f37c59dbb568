"""Which partitions of a sender heartbeat the receiver writes to the raw topic (pure).

Why: every heartbeat record is input to the dedup, and Spark runs a micro-batch for any input,
each ~0.5-0.8 CPU-s however little it holds. A live sender on a quiet link heartbeats every
``heartbeat_interval`` (2 s), so the dedup ran a batch every 2 s to learn nothing: ~0.4 of a
core with no record flowing (docs/benchmarks.md "Dedup").

What a heartbeat tells the dedup per partition is ``(session, started_at, high, low)`` (and a
share chain's fields): the detector keeps the highest ``high``, and a ``low`` it has applied
once changes nothing when it comes again (``gaps.PartitionDetector.heartbeat``). So a partition's
heartbeat record is written when any of these changed since the last one written for that
(sender, chain, partition), and otherwise once per ``repeat_interval`` seconds (a dedup whose
state was reset, or that starts over a raw topic whose older records retention removed, learns
the tail again within that time, and ``kafka-diode status``, which reads the age of a
partition's last heartbeat record as the link's liveness, sees one at least that often).
``sent_at_ms`` is not compared: it changes every time.

Bounded: at most ``max_entries`` remembered partitions; past that the memory starts over, which
only writes more heartbeats, never fewer.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from common.raw_topic import HEARTBEAT_CHAIN_FIELDS
from common.wire.events import Heartbeat

#: Remembered (sender, chain, partition) entries before the memory starts over.
MAX_ENTRIES: Final = 100_000

_Key = tuple[str, tuple[int, ...], str, int]
_Said = tuple[bytes, int, int, int]


class HeartbeatRepeats:
    """Drops the partitions of a heartbeat that repeat what was written less than
    ``repeat_interval`` seconds ago. ``repeat_interval`` 0 keeps every partition."""

    def __init__(self, repeat_interval: float, max_entries: int = MAX_ENTRIES) -> None:
        if repeat_interval < 0:
            raise ValueError("repeat_interval must be >= 0")
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.repeat_interval = repeat_interval
        self.max_entries = max_entries
        #: (sender, chain fields, topic, partition) -> (what it said, when it was written)
        self._written: dict[_Key, tuple[_Said, float]] = {}
        #: partitions dropped as repeats (a counter for tests and logs)
        self.dropped = 0

    def select(self, beat: Heartbeat, now: float) -> Heartbeat | None:
        """``beat`` with only the partitions to write (None: none), remembered as written at
        ``now`` (monotonic seconds)."""
        if self.repeat_interval == 0:
            return beat
        counters = dict(beat.counters)
        chain = tuple(counters.get(name, -1) for name in HEARTBEAT_CHAIN_FIELDS)
        lows = {(topic, partition): low for topic, partition, low in beat.low_offsets}
        written = self._written
        keep: list[tuple[str, int, int]] = []
        for topic, partition, high in beat.high_offsets:
            key = (beat.sender_id, chain, topic, partition)
            said = (beat.session_id, beat.started_at_ms, high, lows.get((topic, partition), -1))
            last = written.get(key)
            if last is not None and last[0] == said and now - last[1] < self.repeat_interval:
                self.dropped += 1
                continue
            if last is None and len(written) >= self.max_entries:
                written.clear()
            written[key] = (said, now)
            keep.append((topic, partition, high))
        if not keep:
            return None
        if len(keep) == len(beat.high_offsets):
            return beat
        kept = {(topic, partition) for topic, partition, _ in keep}
        return dataclasses.replace(
            beat,
            high_offsets=tuple(keep),
            low_offsets=tuple(item for item in beat.low_offsets if item[:2] in kept),
        )
