"""The stall watchdog: a sender that silently stops reading is the worst failure a diode can have.

When nothing was read or sent for ``limit`` seconds, the watchdog asks the broker whether records
wait that this consumer has not read (``suspect``, then ``verdict`` with the fresh lag). If they
do, that is a stall: counted, logged at ERROR, and the caller re-creates the Kafka consumer; the
new consumer then gets a whole ``limit`` before the next verdict. Progress of any kind, or no
lag, clears it. ``StallWatch`` is pure (the caller passes the clock, the progress and the lag);
``watch`` is the loop that feeds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Stall:
    """A verdict: records wait and nothing moved."""

    idle: float
    """Seconds with nothing read or sent."""
    waiting: dict[TopicPartition, int]
    """Records waiting per partition (only partitions with some)."""


class StallWatch:
    """Progress over time, and the stall verdicts (module docstring)."""

    def __init__(self, limit: float, now: float) -> None:
        self.limit = limit
        self._progress: tuple[int, ...] = ()
        self._since = now
        self.stalled = False
        """True from a stall verdict until progress or an empty lag clears it."""
        self.stalls = 0
        """Stall verdicts so far."""

    @property
    def interval(self) -> float:
        """How often to look."""
        return min(5.0, self.limit / 4)

    def suspect(self, now: float, progress: tuple[int, ...]) -> bool:
        """True when ``progress`` (records read, records sent) has not moved for ``limit``
        seconds: ask the broker for the lag and pass it to ``verdict``."""
        if progress != self._progress:
            self._progress, self._since = progress, now
            self.stalled = False
            return False
        return now - self._since >= self.limit

    def verdict(self, now: float, lag: Mapping[TopicPartition, int]) -> Stall | None:
        """A ``Stall`` when records wait (the limit starts again), None when none do."""
        waiting = {tp: n for tp, n in lag.items() if n > 0}
        idle = now - self._since
        self._since = now
        if not waiting:
            self.stalled = False
            return None
        self.stalled = True
        self.stalls += 1
        return Stall(idle, waiting)


async def watch(
    stalls: StallWatch,
    *,
    progress: Callable[[], tuple[int, ...] | None],
    lag: Callable[[], Awaitable[Mapping[TopicPartition, int]]],
    on_stall: Callable[[Stall], None],
    clock: Callable[[], float],
) -> None:
    """Forever: look every ``stalls.interval`` seconds; ``progress`` None means not running yet."""
    while True:
        await asyncio.sleep(stalls.interval)
        current = progress()
        if current is None:
            continue
        now = clock()
        if not stalls.suspect(now, current):
            continue
        stall = stalls.verdict(now, await lag())
        if stall is None:
            continue
        log.error(
            "sender stalled: nothing read or sent for %.0f s while %d records wait in %s; "
            "re-creating the Kafka consumer",
            stall.idle,
            sum(stall.waiting.values()),
            ", ".join(f"{t}/{p}" for t, p in sorted(stall.waiting)),
        )
        on_stall(stall)
