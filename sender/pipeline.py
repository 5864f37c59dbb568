"""The send path shared by live sending and resend: encoder -> backlog -> pacer -> UDP socket.

Delivery order (docs/sender.md, "Delivery order"): records go into the wire ``Encoder``; the
datagrams it emits wait in one FIFO backlog; the pump hands them to the socket as fast as the
``Pacer`` allows, every copy paced; only when the *last* copy of a datagram was handed to the
socket (or refused by the kernel, which the link would have lost anyway) do the offsets it
completes (``OutgoingDatagram.completes``) advance ``sent_high``. Callers commit ``sent_high + 1``
and put ``sent_high`` in heartbeats, so neither ever runs ahead of what left the process.

Backpressure: the backlog is measured in bytes (every pending copy counted). Above
``max_backlog_bytes`` the pipeline reports pressure (``on_pressure(True)``) and the caller stops
feeding it (the sender pauses its Kafka partitions); below half of it, pressure is released. The
caller feeds at most two more consumer batches (the one in hand, the prefetched one) after
pressure is reported, so memory stays bounded
whatever the input rate.

The pump is synchronous (no task per datagram): it sends until the backlog is empty, the pacer
asks for a delay (a loop timer resumes it) or the socket buffer is full (a writer callback resumes
it). A caller adding a whole consumer batch uses the fast path instead of ``add``: it calls
``encoder.add`` itself, hands each non-empty result to ``submit`` and calls ``settle`` at the end;
``submit`` pumps only every ``PUMP_EVERY`` datagrams, so the per-datagram bookkeeping runs in one
loop per burst (measured: docs/benchmarks.md, "Sender"). Without a rate limit and with one copy,
the pump takes a shorter path that skips the pacer and the delayed-copy heap entirely.

Heartbeats jump the queue: their high offsets only name offsets already sent, so they can never
claim more than left, and a link saturated by a long backlog still shows signs of life.

Several targets (``target_ports``): the destination is chosen per *message*, round-robin, never
per datagram. A datagram whose fragment index is 0 (envelope bytes 36-37, docs/protocol.md) starts
a message and moves to the next target; its further fragments and every copy of each datagram
follow it to the same target, so one receiver socket (or worker process) sees a whole message and
drops the copies in its own replay window. Round-robin rather than a hash of the partition: a
message holds records of several partitions, and round-robin spreads the load evenly whatever the
partitions' rates. Control messages (heartbeats, resend markers, via ``enqueue``) go to *every*
target, so each receiver socket sees the session alive and a dead worker does not hide tail loss;
record batches that ``enqueue`` is handed (sealed ahead of a heartbeat) still go to one target.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from common.wire.envelope import KIND_RECORD_BATCH
from sender.pacing import Pacer
from sender.transport import SendResult, UdpSender

if TYPE_CHECKING:
    from common.wire import Encoder, OutgoingDatagram
    from common.wire.fec import FecEncoder

Headers = Sequence[tuple[str, bytes | None]] | None

#: Envelope byte of the message kind (``common.wire.envelope.HEADER`` field 3).
_KIND = 5
#: Envelope bytes of the fragment index (uint16 big-endian, docs/protocol.md §3 header layout,
#: ``common.wire.envelope.HEADER`` field 9); 0 marks the first datagram of a message.
_FRAGMENT_INDEX_HIGH, _FRAGMENT_INDEX_LOW = 36, 37

#: ``submit`` pumps once this many datagrams wait (bounds how long a burst waits while a consumer
#: batch is encoded: ~32 x 1.4 KB, well under a millisecond of encoding).
PUMP_EVERY = 32


class _Item:
    """One datagram waiting in the backlog, with what sending it completes."""

    __slots__ = ("completes", "copies_left", "data", "records", "target")

    def __init__(
        self,
        data: bytes,
        completes: tuple[tuple[str, int, int], ...],
        records: int,
        copies: int,
        target: int = 0,
    ) -> None:
        self.data = data
        self.completes = completes
        self.records = records
        self.copies_left = copies
        self.target = target
        """Index of the ``UdpSender`` target every copy of this datagram goes to."""


class SendPipeline:
    """Records in, paced datagrams out; tracks what has been handed to the socket."""

    def __init__(
        self,
        *,
        encoder: Encoder,
        pacer: Pacer,
        udp: UdpSender,
        loop: asyncio.AbstractEventLoop,
        copies: int = 1,
        copy_spacing: float = 0.0,
        max_backlog_bytes: int = 4 * 1024 * 1024,
        on_pressure: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fec: FecEncoder | None = None,
    ) -> None:
        self.encoder = encoder
        #: Repair datagrams over the finished datagrams (docs/sender.md, "Forward error
        #: correction"): each source goes in its target's block; a closed block's repairs are
        #: queued after it, to the same target, paced and copied like any datagram.
        self.fec = fec
        self._fec_timer: asyncio.TimerHandle | None = None
        self._pacer = pacer
        self._udp = udp
        self._loop = loop
        self._copies = copies
        self._spacing = copy_spacing
        self._max_backlog = max_backlog_bytes
        self._on_pressure = on_pressure
        self._clock = clock
        self._targets = udp.target_count
        self._target = self._targets - 1  # target of the last message; the first goes to 0
        self._queue: deque[_Item] = deque()
        self._delayed: list[tuple[float, int, _Item]] = []  # (due, tie-break, item)
        self._tie = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._held = False  # datagrams have been waiting for the pacer since the last send
        self._linger: asyncio.TimerHandle | None = None
        self._waiting_writable = False
        self._emitted_records = encoder.records_sealed  # when datagrams were last queued
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self.backlog_bytes = 0
        """Bytes of every pending copy in the backlog."""
        self.congested = False
        """True between pressure reported and released."""
        self.sent_high: dict[tuple[str, int], int] = {}
        """Per (topic, partition): the highest offset whose datagrams were all handed over."""
        self.records_sent = 0
        """Records whose datagrams were all handed to the socket."""
        self.datagrams_sent = 0
        """Datagrams handed to the socket, every copy counted."""
        self.bytes_sent = 0
        """UDP payload bytes handed to the socket, every copy counted."""
        self.copies_sent = 0
        """Copies beyond the first."""
        self.datagrams_dropped = 0
        """Datagrams the kernel refused (counted by errno in ``UdpSender.errors``)."""
        self.pacing_delay = 0.0
        """Seconds the pump waited for the pacer."""

    # -- input ---------------------------------------------------------------------------------

    def add(  # noqa: PLR0917  per-record hot path, mirrors Encoder.add's positional API
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        timestamp_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
    ) -> None:
        """Encode one record; raises the encoder's ``RecordTooLarge`` (nothing is queued then)."""
        out = self.encoder.add(
            topic,
            partition,
            offset,
            timestamp,
            timestamp_type,
            key,
            value,
            headers or (),
            self._clock(),
        )
        if out:
            self._enqueue(out)
        elif self._linger is None:
            self._arm_linger()

    def submit(self, datagrams: list[OutgoingDatagram]) -> None:
        """Queue what a direct ``encoder.add`` call returned (the batch fast path).

        Sending waits until ``PUMP_EVERY`` datagrams are queued or ``settle`` is called; the
        delivery order and the backlog bound are the same as with ``add``.
        """
        self._enqueue(datagrams, pump=len(self._queue) >= PUMP_EVERY)

    def settle(self) -> None:
        """End of a run of direct ``encoder.add`` calls: send what waits, arm the linger timer."""
        self._pump()
        if self._linger is None and not self._closed:
            self._arm_linger()

    def enqueue(self, datagrams: Iterable[OutgoingDatagram], *, front: bool = False) -> None:
        """Queue datagrams built outside ``add`` (heartbeats, resend markers) to every target."""
        self._enqueue(list(datagrams), front=front, everywhere=True)

    def flush(self) -> None:
        """Emit whatever the encoder holds back for its linger time."""
        out = self.encoder.flush()
        if out:
            self._enqueue(out)

    async def drain(self, timeout: float) -> bool:  # noqa: ASYNC109  a bound, not a cancel
        """Flush, then wait until every datagram and copy was handed over; False on timeout."""
        self.flush()
        if self.fec is not None:
            self._queue_repairs(self.fec.flush())
        self._pump()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    @property
    def pending_datagrams(self) -> int:
        """Datagrams (with pending copies) in the backlog."""
        return len(self._queue) + len(self._delayed)

    def close(self) -> None:
        """Cancel timers; queued datagrams are abandoned (idempotent)."""
        self._closed = True
        for handle in (self._timer, self._linger, self._fec_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._linger = self._fec_timer = None

    # -- internals -----------------------------------------------------------------------------

    def _arm_linger(self) -> None:
        deadline = self.encoder.next_deadline()
        if deadline is None or self._closed:
            return
        self._linger = self._loop.call_later(max(0.0, deadline - self._clock()), self._on_linger)

    def _on_linger(self) -> None:
        self._linger = None
        out = self.encoder.poll(self._clock())
        if out:
            self._enqueue(out)
        self._arm_linger()

    def _enqueue(
        self,
        datagrams: list[OutgoingDatagram],
        *,
        front: bool = False,
        pump: bool = True,
        everywhere: bool = False,
    ) -> None:
        sealed = self.encoder.records_sealed
        records = sealed - self._emitted_records  # the last datagram completes them
        self._emitted_records = sealed
        copies = self._copies
        targets = self._targets
        size = 0
        item: _Item | None = None
        fec = self.fec
        if front or everywhere or targets > 1:
            items: list[_Item] = []
            target = self._target
            for d in datagrams:
                data = d.data
                if everywhere and data[_KIND] != KIND_RECORD_BATCH:
                    # A control message (a heartbeat, a resend marker): every target gets it.
                    items.extend(_Item(data, d.completes, 0, copies, t) for t in range(targets))
                    continue
                if not (data[_FRAGMENT_INDEX_HIGH] | data[_FRAGMENT_INDEX_LOW]):
                    target = target + 1 if target + 1 < targets else 0  # a new message
                items.append(_Item(data, d.completes, 0, copies, target))
            self._target = target
            item = items[-1] if items else None  # the last source: it completes the records
            if self.fec is not None:
                items = self._with_repairs(items)
            size = sum(len(i.data) for i in items)
            if front:
                self._queue.extendleft(reversed(items))
            else:
                self._queue.extend(items)
        elif fec is None:  # the hot path: one target, records in order
            append = self._queue.append
            for d in datagrams:
                data = d.data
                size += len(data)
                item = _Item(data, d.completes, 0, copies)
                append(item)
        else:  # the hot path with FEC: a closed block's repairs right after its last source
            append, add, now = self._queue.append, fec.add, self._clock()
            for d in datagrams:
                data = d.data
                size += len(data)
                item = _Item(data, d.completes, 0, copies)
                append(item)
                for repair in add(data, 0, now):
                    size += len(repair)
                    append(_Item(repair, (), 0, copies))
            if self._fec_timer is None:
                self._arm_fec()
        if item is None:
            return
        item.records = records
        self.backlog_bytes += size * copies
        self._idle.clear()
        if not self.congested and self.backlog_bytes > self._max_backlog:
            self.congested = True
            if self._on_pressure is not None:
                self._on_pressure(True)
        if pump:
            self._pump()

    def _with_repairs(self, items: list[_Item]) -> list[_Item]:
        """``items`` with the repairs of every FEC block they close right after its last source."""
        assert self.fec is not None
        add, now, copies = self.fec.add, self._clock(), self._copies
        out: list[_Item] = []
        for it in items:
            out.append(it)
            for repair in add(it.data, it.target, now):
                out.append(_Item(repair, (), 0, copies, it.target))
        self._arm_fec()
        return out

    def _queue_repairs(self, repairs: list[tuple[int, bytes]]) -> None:
        if not repairs:
            return
        copies = self._copies
        self._queue.extend(_Item(data, (), 0, copies, target) for target, data in repairs)
        self.backlog_bytes += sum(len(data) for _, data in repairs) * copies
        self._idle.clear()
        self._pump()

    def _arm_fec(self) -> None:
        if self._fec_timer is not None or self._closed or self.fec is None:
            return
        deadline = self.fec.next_deadline()
        if deadline is None:
            return
        self._fec_timer = self._loop.call_later(max(0.0, deadline - self._clock()), self._on_fec)

    def _on_fec(self) -> None:
        self._fec_timer = None
        assert self.fec is not None
        self._queue_repairs(self.fec.poll(self._clock()))
        self._arm_fec()

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    def _on_writable(self) -> None:
        self._waiting_writable = False
        self._pump()

    def _pump(self) -> None:
        if self._waiting_writable or self._closed:
            return
        if self._timer is not None:
            # Called from ``add`` while encoding a long batch keeps the loop busy: a pacing timer
            # that is already due would fire late and the idle bucket would cap the lost time at
            # one burst, so the average would fall short of the rate. Send now instead.
            if self._clock() < self._timer_due:
                return
            self._timer.cancel()
            self._timer = None
        self._send_some()
        if self.congested and self.backlog_bytes <= self._max_backlog // 2:
            self.congested = False
            if self._on_pressure is not None:
                self._on_pressure(False)

    def _send_some(self) -> None:
        if self._copies == 1 and self._pacer.unlimited and not self._delayed:
            self._send_unpaced()
            return
        pacer, udp, queue, delayed = self._pacer, self._udp, self._queue, self._delayed
        now = self._clock()
        while True:
            if delayed and delayed[0][0] <= now:
                item = delayed[0][2]
                from_heap = True
            elif queue:
                item = queue[0]
                from_heap = False
            else:
                break
            size = len(item.data)
            if not pacer.unlimited:
                wait = pacer.delay(size, now, backlogged=self._held)
                if wait > 0:
                    self._held = True
                    self.pacing_delay += wait
                    self._timer_due = now + wait
                    self._timer = self._loop.call_later(wait, self._on_timer)
                    return
            result = udp.send(item.data, item.target)
            if result is SendResult.BLOCKED:
                self._waiting_writable = True
                udp.wait_writable(self._loop, self._on_writable, item.target)
                return
            if result is SendResult.SENT:
                pacer.take(size, now)
                self.datagrams_sent += 1
                self.bytes_sent += size
                if item.copies_left < self._copies:
                    self.copies_sent += 1
            else:
                self.datagrams_dropped += 1
            self.backlog_bytes -= size
            item.copies_left -= 1
            if from_heap:
                heapq.heappop(delayed)
            elif item.copies_left == 0 or self._spacing > 0:
                queue.popleft()
            if item.copies_left > 0:
                if self._spacing > 0:
                    due = now + self._spacing
                    heapq.heappush(delayed, (due, next(self._tie), item))
            else:
                self._complete(item)
            now = self._clock()
        if delayed:
            self._timer_due = delayed[0][0]
            self._timer = self._loop.call_later(max(0.0, delayed[0][0] - now), self._on_timer)
        elif not queue:
            self._held = False
            self._idle.set()

    def _send_unpaced(self) -> None:
        """``_send_some`` without a rate limit and with one copy: no pacer, no heap, no clock."""
        queue, udp = self._queue, self._udp
        send, sent_result, blocked = udp.send, SendResult.SENT, SendResult.BLOCKED
        high = self.sent_high
        sent = dropped = nbytes = gone = records = 0
        try:
            while queue:
                item = queue[0]
                data = item.data
                result = send(data, item.target)
                if result is blocked:
                    self._waiting_writable = True
                    udp.wait_writable(self._loop, self._on_writable, item.target)
                    break
                queue.popleft()
                size = len(data)
                gone += size
                if result is sent_result:
                    sent += 1
                    nbytes += size
                else:
                    dropped += 1
                records += item.records
                for topic, partition, offset in item.completes:
                    tp = (topic, partition)
                    if offset > high.get(tp, -1):
                        high[tp] = offset
        finally:
            # Also on an exception: what went out stays counted and committable.
            self.datagrams_sent += sent
            self.bytes_sent += nbytes
            self.datagrams_dropped += dropped
            self.backlog_bytes -= gone
            self.records_sent += records
        if not queue:
            self._held = False
            self._idle.set()

    def _complete(self, item: _Item) -> None:
        self.records_sent += item.records
        high = self.sent_high
        for topic, partition, offset in item.completes:
            tp = (topic, partition)
            if offset > high.get(tp, -1):
                high[tp] = offset
