"""Loss aimed at one datagram kind: the relay drops a share of, e.g., key announcements only.

netem's vocabulary has no notion of what a datagram carries; a test of the public-key mode needs
to lose *control* datagrams (key announcements, envelope byte 5 = 3, docs/protocol.md §3) while
data flows. ``KindLoss.parse("3:20:2")`` drops the first 2 datagrams of kind 3 and then 20 % of
them, seeded; every other datagram passes untouched and goes on to the profile's impairments.
Pure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

from common.errors import ConfigError

_KIND_BYTE: Final = 5


@dataclass(kw_only=True)
class KindLoss:
    """Drop datagrams of envelope kind ``kind``: the first ``first``, then ``percent`` of them."""

    kind: int
    """Envelope kind byte (offset 5) to aim at, 0..255."""
    percent: float
    """Share of the later ones dropped, 0..100."""
    first: int = 0
    """How many of the first such datagrams are dropped whatever ``percent`` says."""
    seed: int = 0
    """Seed of the random decisions."""
    seen: int = 0
    """Datagrams of ``kind`` seen."""
    dropped: int = 0
    """Datagrams of ``kind`` dropped."""
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.kind <= 255 or not 0 <= self.percent <= 100 or self.first < 0:
            raise ConfigError("kind_loss", "wants KIND:PERCENT[:FIRST]", "e.g. 3:20 or 3:20:2")
        self._rng = random.Random(self.seed)

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> KindLoss:
        """``KIND:PERCENT[:FIRST]``.

        Raises:
            ConfigError: not that form.
        """
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError(text)
            first = int(parts[2]) if len(parts) == 3 else 0
            return cls(kind=int(parts[0]), percent=float(parts[1]), first=first, seed=seed)
        except ValueError:
            raise ConfigError(
                "kind_loss", f"{text!r} is not KIND:PERCENT[:FIRST]", "e.g. 3:20 or 3:20:2"
            ) from None

    def drops(self, datagram: bytes) -> bool:
        """True when the relay should lose this datagram."""
        if len(datagram) <= _KIND_BYTE or datagram[_KIND_BYTE] != self.kind:
            return False
        self.seen += 1
        if self.seen <= self.first or self._rng.random() * 100 < self.percent:
            self.dropped += 1
            return True
        return False
