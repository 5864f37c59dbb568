"""Pacing: a token bucket in bytes per second and datagrams per second.

A diode cannot push back, so the sender must never emit faster than the link and the receiver can
take: whatever exceeds the rate is lost on the far side, silently. The pacer is the only brake.

Theory of operation
-------------------
Each bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second. A datagram of
``n`` bytes needs ``n`` byte tokens *and* one datagram token. It may leave when the bucket holds at
least ``min(n, burst)`` tokens (so a datagram larger than the burst is not blocked forever); taking
it may leave the bucket in debt, which later refills pay back. Over any interval ``t`` the pacer
therefore lets through at most ``burst + rate * t`` tokens plus one datagram: the long-run average
is exactly ``rate``. A busy event loop wakes the sender late; while datagrams were waiting for
tokens (not idle), that lateness is credited back up to ``catch_up_seconds`` instead of being cut
off at ``burst``, or the average would fall below ``rate`` whenever the loop is slow. Every copy
of a redundant datagram is paced like any other datagram. A run of datagrams handed to the kernel
in one call (UDP GSO) is paced per datagram: it may leave only when every datagram in it would
have left at once on its own, without debt (``room``), so a run is never larger than the burst.
A wait is never shorter than ``MIN_WAIT`` (or either burst, if that is shorter): a paced sender
wakes about every two milliseconds and sends what the rate allowed in it, not once per datagram.

Pure (docs/design.md, "A sans-IO core"): the caller passes ``now`` (seconds, monotonic); nothing
here sleeps or reads a clock, so tests drive it with a fake clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import ConfigError

_EPSILON = 1e-6
MIN_WAIT = 0.002
"""Shortest wait ``Pacer.delay`` asks for (seconds), unless a burst is shorter: waking
per datagram costs a timer per datagram, and event loops round timers to whole milliseconds
(uvloop rounds 36 µs down to 0: the sender would spin a core between datagrams)."""


class TokenBucket:
    """One token bucket; ``rate == 0`` means unlimited."""

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate < 0 or not math.isfinite(rate):
            raise ConfigError("rate", f"is {rate}", "use 0 (unlimited) or a positive number")
        if rate > 0 and burst <= 0:
            raise ConfigError("burst", f"is {burst}", "use a positive number")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last = now

    def _refill(self, now: float, cap: float) -> None:
        if now > self._last:
            self._tokens = min(cap, self._tokens + (now - self._last) * self.rate)
            self._last = now

    def delay(self, amount: float, now: float, *, catch_up: float = 0.0) -> float:
        """Seconds from ``now`` until ``amount`` tokens may be taken (0.0: at once).

        ``catch_up`` (seconds) raises the cap for this refill: a sender that was waiting for
        tokens with data queued, and was woken late by a busy event loop, gets up to that much
        lost time back, so the long-run average stays at ``rate``.
        """
        if self.rate == 0:
            return 0.0
        self._refill(now, self.burst + self.rate * catch_up)
        need = min(amount, self.burst)
        # A millionth of a token of tolerance: float rounding must not leave a shortfall so small
        # that adding it to ``now`` changes nothing (an endless zero-length wait).
        if self._tokens >= need - _EPSILON:
            return 0.0
        return (need - self._tokens) / self.rate

    def room(self) -> float:
        """Tokens that may be taken at once after the last ``delay``: what the bucket holds, but
        never more than ``burst`` (``inf`` when unlimited)."""
        if self.rate == 0:
            return math.inf
        return min(self._tokens, self.burst)

    def burst_time(self) -> float:
        """Seconds of rate the burst holds (``inf`` when unlimited)."""
        return math.inf if self.rate == 0 else self.burst / self.rate

    def take(self, amount: float, now: float) -> None:
        """Take ``amount`` tokens (the bucket may go into debt; see the module docstring)."""
        if self.rate == 0:
            return
        self._refill(now, max(self.burst, self._tokens))
        self._tokens -= amount


@dataclass(frozen=True, slots=True, kw_only=True)
class PacingConfig:
    """Limits for one pacer."""

    bytes_per_s: float = 0.0
    """Byte rate limit, UDP payload bytes per second, every copy counted; 0 is unlimited."""
    datagrams_per_s: float = 0.0
    """Datagram rate limit per second, every copy counted; 0 is unlimited."""
    burst_seconds: float = 0.02
    """How much sending may run ahead of the rate after an idle spell, in seconds of rate."""
    max_datagram_size: int = 1472
    """Largest datagram; the byte burst is never smaller than this."""
    catch_up_seconds: float = 0.25
    """Lateness of the event loop credited back while datagrams wait for pacing (seconds)."""

    def __post_init__(self) -> None:
        for key in ("bytes_per_s", "datagrams_per_s"):
            value = getattr(self, key)
            if value < 0 or not math.isfinite(value):
                raise ConfigError(key, f"is {value}", "use 0 (unlimited) or a positive number")
        if not 0 < self.burst_seconds <= 10:
            raise ConfigError("burst_seconds", f"is {self.burst_seconds}", "use 0 < value <= 10")
        if not 0 <= self.catch_up_seconds <= 10:
            raise ConfigError(
                "catch_up_seconds", f"is {self.catch_up_seconds}", "use 0 <= value <= 10"
            )
        if self.max_datagram_size <= 0:
            raise ConfigError("max_datagram_size", "must be positive")


class Pacer:
    """Both buckets together: a datagram leaves only when both allow it."""

    __slots__ = ("_bytes", "_catch_up", "_datagrams", "_min_wait", "unlimited")

    def __init__(self, config: PacingConfig, now: float) -> None:
        byte_burst = max(float(config.max_datagram_size), config.bytes_per_s * config.burst_seconds)
        dgram_burst = max(1.0, config.datagrams_per_s * config.burst_seconds)
        self._bytes = TokenBucket(config.bytes_per_s, byte_burst, now)
        self._datagrams = TokenBucket(config.datagrams_per_s, dgram_burst, now)
        self._catch_up = config.catch_up_seconds
        # A wait no longer than either burst loses no tokens to the cap while backlogged: what
        # refills in it is at most what the bucket that sets the pace was emptied of.
        self._min_wait = min(MIN_WAIT, self._bytes.burst_time(), self._datagrams.burst_time())
        self.unlimited = config.bytes_per_s == 0 and config.datagrams_per_s == 0
        """True when no limit is set: callers may skip the bookkeeping entirely."""

    def delay(self, size: int, now: float, *, backlogged: bool = False) -> float:
        """Seconds from ``now`` until a datagram of ``size`` bytes may be sent.

        ``backlogged``: the caller has been holding datagrams back since its last send (it was
        waiting for this pacer, not idle). Then a late wake-up is credited, up to
        ``catch_up_seconds``, instead of being lost to the burst cap.
        """
        if self.unlimited:
            return 0.0
        catch_up = self._catch_up if backlogged else 0.0
        wait = max(
            self._bytes.delay(size, now, catch_up=catch_up),
            self._datagrams.delay(1, now, catch_up=catch_up),
        )
        if 0.0 < wait < self._min_wait:
            # Wake for a batch of datagrams, not one: the tokens that gather meanwhile leave
            # together (a GSO run), within the burst, so the average and the burst are unchanged.
            return self._min_wait
        return wait

    def room(self) -> tuple[float, float]:
        """``(bytes, datagrams)`` that may leave together right after a ``delay`` that said 0:
        a run of datagrams (UDP GSO) whose sizes add up to no more than these is paced exactly
        as if each had asked ``delay`` in turn, and is never larger than either burst. The
        datagrams are whole ones (``delay`` lets one leave per whole token, within its
        tolerance): 3.7 tokens let 3 leave at once, not 4."""
        datagrams = self._datagrams.room()
        if datagrams != math.inf:
            datagrams = float(math.floor(datagrams + _EPSILON))
        return self._bytes.room(), datagrams

    def take(self, size: int, now: float) -> None:
        """Account for a datagram of ``size`` bytes handed to the socket at ``now``."""
        if self.unlimited:
            return
        self._bytes.take(size, now)
        self._datagrams.take(1, now)

    def take_run(self, size: int, datagrams: int, now: float) -> None:
        """Account for ``datagrams`` datagrams of ``size`` bytes in all handed over at ``now`` in
        one call (a UDP GSO run): the same tokens as one ``take`` per datagram at ``now``."""
        if self.unlimited:
            return
        self._bytes.take(size, now)
        self._datagrams.take(datagrams, now)
