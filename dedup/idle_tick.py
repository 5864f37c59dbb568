"""Ticks: a micro-batch at least once per gap-scan interval, without a batch every trigger.

The stateful step scans a source partition's gaps in Spark's processing-time timeouts, and Spark
evaluates timeouts only inside a micro-batch. By default Spark therefore runs a *no-data*
micro-batch every trigger; each costs about what a batch with data costs (state commit, the
timeout pass through Python, planning: ~0.9 CPU-s on the 2-core machine of docs/benchmarks.md),
so an idle dedup burned most of a core. The job turns no-data batches off
(``spark.sql.streaming.noDataMicroBatches.enabled=false``) and the driver writes a tick to its own
control topic whenever no batch ran for one scan interval: the tick is input, so Spark runs a
batch, the timeouts fire, the classifier drops the tick. A dead link's gaps are still reported
(at most one scan interval later than with a batch every trigger), at a tenth of the cost.

**Settled: a tick per ``SETTLED_FACTOR`` intervals.** A tick's batch only runs gap scans, and a
scan with no input since the last one changes nothing once no partition holds a *pending* gap
(seen by one scan, reported by the next: ``gaps.PartitionDetector.scan``). So after a batch with
no input and no output whose scanned partitions hold no pending gap (``dedup/batch_driver.py``
``settled``; every partition is due at a tick's batch, which comes an interval after the last
batch: a quiet batch sooner than an interval after input, such as one of a tick written while
the first batch was planned, does not count), further ticks would change nothing until input
arrives, and input makes a batch by itself. The ticker then ticks ``SETTLED_FACTOR`` times less
often rather than never: a safety net should a wall-clock step have left a partition unscanned
in the settling batch. A silent link then costs one batch per 10 intervals (docs/benchmarks.md
"Dedup").

Runs in the **driver** (``dedup/runner.py`` polls it twice a second). Pure: the clock and the
write are passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

#: While settled, a tick per this many intervals (100 s at the default 10 s).
SETTLED_FACTOR: Final = 10


class IdleTicker:
    """Calls ``write_tick`` when no micro-batch started or ended for ``interval`` seconds."""

    def __init__(self, write_tick: Callable[[], None], interval: float, now: float) -> None:
        if not interval > 0:
            raise ValueError(f"tick interval must be > 0 s, got {interval!r}")
        self._write_tick = write_tick
        self.interval = interval
        self._batches = 0
        self._since = now
        self.ticks = 0

    def idle_wait(self, *, settled: bool) -> float:
        """Seconds of idleness before a tick: ``SETTLED_FACTOR`` intervals while settled."""
        return self.interval * (SETTLED_FACTOR if settled else 1)

    def poll(self, now: float, *, batches_seen: int, in_batch: bool, settled: bool = False) -> bool:
        """Tick if the query has been idle for an interval (``SETTLED_FACTOR`` intervals when
        the last batch left the state ``settled``); True if it ticked."""
        if in_batch or batches_seen != self._batches:
            self._batches = batches_seen
            self._since = now
            return False
        if now - self._since < self.idle_wait(settled=settled):
            return False
        # a tick that Spark has not yet turned into a batch is not repeated before an interval
        self._since = now
        self.ticks += 1
        self._write_tick()
        return True
