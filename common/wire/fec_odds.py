"""The odds of a FEC block: how often a block of k sources and m repairs fails, by arithmetic.

Pure (no I/O, no randomness): the figures docs/sender.md tabulates, the sender's defaults were
chosen from (``FecConfig``), ``bench/fec_loss.py`` prints beside what it measured, and the
receiver's ``KafkaDiodeFecMarginLow`` alert is calibrated against.

Theory of operation. A block is k source datagrams and m = ceil(k x overhead / 100) repairs;
Reed-Solomon is MDS, so the block loses nothing when at most m of its n = k + m datagrams are
lost and fails (its lost sources become gaps until a resend) when more than m are.

- **Independent loss** at rate p (netem ``loss p%``): the losses of a block are Binomial(n, p),
  and the block fails with the upper tail P(X > m), summed term by term (no ``1 - ...``, which
  would cancel to 0 below ~1e-16).
- **Bursty loss**: the Gilbert-Elliott chain netem's ``loss gemodel p r 1-h 1-k`` and our relay
  (netem/impair.py) run: per datagram, lose it with the probability of the current state (bad:
  ``loss_bad``, good: ``loss_good``), then move good -> bad with probability p_gb and bad -> good
  with r_bg. The chain starts in its stationary distribution. With interleave D the sender deals
  consecutive datagrams round-robin into D blocks and sends their repairs interleaved as well, so
  a block's n datagrams sit exactly D apart on the link: between two members the chain takes D
  steps (the D-th power of its transition matrix). A forward pass over the members, carrying
  (state, losses so far capped at m + 1), gives the exact failure probability of this model.
  With independent loss and any D this reduces to the binomial tail.

The unit that matters to an operator is **failed blocks per million source datagrams**:
P(fail) x 10^6 / k. A block of k sources is opened every k source datagrams, so this is the
expected number of blocks whose records wait for a resend per million datagrams of data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import ConfigError

#: The unit of docs/sender.md's table: failed blocks per this many source datagrams.
PER_MILLION = 1_000_000


def repairs_for(k: int, overhead: float) -> int:
    """Repairs of a block of ``k`` sources at ``overhead`` percent: ``ceil(k x P / 100)``, at
    least 1, exactly as ``FecConfig.repairs_for`` (the 1e-9 absorbs 20 % of 5 = 1.0000000002)."""
    return max(1, math.ceil(k * overhead / 100 - 1e-9))


def binomial_tail(n: int, p: float, m: int) -> float:
    """P(X > m) for X ~ Binomial(n, p): the chance that more than ``m`` of ``n`` are lost.

    Summed from the tail's own terms, so 1e-30 stays 1e-30.

    Raises:
        ValueError: ``p`` not in [0, 1] or ``n``/``m`` negative.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p} is not a probability")
    if n < 0 or m < 0:
        raise ValueError(f"n={n}, m={m} must not be negative")
    if m >= n:
        return 0.0
    if p == 0.0:
        return 0.0
    if p == 1.0:
        return 1.0
    q = 1.0 - p
    return math.fsum(math.comb(n, i) * p**i * q ** (n - i) for i in range(m + 1, n + 1))


