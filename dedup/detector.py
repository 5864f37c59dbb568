"""Per-partition gap detector: first-seen/duplicate answers and gap reports (pure, no Spark).

Guarantee (docs/gaps.md): for one source (topic, partition), every offset passed to
:meth:`PartitionDetector.observe` is answered *deliver* at most once, and every offset at or above
the first one seen (or the sending session's heartbeat ``low_offset``, when lower and known before
an eviction) that has not been delivered is either inside a gap the detector reports OPEN, or was
reported EXPIRED (a counted, reported loss). Nothing is lost or repeated silently.

Theory of operation
-------------------
State per partition::

    first      the low end of what the state vouches for: the first offset seen, lowered by a
               heartbeat's low_offset (the lowest offset the sending session sent)
    next       nextExpected = highest offset seen + 1
    high       highest offset the sender's heartbeat says it sent (tail gaps)
    windows    [lo_w, hi_w]: window indices, each WINDOW_SIZE offsets aligned to multiples of
               WINDOW_SIZE (1000: offset 5499 is in window 5000..5999); hi_w - lo_w < MAX_WINDOWS
    seen       one Roaring BitMap64 of delivered offsets inside the windows
    expired    bounded list of gap ranges below the oldest window (MAX_EXPIRED_GAPS)
    reported   gaps currently OPEN in the gap topic (key -> last, detected_at)
    pending    gaps seen by the previous scan but not yet reported (the two-scan rule)

The floor is ``lo_w * WINDOW_SIZE``. For an offset ``o``:

- ``o`` at or above the floor: deliver iff its bit is clear (this is DESIGN §7's four cases: equal
  to or beyond ``next`` is never seen; below ``next`` with a clear bit is inside a gap; a set bit is
  a duplicate). An ``o`` beyond the newest window opens windows up to it; if the span would exceed
  MAX_WINDOWS the oldest windows are evicted first and their gaps move to ``expired`` and are
  reported at once (OPEN).
- ``o`` below the floor: deliver iff inside an ``expired`` gap (which shrinks or splits). Otherwise
  drop: a duplicate if the state still remembers every gap down there, else ``below_window``.
- ``o`` below ``first`` before any eviction: the sender may have started there, so these offsets
  are never a gap; they are delivered once (the window range grows down if it fits MAX_WINDOWS).
- A heartbeat's ``low_offset`` below ``first`` lowers ``first`` (and the windows) to it, so a
  session's lost first records become gaps; see :meth:`PartitionDetector.heartbeat`.

Gaps are never stored twice: inside the windows they are the clear bits between ``max(first,
floor)`` and ``max(next - 1, high)`` (so missing tails and whole empty windows are gaps; for a
partition carried by share chains only up to ``high``, what every chain vouched for), below the
floor they are the ``expired`` ranges. ``scan`` compares that set with what the gap topic says
(``reported``) and emits only changes. The pure core never reads a clock: every call takes
``now_ms``.

One BitMap64 for all windows instead of one bitmap per window: Roaring already splits a bitmap into
65,536-offset containers, so compression is the same, while a whole micro-batch becomes one bulk
operation and eviction one ``remove_range``. Windows remain the unit of eviction and of MAX_WINDOWS.
"""

from __future__ import annotations

import array
import bisect
import logging
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap64

from common.errors import ConfigError, GapStateError, LocalProtocolError
from common.gap_record import MAX_OFFSET, GapReport, GapState
from common.raw_topic import MAX_CHAINS

__all__ = [
    "MAX_OFFSET",
    "DetectorConfig",
    "GapReport",
    "GapState",
    "GapStateError",
    "PartitionDetector",
    "WindowSizeMismatchError",
]

logger = logging.getLogger(__name__)


_MAX_WINDOW_SIZE = 2**32
_MAX_WINDOWS = 2**20
_MAX_SPAN = 2**36  # WINDOW_SIZE x MAX_WINDOWS: bounds the transient range bitmaps of a scan
_GAP_ENTRY_BYTES = 64  # estimated memory per remembered gap (Python objects), for the budget
_MAX_WARNINGS = 16


class WindowSizeMismatchError(GapStateError):
    """The state was saved with another WINDOW_SIZE (the window layout would not match)."""

    def __init__(self, saved: int, configured: int) -> None:
        self.saved = saved
        """WINDOW_SIZE the state was written with."""
        self.configured = configured
        """WINDOW_SIZE of the running configuration."""
        super().__init__(
            f"state was written with WINDOW_SIZE={saved}, but WINDOW_SIZE={configured} is set"
        )


@dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """Limits of one partition's detector; the dedup reads them from the environment."""

    window_size: int = 65_536
    """WINDOW_SIZE: offsets per window; windows are aligned to multiples of it. The default is one
    Roaring container, so a window costs nothing beyond its container."""

    max_windows: int = 1024
    """MAX_WINDOWS: windows kept per partition (default span 67 M offsets, about 1.9 h at 10,000
    records/s). A record older than the oldest window is accepted only if it fills a remembered
    gap."""

    max_expired_gaps: int = 100_000
    """MAX_EXPIRED_GAPS: gap ranges remembered below the oldest window, so a late resend into them
    is still delivered once. Beyond it the oldest are reported EXPIRED and forgotten."""

    max_state_bytes: int = 64 * 1024 * 1024
    """MAX_STATE_BYTES: memory budget of one partition's state (bitmap plus gap tables, estimated).
    When opening a window would exceed it, the oldest windows are evicted early (and reported).
    Keep it below Spark's per-key state limit (about 256 MiB)."""

    def __post_init__(self) -> None:
        _check_int("WINDOW_SIZE", self.window_size, 1, _MAX_WINDOW_SIZE)
        _check_int("MAX_WINDOWS", self.max_windows, 1, _MAX_WINDOWS)
        _check_int("MAX_EXPIRED_GAPS", self.max_expired_gaps, 0, 2**31)
        _check_int("MAX_STATE_BYTES", self.max_state_bytes, 4096, 2**40)
        if self.window_size * self.max_windows > _MAX_SPAN:
            raise ConfigError(
                "MAX_WINDOWS",
                f"WINDOW_SIZE x MAX_WINDOWS = {self.window_size * self.max_windows} exceeds "
                f"{_MAX_SPAN}",
                "lower WINDOW_SIZE or MAX_WINDOWS",
            )


