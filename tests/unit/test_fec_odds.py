"""common/wire/fec_odds.py: the block-failure arithmetic behind the FEC defaults and docs."""

from __future__ import annotations

import itertools
import math

import pytest

from common.errors import ConfigError
from common.wire.fec import FecConfig
from common.wire.fec_odds import (
    GilbertElliott,
    binomial_tail,
    block_failure_burst,
    block_failure_random,
    blocks_at_rate,
    failed_per_million_burst,
    failed_per_million_random,
    margin_used_tail,
    repairs_for,
)
from sender.config import SenderConfig

BURSTY_2 = GilbertElliott.from_loss(0.02, 5)


def test_known_binomial_tails_of_the_issue() -> None:
    # issue #27: 32 + 7 fails when 8 or more of 39 are lost: 6.0e-4 at 5 %, ~19 per million
    assert block_failure_random(32, 7, 0.05) == pytest.approx(5.951e-4, rel=1e-3)
    assert failed_per_million_random(32, 20, 0.05) == pytest.approx(18.6, rel=1e-2)
    assert failed_per_million_random(64, 20, 0.05) == pytest.approx(0.404, rel=1e-2)
    assert failed_per_million_random(128, 20, 0.05) == pytest.approx(1.06e-4, rel=1e-2)
    # docs/sender.md's old table, 32 (7) at 1 % and 64 (13) at 2 %
    assert block_failure_random(32, 7, 0.01) == pytest.approx(4.7e-9, rel=2e-2)
    assert block_failure_random(64, 13, 0.02) == pytest.approx(4.2e-10, rel=2e-2)


def test_binomial_tail_edges_and_tiny_values() -> None:
    assert binomial_tail(10, 0.0, 0) == 0.0
    assert binomial_tail(10, 1.0, 9) == 1.0
    assert binomial_tail(5, 0.5, 5) == 0.0  # more than all five cannot be lost
    assert binomial_tail(1, 0.3, 0) == pytest.approx(0.3)
    assert binomial_tail(2, 0.5, 0) == pytest.approx(0.75)
    # far below double precision's 1 - x resolution, still exact: only the all-lost term
    assert binomial_tail(30, 1e-3, 29) == pytest.approx(1e-90, rel=1e-9)
    with pytest.raises(ValueError, match="probability"):
        binomial_tail(3, 1.5, 1)


def test_repairs_match_the_encoder() -> None:
    for k, overhead in itertools.product((1, 5, 32, 64, 160, 200), (5, 10, 20, 33.3, 50)):
        if k + repairs_for(k, overhead) <= 256:
            assert repairs_for(k, overhead) == FecConfig(overhead=overhead).repairs_for(k)


def _burst_by_enumeration(k: int, m: int, chain: GilbertElliott, interleave: int) -> float:
    """Every state path of the underlying chain, members every ``interleave`` steps."""
    n = k + m
    steps = (n - 1) * interleave + 1
    total = 0.0
    for path in itertools.product((False, True), repeat=steps):
        weight = chain.bad_share if path[0] else 1 - chain.bad_share
        for was, now in itertools.pairwise(path):
            to_bad = (1 - chain.r_bg) if was else chain.p_gb
            weight *= to_bad if now else 1 - to_bad
        # loss_bad 1, loss_good 0: the members lost are exactly those in the bad state
        if sum(path[i * interleave] for i in range(n)) > m:
            total += weight
    return total


@pytest.mark.parametrize(("k", "m", "interleave"), [(3, 1, 1), (4, 2, 1), (3, 1, 3), (2, 2, 4)])
def test_burst_model_matches_brute_force(k: int, m: int, interleave: int) -> None:
    chain = GilbertElliott(p_gb=0.1, r_bg=0.3)
    expected = _burst_by_enumeration(k, m, chain, interleave)
    assert block_failure_burst(k, m, chain, interleave=interleave) == pytest.approx(expected)


def test_memoryless_chain_is_the_binomial_tail() -> None:
    # p + r = 1: the next state ignores the current one, so losses are independent
    chain = GilbertElliott(p_gb=0.05, r_bg=0.95)
    assert chain.mean_loss == pytest.approx(0.05)
    for interleave in (1, 4):
        got = block_failure_burst(32, 7, chain, interleave=interleave)
        assert got == pytest.approx(block_failure_random(32, 7, 0.05), rel=1e-9)


