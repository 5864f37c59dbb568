"""The pure token bucket: average rates over a fake clock, bursts, both limits together."""

import random

import pytest

from common.errors import ConfigError
from sender.pacing import Pacer, PacingConfig, TokenBucket


def run_paced(pacer: Pacer, size: int, duration: float, start: float = 0.0) -> tuple[int, int]:
    """Send datagrams of ``size`` as fast as the pacer allows for ``duration`` fake seconds."""
    now = start
    sent_bytes = sent = 0
    while True:
        wait = pacer.delay(size, now)
        if wait > 0:
            now += wait
            continue
        if now >= start + duration:
            return sent_bytes, sent
        pacer.take(size, now)
        sent_bytes += size
        sent += 1


@pytest.mark.parametrize(
    ("rate", "size"),
    [
        (10_000.0, 200),
        (10_000.0, 1452),
        (1_000_000.0, 1452),
        (1_000_000.0, 9000),
        (100_000_000.0, 9000),
    ],
)
def test_byte_rate_average_is_within_ten_percent(rate: float, size: int) -> None:
    pacer = Pacer(PacingConfig(bytes_per_s=rate, max_datagram_size=size), 0.0)
    sent_bytes, _ = run_paced(pacer, size, duration=5.0)
    assert abs(sent_bytes / 5.0 - rate) <= 0.10 * rate


@pytest.mark.parametrize("size", [200, 1452, 9000])
def test_excess_over_the_rate_is_at_most_one_burst(size: int) -> None:
    # burst = max(max datagram, rate x burst_seconds): 9000 bytes here, 18 % of 5 s at 10 kB/s.
    config = PacingConfig(bytes_per_s=10_000.0, max_datagram_size=9000)
    sent_bytes, _ = run_paced(Pacer(config, 0.0), size, duration=5.0)
    assert 10_000 * 5.0 - size <= sent_bytes <= 10_000 * 5.0 + 9000 + size


def test_datagram_rate_average() -> None:
    pacer = Pacer(PacingConfig(datagrams_per_s=5000), 100.0)
    _, count = run_paced(pacer, 1000, duration=4.0, start=100.0)
    assert abs(count / 4.0 - 5000) <= 500


def test_the_tighter_limit_wins() -> None:
    # 1 MB/s of 1000-byte datagrams is 1000/s; the datagram limit of 200/s is tighter.
    pacer = Pacer(PacingConfig(bytes_per_s=1_000_000, datagrams_per_s=200), 0.0)
    sent_bytes, count = run_paced(pacer, 1000, duration=5.0)
    assert abs(count / 5.0 - 200) <= 20
    assert sent_bytes / 5.0 < 1_000_000 * 0.5


def test_unlimited_never_delays() -> None:
    pacer = Pacer(PacingConfig(), 0.0)
    assert pacer.unlimited
    for _ in range(10_000):
        assert pacer.delay(65_000, 0.0) == 0.0
        pacer.take(65_000, 0.0)


def test_idle_time_earns_at_most_one_burst() -> None:
    bucket = TokenBucket(rate=1000.0, burst=100.0, now=0.0)
    bucket.take(100, 0.0)
    # A long idle spell refills to the burst, not beyond.
    now = 1_000.0
    taken = 0
    while bucket.delay(10, now) == 0.0:
        bucket.take(10, now)
        taken += 10
    assert taken == 100


def test_a_datagram_larger_than_the_burst_is_not_blocked_forever() -> None:
    bucket = TokenBucket(rate=100.0, burst=50.0, now=0.0)
    assert bucket.delay(500, 0.0) == 0.0
    bucket.take(500, 0.0)  # debt of 450 tokens: 4.5 s + the next datagram's 0.5 s
    assert bucket.delay(500, 0.0) == pytest.approx(5.0)


def test_delay_is_exact_for_the_missing_tokens() -> None:
    bucket = TokenBucket(rate=1000.0, burst=1000.0, now=0.0)
    bucket.take(1000, 0.0)
    assert bucket.delay(250, 0.0) == pytest.approx(0.25)
    assert bucket.delay(250, 0.25) == 0.0


def test_clock_going_backwards_does_not_mint_tokens() -> None:
    bucket = TokenBucket(rate=1000.0, burst=1000.0, now=10.0)
    bucket.take(1000, 10.0)
    assert bucket.delay(500, 5.0) > 0


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"bytes_per_s": -1}, "bytes_per_s"),
        ({"datagrams_per_s": float("inf")}, "datagrams_per_s"),
        ({"burst_seconds": 0}, "burst_seconds"),
    ],
)
def test_bad_pacing_config_names_the_key(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        PacingConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.key == key


def test_late_wakeups_while_backlogged_do_not_lower_the_average() -> None:
    # A busy event loop wakes the sender 0-40 ms late. Credited back, the average stays at rate;
    # cut at the 20 ms burst (not backlogged), it would fall well short.
    def run(backlogged: bool) -> float:
        rng = random.Random(7)
        pacer = Pacer(PacingConfig(bytes_per_s=300_000, burst_seconds=0.02), 0.0)
        now = sent = 0.0
        while now < 5.0:
            wait = pacer.delay(1452, now, backlogged=backlogged)
            if wait > 0:
                now += wait + rng.uniform(0.0, 0.04)
                continue
            pacer.take(1452, now)
            sent += 1452
        return sent / now

    assert abs(run(True) - 300_000) <= 0.02 * 300_000
    assert run(False) < 0.9 * 300_000


@pytest.mark.parametrize("seed", range(20))
def test_room_counts_the_whole_datagrams_that_leave_at_once(seed: int) -> None:
    """``room()`` (what a UDP GSO run may carry) gives exactly the datagrams that ``delay`` then
    ``take``, one at a time, let leave at the same instant: 3.7 tokens are 3 datagrams, not 4."""
    rnd = random.Random(seed)
    pacer = Pacer(PacingConfig(datagrams_per_s=rnd.choice([150.0, 2_000.0, 9_000.0])), 0.0)
    now = 0.0
    for _ in range(200):
        now += rnd.random() * 0.003
        if pacer.delay(1000, now) > 0:
            continue
        _, room = pacer.room()
        assert room == int(room) >= 1
        for _ in range(int(room)):
            assert pacer.delay(1000, now) == 0.0
            pacer.take(1000, now)
        assert pacer.delay(1000, now) > 0