def _check_int(key: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(key, f"must be between {low} and {high}, got {value}")


# -- serialisation layout (version 1) --------------------------------------------------------
_MAGIC = b"KDGD"
_VERSION = 3  # 3: chain highs (a fourth table); 2: reset time; 1: neither
_NONE = -1
# window_size, first, next, high, lo_w, hi_w, evicted_any, delivered, duplicates, below_window,
# budget_evictions, forgotten_max, topic length
_HEADER_V1 = struct.Struct("<QqqqqqBQQQQqH")
# version 2 adds (before the topic length): reset_at, lows_ignored
_HEADER = struct.Struct("<QqqqqqBQQQQqqQH")
_SECTION = struct.Struct("<QQ")  # (entry count or bitmap bytes, compressed bytes)


class PartitionDetector:
    """Gap detector of one source (topic, partition). See the module docstring."""

    def __init__(
        self,
        topic: str,
        partition: int,
        config: DetectorConfig,
        *,
        reset_at_ms: int | None = None,
    ) -> None:
        """A detector with no state; ``reset_at_ms``: it replaces state cleared by a reset then."""
        self.topic = topic
        self.partition = partition
        self.config = config
        self._reset_at = reset_at_ms
        self._first: int | None = None
        self._next: int | None = None
        self._high: int | None = None
        self._lo_w = 0
        self._hi_w = -1
        self._evicted_any = False
        self._seen = BitMap64()
        # expired gaps below the floor: sorted, disjoint, parallel lists
        self._e_first: list[int] = []
        self._e_last: list[int] = []
        self._e_det: list[int] = []
        self._forgotten_max = -1  # highest offset of any forgotten (EXPIRED) gap
        self._reported: dict[int, tuple[int, int]] = {}  # first -> (last, detected_at)
        self._pending: dict[tuple[int, int], int] = {}  # (first, last) -> detected_at
        self._reports: list[GapReport] = []
        self._warnings: list[str] = []
        self.delivered = 0
        """Offsets answered *deliver*."""
        self.duplicates = 0
        """Offsets dropped as already delivered."""
        self.below_window = 0
        """Offsets dropped because they are older than anything the state can vouch for."""
        self.budget_evictions = 0
        """Windows evicted early because of MAX_STATE_BYTES."""
        self.lows_ignored = 0
        """Heartbeat low offsets ignored because their session started before a reset."""
        # Share chains (docs/sender.md "Chains"): N senders each carry offset % N == I - 1.
        self._chain_count = 0
        self._chain_highs: dict[int, int] = {}  # chain index I -> highest offset it sent

    # -- properties ---------------------------------------------------------------------------
    @property
    def next_expected(self) -> int | None:
        """nextExpected (highest offset seen + 1), or None before the first offset."""
        return self._next

    @property
    def low_watermark(self) -> int | None:
        """The floor: first offset of the oldest window, or None before the first offset."""
        return None if self._next is None else self._lo_w * self.config.window_size

    @property
    def first_offset(self) -> int | None:
        """The low end of what the state vouches for (offsets below it are never a gap): the
        first offset seen, or a heartbeat's lower ``low_offset``."""
        return self._first

    @property
    def heartbeat_high(self) -> int | None:
        """Highest offset a heartbeat announced, or None."""
        return self._high

    # -- observing ----------------------------------------------------------------------------
    def observe(self, offset: int, now_ms: int) -> bool:
        """Answer one offset: True to deliver it (first seen), False to drop it.

        Raises:
            LocalProtocolError: ``offset`` is not within 0..MAX_OFFSET.
        """
        if not 0 <= offset <= MAX_OFFSET:
            raise LocalProtocolError(f"offset {offset} outside 0..{MAX_OFFSET}")
        ws = self.config.window_size
        if self._next is None:
            self._first = offset
            self._next = offset + 1
            self._lo_w = self._hi_w = offset // ws
            self._seen.add(offset)
            self.delivered += 1
            return True
        if offset >= (self._hi_w + 1) * ws:
            self._open_window(offset // ws, offset, now_ms)
        if offset >= self._lo_w * ws:
            return self._mark(offset)
        window = offset // ws
        assert self._first is not None
        if (
            not self._evicted_any
            and offset < self._first
            and self._hi_w - window < self.config.max_windows
        ):
            # Before any eviction nothing below the floor was ever delivered: grow down.
            self._lo_w = window
            return self._mark(offset)
        return self._below_floor(offset, now_ms)

    def _mark(self, offset: int) -> bool:
        if offset in self._seen:
            self.duplicates += 1
            return False
        self._seen.add(offset)
        assert self._next is not None
        if offset >= self._next:
            self._next = offset + 1
        self.delivered += 1
        return True

    def _below_floor(self, offset: int, now_ms: int) -> bool:
        del now_ms  # reports for expired gaps are produced by the next scan
        idx = bisect.bisect_right(self._e_first, offset) - 1
        if idx >= 0 and offset <= self._e_last[idx]:
            first, last, det = self._e_first[idx], self._e_last[idx], self._e_det[idx]
            del self._e_first[idx], self._e_last[idx], self._e_det[idx]
            pieces = [(a, b) for a, b in ((first, offset - 1), (offset + 1, last)) if a <= b]
            for a, b in reversed(pieces):
                self._e_first.insert(idx, a)
                self._e_last.insert(idx, b)
                self._e_det.insert(idx, det)
            self.delivered += 1
            return True
        assert self._first is not None
        if offset < self._first or offset <= self._forgotten_max:
            self.below_window += 1
        else:
            self.duplicates += 1
        return False

    def withhold(self, first: int, last: int, now_ms: int) -> int:
        """Record ``first..last`` as withheld by the sender's content filter: every offset in it
        is *seen*, as if observed (so it is never a gap, and a later copy of it is dropped), but
        none is delivered. Returns how many of them were not seen before.

        Window by window: the first offset of each window's part goes through :meth:`observe`
        (which opens, evicts, grows down or splits expired gaps exactly as for a record), the
        rest of that part is one bitmap range.

        Raises:
            LocalProtocolError: not ``0 <= first <= last <= MAX_OFFSET``.
        """
        if not 0 <= first <= last <= MAX_OFFSET:
            raise LocalProtocolError(f"withheld range {first}..{last} outside 0..{MAX_OFFSET}")
        counters = self.delivered, self.duplicates, self.below_window
        ws = self.config.window_size
        newly = 0
        a = first
        while a <= last:
            b = min(last, (a // ws + 1) * ws - 1)  # a's window ends here
            newly += self.observe(a, now_ms)
            if b > a:
                if a >= self._lo_w * ws:  # a's window is open: the rest is one range
                    newly += (b - a) - self._seen.range_cardinality(a + 1, b + 1)
                    self._seen.add_range(a + 1, b + 1)
                    assert self._next is not None
                    self._next = max(self._next, b + 1)
                else:  # below the floor (an old range again): only expired gaps can shrink
                    newly += sum(self._below_floor(x, now_ms) for x in range(a + 1, b + 1))
            a = b + 1
        self.delivered, self.duplicates, self.below_window = counters
        return newly

    def observe_run(self, first: int, last: int, now_ms: int) -> list[tuple[int, int]]:
        """Answer the consecutive offsets ``first..last`` at once: the ranges to deliver.

        The same verdicts and the same state as calling :meth:`observe` for each offset in
        increasing order (a property test holds it to that). Window by window, as
        :meth:`withhold`: the window's first offset goes through :meth:`observe` (opening,
        evicting, growing down, splitting expired gaps exactly as for one record); the rest of
        the window's part is one bitmap difference when the window is open, else offset by
        offset below the floor. Returned ranges are disjoint, increasing and merged.

        Raises:
            LocalProtocolError: not ``0 <= first <= last <= MAX_OFFSET``.
        """
        if not 0 <= first <= last <= MAX_OFFSET:
            raise LocalProtocolError(f"run {first}..{last} outside 0..{MAX_OFFSET}")
        ws = self.config.window_size
        out: list[tuple[int, int]] = []
        a = first
        while a <= last:
            b = min(last, (a // ws + 1) * ws - 1)  # a's window ends here
            if self.observe(a, now_ms):
                _add_range(out, a, a)
            if b > a:
                if a >= self._lo_w * ws:  # a's window is open: the rest is one difference
                    part = BitMap64()
                    part.add_range(a + 1, b + 1)
                    new = part - self._seen
                    k = len(new)
                    if k == b - a:
                        _add_range(out, a + 1, b)
                    elif k:
                        for x, y in _ranges_of(new):
                            _add_range(out, x, y)
                    if k:
                        self._seen |= new
                        assert self._next is not None
                        self._next = max(self._next, b + 1 if k == b - a else new.max() + 1)
                    self.delivered += k
                    self.duplicates += (b - a) - k
                else:  # below the floor: only expired gaps can take offsets
                    for x in range(a + 1, b + 1):
                        if self._below_floor(x, now_ms):
                            _add_range(out, x, x)
            a = b + 1
        return out

    def observe_many(self, offsets: Sequence[int] | array.array[int], now_ms: int) -> list[bool]:
        """Answer a batch: the same answers, in order, as calling :meth:`observe` for each.

        Runs of offsets inside the already open windows are answered with bulk bitmap operations;
        only offsets that open a window or fall below the floor take the one-by-one path.

        Raises:
            LocalProtocolError: an offset is not within 0..MAX_OFFSET.
        """
        arr = _as_u64(offsets)
        n = len(arr)
        answers: list[bool] = []
        ws = self.config.window_size
        i = 0
        while i < n:
            if self._next is None:
                answers.append(self.observe(arr[i], now_ms))
                i += 1
                continue
            floor = self._lo_w * ws
            top = (self._hi_w + 1) * ws - 1
            x = arr[i]
            if not floor <= x <= top:
                answers.append(self.observe(x, now_ms))
                i += 1
                continue
            j = _fitting_prefix_end(arr, i, floor, top)
            answers.extend(self._bulk(arr[i:j]))
            i = j
        return answers

    def _bulk(self, chunk: array.array[int]) -> list[bool]:
        batch = BitMap64(chunk)
        new = batch - self._seen
        k = len(new)
        n = len(chunk)
        if k == n:
            answers = [True] * n
        elif k == 0:
            answers = [False] * n
        else:
            todo = set(new)
            answers = [False] * n
            for idx, x in enumerate(chunk):
                if x in todo:
                    todo.remove(x)
                    answers[idx] = True
        if k:
            self._seen |= new
            assert self._next is not None
            self._next = max(self._next, new.max() + 1)
        self.delivered += k
        self.duplicates += n - k
        return answers

    def heartbeat(
        self,
        high_offset: int,
        now_ms: int,
        low_offset: int | None = None,
        *,
        session_started_ms: int | None = None,
    ) -> None:
        """The sender says it has sent every offset from ``low_offset`` up to ``high_offset``.

        Offsets between the last one received and ``high_offset`` become a (tail) gap at the next
        scans even if nothing follows. ``low_offset`` (the lowest offset the sending session sent;
        None from older receivers) lowers the floor when it lies below the first offset seen, so
        ``[low_offset, first seen - 1]`` (or ``[low_offset, high_offset]`` when nothing arrived)
        become gaps under the usual two-scan rule: the loss of a session's first records is
        reported. A higher ``low_offset`` later (a new session resuming from its commit) never
        raises the floor. Window rules (docs/gaps.md "Heartbeat low offsets"): if the windows
        cannot reach down to ``low_offset`` within MAX_WINDOWS, the part below them goes to the
        expired list at once and is reported OPEN (as an eviction); after an eviction the floor is
        lowered only down to the oldest window (the state no longer knows what was delivered
        below it). After a reset (``reset_at_ms``), lows of sessions that started at or before
        the reset (``session_started_ms``, the sender's clock; None counts as before) are
        ignored: they would report records delivered before the reset as missing.

        Raises:
            LocalProtocolError: an offset outside 0..MAX_OFFSET, or ``low_offset > high_offset``.
        """
        if not 0 <= high_offset <= MAX_OFFSET:
            raise LocalProtocolError(f"heartbeat offset {high_offset} outside 0..{MAX_OFFSET}")
        if low_offset is not None and not 0 <= low_offset <= high_offset:
            raise LocalProtocolError(
                f"heartbeat low offset {low_offset} outside 0..high offset {high_offset}"
            )
        if self._high is None or high_offset > self._high:
            self._high = high_offset
        if low_offset is not None:
            self.session_low(low_offset, now_ms, session_started_ms=session_started_ms)

    def session_low(
        self, low_offset: int, now_ms: int, *, session_started_ms: int | None = None
    ) -> None:
        """Only the ``low_offset`` part of :meth:`heartbeat` (a share chain's heartbeat: its
        high vouches for its own share only, see :meth:`chain_heartbeat`)."""
        if not 0 <= low_offset <= MAX_OFFSET:
            raise LocalProtocolError(f"heartbeat low offset {low_offset} outside 0..{MAX_OFFSET}")
        if self._reset_at is not None and (
            session_started_ms is None or session_started_ms <= self._reset_at
        ):
            self.lows_ignored += 1
            return
        self._lower_floor(low_offset, now_ms)

    def chain_heartbeat(self, index: int, count: int, high_offset: int, now_ms: int) -> None:
        """A heartbeat of share chain ``index`` of ``count``: that sender carries exactly the
        offsets ``o % count == index - 1`` and has sent all of them up to ``high_offset``.

        Chain ``I`` sending everything of its share up to ``h_I`` means every offset of the
        share below ``h_I + count`` was sent (the next one of the share is ``h_I + count``). So
        once every chain has reported, every offset up to ``min(h_I + count - 1)`` is vouched
        for, and that is the high this heartbeat applies; before that, share heartbeats vouch
        for nothing (``chains_missing`` says how many chains are silent). A different ``count``
        than before (the chains were re-planned) starts the table afresh.

        Raises:
            LocalProtocolError: not ``1 <= index <= count <= MAX_CHAINS``, or the offset out of
                range.
        """
        if not 1 <= index <= count <= MAX_CHAINS:
            raise LocalProtocolError(
                f"chain {index}/{count} out of range (1 <= I <= N <= {MAX_CHAINS})"
            )
        if not 0 <= high_offset <= MAX_OFFSET:
            raise LocalProtocolError(f"heartbeat offset {high_offset} outside 0..{MAX_OFFSET}")
        if count != self._chain_count:
            if self._chain_count:
                message = (
                    f"gap detector {self.topic}:{self.partition}: a chain heartbeat says "
                    f"{index}/{count}, earlier ones said N = {self._chain_count}: the chains "
                    "were re-planned (or are configured differently); starting over with "
                    f"N = {count}"
                )
                logger.warning("%s", message)
                if len(self._warnings) < _MAX_WARNINGS:
                    self._warnings.append(message)
            self._chain_count, self._chain_highs = count, {}
        if high_offset > self._chain_highs.get(index, -1):
            self._chain_highs[index] = high_offset
        if len(self._chain_highs) == count:
            vouched = min(h + count - 1 for h in self._chain_highs.values())
            self.heartbeat(min(vouched, MAX_OFFSET), now_ms)

    @property
    def chains_missing(self) -> int:
        """Share chains of this partition that have not sent a heartbeat yet (0 unchained)."""
        return self._chain_count - len(self._chain_highs)

    def _lower_floor(self, low: int, now_ms: int) -> None:
        ws = self.config.window_size
        if self._next is None:
            # Nothing arrived yet: the whole announced range is missing.
            self._first = self._next = low
            self._lo_w = self._hi_w = low // ws
            return
        assert self._first is not None
        if low >= self._first:
            return
        if self._evicted_any:
            # Below the oldest window the state no longer knows what was delivered (records
            # there were dropped as below_window): lower the floor only down to that window.
            low = max(low, self._lo_w * ws)
            self._first = min(self._first, low)
            return
        window = low // ws
        if self._hi_w - window < self.config.max_windows:
            self._lo_w = min(self._lo_w, window)
            self._first = low
            return
        # The windows cannot reach down to ``low``: what lies below them is evicted at once
        # (reported OPEN now, its last report from the windows). Nothing below the current floor
        # was ever delivered (before an eviction such records are dropped as below_window), and
        # the expired list is still empty, so the range is exactly one gap.
        new_lo = self._hi_w - self.config.max_windows + 1
        top = new_lo * ws - 1
        self._lo_w = new_lo
        self._first = low
        self._evicted_any = True
        self._e_first.insert(0, low)
        self._e_last.insert(0, top)
        self._e_det.insert(0, now_ms)
        self._reported[low] = (top, now_ms)
        self._emit(low, top, GapState.OPEN, now_ms, now_ms)
        self._trim_expired(now_ms)

    # -- windows and eviction -------------------------------------------------------------------
    def _tail(self) -> int:
        assert self._next is not None
        tail = self._next - 1
        return tail if self._high is None else max(tail, self._high)

    def _open_window(self, window: int, offset: int, now_ms: int) -> None:
        new_lo = max(self._lo_w, window - self.config.max_windows + 1)
        top = max(self._tail(), offset - 1)  # the record about to arrive makes [next, o-1] a gap
        if new_lo > self._lo_w:
            self._evict(new_lo, top, now_ms)
        self._hi_w = window
        budget = self.config.max_state_bytes
        if self.state_bytes_estimate() > budget and self._lo_w < self._hi_w:
            before = self._lo_w
            while self.state_bytes_estimate() > budget and self._lo_w < self._hi_w:
                self._evict(self._lo_w + 1, top, now_ms)
                self.budget_evictions += 1
            message = (
                f"gap detector {self.topic}:{self.partition}: state would exceed MAX_STATE_BYTES="
                f"{budget}; evicted windows {before}..{self._lo_w - 1} early and reported their "
                "gaps; raise MAX_STATE_BYTES, or lower WINDOW_SIZE x MAX_WINDOWS"
            )
            logger.warning("%s", message)
            if len(self._warnings) < _MAX_WARNINGS:
                self._warnings.append(message)

    def _evict(self, new_lo: int, top: int, now_ms: int) -> None:
        """Drop windows below ``new_lo``; their gaps move to the expired list, reported OPEN."""
        ws = self.config.window_size
        assert self._first is not None
        old_floor = self._lo_w * ws
        new_floor = new_lo * ws
        runs = self._missing_runs(max(self._first, old_floor), min(new_floor - 1, top))
        self._seen.remove_range(0, new_floor)
        self._lo_w = new_lo
        self._evicted_any = True
        for a, b in runs:
            prev = self._reported.get(a)
            det = prev[1] if prev is not None else self._pending.get((a, b), now_ms)
            if prev is not None and prev[0] >= new_floor:
                # The reported gap crosses the new floor: its upper part gets its own key now.
                self._reported[new_floor] = (prev[0], det)
                self._emit(new_floor, prev[0], GapState.OPEN, det, now_ms)
            self._e_first.append(a)
            self._e_last.append(b)
            self._e_det.append(det)
            if prev is None or prev[0] != b:
                self._reported[a] = (b, det)
                self._emit(a, b, GapState.OPEN, det, now_ms)
        self._trim_expired(now_ms)

    def _trim_expired(self, now_ms: int) -> None:
        """Forget the oldest expired gaps beyond MAX_EXPIRED_GAPS, reporting them EXPIRED."""
        overflow = len(self._e_first) - self.config.max_expired_gaps
        if overflow > 0:
            for a, b, det in zip(
                self._e_first[:overflow],
                self._e_last[:overflow],
                self._e_det[:overflow],
                strict=True,
            ):
                self._reported.pop(a, None)
                self._forgotten_max = max(self._forgotten_max, b)
                self._emit(a, b, GapState.EXPIRED, det, now_ms)
            del self._e_first[:overflow], self._e_last[:overflow], self._e_det[:overflow]

    def _emit(self, first: int, last: int, state: GapState, det: int, now_ms: int) -> None:
        self._reports.append(GapReport(self.topic, self.partition, first, last, state, det, now_ms))

    def _missing_runs(self, low: int, high: int) -> list[tuple[int, int]]:
        """Maximal runs of offsets in ``low..high`` whose bit is clear."""
        if low > high:
            return []
        seen = self._seen
        if not seen or seen.max() < low or seen.min() > high:
            return [(low, high)]
        span = BitMap64()
        span.add_range(max(low, seen.min()), min(high, seen.max()) + 1)
        sub = seen & span
        if not sub:
            return [(low, high)]
        starts = (sub - sub.shift(1)).to_array()  # first offset of each run of present bits
        ends = (sub - sub.shift(-1)).to_array()  # last offset of each run of present bits
        runs: list[tuple[int, int]] = []
        if starts[0] > low:
            runs.append((low, starts[0] - 1))
        runs.extend((e + 1, s - 1) for e, s in zip(ends, starts[1:], strict=False))
        if ends[-1] < high:
            runs.append((ends[-1] + 1, high))
        return runs

    # -- gaps and reports -----------------------------------------------------------------------
    def open_gaps(self) -> list[tuple[int, int]]:
        """Every range currently missing (expired ranges below the floor, then window gaps)."""
        if self._next is None:
            return []
        assert self._first is not None
        expired = list(zip(self._e_first, self._e_last, strict=True))
        floor = self._lo_w * self.config.window_size
        return expired + self._missing_runs(max(self._first, floor), self._report_tail())

    def _report_tail(self) -> int:
        """Where window gaps end. Unchained: the highest offset seen or vouched for (one sender
        sends a partition in order, so a hole below what arrived is a loss). Share-chained: only
        what every chain vouched for (``chain_heartbeat``): one chain's records running ahead of
        another's are not a loss of the slower one's, so they never open a gap by themselves."""
        if self._chain_count:
            return -1 if self._high is None else self._high
        return self._tail()

    def scan(self, now_ms: int) -> list[GapReport]:
        """Periodic scan: report gaps seen by two consecutive scans, and changes to reported ones.

        A new gap is reported OPEN when the previous scan saw exactly the same range (so ordinary
        reordering raises no alarm). A gap already reported is updated at once: OPEN with its new
        ``last`` if it shrank from the end; remainders after a late fill are OPEN under their own
        ``first``; a key whose ``first`` got filled is closed FILLED (``last`` = the filled prefix).
        Reports produced since the last :meth:`drain_reports` are returned first.
        """
        reports = self.drain_reports()
        current = self.open_gaps()
        cur_first = [a for a, _ in current]
        cur_last = [b for _, b in current]
        old_rep = sorted((k, v[0], v[1]) for k, v in self._reported.items())
        old_pend = sorted((a, b, d) for (a, b), d in self._pending.items())
        new_rep: dict[int, tuple[int, int]] = {}
        new_pend: dict[tuple[int, int], int] = {}
        ri = pi = 0
        for a, b in current:
            prev = self._reported.get(a)
            if prev is not None:
                new_rep[a] = (b, prev[1])
                if prev[0] != b:
                    self._emit(a, b, GapState.OPEN, prev[1], now_ms)
                continue
            while ri < len(old_rep) and old_rep[ri][1] < a:
                ri += 1
            if ri < len(old_rep) and old_rep[ri][0] <= b:  # remainder of a reported gap
                det = old_rep[ri][2]
                new_rep[a] = (b, det)
                self._emit(a, b, GapState.OPEN, det, now_ms)
                continue
            while pi < len(old_pend) and old_pend[pi][1] < a:
                pi += 1
            overlapping = pi < len(old_pend) and old_pend[pi][0] <= b
            det = old_pend[pi][2] if overlapping else now_ms
            if overlapping and old_pend[pi][0] == a and old_pend[pi][1] == b:
                new_rep[a] = (b, det)
                self._emit(a, b, GapState.OPEN, det, now_ms)
            else:
                new_pend[(a, b)] = det
        for k, last, det in old_rep:
            if k in new_rep:
                continue
            idx = bisect.bisect_left(cur_last, k)
            if idx < len(current) and cur_first[idx] <= last:
                filled_last = max(k, cur_first[idx] - 1)
            else:
                filled_last = last
            self._emit(k, filled_last, GapState.FILLED, det, now_ms)
        self._reported = new_rep
        self._pending = new_pend
        return reports + self.drain_reports()

    def drain_reports(self) -> list[GapReport]:
        """Reports produced outside :meth:`scan` (evictions, EXPIRED), oldest first; clears them."""
        reports, self._reports = self._reports, []
        return reports

    def drain_warnings(self) -> list[str]:
        """Operator messages (memory budget evictions) since the last call, at most 16."""
        warnings, self._warnings = self._warnings, []
        return warnings

    @property
    def pending_gaps(self) -> int:
        """Gaps the last scan saw for the first time: the next scan reports them (two-scan rule).

        With none, and no input before the next scan, that scan reports nothing and changes
        nothing: the state is settled (the driver then ticks less often, dedup/idle_tick.py)."""
        return len(self._pending)

    def reported_open(self) -> list[tuple[int, int]]:
        """Ranges the gap topic currently holds OPEN for this partition (after drained reports)."""
        return sorted((k, v[0]) for k, v in self._reported.items())

    def state_bytes_estimate(self) -> int:
        """Estimated memory of the state: bitmap containers plus the gap tables."""
        stats = self._seen.get_statistics()
        bitmap = (
            stats["n_bytes_array_containers"]
            + stats["n_bytes_run_containers"]
            + stats["n_bytes_bitset_containers"]
            + 16 * stats["n_containers"]
        )
        entries = len(self._e_first) + len(self._reported) + len(self._pending)
        return bitmap + _GAP_ENTRY_BYTES * entries

    # -- persistence ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serialise the whole state (including scan state and undrained reports' effect).

        Layout v3: ``KDGD`` + version byte + fixed header + topic (UTF-8) + partition + the seen
        bitmap in pyroaring's portable format + four zlib-compressed int64 tables (expired,
        reported, pending, chain highs as ``(N, I, high)``; v2 had no chain table). Undrained
        reports are not part of the state: drain before saving.
        """
        seen = self._seen.copy()
        seen.run_optimize()
        topic = self.topic.encode("utf-8")
        header = _HEADER.pack(
            self.config.window_size,
            _opt(self._first),
            _opt(self._next),
            _opt(self._high),
            self._lo_w,
            self._hi_w,
            int(self._evicted_any),
            self.delivered,
            self.duplicates,
            self.below_window,
            self.budget_evictions,
            self._forgotten_max,
            _opt(self._reset_at),
            self.lows_ignored,
            len(topic),
        )
        parts = [_MAGIC, bytes([_VERSION]), header, topic, struct.pack("<q", self.partition)]
        bitmap = seen.serialize()
        parts += [_SECTION.pack(len(bitmap), 0), bitmap]
        expired = _flatten(zip(self._e_first, self._e_last, self._e_det, strict=True))
        reported = _flatten((k, v[0], v[1]) for k, v in sorted(self._reported.items()))
        pending = _flatten((a, b, d) for (a, b), d in sorted(self._pending.items()))
        chains = _flatten((self._chain_count, i, h) for i, h in sorted(self._chain_highs.items()))
        for table in (expired, reported, pending, chains):
            packed = zlib.compress(table.tobytes(), 1)
            parts += [_SECTION.pack(len(table) // 3, len(packed)), packed]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes, config: DetectorConfig) -> PartitionDetector:
        """Restore a detector saved by :meth:`to_bytes`.

        Raises:
            GapStateError: the bytes are not a complete v1 state, or were written with another
                WINDOW_SIZE (the window layout would not match).
        """
        try:
            return _decode(cls, bytes(data), config)
        except GapStateError:
            raise
        except (ValueError, struct.error, zlib.error, UnicodeDecodeError, IndexError) as exc:
            raise GapStateError(f"detector state unreadable: {exc}") from exc


def _opt(value: int | None) -> int:
    return _NONE if value is None else value


def _unopt(value: int) -> int | None:
    return None if value == _NONE else value


def _flatten(rows: Iterable[tuple[int, int, int]]) -> array.array[int]:
    out = array.array("q")
    for row in rows:
        out.extend(row)
    return out


def _decode(cls: type[PartitionDetector], data: bytes, config: DetectorConfig) -> PartitionDetector:
    view = memoryview(data)
    if bytes(view[:4]) != _MAGIC or len(view) < 5:
        raise GapStateError("not a gap detector state (bad magic)")
    if view[4] not in (1, 2, _VERSION):
        raise GapStateError(f"gap detector state version {view[4]} is not supported")
    pos = 5
    reset_at, lows_ignored = _NONE, 0
    if view[4] == 1:  # states saved before heartbeat low offsets: no reset time
        fields = _HEADER_V1.unpack_from(view, pos)
        pos += _HEADER_V1.size
        (ws, first, nxt, high, lo_w, hi_w, evicted, delivered, dups, below, budget, forgot) = (
            fields[:-1]
        )
    else:
        fields = _HEADER.unpack_from(view, pos)
        pos += _HEADER.size
        (ws, first, nxt, high, lo_w, hi_w, evicted, delivered, dups, below, budget, forgot) = (
            fields[:-3]
        )
        reset_at, lows_ignored = fields[-3], fields[-2]
    tlen = fields[-1]
    if ws != config.window_size:
        raise WindowSizeMismatchError(ws, config.window_size)
    topic = bytes(view[pos : pos + tlen]).decode("utf-8")
    if len(topic.encode("utf-8")) != tlen:
        raise GapStateError("truncated topic")
    pos += tlen
    (partition,) = struct.unpack_from("<q", view, pos)
    pos += 8
    size, _ = _SECTION.unpack_from(view, pos)
    pos += _SECTION.size
    if pos + size > len(view):
        raise GapStateError("truncated bitmap")
    seen = BitMap64.deserialize(bytes(view[pos : pos + size]))
    pos += size
    tables: list[array.array[int]] = []
    for _ in range(4 if view[4] >= 3 else 3):
        count, clen = _SECTION.unpack_from(view, pos)
        pos += _SECTION.size
        if pos + clen > len(view) or count > len(view) * 1024:
            raise GapStateError("truncated or oversized gap table")
        want = count * 24
        inflater = zlib.decompressobj()
        raw = inflater.decompress(bytes(view[pos : pos + clen]), want + 1)  # bounded
        if len(raw) != want or not inflater.eof or inflater.unused_data:
            raise GapStateError("gap table length mismatch")
        table = array.array("q")
        table.frombytes(raw)
        tables.append(table)
        pos += clen
    if pos != len(view):
        raise GapStateError(f"{len(view) - pos} trailing bytes after detector state")
    det = cls(topic, partition, config)
    det._first, det._next, det._high = _unopt(first), _unopt(nxt), _unopt(high)
    if (det._first is None) != (det._next is None):
        raise GapStateError("inconsistent first/next offsets")
    det._lo_w, det._hi_w, det._evicted_any = lo_w, hi_w, bool(evicted)
    det.delivered, det.duplicates, det.below_window, det.budget_evictions = (
        delivered,
        dups,
        below,
        budget,
    )
    det._forgotten_max = forgot
    det._reset_at, det.lows_ignored = _unopt(reset_at), lows_ignored
    det._seen = seen
    expired, reported, pending = tables[:3]
    if len(tables) > 3:
        chains = tables[3]
        det._chain_highs = dict(zip(chains[1::3], chains[2::3], strict=True))
        det._chain_count = chains[0] if chains else 0
    det._e_first = list(expired[0::3])
    det._e_last = list(expired[1::3])
    det._e_det = list(expired[2::3])
    det._reported = {
        k: (last, d)
        for k, last, d in zip(reported[0::3], reported[1::3], reported[2::3], strict=True)
    }
    det._pending = {
        (a, b): d for a, b, d in zip(pending[0::3], pending[1::3], pending[2::3], strict=True)
    }
    return det


def _as_u64(offsets: Sequence[int] | array.array[int]) -> array.array[int]:
    if isinstance(offsets, array.array) and offsets.typecode == "Q":
        arr = offsets
    else:
        try:
            arr = array.array("Q", offsets)
        except (OverflowError, TypeError) as exc:
            raise LocalProtocolError(f"offsets must be integers in 0..{MAX_OFFSET}") from exc
    if arr:
        top = int(np.frombuffer(arr, dtype=np.uint64).max())
        if top > MAX_OFFSET:
            raise LocalProtocolError(f"offset {top} outside 0..{MAX_OFFSET}")
    return arr


def _fitting_prefix_end(arr: array.array[int], start: int, low: int, high: int) -> int:
    """End index of the longest run from ``start`` whose offsets all lie within ``low..high``."""
    # numpy only as a zero-copy view for this scan: builtins.min/max box every element.
    view = np.frombuffer(arr, dtype=np.uint64)[start:]
    outside = (view < np.uint64(low)) | (view > np.uint64(high))
    first_out = int(outside.argmax())
    return len(arr) if not outside[first_out] else start + first_out


def _add_range(out: list[tuple[int, int]], first: int, last: int) -> None:
    """Append ``first..last`` to increasing ranges, merging it with an adjacent last one."""
    if out and out[-1][1] + 1 == first:
        out[-1] = (out[-1][0], last)
    else:
        out.append((first, last))


def _ranges_of(bitmap: BitMap64) -> list[tuple[int, int]]:
    """The maximal runs of consecutive offsets in ``bitmap``, increasing."""
    values = np.fromiter(bitmap, dtype=np.uint64, count=len(bitmap))
    if not len(values):
        return []
    breaks = np.flatnonzero(np.diff(values) != 1)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(values) - 1]))
    return [(int(values[s]), int(values[e])) for s, e in zip(starts, ends, strict=True)]
