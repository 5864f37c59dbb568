"""Per-session anti-replay windows (RFC 4303 §3.4.3 style), bounded in number (LRU).

A window remembers the highest authenticated sequence number of a session and which of the
``size`` sequence numbers up to it were seen. A sequence number above the highest is new; one
inside the window is new unless it was seen (DUPLICATE: redundant copies end here); one below
the window is REPLAYED. The decoder checks (without updating) before authentication, so copies
are dropped without paying for AES, and checks-and-updates only after authentication, so forged
datagrams cannot move a window. When more than ``max_sessions`` sessions are active, the least
recently used window is forgotten: authentic datagrams of that session could then be accepted
once more (docs/protocol.md §7.4).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from common.wire.events import DropReason


class ReplayWindow:
    """The window of one session: ``seen[s % size]`` says whether sequence ``s`` was seen.

    A ring of ``size`` flag bytes (RFC 6479's idea, a byte per flag): position ``s % size``
    belongs to ``s`` while ``highest - size < s <= highest``. When ``highest`` advances, the
    positions of the sequences it skipped are cleared (they held flags of sequences that just
    left the window), so a flag is never stale. Check and update are O(1) for in-order datagrams
    (the usual advance by one writes one byte), where a shifted bitmap of ``size`` bits costs a
    big-integer shift per datagram. Memory: ``size`` bytes per session.
    """

    __slots__ = ("highest", "seen", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.highest = -1
        self.seen = bytearray(size)

    def check(self, sequence: int) -> DropReason | None:
        """Why ``sequence`` must be dropped, or None if it is new."""
        diff = self.highest - sequence
        if diff < 0:
            return None
        if diff >= self.size:
            return DropReason.REPLAYED
        if self.seen[sequence % self.size]:
            return DropReason.DUPLICATE
        return None

    def update(self, sequence: int) -> None:
        """Mark ``sequence`` as seen (call only after ``check`` returned None)."""
        size = self.size
        skipped = sequence - self.highest - 1  # sequences the window slides over unseen
        if skipped > 0:
            if skipped >= size:
                self.seen[:] = bytes(size)
            else:
                start = (self.highest + 1) % size
                stop = start + skipped
                if stop <= size:
                    self.seen[start:stop] = bytes(skipped)
                else:
                    self.seen[start:] = bytes(size - start)
                    self.seen[: stop - size] = bytes(stop - size)
        self.seen[sequence % size] = 1
        if sequence > self.highest:  # noqa: PLR1730  a compare is cheaper than max()
            self.highest = sequence


class ReplayGuard:
    """Windows for at most ``max_sessions`` sessions, least recently used evicted first."""

    __slots__ = ("_max_sessions", "_size", "windows")

    def __init__(self, *, window: int, max_sessions: int) -> None:
        self._size = window
        self._max_sessions = max_sessions
        #: session id -> window, least recently used first (the decoder's fast path reads it).
        self.windows: OrderedDict[bytes, ReplayWindow] = OrderedDict()

    def precheck(self, session_id: bytes, sequence: int) -> DropReason | None:
        """The cheap pre-authentication check; changes nothing."""
        window = self.windows.get(session_id)
        return None if window is None else window.check(sequence)

    def accept(self, session_id: bytes, sequence: int) -> DropReason | None:
        """Check and record an authenticated datagram; None means it is new."""
        windows = self.windows
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
        return {s: w.highest for s, w in self.windows.items()}