@dataclass(frozen=True, kw_only=True, slots=True)
class GilbertElliott:
    """A Gilbert-Elliott loss chain, in probabilities per datagram (netem's in percent / 100)."""

    p_gb: float
    """Good -> bad transition probability (netem ``p``)."""
    r_bg: float
    """Bad -> good transition probability (netem ``r``): bursts last 1 / r datagrams on average."""
    loss_bad: float = 1.0
    """Loss probability in the bad state (netem ``1-h``)."""
    loss_good: float = 0.0
    """Loss probability in the good state (netem ``1-k``)."""

    def __post_init__(self) -> None:
        for name in ("p_gb", "r_bg", "loss_bad", "loss_good"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(name, f"{value} is not a probability", "use 0 .. 1")
        if self.p_gb + self.r_bg <= 0.0:
            raise ConfigError("r_bg", "the chain never moves", "set p_gb or r_bg above 0")

    @classmethod
    def from_loss(cls, loss: float, mean_burst: float) -> GilbertElliott:
        """The chain with mean loss ``loss`` (0..1) in bursts of ``mean_burst`` datagrams on
        average (bad state always loses, good state never): r = 1 / burst, p = r x loss /
        (1 - loss). This is bench/fec_loss.py's ``bursty`` model and the relay's ``bursty``
        profile (1 %, 20 %: 4.8 % loss in bursts of 5).

        Raises:
            ConfigError: ``loss`` not in [0, 1) or ``mean_burst`` below 1.
        """
        if not 0.0 <= loss < 1.0:
            raise ConfigError("loss", f"{loss} is not in [0, 1)", "e.g. 0.02 for 2 %")
        if mean_burst < 1.0:
            raise ConfigError("mean_burst", f"{mean_burst} is below 1 datagram")
        r = 1.0 / mean_burst
        return cls(p_gb=min(1.0, r * loss / (1.0 - loss)), r_bg=r)

    @property
    def bad_share(self) -> float:
        """Stationary probability of the bad state, p / (p + r)."""
        return self.p_gb / (self.p_gb + self.r_bg)

    @property
    def mean_loss(self) -> float:
        """Long-run share of datagrams lost."""
        bad = self.bad_share
        return bad * self.loss_bad + (1.0 - bad) * self.loss_good

    def steps(self, d: int) -> tuple[float, float]:
        """(P(bad after d steps | good), P(bad after d steps | bad)): the D-th matrix power of a
        two-state chain in closed form, pi_bad + (start - pi_bad) x (1 - p - r)^d."""
        bad = self.bad_share
        decay = (1.0 - self.p_gb - self.r_bg) ** d
        return bad - bad * decay, bad + (1.0 - bad) * decay


def block_failure_random(k: int, m: int, loss: float) -> float:
    """P(a block of ``k`` sources and ``m`` repairs fails) with independent loss ``loss`` (0..1)."""
    return binomial_tail(k + m, loss, m)


def block_failure_burst(k: int, m: int, chain: GilbertElliott, *, interleave: int = 1) -> float:
    """P(a block of ``k`` sources and ``m`` repairs fails) on ``chain``, its members
    ``interleave`` datagrams apart (see the module docstring).

    Raises:
        ValueError: ``k`` or ``interleave`` below 1, or ``m`` negative.
    """
    if k < 1 or m < 0 or interleave < 1:
        raise ValueError(f"k={k}, m={m}, interleave={interleave}")
    to_bad_from_good, stay_bad = chain.steps(interleave)
    cap = m + 1  # every count above m fails alike: one bucket keeps the pass O(n x m)
    bad = chain.bad_share
    # probs[state][losses]: state 0 good, 1 bad, before the next member's loss is drawn
    good_row = [0.0] * (cap + 1)
    bad_row = [0.0] * (cap + 1)
    good_row[0], bad_row[0] = 1.0 - bad, bad
    n = k + m
    for member in range(n):
        new_good = [0.0] * (cap + 1)
        new_bad = [0.0] * (cap + 1)
        last = member == n - 1
        for losses in range(cap + 1):
            for weight, loss_p, from_bad in (
                (good_row[losses], chain.loss_good, False),
                (bad_row[losses], chain.loss_bad, True),
            ):
                if weight == 0.0:
                    continue
                hit = min(cap, losses + 1)
                lost, kept = weight * loss_p, weight * (1.0 - loss_p)
                if last:  # the state after the block does not matter
                    new_good[hit] += lost
                    new_good[losses] += kept
                    continue
                to_bad = stay_bad if from_bad else to_bad_from_good
                new_bad[hit] += lost * to_bad
                new_good[hit] += lost * (1.0 - to_bad)
                new_bad[losses] += kept * to_bad
                new_good[losses] += kept * (1.0 - to_bad)
        good_row, bad_row = new_good, new_bad
    return good_row[cap] + bad_row[cap]


def per_million(p_block: float, k: int) -> float:
    """Failed blocks per million source datagrams for blocks of ``k`` sources failing with
    probability ``p_block``."""
    return p_block * PER_MILLION / k


def failed_per_million_random(k: int, overhead: float, loss: float) -> float:
    """Failed blocks per million source datagrams: full blocks of ``k`` at ``overhead`` %,
    independent loss ``loss`` (0..1)."""
    return per_million(block_failure_random(k, repairs_for(k, overhead), loss), k)


def failed_per_million_burst(
    k: int, overhead: float, chain: GilbertElliott, *, interleave: int = 1
) -> float:
    """Failed blocks per million source datagrams: full blocks of ``k`` at ``overhead`` %,
    interleave ``interleave``, on the Gilbert-Elliott ``chain``."""
    m = repairs_for(k, overhead)
    return per_million(block_failure_burst(k, m, chain, interleave=interleave), k)


def margin_used_tail(k: int, m: int, loss: float, share: float) -> float:
    """P(a block with independent loss ``loss`` loses more than ``share`` x m of its k + m
    datagrams): how often the receiver's ``fec_margin_used`` histogram exceeds ``share`` on a
    link at that loss (the alert's calibration, docs/operations.md)."""
    return binomial_tail(k + m, loss, math.floor(share * m))


def blocks_at_rate(
    rate: float, block_size: int, interleave: int, latency: float
) -> tuple[int, int]:
    """(sources per block, blocks per round) of a stream carrying ``rate`` source datagrams/s.

    A round (``interleave`` blocks) fills in ``block_size x interleave / rate`` seconds; when
    that is longer than ``latency`` the round closes early with ``rate x latency`` sources,
    dealt afresh into ``ceil(n / block_size)`` blocks (``FecEncoder``): that many blocks of
    ``n / count`` sources, members ``count`` apart.
    """
    per_round = block_size * interleave
    n = min(per_round, max(1, math.floor(rate * latency)))
    if n == per_round:
        return block_size, interleave
    count = -(-n // block_size)
    return n // count, count
