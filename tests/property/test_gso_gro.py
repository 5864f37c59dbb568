"""UDP GSO on the send side and GRO on the receive side deliver exactly the datagrams sent.

Real loopback sockets: ``UdpSender.send_run`` (one ``sendmsg`` with ``UDP_SEGMENT`` per run) into a
``SocketDrainer`` that splits coalesced reads by the kernel's segment size (``UDP_GRO``), or reads
one datagram per call (GRO off: the kernel segments). Runs of any segment size, a shorter last
segment, single datagrams and their mixtures must arrive as the same datagrams in the same order.
Then the whole wire path over the same sockets: encoder -> GSO -> GRO -> decoder.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire import (
    Decoder,
    Encoder,
    Key,
    KeyRing,
    RecordBatch,
    WireConfig,
    coalesced_segment,
    message_goes_on,
)
from common.wire.envelope import HEADER, HEADER_SIZE, MAGIC, encode_long
from receiver import transport
from receiver.transport import SocketDrainer, open_udp_socket
from sender.transport import GSO_MAX_BYTES, GSO_MAX_SEGMENTS, SendResult, UdpSender, gso_supported


def _kernel_has_gso() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return gso_supported(sock)


pytestmark = pytest.mark.skipif(not _kernel_has_gso(), reason="no UDP GSO in this kernel")


#: The segment sizes ``link``'s ``segment_of`` found (reads split by the datagrams' length).
split_by_length: list[int] = []


@contextmanager
def link(
    *,
    gro: bool,
    joined: list[tuple[int, int]] | None = None,
    framed: bool = False,
    goes_on: bool = False,
) -> Iterator[tuple[UdpSender, SocketDrainer, list[bytes]]]:
    """``joined``: take coalesced reads whole (``on_coalesced``), noting (datagrams, segment)
    of each buffer handed over, and split them here; ``framed``: the datagrams are framed as
    the wire frames them, and reads after a wakeup's first are split by what they hold
    (``segment_of``), not by the kernel's word; ``goes_on``: reads are joined only while their
    last datagram says its message goes on (``message_goes_on``)."""
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=32 << 20, gro=gro)
    got: list[bytes] = []
    split_by_length.clear()

    def segment_of(view: memoryview, nbytes: int) -> int:
        segment = coalesced_segment(view, nbytes)
        if segment:
            split_by_length.append(segment)
        return segment

    def whole(data: bytes, segment: int) -> None:
        assert joined is not None
        assert len(data) > segment
        joined.append((-(-len(data) // segment), segment))
        got.extend(data[at : at + segment] for at in range(0, len(data), segment))

    drainer = SocketDrainer(
        sock,
        got.append,
        lambda: None,
        max_per_wakeup=1 << 16,
        on_error=pytest.fail,
        on_coalesced=None if joined is None else whole,
        segment_of=segment_of if framed else None,
        goes_on=message_goes_on if goes_on else None,
    )
    assert drainer.gro is gro
    udp = UdpSender([("127.0.0.1", drainer.port)], gso=True)
    try:
        assert udp.gso
        yield udp, drainer, got
    finally:
        udp.close()
        drainer.close()


def frameable(size: int) -> bool:
    """Whether a datagram can be ``size`` bytes long: not 109, where a one-byte payload length
    (up to 63 bytes) ends and a two-byte one (from 64) begins."""
    return size != HEADER_SIZE + 1 + 64


def framed(size: int, fill: bytes) -> bytes:
    """A datagram of ``size`` bytes framed as the wire frames one: the magic, the rest of a
    44-byte header, the payload's Avro length, the payload (``fill`` repeated)."""
    for prefix in (1, 2, 3):
        payload = size - HEADER_SIZE - prefix
        length = encode_long(payload)
        if len(length) == prefix:
            body = (fill * payload)[:payload]
            return MAGIC + fill[:1] * (HEADER_SIZE - len(MAGIC)) + length + body
    raise AssertionError(size)


#: The smallest datagram ``framed`` makes: header, one length byte, a payload of one byte.
MIN_FRAMED = HEADER_SIZE + 2


