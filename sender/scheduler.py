"""The send ordering, pure: which datagram leaves next, to which target, and when.

Theory of operation
-------------------
The encoder numbers datagrams as it seals them; the receiver keeps, per session, an anti-replay
window of ``replay_window`` sequence numbers below the highest it has seen and refuses anything
older as ``replayed`` (common/wire/replay.py). So the order in which datagrams leave the sender
decides whether its own receiver accepts them. This module owns that order and keeps one
invariant, which tests/property/test_send_scheduler.py checks with the real encoder and decoder
over pacing, backlog, copies, copy spacing, targets, heartbeat and linger settings:

    **When any datagram (any copy) leaves, the highest sequence number that left before it is
    less than ``margin`` above its own** (``margin`` = half the receiver's replay window).

On a link that does not reorder, the receiver's highest sequence is then never a window or more
above what arrives: no datagram the sender emits can be refused as replayed. Half the window is
left for reordering on the link itself.

Lanes. Fresh datagrams wait in two FIFO lanes, each in sequence order: **data** (record batches,
withheld messages and their fragments) and **control** (heartbeats, resend markers). Control goes
first, so a link saturated by a long paced backlog still shows signs of life; the extra copies of
redundant datagrams wait in one FIFO per copy round and lane (each in sequence order too, because
each round leaves in the order of the round before). The candidate is the earliest due copy, else
the control head (control and data take turns while both wait, so heartbeats on a slow link never
take more than half of it), else the data head; if it is ``margin`` or more above the lowest
sequence still pending (the smallest lane head), that lowest one leaves first instead: a heartbeat
waits until the backlog ahead of it is within the margin, and a spaced copy leaves early rather
than fall out of the window. This bounds copy spacing to ``margin`` datagrams (docs/sender.md).

Pacing. Every copy is paced by ``Pacer`` (a token bucket in bytes and datagrams per second).
``next_transmit(now)`` returns ``None`` when the pacer or a copy's due time says wait;
``next_timer()`` says until when. ``next_run`` hands out runs of fresh, equal-sized data datagrams
for one UDP GSO call each; a run leaves only when the pacer would have let each of its datagrams
leave at once, so pacing holds per datagram (tests/property/test_send_scheduler.py).

Accounting. The caller hands the datagram to the socket and calls ``transmitted`` (or does not,
when the socket would block: the same datagram is offered again); a run from ``next_run`` is
accounted by one ``transmitted_run``, which leaves the scheduler exactly as ``transmitted`` for
each of its datagrams in turn would (tests/property/test_send_scheduler.py). Only when the *last*
copy of a datagram left (or the kernel refused it: the link would have lost it) do the offsets it
completes advance ``sent_high``: callers commit ``sent_high + 1`` and put ``sent_high`` in
heartbeats, so neither ever runs ahead of what left the process.

Backpressure. ``backlog_bytes`` counts every pending copy; above ``max_backlog_bytes`` the
scheduler is ``congested`` (the caller pauses its Kafka partitions) until it falls to half.

Forward error correction. With a ``FecEncoder`` every record batch (and fragment) pushed joins
its target's FEC block; a block's repair datagrams follow the source that closed it in the data
lane, to the same target, paced and copied like any datagram (docs/sender.md, "Forward error
correction"). Control datagrams stay out of blocks: a heartbeat is superseded by the next one
(and on a slow link heartbeat-only blocks closed by the latency bound would add a repair per
heartbeat), a resend marker is repeated by ``copies``. Repairs
have their own sequence counter on the wire; here they carry the sequence of the datagram they
follow, which keeps every lane in sequence order for the rule above.

Targets. With several destination ports the target is chosen per *message*, round-robin: a
datagram whose fragment index is 0 starts a message and moves to the next target, its further
fragments and every copy follow it, so one receiver socket sees a whole message. Control
datagrams go to every target (each receiver socket sees the session alive).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING

from common.errors import ConfigError
from common.wire.envelope import KIND_RECORD_BATCH, KIND_WITHHELD

if TYPE_CHECKING:
    from common.wire import OutgoingDatagram
    from common.wire.fec import FecEncoder
    from sender.pacing import Pacer

#: Envelope byte of the message kind (``common.wire.envelope.HEADER`` field 3).
_KIND = 5
#: Envelope bytes of the fragment index (uint16 big-endian, docs/protocol.md §3 header layout,
#: ``common.wire.envelope.HEADER`` field 9); 0 marks the first datagram of a message.
_FRAGMENT_INDEX_HIGH, _FRAGMENT_INDEX_LOW = 36, 37

_DATA, _CONTROL = 0, 1
#: Envelope kind byte -> lane. Withheld messages (what a content filter held back) are data:
#: they complete offsets, so they keep the record batches' order and target rotation.
_LANE_OF_KIND: tuple[int, ...] = tuple(
    _DATA if kind in (KIND_RECORD_BATCH, KIND_WITHHELD) else _CONTROL for kind in range(256)
)


class Transmit:
    """One datagram waiting to leave, with what its last copy completes."""

    __slots__ = ("completes", "copies_left", "data", "due", "lane", "records", "sequence", "target")

    def __init__(  # noqa: PLR0917  hot path: positional construction, no kwargs dict
        self,
        data: bytes,
        sequence: int,
        completes: tuple[tuple[str, int, int], ...],
        copies: int,
        target: int,
        lane: int,
    ) -> None:
        self.data = data
        """The datagram bytes."""
        self.sequence = sequence
        """Its sequence number in the session (all copies share it)."""
        self.completes = completes
        """``(topic, partition, offset)`` the last copy completes (``OutgoingDatagram``)."""
        self.records = 0
        """Records this datagram finishes (counted in ``records_sent`` after the last copy)."""
        self.copies_left = copies
        """Copies still to send, this one included."""
        self.target = target
        """Index of the destination every copy goes to."""
        self.lane = lane
        """0: data, 1: control."""
        self.due = 0.0
        """When the next copy may leave (monotonic seconds)."""


class SendScheduler:
    """Datagrams in (``push``), datagrams out in a safe, paced order (``next_transmit``)."""

    def __init__(
        self,
        *,
        pacer: Pacer,
        copies: int = 1,
        copy_spacing: float = 0.0,
        targets: int = 1,
        max_backlog_bytes: int = 4 * 1024 * 1024,
        replay_window: int = 8192,
        fec: FecEncoder | None = None,
    ) -> None:
        if replay_window < 2:
            raise ConfigError("replay_window", f"is {replay_window}", "use the receiver's value")
        if not 1 <= copies <= 16:
            raise ConfigError("copies", f"is {copies}", "use 1..16")
        self._pacer = pacer
        self.fec = fec
        """Repairs over the pushed datagrams (None: FEC off)."""
        self._last_sequence = -1  # highest sequence pushed: the one repairs from a timer carry
        self._copies = copies
        self._spacing = copy_spacing
        self._targets = targets
        self._target = targets - 1  # target of the last message; the first goes to 0
        self.max_backlog_bytes = max_backlog_bytes
        """Backlog bytes above which the scheduler is congested (released at half)."""
        self.margin = replay_window // 2
        """Sequence distance no emission may exceed (see the module docstring)."""
        self._fresh: tuple[deque[Transmit], deque[Transmit]] = (deque(), deque())
        # _rounds[lane][r]: copies r + 2 waiting for their due time, sequence (and due) ordered.
        self._rounds: tuple[list[deque[Transmit]], list[deque[Transmit]]] = (
            [deque() for _ in range(copies - 1)],
            [deque() for _ in range(copies - 1)],
        )
        self._pending_copies = 0
        self._control_copies = 0
        self._control_turn = True  # control and data alternate while both wait
        self._held = False  # datagrams waited for the pacer since the last one left
        self._wake: float | None = None
        self.highest_sent = -1
        """Highest sequence number handed over so far."""
        self.backlog_bytes = 0
        """Bytes of every pending copy."""
        self.congested = False
        """True from ``backlog_bytes`` above the bound until it falls to half of it."""
        self.sent_high: dict[tuple[str, int], int] = {}
        """Per (topic, partition): the highest offset whose datagrams all left."""
        self.records_sent = 0
        """Records whose datagrams all left."""
        self.datagrams_sent = 0
        """Datagrams handed to the socket, every copy counted."""
        self.bytes_sent = 0
        """UDP payload bytes handed to the socket, every copy counted."""
        self.copies_sent = 0
        """Copies beyond the first."""
        self.datagrams_dropped = 0
        """Datagrams the kernel refused."""
        self.pacing_delay = 0.0
        """Seconds spent waiting for the pacer."""

    # -- input ---------------------------------------------------------------------------------

    def push(
        self, datagrams: Sequence[OutgoingDatagram], records: int = 0, now: float = 0.0
    ) -> None:
        """Queue the encoder's datagrams in their order; the last record batch among them
        finishes ``records`` (a push without one carries none: the encoder seals records only
        into record batches).

        Record batches (and their fragments) join the data lane, going round-robin over the
        targets per message; anything else (a heartbeat, a resend marker) joins the control lane
        once per target. ``now`` only times FEC blocks.
        """
        if not datagrams:
            return
        copies, targets, fec = self._copies, self._targets, self.fec
        lanes = self._fresh
        size = 0
        last: Transmit | None = None
        if targets == 1:
            data_lane, control_lane = lanes
            for d in datagrams:
                data = d.data
                if _LANE_OF_KIND[data[_KIND]] == _DATA:
                    last = Transmit(data, d.sequence, d.completes, copies, 0, _DATA)
                    data_lane.append(last)
                    if fec is not None and (repairs := fec.add(data, 0, now)):
                        for repair in repairs:
                            data_lane.append(Transmit(repair, d.sequence, (), copies, 0, _DATA))
                            size += len(repair)
                else:
                    control_lane.append(
                        Transmit(data, d.sequence, d.completes, copies, 0, _CONTROL)
                    )
                size += len(data)
        else:
            target = self._target
            for d in datagrams:
                data = d.data
                sequence = d.sequence
                if _LANE_OF_KIND[data[_KIND]] == _CONTROL:
                    chosen: range | tuple[int] = range(targets)
                    lane = _CONTROL
                else:
                    if not (data[_FRAGMENT_INDEX_HIGH] | data[_FRAGMENT_INDEX_LOW]):
                        target = target + 1 if target < targets - 1 else 0  # a new message
                    chosen = (target,)
                    lane = _DATA
                queue = lanes[lane]
                for t in chosen:
                    item = Transmit(data, sequence, d.completes, copies, t, lane)
                    queue.append(item)
                    size += len(data)
                    if lane == _DATA:
                        last = item
                    if fec is not None and lane == _DATA:
                        for repair in fec.add(data, t, now):
                            queue.append(Transmit(repair, sequence, (), copies, t, lane))
                            size += len(repair)
            self._target = target
        if (
            last is not None
        ):  # the last record batch finishes the records sealed since the last push
            last.records += records
        self._last_sequence = max(self._last_sequence, datagrams[-1].sequence)
        self.backlog_bytes += size * copies
        if not self.congested and self.backlog_bytes > self.max_backlog_bytes:
            self.congested = True

    def fec_deadline(self) -> float | None:
        """When ``poll_fec`` has a block to close for its latency bound (None: no FEC or open
        block)."""
        return self.fec.next_deadline() if self.fec is not None else None

    def poll_fec(self, now: float) -> int:
        """Close FEC blocks whose latency bound passed and queue their repairs; returns how many."""
        return self._queue_repairs(self.fec.poll(now)) if self.fec is not None else 0

    def flush_fec(self) -> int:
        """Close every open FEC block (shutdown) and queue the repairs; returns how many."""
        return self._queue_repairs(self.fec.flush()) if self.fec is not None else 0

    def _queue_repairs(self, repairs: list[tuple[int, bytes]]) -> int:
        copies, lane, sequence = self._copies, self._fresh[_DATA], self._last_sequence
        for target, data in repairs:
            lane.append(Transmit(data, sequence, (), copies, target, _DATA))
            self.backlog_bytes += len(data) * copies
        if not self.congested and self.backlog_bytes > self.max_backlog_bytes:
            self.congested = True
        return len(repairs)

    # -- output --------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Datagrams (and copies) not yet handed over."""
        return len(self._fresh[0]) + len(self._fresh[1]) + self._pending_copies

    @property
    def control_pending(self) -> int:
        """Control datagrams (heartbeats, markers) and their copies still to send: the sender
        builds no new heartbeat while one still waits, so heartbeats never queue up on a slow
        link."""
        return len(self._fresh[_CONTROL]) + self._control_copies

    @property
    def idle(self) -> bool:
        """Nothing waits."""
        return not (self._fresh[0] or self._fresh[1] or self._pending_copies)

    def next_timer(self) -> float | None:
        """When ``next_transmit`` may next return a datagram after it returned ``None``."""
        return self._wake

    def next_transmit(self, now: float) -> Transmit | None:
        """The datagram to hand to the socket now, or ``None`` (nothing waits, or wait until
        ``next_timer()``). Offered again until ``transmitted`` is called for it."""
        self._wake = None
        data_lane, control_lane = self._fresh
        if not self._pending_copies:
            if control_lane and (self._control_turn or not data_lane):
                item = control_lane[0]
                if data_lane and item.sequence - data_lane[0].sequence >= self.margin:
                    item = data_lane[0]  # the backlog ahead of the heartbeat goes first
            elif data_lane:
                item = data_lane[0]
            else:
                return None
        else:
            found = self._next_with_copies(now)
            if found is None:
                return None
            item = found
        pacer = self._pacer
        if not pacer.unlimited:
            wait = pacer.delay(len(item.data), now, backlogged=self._held)
            if wait > 0:
                self._held = True
                self.pacing_delay += wait
                self._wake = now + wait
                return None
        return item

    def next_run(self, now: float, max_segments: int, max_bytes: int) -> list[Transmit] | None:
        """Like ``next_transmit``, but datagrams that may leave together in one UDP GSO call:
        the one ``next_transmit`` picks, then the data lane's next datagrams while they have the
        same target and size (a shorter one ends the run), at most ``max_segments`` datagrams
        and ``max_bytes`` in all, and no more than the pacer lets leave at once (``Pacer.room``:
        pacing holds per datagram, and a run is never larger than the burst). Runs are only made
        of fresh data with one copy each; a control datagram waiting for the backlog ahead of it
        to come within ``margin`` lets the data up to that point run. Any other case is a run of
        one, so the order of transmissions is exactly ``next_transmit``'s. Call
        ``transmitted_run`` once for the run.
        """
        first = self.next_transmit(now)
        if first is None:
            return None
        run = [first]
        data_lane, control_lane = self._fresh
        if max_segments < 2 or self._copies != 1 or len(data_lane) < 2 or data_lane[0] is not first:
            return run
        # next_transmit lets data pass a waiting heartbeat only while the data head is at least
        # ``margin`` below it; on a paced link a heartbeat waits like that most of the time
        # (a second of backlog is more than the margin), and runs of one there cost a system
        # call per datagram
        last_before_control = control_lane[0].sequence - self.margin if control_lane else None
        size = len(first.data)
        target = first.target
        room_bytes, room_datagrams = self._pacer.room()
        limit = min(max_segments, len(data_lane), room_datagrams)
        if limit < 2:
            return run
        budget = min(max_bytes, room_bytes) - size  # bytes the rest of the run may add
        append = run.append
        for item in islice(data_lane, 1, int(limit)):
            n = len(item.data)
            if n > size or n > budget or item.target != target:
                break
            if last_before_control is not None and item.sequence > last_before_control:
                break
            append(item)
            budget -= n
            if n < size:
                break
        return run

    def _next_with_copies(self, now: float) -> Transmit | None:
        heads = [lane[0] for lane in self._fresh if lane]
        for rounds in self._rounds:
            heads.extend(r[0] for r in rounds if r)
        lowest = min(heads, key=_sequence)
        due = min((h for h in heads if h.copies_left < self._copies), key=_due, default=None)
        data_lane, control_lane = self._fresh
        if due is not None and due.due <= now:
            item = due
        elif control_lane:
            item = control_lane[0]
        elif data_lane:
            item = data_lane[0]
        else:
            assert due is not None  # only copies wait, none due yet
            self._wake = due.due
            return None
        if item.lane == _CONTROL and not self._control_turn and data_lane:
            item = data_lane[0]  # control and data take turns
        if item.sequence - lowest.sequence >= self.margin:
            item = lowest  # it would fall out of the window: it leaves now, early if a copy
        return item

    def transmitted(self, item: Transmit, now: float, *, sent: bool = True) -> None:
        """``item`` (from ``next_transmit``) was handed to the socket, or the kernel refused it
        (``sent=False``: counted as dropped, as the link would have lost it)."""
        size = len(item.data)
        if sent:
            self._pacer.take(size, now)
            self.datagrams_sent += 1
            self.bytes_sent += size
            if item.copies_left < self._copies:
                self.copies_sent += 1
        else:
            self.datagrams_dropped += 1
        self.highest_sent = max(self.highest_sent, item.sequence)
        self.backlog_bytes -= size
        first = item.copies_left == self._copies
        self._control_turn = item.lane == _DATA
        rounds = self._rounds[item.lane]
        if first:
            self._fresh[item.lane].popleft()
        else:
            rounds[self._copies - item.copies_left - 1].popleft()
            self._pending_copies -= 1
            self._control_copies -= item.lane
        item.copies_left -= 1
        if item.copies_left:
            # Control copies follow at once: a lost heartbeat is replaced by the next one, and
            # spacing them would only hold back the next heartbeat (``control_pending``).
            item.due = now + self._spacing if item.lane == _DATA else now
            rounds[self._copies - item.copies_left - 1].append(item)
            self._pending_copies += 1
            self._control_copies += item.lane
        else:
            self.records_sent += item.records
            high = self.sent_high
            for topic, partition, offset in item.completes:
                tp = (topic, partition)
                if offset > high.get(tp, -1):
                    high[tp] = offset
        self._after_leaving()

    def transmitted_run(self, run: list[Transmit], now: float, *, sent: bool = True) -> None:
        """The whole ``run`` (from ``next_run``) was handed to the socket in one call, or the
        kernel refused it (``sent=False``): ``transmitted`` for each datagram in turn, in one pass.

        A run of two or more is fresh data with one copy each, taken from the head of the data
        lane (``next_run``), so every datagram in it is its own last copy: its offsets and records
        count at once, and the counters and the pacer move once per run, not per datagram.
        """
        count = len(run)
        if count == 1 or self._copies != 1:
            for item in run:
                self.transmitted(item, now, sent=sent)
            return
        lane = self._fresh[_DATA]
        popleft = lane.popleft
        total = 0
        records = 0
        high = self.sent_high
        for item in run:
            popleft()
            total += len(item.data)
            records += item.records
            for topic, partition, offset in item.completes:
                tp = (topic, partition)
                if offset > high.get(tp, -1):
                    high[tp] = offset
            item.copies_left = 0
        if sent:
            self._pacer.take_run(total, count, now)
            self.datagrams_sent += count
            self.bytes_sent += total
        else:
            self.datagrams_dropped += count
        self.records_sent += records
        last = run[-1].sequence
        self.highest_sent = max(self.highest_sent, last)
        self.backlog_bytes -= total
        self._control_turn = True  # data left last
        self._after_leaving()

    def _after_leaving(self) -> None:
        """Backpressure and the burst after datagrams left the backlog."""
        if self.congested and self.backlog_bytes <= self.max_backlog_bytes // 2:
            self.congested = False
        if not self.backlog_bytes:
            self._held = False  # idle: the next wait starts a new burst, with no catch-up credit


def _sequence(item: Transmit) -> int:
    return item.sequence


def _due(item: Transmit) -> float:
    return item.due
