"""SendPipeline glue on real loopback sockets with the real wire Encoder/Decoder (no Kafka).

The send order itself (backlog, copies, delays, pacing, heartbeats) is the pure scheduler's and is
tested with a fake clock and no sockets in tests/property/test_send_scheduler.py; this file checks
the asyncio glue around it: the one entrance (bursts of ``record``/``withhold`` between ``begin``
and ``settle``, control messages at once), timers, the socket, what a real decoder makes of it.
"""

import asyncio
import os
import socket

import pytest

from common.wire import (
    Decoder,
    DropReason,
    Encoder,
    Heartbeat,
    Key,
    KeyRing,
    RecordBatch,
    WireConfig,
)
from sender.heartbeat import Beat
from sender.pacing import Pacer, PacingConfig
from sender.send_pipeline import PUMP_EVERY, SendPipeline
from sender.transport import UdpSender

WIRE = WireConfig(max_datagram_size=1452, linger=0.002)


def ring() -> KeyRing:
    key = Key.generate()
    return KeyRing([key], active=key.key_id)


class Rig:
    """A pipeline sending to a loopback socket that the test drains and decodes."""

    def __init__(
        self,
        *,
        copies: int = 1,
        spacing: float = 0.0,
        pacing: PacingConfig | None = None,
        max_backlog: int = 1 << 20,
    ) -> None:
        self.keys = ring()
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.rx.setblocking(False)
        self.udp = UdpSender([("127.0.0.1", self.rx.getsockname()[1])])
        self.pressure: list[bool] = []
        loop = asyncio.get_running_loop()
        self.pipeline = SendPipeline(
            encoder=Encoder(WIRE, self.keys, session_id=os.urandom(16)),
            pacer=Pacer(pacing or PacingConfig(), loop.time()),
            udp=self.udp,
            loop=loop,
            copies=copies,
            copy_spacing=spacing,
            max_backlog_bytes=max_backlog,
            on_pressure=self.pressure.append,
        )
        self.decoder = Decoder(WIRE, self.keys)
        self.datagrams = 0

    def receive(self) -> list[object]:
        events: list[object] = []
        while True:
            try:
                data = self.rx.recv(65536)
            except BlockingIOError:
                break
            self.datagrams += 1
            self.decoder.receive_datagram(data, 0.0)
            while (event := self.decoder.next_event()) is not None:
                events.append(event)
        return events

    def close(self) -> None:
        self.pipeline.close()
        self.udp.close()
        self.rx.close()


def run(coro):
    with asyncio.Runner() as runner:
        return runner.run(coro)


def test_records_arrive_intact_and_sent_high_follows() -> None:
    async def scenario() -> None:
        rig = Rig()
        try:
            for p in range(3):
                for o in range(100):
                    rig.pipeline.record(
                        "t",
                        p,
                        o,
                        1_700_000_000_000 + o,
                        1,
                        None if o % 7 == 0 else f"k{o}".encode(),
                        None if o % 5 == 0 else b"v" * 200,
                        [("h", b"x"), ("n", None)] if o % 3 == 0 else None,
                    )
            assert await rig.pipeline.drain(5.0)
            records = [r for e in rig.receive() if isinstance(e, RecordBatch) for r in e.records]
            assert len(records) == 300
            got = {(r.partition, r.offset): r for r in records}
            r = got[(1, 21)]
            assert (r.key, r.value, r.headers, r.timestamp, r.timestamp_type) == (
                None,
                b"v" * 200,
                (("h", b"x"), ("n", None)),
                1_700_000_000_021,
                1,
            )
            assert got[(2, 10)].value is None
            assert rig.pipeline.sent_high == {("t", 0): 99, ("t", 1): 99, ("t", 2): 99}
            assert rig.pipeline.records_sent == 300
            assert rig.pipeline.backlog_bytes == 0
        finally:
            rig.close()

    run(scenario())


