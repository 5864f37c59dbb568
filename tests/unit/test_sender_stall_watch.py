"""The stall watchdog's verdicts (sender/stall_watch.py), on a fake clock."""

import asyncio
import logging

import pytest

from sender.stall_watch import Stall, StallWatch, watch


def test_progress_keeps_it_quiet_and_a_standstill_is_only_suspected_after_the_limit() -> None:
    stalls = StallWatch(60.0, now=0.0)
    assert stalls.interval == 5.0
    assert not stalls.suspect(5.0, (0, 0))  # first look: progress recorded
    assert not stalls.suspect(30.0, (0, 0))
    assert not stalls.suspect(64.0, (0, 0))  # 59 s without progress
    assert stalls.suspect(65.0, (0, 0))
    assert not stalls.suspect(70.0, (1, 0))  # anything read: the limit starts again
    assert not stalls.suspect(129.0, (1, 0))
    assert stalls.suspect(130.0, (1, 0))
    assert (stalls.stalled, stalls.stalls) == (False, 0)


def test_no_lag_is_no_stall_and_restarts_the_limit() -> None:
    stalls = StallWatch(10.0, now=0.0)
    stalls.suspect(0.0, (5, 5))
    assert stalls.suspect(10.0, (5, 5))
    assert stalls.verdict(10.0, {("t", 0): 0}) is None  # caught up: idle, not stalled
    assert not stalls.suspect(19.0, (5, 5))
    assert stalls.suspect(20.0, (5, 5))
    assert (stalls.stalled, stalls.stalls) == (False, 0)


def test_records_waiting_is_a_stall_until_progress_clears_it() -> None:
    stalls = StallWatch(10.0, now=0.0)
    stalls.suspect(0.0, (5, 5))
    assert stalls.suspect(12.0, (5, 5))
    stall = stalls.verdict(12.0, {("t", 0): 0, ("t", 1): 7})
    assert stall == Stall(idle=12.0, waiting={("t", 1): 7})
    assert (stalls.stalled, stalls.stalls) == (True, 1)
    # the new consumer gets a whole limit before the next verdict
    assert not stalls.suspect(21.0, (5, 5))
    assert stalls.suspect(22.0, (5, 5))
    assert stalls.verdict(22.0, {("t", 1): 7}) == Stall(idle=10.0, waiting={("t", 1): 7})
    assert stalls.stalls == 2
    assert not stalls.suspect(23.0, (6, 5))  # it reads again
    assert not stalls.stalled


class _StopError(Exception):
    pass


def test_the_loop_reports_a_stall_once_per_limit(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    found: list[Stall] = []
    lags: list[float] = []

    async def lag() -> dict[tuple[str, int], int]:
        lags.append(now[0])
        if len(lags) == 3:
            raise _StopError
        return {("t", 0): 3}

    async def fake_sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr("sender.stall_watch.asyncio.sleep", fake_sleep)
    stalls = StallWatch(4.0, now=0.0)
    with caplog.at_level(logging.ERROR, logger="sender.stall_watch"), pytest.raises(_StopError):
        asyncio.run(
            watch(
                stalls,
                progress=lambda: (1, 1),
                lag=lag,
                on_stall=found.append,
                clock=lambda: now[0],
            )
        )
    assert lags == [5.0, 9.0, 13.0]  # looks every second (limit / 4), asks after 4 s idle
    assert found == [Stall(idle=4.0, waiting={("t", 0): 3})] * 2
    assert stalls.stalls == 2
    assert "sender stalled: nothing read or sent for 4 s while 3 records wait in t/0" in caplog.text
