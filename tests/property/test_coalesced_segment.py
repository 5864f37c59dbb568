"""``coalesced_segment`` splits a UDP GRO read where the kernel's segment size would have.

The receiver reads a GRO socket with ``recv_into`` after a wakeup's first read, so it learns how
a read was coalesced from the datagrams themselves (receiver/transport.py). The kernel coalesces
datagrams of one flow and one size, the last possibly shorter; for every datagram the sender can
emit (record batches whole and fragmented, at every datagram size and compression, heartbeats,
resend markers, withheld ranges, FEC repairs, with and without a key) such a read must split at
exactly the first datagram's size, and a datagram alone must not split at all. Arbitrary bytes
split only where a second datagram's magic follows a length-framed first one.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import (
    Encoder,
    Key,
    KeyRing,
    OutgoingDatagram,
    WireConfig,
    coalesced_segment,
    message_goes_on,
)
from common.wire.envelope import HEADER, MAGIC
from common.wire.fec import FecConfig, FecEncoder

KEY = Key.from_material(b"k" * 32)


def datagrams(draw: st.DrawFn) -> list[bytes]:
    """A session's datagrams of every kind, as the sender emits them."""
    size = draw(st.sampled_from([576, 1200, 1452, 4000, 8952, 65000]))
    keyed = draw(st.booleans())
    ring = KeyRing([KEY]) if keyed else None
    wire = WireConfig(
        max_datagram_size=size,
        compression=draw(st.sampled_from(["none", "zstd"])),
        allow_cleartext=not keyed,
    )
    # Bytes from a drawn seed, not os.urandom: zstd may shrink random bytes by a few, and the
    # datagram lengths bound later draws, which hypothesis requires to replay identically.
    rng = random.Random(draw(st.integers(0, 2**32)))
    encoder = Encoder(wire, ring, session_id=rng.randbytes(16))
    out: list[OutgoingDatagram] = []
    values = draw(st.lists(st.integers(0, 200_000), min_size=1, max_size=6))
    for offset, n in enumerate(values):
        value = rng.randbytes(n) if draw(st.booleans()) else b"text " * (n // 5)
        out += encoder.add("topic", offset % 3, offset, 0, 1, b"key", value, (), 0.0)
        if draw(st.booleans()):
            out += encoder.withhold("topic", 7, offset, 0.0)
    out += encoder.flush()
    out += encoder.heartbeat(
        sender_id="s", started_at_ms=1, sent_at_ms=2,
        high_offsets=[("topic", 0, 5)], low_offsets=[("topic", 0, 0)], counters=[("n", 1)],
    )  # fmt: skip
    out += encoder.resend_marker(
        bundle_id="b", phase="start", ranges=[("topic", 0, 0, 5)], records_sent=0, sent_at_ms=3
    )
    sent = [d.data for d in out]
    if draw(st.booleans()):
        fec = FecEncoder(
            FecConfig(overhead=50.0, block_size=4),
            ring,
            session_id=encoder.session_id,
            max_source_size=size,
        )
        repairs = [r for d in sent for r in fec.add(d, 0, 0.0)]
        sent += repairs + [r for _, r in fec.flush()]
    return sent


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_coalesced_read_splits_at_its_first_datagrams_size(data: st.DataObject) -> None:
    for datagram in datagrams(data.draw):
        n = len(datagram)
        assert coalesced_segment(datagram, n) == 0  # alone: one datagram
        assert coalesced_segment(memoryview(datagram), n) == 0
        copies = data.draw(st.integers(2, 5))
        last = datagram[: data.draw(st.integers(4, n))]  # the kernel only asks: no longer
        read = datagram * (copies - 1) + last
        buffer = bytearray(65536 * 5)
        buffer[: len(read)] = read  # as the drainer reads: one reused buffer, stale bytes after
        assert coalesced_segment(memoryview(buffer), len(read)) == n


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 300))
def test_any_bytes_split_only_before_a_second_magic(raw: bytes, cut: int) -> None:
    data = MAGIC + raw if cut % 2 else raw
    segment = coalesced_segment(data, len(data))
    if segment:
        assert 0 < segment < len(data)
        assert data[:4] == MAGIC
        assert data[segment : segment + 4] == MAGIC


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_read_goes_on_exactly_when_it_ends_before_a_messages_last_fragment(
    data: st.DataObject,
) -> None:
    """``message_goes_on`` looks at a read's last datagram: a fragment of a message other than
    its last says the message goes on in the next read; every other datagram the sender emits
    (a message's last fragment, a message in one datagram, heartbeats, markers, repairs) ends
    it, whatever datagrams of the read's segment size come before it."""
    sent = datagrams(data.draw)
    for datagram in sent:
        *_, index, count, _total = HEADER.unpack_from(datagram)
        expected = index + 1 < count
        assert message_goes_on(datagram, len(datagram)) is expected
        before = [d for d in sent if len(d) >= len(datagram)]
        segment = max(len(d) for d in before)
        read = b"".join(d for d in before if len(d) == segment) + datagram
        assert message_goes_on(read, segment) is expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 100))
def test_any_bytes_may_only_join_reads(raw: bytes, segment: int) -> None:
    """Bytes too short for a header never say a message goes on (and nothing raises)."""
    if not raw:
        return
    goes_on = message_goes_on(raw, segment)
    last = (len(raw) - 1) // segment * segment
    if len(raw) - last < HEADER.size - 4:
        assert goes_on is False