def test_good_state_loss_counts_too() -> None:
    # a chain stuck in the good state (p 0) losing 5 % there is independent 5 % loss
    chain = GilbertElliott(p_gb=0.0, r_bg=0.5, loss_good=0.05)
    assert block_failure_burst(32, 7, chain) == pytest.approx(5.951e-4, rel=1e-3)


def test_interleave_spreads_bursts_and_wide_spacing_tends_to_independent_loss() -> None:
    fails = [block_failure_burst(32, 7, BURSTY_2, interleave=d) for d in (1, 2, 4, 8, 16)]
    assert fails == sorted(fails, reverse=True)
    assert fails[0] > 10 * fails[-1]
    far = block_failure_burst(32, 7, BURSTY_2, interleave=10_000)
    assert far == pytest.approx(block_failure_random(32, 7, BURSTY_2.mean_loss), rel=1e-6)


def test_from_loss_is_the_bench_and_relay_parametrisation() -> None:
    assert BURSTY_2.r_bg == pytest.approx(0.2)
    assert BURSTY_2.mean_loss == pytest.approx(0.02)
    # the relay's `bursty` profile: p 1 %, r 20 %, ~4.8 % loss in bursts of 5 on average
    assert GilbertElliott(p_gb=0.01, r_bg=0.2).mean_loss == pytest.approx(0.0476, rel=1e-2)
    with pytest.raises(ConfigError) as err:
        GilbertElliott.from_loss(1.0, 5)
    assert err.value.key == "loss"
    with pytest.raises(ConfigError) as err:
        GilbertElliott(p_gb=1.5, r_bg=0.2)
    assert err.value.key == "p_gb"


def test_the_defaults_keep_the_documented_promise() -> None:
    """docs/sender.md and the README: at 20 % with the default block size and interleave, fewer
    than one failed block per 10^9 source datagrams at 5 % random loss and at 2 % Gilbert-Elliott
    loss in bursts of 5 (full blocks)."""
    cfg = SenderConfig.__dataclass_fields__
    k = cfg["fec_block_size"].default
    d = cfg["fec_interleave"].default
    assert isinstance(k, int)
    assert isinstance(d, int)
    assert FecConfig(overhead=20).block_size == k
    assert FecConfig(overhead=20).interleave == d
    per_billion = 1000.0  # per million x 1000
    assert failed_per_million_random(k, 20, 0.05) * per_billion < 1
    assert failed_per_million_burst(k, 20, BURSTY_2, interleave=d) * per_billion < 1
    # the old default (32, 1) did not: ~19 and ~1000 per million
    assert failed_per_million_random(32, 20, 0.05) > 10
    assert failed_per_million_burst(32, 20, BURSTY_2) > 500


def test_margin_tail_is_the_binomial_tail_at_a_share_of_m() -> None:
    assert margin_used_tail(32, 7, 0.05, 1.0) == pytest.approx(block_failure_random(32, 7, 0.05))
    assert margin_used_tail(160, 32, 0.05, 0.5) == pytest.approx(binomial_tail(192, 0.05, 16))
    assert math.isclose(margin_used_tail(160, 32, 0.0, 0.5), 0.0)


def test_slow_streams_get_the_blocks_the_encoder_regroups_them_into() -> None:
    assert blocks_at_rate(10_000, 160, 4, 0.2) == (160, 4)  # a round fills in 64 ms
    assert blocks_at_rate(3200, 160, 4, 0.2) == (160, 4)
    assert blocks_at_rate(1000, 160, 4, 0.2) == (100, 2)  # 200 sources: 2 blocks of 100
    assert blocks_at_rate(100, 160, 4, 0.2) == (20, 1)
    assert blocks_at_rate(1, 160, 4, 0.2) == (1, 1)
    # regrouping is what keeps slow streams as safe as with the old default: 20 + 4 either way
    assert blocks_at_rate(100, 32, 1, 0.2) == (20, 1)