@st.composite
def runs(draw: st.DrawFn, *, wire: bool = False) -> list[list[bytes]]:
    """Runs as ``send_run`` takes them: one size, the last possibly shorter; singles among them
    (``wire``: each datagram framed as the wire frames one)."""
    out: list[list[bytes]] = []
    low = MIN_FRAMED if wire else 1
    for _ in range(draw(st.integers(1, 6))):
        size = draw(st.integers(low, 1472).filter(frameable))
        count = draw(st.integers(1, min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size)))
        last = draw(st.integers(low, size).filter(frameable))
        tag = len(out).to_bytes(1, "big")
        if wire:
            run = [framed(size, tag + i.to_bytes(2, "big")) for i in range(count - 1)]
            run.append(framed(last, tag + b"L"))
        else:
            run = [(tag + i.to_bytes(2, "big") * size)[:size] for i in range(count - 1)]
            run.append((tag + b"L" * last)[:last])
        out.append(run)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_the_datagrams_sent_in_runs_arrive_as_sent(
    data: st.DataObject, gro: bool, whole: bool, at_once: bool, wire: bool, goes_on: bool
) -> None:
    """... datagram by datagram, or coalesced reads taken whole (``on_coalesced``), consecutive
    reads joined while a run may go on; drained after each run or once after all of them; the
    segment size from the kernel, or (``wire``) from what the datagrams say of their length;
    reads joined while a run may go on, or (``goes_on``) while its last datagram says so."""
    sent = data.draw(runs(wire=wire))
    joined = [] if whole else None
    with link(gro=gro, joined=joined, framed=wire, goes_on=goes_on) as (udp, drainer, got):
        for run in sent:
            assert udp.send_run(run) == (len(run), SendResult.SENT)
            if not at_once:
                drainer._drain()  # loopback delivers during sendmsg: the datagrams are there
        drainer._drain()
        assert got == [d for run in sent for d in run]
        assert drainer.datagrams == len(got)
        assert udp.sent == len(got)
        assert udp.calls == len(sent)  # a run of one goes with send, a longer one with sendmsg
        assert drainer.kernel_drops == 0


def test_a_run_is_coalesced_into_one_read_with_gro_and_split_back() -> None:
    run = [bytes([i]) * 1000 for i in range(10)] + [b"z" * 300]
    with link(gro=True) as (udp, drainer, got):
        assert udp.send_run(run) == (11, SendResult.SENT)
        assert udp.send_run([b"alone"]) == (1, SendResult.SENT)
        drainer._drain()
        assert got == [*run, b"alone"]
        assert drainer.coalesced == 1  # one read carried the run, another the single datagram
        assert udp.gso_calls == 1


def test_runs_of_one_size_read_in_one_wakeup_are_joined_into_one_buffer() -> None:
    """A message longer than one GSO run (64 datagrams, 64 KB) comes in several runs; read in
    one wakeup, they reach ``on_coalesced`` as one buffer, ending at the shorter datagram."""
    first = [bytes([i]) * 1000 for i in range(60)]  # 60 KB: a full run
    second = [bytes([i]) * 1000 for i in range(60, 70)] + [b"z" * 300]
    joined: list[tuple[int, int]] = []
    with link(gro=True, joined=joined) as (udp, drainer, got):
        assert udp.send_run(first) == (60, SendResult.SENT)
        assert udp.send_run(second) == (11, SendResult.SENT)
        assert udp.send_run([b"y" * 1000, b"y" * 1000]) == (2, SendResult.SENT)
        drainer._drain()
    assert got == [*first, *second, b"y" * 1000, b"y" * 1000]
    assert joined == [(71, 1000), (2, 1000)]
    assert drainer.coalesced == 3
    assert drainer.datagrams == 73


def _fragment(size: int, tag: int, index: int, count: int) -> bytes:
    """A framed datagram whose header says it is fragment ``index`` of ``count``."""
    data = bytearray(framed(size, bytes([tag])))
    data[HEADER_SIZE - 8 : HEADER_SIZE - 4] = (index << 16 | count).to_bytes(4, "big")
    assert HEADER.unpack_from(data)[8:10] == (index, count)
    return bytes(data)


def test_reads_that_end_their_messages_are_handed_over_alone() -> None:
    """With ``goes_on``, a read whose last datagram ends its message reaches ``on_coalesced``
    by itself (runs of one-datagram messages: no join, no copy); a read that ends before a
    message's last fragment is still joined with the next, up to the shorter datagram."""
    singles = [_fragment(1000, i, 0, 1) for i in range(20)]
    more = [_fragment(1000, 20 + i, 0, 1) for i in range(20)]
    head = [_fragment(1000, 40 + i, i, 80) for i in range(60)]  # a full GSO run
    tail = [_fragment(1000, 100 + i, 60 + i, 80) for i in range(19)] + [_fragment(300, 1, 79, 80)]
    for goes_on, expected in [
        (True, [(20, 1000), (20, 1000), (80, 1000)]),
        (False, [(120, 1000)]),  # every read that ends on a whole segment may go on
    ]:
        joined: list[tuple[int, int]] = []
        with link(gro=True, joined=joined, framed=True, goes_on=goes_on) as (udp, drainer, got):
            for run in (singles, more, head, tail):
                assert udp.send_run(run) == (len(run), SendResult.SENT)
            drainer._drain()
        assert got == [*singles, *more, *head, *tail]
        assert joined == expected