def test_a_burst_sends_in_bursts_and_never_counts_unsent_records() -> None:
    async def scenario() -> None:
        rig = Rig()
        pipeline = rig.pipeline
        try:
            # 20 records of 200 B: 3 full datagrams and 2 records pending in the encoder. Fewer
            # than PUMP_EVERY datagrams wait until settle(): nothing left, nothing committable.
            pipeline.begin()
            for o in range(20):
                pipeline.record("t", 0, o, 1_700_000_000_000 + o, 1, b"k", b"v" * 200, ())
            assert pipeline.pending_datagrams == 3
            assert (pipeline.sent_high, pipeline.records_sent, pipeline.datagrams_sent) == (
                {},
                0,
                0,
            )
            pipeline.settle()
            assert pipeline.pending_datagrams == 0
            assert pipeline.records_sent == 18
            assert pipeline.sent_high == {("t", 0): 17}
            # A long burst pumps every PUMP_EVERY datagrams; whatever has left is exactly what
            # sent_high and records_sent claim (offsets are contiguous from 0 here).
            pipeline.begin()
            for o in range(20, 1000):
                pipeline.record("t", 0, o, 1_700_000_000_000 + o, 1, b"k", b"v" * 200, ())
                high = pipeline.sent_high[("t", 0)]
                assert high + 1 == pipeline.records_sent
                assert pipeline.pending_datagrams <= PUMP_EVERY + 1
            assert pipeline.records_sent >= 500  # bursts went out before settle()
            pipeline.settle()  # also arms the linger timer for the records still pending
            async with asyncio.timeout(5):
                while pipeline.sent_high.get(("t", 0)) != 999:  # noqa: ASYNC110  a deadline-bounded poll
                    await asyncio.sleep(0.005)
            assert pipeline.records_sent == 1000
            assert pipeline.backlog_bytes == 0
            records = [r for e in rig.receive() if isinstance(e, RecordBatch) for r in e.records]
            assert [r.offset for r in records] == list(range(1000))
        finally:
            rig.close()

    run(scenario())


def test_linger_emits_a_lone_record_without_flush() -> None:
    async def scenario() -> None:
        rig = Rig()
        try:
            rig.pipeline.record("t", 0, 5, 0, 1, b"k", b"v", None)
            rig.pipeline.settle()  # the end of a burst arms the linger timer
            async with asyncio.timeout(5):
                while rig.pipeline.sent_high.get(("t", 0)) != 5:  # noqa: ASYNC110  a deadline-bounded poll
                    await asyncio.sleep(0.005)
            assert rig.pipeline.records_sent == 1
        finally:
            rig.close()

    run(scenario())


@pytest.mark.parametrize("spacing", [0.0, 0.01])
def test_copies_are_sent_and_the_receiver_drops_them_as_duplicates(spacing: float) -> None:
    async def scenario() -> None:
        rig = Rig(copies=3, spacing=spacing)
        try:
            for o in range(50):
                rig.pipeline.record("t", 0, o, 0, 1, None, b"v" * 100, None)
            assert await rig.pipeline.drain(5.0)
            events = rig.receive()
            records = [r for e in events if isinstance(e, RecordBatch) for r in e.records]
            assert sorted(r.offset for r in records) == list(range(50))
            unique = rig.pipeline.datagrams_sent // 3
            assert rig.pipeline.copies_sent == 2 * unique
            assert rig.decoder.drops[DropReason.DUPLICATE] == 2 * unique
            assert rig.pipeline.sent_high == {("t", 0): 49}
        finally:
            rig.close()

    run(scenario())


def test_pacing_holds_back_reports_pressure_and_releases_it() -> None:
    async def scenario() -> None:
        # 200 kB/s, backlog bound 20 kB: 100 kB of records must raise pressure, then release it.
        rig = Rig(pacing=PacingConfig(bytes_per_s=200_000), max_backlog=20_000)
        try:
            for o in range(500):
                rig.pipeline.record("t", 0, o, 0, 1, None, b"v" * 200, None)
            assert rig.pressure == [True]
            assert rig.pipeline.sent_high.get(("t", 0), -1) < 499  # held back by pacing
            assert await rig.pipeline.drain(10.0)
            assert rig.pressure == [True, False]
            assert rig.pipeline.pacing_delay > 0
            assert rig.pipeline.sent_high == {("t", 0): 499}
        finally:
            rig.close()

    run(scenario())


