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

Runs in the **driver** (``dedup/runner.py`` polls it twice a second). Pure: the clock and the
write are passed in.
"""

from __future__ import annotations

from collections.abc import Callable


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

    def poll(self, now: float, *, batches_seen: int, in_batch: bool) -> bool:
        """Tick if the query has been idle for an interval; True if it ticked."""
        if in_batch or batches_seen != self._batches:
            self._batches = batches_seen
            self._since = now
            return False
        if now - self._since < self.interval:
            return False
        # a tick that Spark has not yet turned into a batch is not repeated before an interval
        self._since = now
        self.ticks += 1
        self._write_tick()
        return True
