"""The send path shared by live sending and resend: encoder -> scheduler -> UDP socket (glue).

Delivery order (docs/sender.md, "Delivery order"): records go into the wire ``Encoder``; the
datagrams it emits go to the pure ``SendScheduler`` (sender/scheduler.py), which decides what
leaves next (lanes, copies, targets, pacing) under the invariant that no datagram can fall out of
its receiver's replay window; this module only moves datagrams from the scheduler to the socket
and arms the timers it asks for. Only when the *last* copy of a datagram was handed to the socket
(or refused by the kernel, which the link would have lost anyway) do the offsets it completes
advance ``sent_high``. Callers commit ``sent_high + 1`` and put ``sent_high`` in heartbeats, so
neither ever runs ahead of what left the process.

Backpressure: the backlog is measured in bytes (every pending copy counted). Above
``max_backlog_bytes`` the pipeline reports pressure (``on_pressure(True)``) and the caller stops
feeding it (the sender pauses its Kafka partitions); below half of it, pressure is released. The
caller feeds at most two more consumer batches (the one in hand, the prefetched one) after
pressure is reported, so memory stays bounded whatever the input rate.

One entrance, for ``send`` and ``resend`` alike: a burst of input (one consumer batch) is
``begin()``, then ``record(...)`` for each record and ``withhold(...)`` for each offset the
content filter held back, then ``settle()``; control messages (``heartbeat``, ``resend_marker``,
the key announcer's ``announcements``) are queued at once, ahead of the data as far as the replay
window allows (sender/scheduler.py). The encoder is the pipeline's own: nobody else adds to it, so
what it emits always reaches the scheduler with the count of records it completes.

The pump is synchronous (no task per datagram): it sends until the scheduler has nothing due, asks
for a delay (a loop timer resumes it) or the socket buffer is full (a writer callback resumes it).
Within a burst the clock is read once per emitted datagram, not per record (``now`` only sets the
encoder's linger deadline, and an older ``now`` only makes it earlier), and the pump runs only
every ``PUMP_EVERY`` datagrams and at ``settle``, so the per-datagram bookkeeping runs in one loop
per burst (measured: docs/benchmarks.md, "Sender").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from sender.pacing import Pacer
from sender.scheduler import SendScheduler
from sender.transport import GSO_MAX_BYTES, SendResult, UdpSender

if TYPE_CHECKING:
    from common.wire import Encoder, OutgoingDatagram
    from common.wire.fec import FecEncoder
    from sender.heartbeat import Beat

Headers = Sequence[tuple[str, bytes | None]] | None

#: ``submit`` pumps once this many datagrams wait (bounds how long a burst waits while a consumer
#: batch is encoded: ~32 x 1.4 KB, well under a millisecond of encoding).
PUMP_EVERY = 32


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
        replay_window: int = 8192,
        on_pressure: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fec: FecEncoder | None = None,
    ) -> None:
        self._encoder = encoder
        self._add = encoder.add  # bound once: ``record`` is the per-record hot path
        self._now = clock()  # the current burst's time (``begin``)
        #: Repair datagrams over the finished datagrams (docs/sender.md, "Forward error
        #: correction"); the scheduler queues a closed block's repairs after its last source.
        self.fec = fec
        self._fec_timer: asyncio.TimerHandle | None = None
        self.scheduler = SendScheduler(
            pacer=pacer,
            copies=copies,
            copy_spacing=copy_spacing,
            targets=udp.target_count,
            max_backlog_bytes=max_backlog_bytes,
            replay_window=replay_window,
            fec=fec,
        )
        self._udp = udp
        self._loop = loop
        self._on_pressure = on_pressure
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._linger: asyncio.TimerHandle | None = None
        self._waiting_writable = False
        self._emitted_records = encoder.records_sealed  # when datagrams were last queued
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._congested = False

    # -- what the scheduler counts -------------------------------------------------------------

    @property
    def sent_high(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition): the highest offset whose datagrams were all handed over."""
        return self.scheduler.sent_high

    @property
    def records_sent(self) -> int:
        """Records whose datagrams were all handed to the socket."""
        return self.scheduler.records_sent

    @property
    def datagrams_sent(self) -> int:
        """Datagrams handed to the socket, every copy counted."""
        return self.scheduler.datagrams_sent

    @property
    def send_calls(self) -> int:
        """System calls that handed datagrams to the socket (a UDP GSO run is one)."""
        return self._udp.calls

    @property
    def bytes_sent(self) -> int:
        """UDP payload bytes handed to the socket, every copy counted."""
        return self.scheduler.bytes_sent

    @property
    def copies_sent(self) -> int:
        """Copies beyond the first."""
        return self.scheduler.copies_sent

    @property
    def datagrams_dropped(self) -> int:
        """Datagrams the kernel refused (counted by errno in ``UdpSender.errors``)."""
        return self.scheduler.datagrams_dropped

    @property
    def pacing_delay(self) -> float:
        """Seconds the pump waited for the pacer."""
        return self.scheduler.pacing_delay

    @property
    def backlog_bytes(self) -> int:
        """Bytes of every pending copy in the backlog."""
        return self.scheduler.backlog_bytes

    @property
    def congested(self) -> bool:
        """True between pressure reported and released."""
        return self.scheduler.congested

    @property
    def pending_datagrams(self) -> int:
        """Datagrams (and pending copies) in the backlog."""
        return self.scheduler.pending

    @property
    def session_id(self) -> bytes:
        """The sender session the encoder seals under."""
        return self._encoder.session_id

    @property
    def next_sequence(self) -> int:
        """The sequence number of the next datagram (they continue across key changes)."""
        return self._encoder.next_sequence

    @property
    def control_pending(self) -> int:
        """Control messages queued and not yet sent (the pacer holds them)."""
        return self.scheduler.control_pending

    # -- the entrance ----------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a burst of input (a consumer batch): its records are stamped with this time
        until a datagram is emitted."""
        self._now = self._clock()

    def record(  # noqa: PLR0917  per-record hot path, mirrors Encoder.add's positional API
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
        """Encode one record; raises the encoder's ``RecordTooLarge`` or ``LocalProtocolError``
        (nothing is queued then)."""
        out = self._add(
            topic,
            partition,
            offset,
            timestamp,
            timestamp_type,
            key,
            value,
            headers or (),
            self._now,
        )
        if out:
            self._enqueue(out, pump=self.scheduler.pending >= PUMP_EVERY)
            self._now = self._clock()

    def withhold(self, topic: str, partition: int, offset: int) -> None:
        """A record the content filter held back: its offset goes out in a withheld message
        (``Encoder.withhold``), which advances ``sent_high`` like records do."""
        out = self._encoder.withhold(topic, partition, offset, self._now)
        if out:
            self._enqueue(out, pump=self.scheduler.pending >= PUMP_EVERY)
            self._now = self._clock()

    def settle(self) -> None:
        """End of a burst: send what waits, arm the linger timer for what the encoder holds."""
        self._pump()
        if self._linger is None and not self._closed:
            self._arm_linger()

    def heartbeat(self, beat: Beat) -> None:
        """Queue a heartbeat (after the records the encoder holds, which it seals first).

        Raises:
            LocalProtocolError: the offset lists break the rules of docs/protocol.md §5.
        """
        self._enqueue(
            self._encoder.heartbeat(
                sender_id=beat.sender_id,
                started_at_ms=beat.started_at_ms,
                sent_at_ms=beat.sent_at_ms,
                high_offsets=beat.high_offsets,
                low_offsets=beat.low_offsets,
                counters=beat.counters,
            )
        )

    def resend_marker(
        self,
        *,
        bundle_id: str,
        phase: str,
        ranges: Sequence[tuple[str, int, int, int]],
        records_sent: int,
        sent_at_ms: int,
    ) -> None:
        """Queue a resend start or end marker (after the records the encoder holds).

        Raises:
            LocalProtocolError: ``phase`` is not "start" or "end".
        """
        self._enqueue(
            self._encoder.resend_marker(
                bundle_id=bundle_id,
                phase=phase,
                ranges=ranges,
                records_sent=records_sent,
                sent_at_ms=sent_at_ms,
            )
        )

    def announcements(self, datagrams: Iterable[OutgoingDatagram]) -> None:
        """Queue the key announcer's datagrams (public-key mode), to every target."""
        self._enqueue(list(datagrams))

    def flush(self) -> None:
        """Emit whatever the encoder holds back for its linger time (``drain`` does)."""
        out = self._encoder.flush()
        if out:
            self._enqueue(out)

    async def drain(self, timeout: float) -> bool:  # noqa: ASYNC109  a bound, not a cancel
        """Flush, then wait until every datagram and copy was handed over; False on timeout."""
        self.flush()
        if self.scheduler.flush_fec():
            self._idle.clear()
        self._pump()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Cancel timers; queued datagrams are abandoned (idempotent)."""
        self._closed = True
        for handle in (self._timer, self._linger, self._fec_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._linger = self._fec_timer = None

    # -- internals -----------------------------------------------------------------------------

    def _arm_linger(self) -> None:
        deadline = self._encoder.next_deadline()
        if deadline is None or self._closed:
            return
        self._linger = self._loop.call_later(max(0.0, deadline - self._clock()), self._on_linger)

    def _on_linger(self) -> None:
        self._linger = None
        out = self._encoder.poll(self._clock())
        if out:
            self._enqueue(out)
        self._arm_linger()

    def _enqueue(self, datagrams: list[OutgoingDatagram], *, pump: bool = True) -> None:
        if not datagrams:
            return
        sealed = self._encoder.records_sealed
        records = sealed - self._emitted_records  # the last datagram completes them
        self._emitted_records = sealed
        self.scheduler.push(datagrams, records, self._clock() if self.fec is not None else 0.0)
        self._idle.clear()
        self._report_pressure()
        if self.fec is not None and self._fec_timer is None:
            self._arm_fec()
        if pump:
            self._pump()

    def _arm_fec(self) -> None:
        deadline = self.scheduler.fec_deadline()
        if deadline is None or self._closed:
            return
        self._fec_timer = self._loop.call_later(max(0.0, deadline - self._clock()), self._on_fec)

    def _on_fec(self) -> None:
        self._fec_timer = None
        if self.scheduler.poll_fec(self._clock()):
            self._idle.clear()
            self._report_pressure()
            self._pump()
        self._arm_fec()

    def _report_pressure(self) -> None:
        congested = self.scheduler.congested
        if congested != self._congested:
            self._congested = congested
            if self._on_pressure is not None:
                self._on_pressure(congested)

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
        self._report_pressure()

    def _send_some(self) -> None:
        if self._udp.max_segments > 1:
            self._send_runs()
            return
        scheduler, udp, clock = self.scheduler, self._udp, self._clock
        next_transmit, transmitted = scheduler.next_transmit, scheduler.transmitted
        send, sent_result, blocked = udp.send, SendResult.SENT, SendResult.BLOCKED
        now = clock()
        while (item := next_transmit(now)) is not None:
            result = send(item.data, item.target)
            if result is blocked:
                self._waiting_writable = True
                udp.wait_writable(self._loop, self._on_writable, item.target)
                return
            transmitted(item, now, sent=result is sent_result)
            now = clock()
        wake = scheduler.next_timer()
        if wake is not None:
            self._timer_due = wake
            self._timer = self._loop.call_later(max(0.0, wake - now), self._on_timer)
        elif scheduler.idle:
            self._idle.set()

    def _send_runs(self) -> None:
        """``_send_some`` with UDP GSO: a run of datagrams per system call (``next_run``)."""
        scheduler, udp, clock = self.scheduler, self._udp, self._clock
        next_run, transmitted_run = scheduler.next_run, scheduler.transmitted_run
        send_run, sent_result, blocked = udp.send_run, SendResult.SENT, SendResult.BLOCKED
        max_segments = udp.max_segments
        now = clock()
        while (run := next_run(now, max_segments, GSO_MAX_BYTES)) is not None:
            target = run[0].target
            if len(run) == 1:
                count, result = 1, udp.send(run[0].data, target)
            else:
                count, result = send_run([item.data for item in run], target)
            if result is blocked:
                self._waiting_writable = True
                udp.wait_writable(self._loop, self._on_writable, target)
                return
            transmitted_run(
                run if count == len(run) else run[:count], now, sent=result is sent_result
            )
            max_segments = udp.max_segments  # 1 from now on if the route refused GSO
            now = clock()
        wake = scheduler.next_timer()
        if wake is not None:
            self._timer_due = wake
            self._timer = self._loop.call_later(max(0.0, wake - now), self._on_timer)
        elif scheduler.idle:
            self._idle.set()