def test_without_gso_a_run_goes_one_datagram_per_call() -> None:
    with link(gro=True) as (udp, drainer, got):
        udp.gso = False
        assert udp.max_segments == 1
        assert udp.send_run([b"a" * 10, b"b" * 10]) == (1, SendResult.SENT)
        assert udp.send_run([b"b" * 10]) == (1, SendResult.SENT)
        drainer._drain()
        assert got == [b"a" * 10, b"b" * 10]
        assert udp.calls == 2


@pytest.mark.parametrize("by_length", [False, True], ids=["kernel-segment", "datagram-length"])
@pytest.mark.parametrize("value_bytes", [200, 9000, 100_000])
def test_the_wire_path_over_gso_and_gro_delivers_every_record(
    value_bytes: int, by_length: bool
) -> None:
    """Encoder -> UdpSender runs (GSO) -> SocketDrainer (GRO) -> Decoder: the records, once;
    coalesced reads split at the kernel's segment size or at the datagrams' own length."""
    ring = KeyRing([Key.generate()])
    wire = WireConfig()
    encoder = Encoder(wire, ring, session_id=os.urandom(16))
    decoder = Decoder(wire, ring)
    values = [os.urandom(value_bytes) for _ in range(40)]
    datagrams = []
    for offset, value in enumerate(values):
        datagrams += encoder.add("t", 0, offset, 1, 0, b"k", value, (), 0.0)
    datagrams += encoder.flush()
    with link(gro=True, framed=by_length) as (udp, drainer, got):
        i = 0
        while i < len(datagrams):  # runs as the pipeline makes them: one size, last shorter
            size = len(datagrams[i].data)
            run = [datagrams[i].data]
            while i + len(run) < len(datagrams) and len(run) < GSO_MAX_SEGMENTS:
                n = len(datagrams[i + len(run)].data)
                if n > size or sum(map(len, run)) + n > GSO_MAX_BYTES:
                    break
                run.append(datagrams[i + len(run)].data)
                if n < size:
                    break
            count, result = udp.send_run(run)
            assert result is SendResult.SENT
            i += count
            if not by_length:
                drainer._drain()  # each wakeup's one read asks the kernel for the segment
        drainer._drain()  # by_length: every read after the first split by the datagrams' length
        assert got == [d.data for d in datagrams]
        if value_bytes > 1400:
            assert drainer.coalesced > 0
            assert bool(split_by_length) is by_length
    for data in got:
        decoder.receive_datagram(data, 0.0)
    received = []
    while (event := decoder.next_event()) is not None:
        assert isinstance(event, RecordBatch), event
        received += [(r.offset, r.value) for r in event.records]
    assert received == list(enumerate(values))
    assert not decoder.drops


def test_a_buffer_coalesced_under_gro_loses_its_segment_size_once_gro_is_off() -> None:
    """Why the receiver never switches GRO off at run time (receiver/transport.py, "GRO is not
    switched with the traffic"): the kernel reports the segment size only while GRO is on at the
    *read*, so a run coalesced before the switch and read after it is one concatenated buffer."""
    run = [bytes([i]) * 100 for i in range(4)]
    with link(gro=True) as (udp, drainer, got):
        assert udp.send_run(run) == (4, SendResult.SENT)
        drainer._sock.setsockopt(transport.SOL_UDP, transport.UDP_GRO, 0)
        drainer._drain_gro()
        assert got == [b"".join(run)]


def test_with_gro_the_kernel_counts_a_dropped_run_as_one_drop() -> None:
    """What ``socket_kernel_drops_total`` means with GRO on (docs/metrics.md): the kernel queues
    a coalesced run as one buffer and, when the socket's buffer is full, drops and counts it as
    one, so the counter counts runs, not datagrams. It is never 0 while datagrams are lost."""
    run = [bytes([i]) * 1000 for i in range(10)]
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=100_000, gro=True)
    got: list[bytes] = []
    drainer = SocketDrainer(sock, got.append, lambda: None, max_per_wakeup=1 << 16, on_error=print)
    udp = UdpSender([("127.0.0.1", drainer.port)], gso=True)
    try:
        for _ in range(100):  # 1,000 datagrams of 1,000 bytes into a ~100 KB buffer
            assert udp.send_run(run) == (10, SendResult.SENT)
        drainer._drain()
        lost = 1000 - len(got)
        drops = drainer.refresh_kernel_drops()
    finally:
        udp.close()
        drainer.close()
    assert lost > 0
    assert drops * len(run) == lost  # whole runs lost, each counted once
