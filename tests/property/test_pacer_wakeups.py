"""The pacer's waits, over the settings that could break them (sender/pacing.py).

A backlogged paced sender wakes, sends what the buckets allow in UDP GSO runs (``room`` and
``take_run``, as ``SendScheduler.next_run`` does), and waits what ``delay`` says. Event loops
round timers to whole milliseconds (uvloop rounds a 36 µs timer to 0 and spins a core), so a
wait is never shorter than ``MIN_WAIT`` or a burst. Lengthening the waits must cost nothing:
over any settings of rates, bursts, datagram sizes and wake-up lateness,

- every wait is at least ``min(MIN_WAIT, burst time)``: a few hundred wake-ups a second, not one
  per datagram;
- the long-run average is the rate the tighter limit sets (within 1 %);
- nothing exceeds either bucket: from the start, bytes <= burst + rate * t + one datagram, and the
  same for datagrams; what leaves at one wake-up is at most a burst, a datagram and the lateness
  credited back (``catch_up_seconds``): a longer wait never makes a larger burst.
"""

from __future__ import annotations

import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sender.pacing import MIN_WAIT, Pacer, PacingConfig
from sender.transport import GSO_MAX_BYTES, GSO_MAX_SEGMENTS

DURATION = 2.0


@settings(max_examples=150, deadline=None)
@given(
    bytes_per_s=st.sampled_from([0.0, 20_000.0, 1e6, 15e6, 40e6, 125e6, 1.25e9]),
    datagrams_per_s=st.sampled_from([0.0, 50.0, 3_000.0, 80_000.0, 1e6]),
    burst_seconds=st.sampled_from([0.0001, 0.001, 0.002, 0.02, 0.5]),
    size=st.integers(min_value=100, max_value=9000),
    late=st.sampled_from([0.0, 0.0005, 0.004]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_waits_are_long_and_the_rate_and_bursts_hold(
    bytes_per_s: float,
    datagrams_per_s: float,
    burst_seconds: float,
    size: int,
    late: float,
    seed: int,
) -> None:
    assume(bytes_per_s or datagrams_per_s)  # unlimited: no waits at all
    config = PacingConfig(
        bytes_per_s=bytes_per_s,
        datagrams_per_s=datagrams_per_s,
        burst_seconds=burst_seconds,
        max_datagram_size=9000,
    )
    pacer = Pacer(config, 0.0)
    byte_burst = max(9000.0, bytes_per_s * burst_seconds)
    dgram_burst = max(1.0, datagrams_per_s * burst_seconds)
    shortest = min(
        MIN_WAIT,
        byte_burst / bytes_per_s if bytes_per_s else MIN_WAIT,
        dgram_burst / datagrams_per_s if datagrams_per_s else MIN_WAIT,
    )
    rng = random.Random(seed)
    now = 0.0
    sent = 0
    backlogged = False
    lateness = 0.0
    at_wake = 0
    while now < DURATION:
        wait = pacer.delay(size, now, backlogged=backlogged)
        if wait > 0:
            assert wait >= shortest * (1 - 1e-9)
            backlogged = True
            lateness = rng.uniform(0.0, late)
            now += wait + lateness
            at_wake = sent
            continue
        room_bytes, room_datagrams = pacer.room()
        n = 1 + max(0, int(min(room_datagrams, GSO_MAX_SEGMENTS) - 1))
        n = min(n, 1 + max(0, int((min(room_bytes, GSO_MAX_BYTES) - size) // size)))
        pacer.take_run(n * size, n, now)
        sent += n
        if backlogged:
            burst = sent - at_wake
            assert burst * size <= (
                byte_burst + size + bytes_per_s * lateness if bytes_per_s else 1e18
            )
            assert burst <= (
                dgram_burst + 1 + datagrams_per_s * lateness if datagrams_per_s else 1e18
            )
        assert sent * size <= (byte_burst + bytes_per_s * now + size if bytes_per_s else 1e18)
        assert sent <= (dgram_burst + datagrams_per_s * now + 1 if datagrams_per_s else 1e18)
    limits = []
    if bytes_per_s:
        limits.append(bytes_per_s / size)
    if datagrams_per_s:
        limits.append(datagrams_per_s)
    expected = min(limits) * now
    # A datagram at least the byte burst leaves one per burst's refill (the bucket's documented
    # rule: min(n, burst) tokens, the rest as debt), which is the byte rate again.
    assert sent >= 0.99 * expected - 1
