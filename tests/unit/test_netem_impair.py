"""The pure impairment engine: statistics, netem semantics, determinism (netem/impair.py)."""

import itertools

import pytest

from netem.impair import HEADER_OVERHEAD, Impairer, apply
from netem.profile import NAMED_PROFILES, Profile

N = 100_000


def numbered(n: int, size: int = 16) -> list[bytes]:
    return [i.to_bytes(8, "big").ljust(size, b"\x00") for i in range(n)]


def number(datagram: bytes) -> int:
    return int.from_bytes(datagram[:8], "big")


def loss_runs(sent: int, received: list[bytes]) -> list[int]:
    """Lengths of runs of consecutive lost datagrams."""
    got = {number(d) for d in received}
    runs, current = [], 0
    for i in range(sent):
        if i in got:
            if current:
                runs.append(current)
            current = 0
        else:
            current += 1
    if current:
        runs.append(current)
    return runs


def test_clean_is_identity() -> None:
    data = numbered(1000)
    assert apply(NAMED_PROFILES["clean"], data, seed=1) == data


@pytest.mark.parametrize("percent", [1.0, 5.0, 20.0])
def test_iid_loss_rate(percent: float) -> None:
    impairer = Impairer(Profile(loss=percent), seed=11)
    out = []
    for i, d in enumerate(numbered(N)):
        impairer.submit(d, float(i))
        out += impairer.due(float(i))
    assert abs(1 - len(out) / N - percent / 100) < 0.005
    assert impairer.stats.dropped_loss == N - len(out)
    assert impairer.stats.forwarded == len(out)
    assert [number(d) for d in out] == sorted(number(d) for d in out)  # loss never reorders


def test_gilbert_elliott_bursts_are_longer_than_iid_at_equal_mean() -> None:
    bursty = NAMED_PROFILES["bursty"]
    ge_out = apply(bursty, numbered(N), seed=5)
    iid_out = apply(Profile(loss=bursty.mean_loss * 100), numbered(N), seed=5)
    ge_loss, iid_loss = 1 - len(ge_out) / N, 1 - len(iid_out) / N
    assert abs(ge_loss - bursty.mean_loss) < 0.01
    assert abs(iid_loss - bursty.mean_loss) < 0.005
    ge_runs, iid_runs = loss_runs(N, ge_out), loss_runs(N, iid_out)
    ge_mean, iid_mean = sum(ge_runs) / len(ge_runs), sum(iid_runs) / len(iid_runs)
    assert 4.0 < ge_mean < 6.0  # 1 / r = 5
    assert iid_mean < 1.2
    assert max(ge_runs) > max(iid_runs)


def test_gilbert_elliott_loss_in_good_state_and_partial_bad_state() -> None:
    p = Profile(ge_p=5, ge_r=20, ge_1_h=50, ge_1_k=1)
    out = apply(p, numbered(N), seed=2)
    assert abs(1 - len(out) / N - p.mean_loss) < 0.01


def test_correlated_loss_keeps_its_mean_and_clusters() -> None:
    out = apply(Profile(loss=5, loss_correlation=50), numbered(N), seed=3)
    assert abs(1 - len(out) / N - 0.05) < 0.006
    runs = loss_runs(N, out)
    assert sum(runs) / len(runs) > 1.6  # iid would be ~1.05; rho = 0.5 gives ~2


def test_duplicate_rate_and_copies_follow_originals() -> None:
    impairer = Impairer(Profile(duplicate=10), seed=4)
    out = []
    for i, d in enumerate(numbered(N)):
        impairer.submit(d, 0.0)
        out += impairer.due(0.0)
        del i
    assert abs(len(out) / N - 1.10) < 0.005
    assert impairer.stats.duplicated == len(out) - N
    pairs = sum(1 for a, b in itertools.pairwise(out) if a == b)
    assert pairs == impairer.stats.duplicated


def test_corrupt_flips_exactly_one_bit() -> None:
    data = numbered(N, size=32)
    out = apply(Profile(corrupt=1), data, seed=6)
    assert len(out) == N
    distances = [
        sum(bin(x ^ y).count("1") for x, y in zip(a, b, strict=True))
        for a, b in zip(data, out, strict=True)
    ]
    assert set(distances) <= {0, 1}
    assert abs(sum(distances) / N - 0.01) < 0.002


def test_corrupt_skips_empty_datagrams() -> None:
    assert apply(Profile(corrupt=100), [b""] * 10, seed=1) == [b""] * 10


