"""The driver's idle ticker (dedup/idle_tick.py): one tick per idle scan interval, never more."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedup.idle_tick import SETTLED_FACTOR, IdleTicker


def test_a_tick_after_an_interval_without_a_batch_and_none_while_batches_run() -> None:
    ticks: list[float] = []
    clock = [0.0]
    ticker = IdleTicker(lambda: ticks.append(clock[0]), 10.0, now=0.0)
    for t in (0.5, 5.0, 9.5):
        clock[0] = t
        assert not ticker.poll(t, batches_seen=0, in_batch=False)
    clock[0] = 10.5
    assert ticker.poll(10.5, batches_seen=0, in_batch=False)
    # the tick's batch has not run yet: no second tick within the interval
    clock[0] = 15.0
    assert not ticker.poll(15.0, batches_seen=0, in_batch=False)
    # the batch runs and ends: the interval starts again from its end
    assert not ticker.poll(16.0, batches_seen=0, in_batch=True)
    assert not ticker.poll(17.0, batches_seen=1, in_batch=False)
    assert not ticker.poll(26.9, batches_seen=1, in_batch=False)
    clock[0] = 27.0
    assert ticker.poll(27.0, batches_seen=1, in_batch=False)
    assert ticks == [10.5, 27.0]
    assert ticker.ticks == 2


@given(st.lists(st.tuples(st.floats(0.01, 30.0), st.booleans()), max_size=200))
def test_ticks_are_at_least_an_interval_apart_and_never_while_busy(
    steps: list[tuple[float, bool]],
) -> None:
    """Whatever the pattern of batches, two ticks are an interval apart, none follows a batch
    by less than an interval, and an idle interval is never left without a tick."""
    interval = 10.0
    ticks: list[float] = []
    now = [0.0]
    ticker = IdleTicker(lambda: ticks.append(now[0]), interval, now=0.0)
    batches, last_activity = 0, 0.0
    for dt, batch in steps:
        now[0] += dt
        if batch:
            batches += 1
            last_activity = now[0]
        ticked = ticker.poll(now[0], batches_seen=batches, in_batch=False)
        if ticked:
            assert now[0] - last_activity >= interval
            assert len(ticks) < 2 or ticks[-1] - ticks[-2] >= interval
        elif not batch:
            since = max([last_activity, *ticks[-1:]])
            assert now[0] - since < interval


def test_an_interval_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="tick interval"):
        IdleTicker(lambda: None, 0.0, now=0.0)


def test_settled_ticks_come_settled_factor_times_less_often_until_a_batch_moves() -> None:
    ticks: list[float] = []
    ticker = IdleTicker(lambda: None, 10.0, now=0.0)
    for t in range(1, 400):
        # settled from the start, until a batch with input at 250 s (then busy again)
        settled = t < 250
        batches = 1 if t >= 250 else 0
        if ticker.poll(float(t), batches_seen=batches, in_batch=False, settled=settled):
            ticks.append(float(t))
    factor = SETTLED_FACTOR * 10.0
    assert ticks[:2] == [factor, 2 * factor]
    # the batch at 250 s restarts the clock, and unsettled ticks come every interval again
    assert [t for t in ticks if t > 250][:3] == [260.0, 270.0, 280.0]
