"""A GRO read decoded whole (``Decoder.receive_coalesced``) equals its datagrams decoded one by one.

The receiver hands a coalesced read to ``receive_coalesced`` message by message and the rest of
it, from the first message that path does not take, to ``receive_datagram`` datagram by datagram
(``Receiver._on_coalesced``). Whatever the reads hold, two decoders, one fed that way and one fed
every datagram on its own, must end alike: the same events in the same order, the same drops by
reason, the same counters, the same replay windows (so what comes next is judged alike) and the
same messages waiting in the reassembler. The link here is hostile: datagrams lost, repeated,
swapped, truncated, bit-flipped, from a session the key ring does not know, under a replaced key,
and reads cut anywhere GRO may cut them (equal sizes, the last one shorter or equal); datagrams
of up to 8952 bytes (a jumbo-frame link: payload lengths of three bytes).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire import Decoder, Encoder, Key, KeyRing, RecordBatch, WireConfig
from common.wire.events import Dropped

KEY = Key.from_material(bytes(range(32)))
OTHER = Key.from_material(bytes(range(1, 33)))


def _feed_coalesced(decoder: Decoder, data: bytes, segment: int) -> None:
    start = 0
    while start < len(data):
        used = decoder.receive_coalesced(data, start, segment, 0.0)
        if not used:
            break
        start += used
    for at in range(start, len(data), segment):
        decoder.receive_datagram(data[at : at + segment], 0.0)


def _events(decoder: Decoder) -> list[Any]:
    out: list[Any] = []
    while (event := decoder.next_event()) is not None:
        if isinstance(event, RecordBatch):
            out.append(("batch", event.session_id, event.sequence, event.count, event.records))
        else:
            assert isinstance(event, Dropped)
            out.append(("drop", event.reason, event.session_id))
    return out


def _state(decoder: Decoder) -> Any:
    windows = {s: (w.highest, bytes(w.seen)) for s, w in decoder._replay.windows.items()}
    partials = {
        mid: (p.count, p.total, sorted(p.chunks.items()))
        for mid, p in decoder._reassembler._partials.items()
    }
    return (
        dict(decoder.drops),
        decoder.datagrams,
        decoder.authenticated,
        windows,
        list(decoder._replay.windows),
        partials,
        list(decoder._ciphers),
    )


@st.composite
def links(draw: st.DrawFn) -> tuple[WireConfig, list[tuple[bytes, int]], bool]:
    """Datagrams of two sessions as a hostile link delivers them, cut into GRO-shaped reads."""
    config = WireConfig(
        max_datagram_size=draw(st.sampled_from([256, 600, 1452, 8952])),
        replay_window=draw(st.sampled_from([64, 4096])),
        max_reassemblies=draw(st.sampled_from([1, 2, 64])),
        max_message_size=1 << 16,
        max_record_size=(1 << 16) - 4096,
    )
    datagrams: list[bytes] = []
    for session in range(draw(st.integers(1, 2))):
        encoder = Encoder(config, KeyRing([KEY]), session_id=bytes([session + 1]) * 16)
        for offset in range(draw(st.integers(1, 6))):
            size = draw(st.sampled_from([10, 200, 900, 3000, 9000, 20000]))
            value = os.urandom(size)
            datagrams += [d.data for d in encoder.add("t", 0, offset, 1, 0, b"k", value, (), 0.0)]
            if draw(st.booleans()):
                datagrams += [d.data for d in encoder.flush()]
        datagrams += [d.data for d in encoder.flush()]
    # the link: each datagram lost, kept, repeated or damaged; neighbours swapped
    delivered: list[bytes] = []
    for sent in datagrams:
        fate = draw(st.sampled_from(["keep"] * 8 + ["lose", "twice", "flip", "cut"]))
        data = sent
        if fate == "lose":
            continue
        if fate == "flip":
            at = draw(st.integers(0, len(data) - 1))
            data = data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
        if fate == "cut":
            data = data[: draw(st.integers(1, len(data)))]
        delivered.append(data)
        if fate == "twice":
            delivered.append(data)
    for i in range(len(delivered) - 1):
        if draw(st.integers(0, 9)) == 0:
            delivered[i], delivered[i + 1] = delivered[i + 1], delivered[i]
    # GRO reads: runs of equal sizes, the last one shorter or equal, cut where it likes
    reads: list[tuple[bytes, int]] = []
    i = 0
    while i < len(delivered):
        segment = len(delivered[i])
        j = i + 1
        while j < len(delivered) and len(delivered[j]) <= segment and draw(st.integers(0, 7)):
            j += 1
            if len(delivered[j - 1]) < segment:
                break
        reads.append((b"".join(delivered[i:j]), segment))
        i = j
    return config, reads, draw(st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(links())
def test_a_coalesced_read_decodes_as_its_datagrams_one_by_one(
    case: tuple[WireConfig, list[tuple[bytes, int]], bool],
) -> None:
    config, reads, rotate = case
    ring_a, ring_b = KeyRing([KEY]), KeyRing([KEY])
    one_by_one, coalesced = Decoder(config, ring_a), Decoder(config, ring_b)
    for n, (data, segment) in enumerate(reads):
        if rotate and n == len(reads) // 2:  # the key replaced mid-link: ciphers must follow
            ring_a.replace(KeyRing([OTHER, KEY]))
            ring_b.replace(KeyRing([OTHER, KEY]))
        for at in range(0, len(data), segment):
            one_by_one.receive_datagram(data[at : at + segment], 0.0)
        _feed_coalesced(coalesced, data, segment)
        assert _events(coalesced) == _events(one_by_one)
        assert _state(coalesced) == _state(one_by_one)


@pytest.mark.parametrize(
    ("datagram_size", "value_size", "fragments"), [(1452, 10_000, 8), (8952, 20_000, 3)]
)
def test_a_large_record_in_one_read_takes_the_coalesced_path(
    datagram_size: int, value_size: int, fragments: int
) -> None:
    """The path is taken at all: a large record's datagrams in one read are one call (with
    jumbo datagrams too, whose payload lengths take three bytes)."""
    config = WireConfig(max_datagram_size=datagram_size)
    encoder = Encoder(config, KeyRing([KEY]), session_id=b"s" * 16)
    first = [d.data for d in encoder.add("t", 0, 0, 1, 0, b"k", b"a" * 100, (), 0.0)]
    first += [d.data for d in encoder.flush()]
    value = os.urandom(value_size)
    datagrams = [d.data for d in encoder.add("t", 0, 1, 1, 0, b"k", value, (), 0.0)]
    datagrams += [d.data for d in encoder.flush()]
    assert len(datagrams) == fragments
    decoder = Decoder(config, KeyRing([KEY]))
    decoder.receive_datagram(first[0], 0.0)  # the session is known: its window and cipher exist
    data = b"".join(datagrams)
    assert decoder.receive_coalesced(data, 0, len(datagrams[0]), 0.0) == len(data)
    events = _events(decoder)
    assert [e[0] for e in events] == ["batch", "batch"]
    assert [r.value for r in events[1][4]] == [value]
    assert decoder.datagrams == decoder.authenticated == fragments + 1
    assert decoder.coalesced_messages == 1
    # the same read again: every sequence is in the window now, so the path declines it
    assert decoder.receive_coalesced(data, 0, len(datagrams[0]), 0.0) == 0
