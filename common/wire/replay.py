"""Per-session anti-replay windows (RFC 4303 §3.4.3 style), bounded in number (LRU).

A window remembers the highest authenticated sequence number of a session and a bitmap of the
``size`` sequence numbers below it. A sequence number above the highest is new; one inside the
window is new unless its bit is set (DUPLICATE: redundant copies end here); one below the window
is REPLAYED. The decoder checks (without updating) before authentication, so copies are dropped
without paying for AES, and checks-and-updates only after authentication, so forged datagrams
cannot move a window. When more than ``max_sessions`` sessions are active, the least recently
used window is forgotten: authentic datagrams of that session could then be accepted once more
(docs/protocol.md §7.4).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from common.wire.events import DropReason


class ReplayWindow:
    """The window of one session; bit 0 of ``bitmap`` is ``highest``."""

    __slots__ = ("bitmap", "highest", "mask", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.mask = (1 << size) - 1
        self.highest = -1
        self.bitmap = 0

    def check(self, sequence: int) -> DropReason | None:
        """Why ``sequence`` must be dropped, or None if it is new."""
        diff = self.highest - sequence
        if diff < 0:
            return None
        if diff >= self.size:
            return DropReason.REPLAYED
        if (self.bitmap >> diff) & 1:
            return DropReason.DUPLICATE
        return None

    def update(self, sequence: int) -> None:
        """Mark ``sequence`` as seen (call only after ``check`` returned None)."""
        diff = sequence - self.highest
        if diff > 0:
            self.bitmap = ((self.bitmap << diff) | 1) & self.mask if diff < self.size else 1
            self.highest = sequence
        else:
            self.bitmap |= 1 << -diff


class ReplayGuard:
    """Windows for at most ``max_sessions`` sessions, least recently used evicted first."""

    __slots__ = ("_max_sessions", "_size", "_windows")

    def __init__(self, *, window: int, max_sessions: int) -> None:
        self._size = window
        self._max_sessions = max_sessions
        self._windows: OrderedDict[bytes, ReplayWindow] = OrderedDict()

    def precheck(self, session_id: bytes, sequence: int) -> DropReason | None:
        """The cheap pre-authentication check; changes nothing."""
        window = self._windows.get(session_id)
        return None if window is None else window.check(sequence)

    def accept(self, session_id: bytes, sequence: int) -> DropReason | None:
        """Check and record an authenticated datagram; None means it is new."""
        windows = self._windows
        window = windows.get(session_id)
        if window is None:
            if len(windows) >= self._max_sessions:
                windows.popitem(last=False)
            window = windows[session_id] = ReplayWindow(self._size)
        else:
            windows.move_to_end(session_id)
        reason = window.check(sequence)
        if reason is None:
            window.update(sequence)
        return reason

    @property
    def last_sequence(self) -> Mapping[bytes, int]:
        """Highest authenticated sequence per tracked session."""
        return {s: w.highest for s, w in self._windows.items()}
