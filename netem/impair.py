"""The impairment engine: netem's rules applied to datagrams, with no I/O and no clock.

Theory of operation
-------------------
``Impairer.submit(datagram, now)`` decides, at once and in arrival order, everything that will
happen to the datagram; ``due(now)`` hands back the datagrams whose release time has come, in
release order; ``next_deadline()`` says when to call ``due`` next. Time is whatever the caller
passes (seconds, e.g. ``loop.time()``), so tests run on a virtual clock.

All random decisions come from one ``random.Random(seed)`` and are drawn in a fixed order per
datagram, so **the same seed and the same arrival order give the same output**, whatever the
timing (only release times depend on ``now``). Per datagram, following ``sch_netem.c``:

1. duplicate? (then the copy goes through steps 2-5 itself, after the original, and is never
   duplicated again);
2. loss: independent, correlated (a two-state Markov chain with mean ``loss`` and lag-1
   correlation ``loss_correlation``; netem's own correlation formula skews the mean, ours
   does not), or Gilbert-Elliott exactly as netem's ``loss_gilb_ell``;
3. corrupt: flip one uniformly chosen bit of the datagram;
4. queue limit: more than ``profile.limit`` datagrams or ``max_held_bytes`` bytes held -> drop;
5. reorder or delay: when at least ``gap - 1`` datagrams were delayed since the last reordered
   one and the reorder draw hits, the datagram is released at once, ahead of every held one;
   otherwise it is held for ``delay +- jitter`` (uniform; jitter makes later datagrams overtake
   earlier ones, as in netem), plus, with ``rate``, the time to serialise it behind the datagram
   queued last (size + 42 bytes of Ethernet/IPv4/UDP headers, so relay and tc agree).

Memory is bounded by ``limit`` datagrams and ``max_held_bytes`` bytes; overflow is a counted drop.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from common.errors import ConfigError
from netem.profile import Profile

#: Bytes of Ethernet (14) + IPv4 (20) + UDP (8) headers counted per datagram by ``rate``.
HEADER_OVERHEAD = 42
DEFAULT_MAX_HELD_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class ImpairStats:
    """What the impairer did, counted per datagram event."""

    received: int = 0
    """Datagrams submitted."""
    forwarded: int = 0
    """Datagrams released by ``due`` (copies included)."""
    dropped_loss: int = 0
    """Datagrams (or copies) dropped by the loss model."""
    duplicated: int = 0
    """Datagrams that got an extra copy."""
    reordered: int = 0
    """Datagrams sent at once ahead of held ones by the reorder rule."""
    corrupted: int = 0
    """Datagrams (or copies) with one bit flipped."""
    delayed: int = 0
    """Datagrams held for a positive time (delay, jitter or rate)."""
    dropped_queue_full: int = 0
    """Datagrams dropped because ``limit`` datagrams or ``max_held_bytes`` were held."""

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (JSON summaries, metrics)."""
        return asdict(self)


class _Bernoulli:
    """Yes/no draws with long-run mean ``p`` and lag-1 correlation ``rho`` (a Markov chain)."""

    __slots__ = ("_after_no", "_after_yes", "_last", "_rng")

    def __init__(self, rng: random.Random, percent: float, correlation: float) -> None:
        p, rho = percent / 100.0, correlation / 100.0
        self._rng = rng
        self._after_yes = p + rho * (1.0 - p)
        self._after_no = p * (1.0 - rho)
        self._last = False

    def __call__(self) -> bool:
        threshold = self._after_yes if self._last else self._after_no
        self._last = self._rng.random() < threshold
        return self._last


class _GilbertElliott:
    """netem's ``loss_gilb_ell``: transition first, then loss with the old state's probability."""

    __slots__ = ("_bad", "_loss_bad", "_loss_good", "_p", "_r", "_rng")

    def __init__(self, rng: random.Random, profile: Profile) -> None:
        assert profile.ge_p is not None
        self._rng = rng
        self._p = profile.ge_p / 100.0
        self._r = profile.ge_r_effective / 100.0
        self._loss_bad = profile.ge_1_h / 100.0
        self._loss_good = profile.ge_1_k / 100.0
        self._bad = False

    def __call__(self) -> bool:
        rng = self._rng
        if self._bad:
            if rng.random() < self._r:
                self._bad = False
            return rng.random() < self._loss_bad
        if rng.random() < self._p:
            self._bad = True
        return rng.random() < self._loss_good


def _never() -> bool:
    return False