def test_heartbeat_jumps_the_queue_and_names_only_sent_offsets() -> None:
    async def scenario() -> None:
        rig = Rig(pacing=PacingConfig(bytes_per_s=100_000), max_backlog=1 << 20)
        try:
            for o in range(300):
                rig.pipeline.record("t", 0, o, 0, 1, None, b"v" * 200, None)
            rig.pipeline.flush()
            high = tuple((t, p, o) for (t, p), o in rig.pipeline.sent_high.items())
            low = tuple((t, p, 0) for t, p, _ in high)
            rig.pipeline.heartbeat(
                Beat(
                    sender_id="s",
                    started_at_ms=1,
                    sent_at_ms=2,
                    high_offsets=high,
                    low_offsets=low,
                    counters=(),
                )
            )
            async with asyncio.timeout(5):
                while True:
                    events = [e for e in rig.receive() if isinstance(e, Heartbeat)]
                    if events:
                        break
                    await asyncio.sleep(0.01)
            assert rig.pipeline.pending_datagrams > 0  # records still queued behind it
            assert events[0].high_offsets == high
            assert events[0].low_offsets == low
            assert all(o < 299 for _, _, o in events[0].high_offsets)
        finally:
            rig.close()

    run(scenario())


class PortRig:
    """A pipeline with two targets, each a loopback socket with its own decoder (two workers)."""

    def __init__(self, *, copies: int, spacing: float) -> None:
        self.keys = ring()
        self.rx = []
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.setblocking(False)
            self.rx.append(sock)
        self.udp = UdpSender([("127.0.0.1", s.getsockname()[1]) for s in self.rx])
        loop = asyncio.get_running_loop()
        self.pipeline = SendPipeline(
            encoder=Encoder(WIRE, self.keys, session_id=os.urandom(16)),
            pacer=Pacer(PacingConfig(), loop.time()),
            udp=self.udp,
            loop=loop,
            copies=copies,
            copy_spacing=spacing,
        )
        self.decoders = [Decoder(WIRE, self.keys) for _ in self.rx]
        self.events: list[list[object]] = [[], []]

    def receive(self) -> None:
        for sock, decoder, events in zip(self.rx, self.decoders, self.events, strict=True):
            while True:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    break
                decoder.receive_datagram(data, 0.0)
                while (event := decoder.next_event()) is not None:
                    events.append(event)

    def close(self) -> None:
        self.pipeline.close()
        self.udp.close()
        for sock in self.rx:
            sock.close()


@pytest.mark.parametrize(("copies", "spacing"), [(1, 0.0), (2, 0.0), (2, 0.005)])
def test_two_targets_get_whole_messages_and_their_copies(copies: int, spacing: float) -> None:
    async def scenario() -> None:
        rig = PortRig(copies=copies, spacing=spacing)
        try:
            offsets = range(300)
            for o in offsets:
                # every 25th record is large: a message of several fragments
                value = bytes([o % 251]) * (6000 if o % 25 == 0 else 120)
                rig.pipeline.record("t", o % 3, o, 0, 1, None, value, None)
                if o % 100 == 99:
                    rig.pipeline.heartbeat(
                        Beat(
                            sender_id="s",
                            started_at_ms=1,
                            sent_at_ms=2,
                            high_offsets=(("t", 0, 0),),
                            low_offsets=(("t", 0, 0),),
                            counters=(),
                        )
                    )
            assert await rig.pipeline.drain(5.0)
            rig.receive()
            seen = []
            for decoder, events in zip(rig.decoders, rig.events, strict=True):
                records = [r for e in events if isinstance(e, RecordBatch) for r in e.records]
                assert records, "each target gets a share of the messages"
                seen += [(r.offset, r.value) for r in records]
                # whole messages: nothing waits in reassembly, nothing dropped but copies
                assert decoder.reassemblies_in_flight == 0
                assert set(decoder.drops) <= {DropReason.DUPLICATE}
                # every heartbeat reached every target
                assert sum(isinstance(e, Heartbeat) for e in events) == 3
            expected = [(o, bytes([o % 251]) * (6000 if o % 25 == 0 else 120)) for o in offsets]
            assert sorted(seen) == expected  # exactly once over both targets
            duplicates = sum(d.drops.get(DropReason.DUPLICATE, 0) for d in rig.decoders)
            assert (
                duplicates
                == rig.pipeline.copies_sent
                == (copies - 1) * (rig.pipeline.datagrams_sent // copies)
            )
            assert rig.pipeline.sent_high == {("t", 0): 297, ("t", 1): 298, ("t", 2): 299}
        finally:
            rig.close()

    run(scenario())