def test_reorder_rate_with_gap_follows_netem() -> None:
    # gap 1: every datagram is a candidate -> 25 %; gap 5: 4 delayed, then geometric(0.25)
    # -> 1 / (4 + 4) = 12.5 %.
    for gap, expected in ((1, 0.25), (5, 0.125)):
        impairer = Impairer(Profile(delay=10, reorder=25, gap=gap), seed=7)
        for i, d in enumerate(numbered(N)):
            impairer.submit(d, i * 0.001)
            impairer.due(i * 0.001)
        assert abs(impairer.stats.reordered / N - expected) < 0.006, gap


def test_reordered_datagrams_overtake_delayed_ones() -> None:
    out = apply(Profile(delay=10, reorder=25, gap=5), numbered(20_000), seed=8, spacing=0.001)
    order = [number(d) for d in out]
    assert sorted(order) == list(range(20_000))
    overtakes = sum(1 for a, b in itertools.pairwise(order) if b < a)
    assert overtakes > 1000
    # A reordered datagram leaves at once: it overtakes at most delay/spacing = 10 others.
    position = {n: i for i, n in enumerate(order)}
    assert max(position[n] - n for n in order) <= 10
    assert max(n - position[n] for n in order) <= 10


def test_jitter_reorders_and_bounds_delay() -> None:
    impairer = Impairer(Profile(delay=10, jitter=5), seed=9)
    releases = []
    for i in range(1000):
        impairer.submit(i.to_bytes(4, "big"), i * 0.001)
        deadline = impairer.next_deadline()
        assert deadline is not None
    while (deadline := impairer.next_deadline()) is not None:
        for d in impairer.due(deadline):
            n = int.from_bytes(d, "big")
            releases.append((n, deadline - n * 0.001))
    delays = [delay for _, delay in releases]
    assert min(delays) >= 0.005 - 1e-9
    assert max(delays) <= 0.015 + 1e-9
    assert [n for n, _ in releases] != sorted(n for n, _ in releases)
    assert impairer.stats.delayed == 1000


def test_delay_holds_until_deadline() -> None:
    impairer = Impairer(Profile(delay=10), seed=1)
    impairer.submit(b"x", 100.0)
    assert impairer.next_deadline() == pytest.approx(100.010)
    assert impairer.due(100.0099) == []
    assert impairer.due(100.010) == [b"x"]
    assert impairer.next_deadline() is None
    assert impairer.held == impairer.held_bytes == 0


def test_rate_serialises_back_to_back() -> None:
    impairer = Impairer(Profile(rate=1_000_000), seed=1)
    for _ in range(10):
        impairer.submit(b"\x00" * 1000, 0.0)
    per = (1000 + HEADER_OVERHEAD) * 8 / 1_000_000
    deadlines = []
    while (deadline := impairer.next_deadline()) is not None:
        deadlines.append(deadline)
        assert len(impairer.due(deadline)) == 1
    assert deadlines == pytest.approx([per * (i + 1) for i in range(10)])


def test_limit_and_byte_cap_drop_and_count() -> None:
    impairer = Impairer(Profile(delay=10, limit=5), seed=1)
    for i in range(10):
        impairer.submit(bytes([i]), 0.0)
    assert impairer.held == 5
    assert impairer.stats.dropped_queue_full == 5
    capped = Impairer(Profile(delay=10), seed=1, max_held_bytes=2500)
    for _ in range(5):
        capped.submit(b"\x00" * 1000, 0.0)
    assert capped.held == 2
    assert capped.held_bytes == 2000
    assert capped.stats.dropped_queue_full == 3
    assert [len(d) for d in capped.flush()] == [1000, 1000]


def test_same_seed_same_output_different_seed_different() -> None:
    hostile = NAMED_PROFILES["hostile"]
    data = numbered(5000)
    first = apply(hostile, data, seed=42)
    assert apply(hostile, data, seed=42) == first
    assert apply(hostile.with_seed(42), data) == first  # the profile's seed is used
    assert apply(hostile, data, seed=43) != first


def test_unseeded_impairer_picks_and_reports_a_seed() -> None:
    impairer = Impairer(NAMED_PROFILES["lossy-5"])
    data = numbered(2000)
    assert apply(NAMED_PROFILES["lossy-5"], data, seed=impairer.seed) == apply(
        NAMED_PROFILES["lossy-5"], data, seed=impairer.seed
    )


def test_hostile_counts_add_up() -> None:
    impairer = Impairer(NAMED_PROFILES["hostile"], seed=10)
    out = []
    for i, d in enumerate(numbered(N)):
        impairer.submit(d, i * 0.0001)
        out += impairer.due(i * 0.0001)
    out += impairer.flush()
    s = impairer.stats
    assert s.received == N
    assert s.forwarded == len(out)
    assert s.received + s.duplicated == s.forwarded + s.dropped_loss + s.dropped_queue_full
    assert s.corrupted > 0
    assert s.reordered > 0
