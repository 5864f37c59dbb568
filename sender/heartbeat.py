"""What the sender's heartbeat says and when it is sent (pure: the caller passes every clock).

A heartbeat (docs/protocol.md §5) names, per partition it reports, the highest offset whose
datagrams were all handed to the socket (``sent_high``) and the lowest offset this process read
and handed to the encoder (kept for the life of the process, across revocations), so the far side
can report the loss of a stream's tail and of a session's first records. Rules:

- a partition is reported while this consumer has it assigned; the last heartbeat, at shutdown
  (``final``), reports every partition this process sent from;
- every sent offset was read first, so each reported partition has a low offset <= its high;
- a tick sends no heartbeat while an earlier one still waits for the pacer: the newer one would
  overtake it anyway, and on a slow link heartbeats must not queue up;
- ticks come every ``interval`` seconds (``HeartbeatSchedule``); ``sent_at_ms`` is wall time.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat's content, as ``Encoder.heartbeat`` takes it."""

    sender_id: str
    """The sender's configured id."""
    started_at_ms: int
    """When this sender process started (wall time, ms)."""
    sent_at_ms: int
    """When the heartbeat was built (wall time, ms)."""
    high_offsets: tuple[tuple[str, int, int], ...]
    """``(topic, partition, offset)``: the highest offset sent, per reported partition."""
    low_offsets: tuple[tuple[str, int, int], ...]
    """``(topic, partition, offset)``: the lowest offset read, for the same partitions."""
    counters: tuple[tuple[str, int], ...]
    """``(name, value)`` sorted by name: the sender's running totals."""


def assemble(
    *,
    sender_id: str,
    started_at_ms: int,
    sent_at_ms: int,
    sent_high: Mapping[TopicPartition, int],
    low_offsets: Mapping[TopicPartition, int],
    assigned: Container[TopicPartition],
    final: bool,
    counters: Mapping[str, int],
) -> Beat:
    """The heartbeat for this moment (rules in the module docstring).

    Raises:
        KeyError: a partition of ``sent_high`` has no low offset (a sent offset was never read:
            a bug in the caller).
    """
    high = tuple(
        (topic, partition, offset)
        for (topic, partition), offset in sorted(sent_high.items())
        if final or (topic, partition) in assigned
    )
    low = tuple((topic, partition, low_offsets[topic, partition]) for topic, partition, _ in high)
    return Beat(
        sender_id=sender_id,
        started_at_ms=started_at_ms,
        sent_at_ms=sent_at_ms,
        high_offsets=high,
        low_offsets=low,
        counters=tuple(sorted(counters.items())),
    )


class HeartbeatSchedule:
    """When the next heartbeat is due: a tick every ``interval`` seconds from the first call."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next_at: float | None = None
        """Monotonic time of the next tick; None before the first."""

    def tick(self, now: float, *, control_pending: int) -> bool:
        """Called at ``now`` (at or after ``next_at``): True when a heartbeat is to be sent now,
        False when none is due yet or an earlier one still waits (``control_pending``)."""
        if self.next_at is not None and now < self.next_at:
            return False
        self.next_at = now + self.interval
        return not control_pending

    def delay(self, now: float) -> float:
        """Seconds from ``now`` to the next tick."""
        return 0.0 if self.next_at is None else max(0.0, self.next_at - now)