class Impairer:
    """Apply a :class:`Profile` to a stream of datagrams; see the module docstring."""

    def __init__(
        self,
        profile: Profile,
        seed: int | None = None,
        *,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
    ) -> None:
        """Seed: ``seed`` if given, else ``profile.seed``, else a fresh one (see ``self.seed``)."""
        if max_held_bytes < 1:
            raise ConfigError("max_held_bytes", "must be positive")
        if seed is None:
            seed = (
                profile.seed if profile.seed is not None else random.SystemRandom().getrandbits(32)
            )
        self.profile = profile
        self.seed: int = seed
        """The seed in use: print it so a run can be repeated."""
        self.stats = ImpairStats()
        self._rng = rng = random.Random(seed)
        self._max_held_bytes = max_held_bytes
        self._limit = profile.limit
        self._lose: Callable[[], bool]
        if profile.ge_p is not None:
            self._lose = _GilbertElliott(rng, profile)
        elif profile.loss:
            self._lose = _Bernoulli(rng, profile.loss, profile.loss_correlation)
        else:
            self._lose = _never
        self._dup: Callable[[], bool] = (
            _Bernoulli(rng, profile.duplicate, profile.duplicate_correlation)
            if profile.duplicate
            else _never
        )
        self._corrupt: Callable[[], bool] = (
            _Bernoulli(rng, profile.corrupt, profile.corrupt_correlation)
            if profile.corrupt
            else _never
        )
        self._reorder: Callable[[], bool] = (
            _Bernoulli(rng, profile.reorder, profile.reorder_correlation)
            if profile.reorder
            else _never
        )
        self._gap = profile.effective_gap
        self._counter = 0  # datagrams delayed normally since the last reordered one (netem)
        self._delay = profile.delay / 1000.0
        self._jitter = profile.jitter / 1000.0
        self._delay_rho = profile.delay_correlation / 100.0
        self._last_u = rng.random() if self._jitter else 0.0
        self._rate = profile.rate
        self._last_release = float("-inf")  # release time of the datagram queued last (rate)
        self._seq = 0
        self._heap: list[tuple[float, int, bytes]] = []
        self._immediate: deque[tuple[float, bytes]] = deque()
        self._held_bytes = 0

    # -- input --------------------------------------------------------------------------------

    def submit(self, datagram: bytes, now: float) -> None:
        """Take one arriving datagram; its fate is decided now, in arrival order."""
        self.stats.received += 1
        duplicate = self._dup()
        self._enqueue(datagram, now)
        if duplicate:
            self.stats.duplicated += 1
            self._enqueue(datagram, now)

    def _enqueue(self, datagram: bytes, now: float) -> None:
        stats = self.stats
        if self._lose():
            stats.dropped_loss += 1
            return
        if self._corrupt() and datagram:
            stats.corrupted += 1
            bit = self._rng.randrange(len(datagram) * 8)
            flipped = bytearray(datagram)
            flipped[bit >> 3] ^= 1 << (bit & 7)
            datagram = bytes(flipped)
        if self.held >= self._limit or self._held_bytes + len(datagram) > self._max_held_bytes:
            stats.dropped_queue_full += 1
            return
        self._held_bytes += len(datagram)
        if self._counter >= self._gap - 1 and self._reorder():
            # netem: "put one out of N packets at the front of the queue", sent at once.
            self._counter = 0
            stats.reordered += 1
            self._immediate.append((now, datagram))
            return
        delay = self._delay
        if self._jitter:
            u = self._rng.random()
            if self._delay_rho:
                u = (1.0 - self._delay_rho) * u + self._delay_rho * self._last_u
            self._last_u = u
            delay = max(0.0, delay + self._jitter * (2.0 * u - 1.0))
        start = now
        if self._rate:
            if self._last_release > now:
                # The link is busy until the last queued datagram leaves; its wait counts
                # against this datagram's delay (netem: "time bonus").
                delay = max(0.0, delay - (self._last_release - now))
                start = self._last_release
            delay += (len(datagram) + HEADER_OVERHEAD) * 8 / self._rate
        release = start + delay
        if self._rate:
            self._last_release = release
        if self._gap:
            self._counter += 1
        if delay > 0:
            stats.delayed += 1
        self._seq += 1
        heapq.heappush(self._heap, (release, self._seq, datagram))

    # -- output -------------------------------------------------------------------------------

    def due(self, now: float) -> list[bytes]:
        """Remove and return the datagrams to send at ``now``, in release order."""
        out: list[bytes] = []
        immediate = self._immediate
        while immediate:
            out.append(immediate.popleft()[1])
        heap = self._heap
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        if out:
            self.stats.forwarded += len(out)
            self._held_bytes -= sum(len(d) for d in out)
        return out

    def next_deadline(self) -> float | None:
        """When ``due`` next has something to return (None: nothing held)."""
        if self._immediate:
            return self._immediate[0][0]
        if self._heap:
            return self._heap[0][0]
        return None

    def flush(self) -> list[bytes]:
        """Release everything held, in release order (end of a virtual-time run)."""
        return self.due(float("inf"))

    @property
    def held(self) -> int:
        """Datagrams held right now."""
        return len(self._heap) + len(self._immediate)

    @property
    def held_bytes(self) -> int:
        """Bytes held right now."""
        return self._held_bytes


def apply(
    profile: Profile,
    datagrams: Iterable[bytes],
    seed: int | None = None,
    *,
    spacing: float = 0.001,
) -> list[bytes]:
    """Run ``datagrams`` through an :class:`Impairer` on a virtual clock; return what comes out.

    Datagram ``i`` arrives at ``i * spacing`` seconds; nothing real waits. With the same profile,
    seed and input, the relay forwards the same datagrams (the same multiset; with delays the
    order can differ by timing).
    """
    impairer = Impairer(profile, seed)
    out: list[bytes] = []
    for index, datagram in enumerate(datagrams):
        now = index * spacing
        out += impairer.due(now)
        impairer.submit(datagram, now)
    out += impairer.flush()
    return out
