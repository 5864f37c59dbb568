"""Hypothesis properties of the FEC core (common/wire/fec.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire.envelope import HEADER_SIZE, decode_long
from common.wire.fec import FEC_HEADER, FecConfig, FecDecoder, FecLimits, _fec_aead, is_repair
from tests.fec_support import FecLink, encode_with_repairs, records
from tests.wire_support import KEY, SESSION, ring

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _split(wire: list[bytes]) -> list[list[bytes]]:
    """Per block (one stream, interleave 1): its sources then its repairs."""
    blocks: list[list[bytes]] = [[]]
    seen_repair = False
    for d in wire:
        if not is_repair(d) and seen_repair:
            blocks.append([])
            seen_repair = False
        seen_repair = seen_repair or is_repair(d)
        blocks[-1].append(d)
    return blocks


@_SETTINGS
@given(
    n=st.integers(1, 120),
    size=st.integers(0, 1500),
    overhead=st.sampled_from([5, 10, 20, 50, 100]),
    block_size=st.integers(1, 40),
    data=st.data(),
)
def test_any_k_symbols_of_a_block_rebuild_every_record(
    n: int, size: int, overhead: int, block_size: int, data: st.DataObject
) -> None:
    cfg = FecConfig(overhead=overhead, block_size=block_size, interleave=1)  # consecutive blocks
    recs = records(n, size=size)
    _, wire = encode_with_repairs(cfg, recs)
    link = FecLink()
    for block in _split(wire):
        k = sum(not is_repair(d) for d in block)
        kept = data.draw(st.lists(st.sampled_from(range(len(block))), min_size=k, unique=True))
        kept_set = set(kept)
        # any order: shuffled subset of at least k symbols of the block
        for i in kept:
            link.receive(block[i])
        assert len(kept_set) >= k
    assert sorted(link.offsets) == sorted((r.topic, r.partition, r.offset) for r in recs)


def _block_of(repair: bytes) -> tuple[int, tuple[int, ...]]:
    """(block sequence, member sequences) of an authentic repair (decrypted with the test key)."""
    _, pos = decode_long(repair, HEADER_SIZE, len(repair))
    sequence = int.from_bytes(repair[24:32], "big")
    plain = _fec_aead(KEY, SESSION).decrypt(
        SESSION[:4] + sequence.to_bytes(8, "big"), repair[pos:], repair[:HEADER_SIZE]
    )
    first, _, k, _, _, _, span = FEC_HEADER.unpack_from(plain)
    bitmap = plain[FEC_HEADER.size : FEC_HEADER.size + (span + 7) // 8]
    members = tuple(first + i for i in range(span) if bitmap[i >> 3] >> (i & 7) & 1)
    assert len(members) == k
    return first, members


@_SETTINGS
@given(
    n=st.integers(1, 150),
    loss=st.lists(st.booleans(), min_size=1, max_size=400),
    interleave=st.integers(1, 4),
)
def test_any_loss_delivers_exactly_what_the_received_symbols_allow(
    n: int, loss: list[bool], interleave: int
) -> None:
    """Model: a block whose received sources plus received repairs reach k delivers all its
    records; any other block delivers the records of its received sources only. Never a record
    twice, never one that was not sent."""
    cfg = FecConfig(overhead=20, block_size=8, interleave=interleave)
    recs = records(n, size=300)
    sources, wire = encode_with_repairs(cfg, recs)
    by_sequence = {int.from_bytes(d[24:32], "big"): d for d in sources}
    received = [d for i, d in enumerate(wire) if not loss[i % len(loss)]]
    link = FecLink()
    for d in received:
        link.receive(d)
    got = set(received)
    blocks: dict[int, tuple[tuple[int, ...], int]] = {}
    for d in wire:
        if is_repair(d):
            first, members = _block_of(d)
            old = blocks.get(first, (members, 0))
            blocks[first] = (members, old[1] + (d in got))
    expected = [d for d in sources if d in got]
    for members, repairs_got in blocks.values():
        have = sum(by_sequence[s] in got for s in members)
        if repairs_got and have + repairs_got >= len(members):
            expected += [by_sequence[s] for s in members if by_sequence[s] not in got]
    model = FecLink()
    for d in expected:
        model.receive(d)
    assert len(link.offsets) == len(set(link.offsets))
    assert sorted(link.offsets) == sorted(model.offsets)
    link.timer(1e6)
    assert link.fec.pending_blocks == 0


@_SETTINGS
@given(junk=st.binary(max_size=2000), prefix=st.sampled_from([b"", b"KDIO\x01\x04"]))
def test_junk_never_raises_and_never_rebuilds(junk: bytes, prefix: bytes) -> None:
    dec = FecDecoder(FecLimits(), ring())
    assert dec.receive_repair(prefix + junk, 0.0) == []
    assert dec.add_source(prefix + junk, 0.0) == []
    assert dec.datagrams_reconstructed == 0


@_SETTINGS
@given(data=st.data())
def test_mutated_authentic_repairs_never_rebuild_a_datagram(data: st.DataObject) -> None:
    cfg = FecConfig(overhead=50, block_size=4)
    sources, wire = encode_with_repairs(cfg, records(8, size=500))
    repairs = [d for d in wire if is_repair(d)]
    repair = bytearray(data.draw(st.sampled_from(repairs)))
    pos = data.draw(st.integers(0, len(repair) - 1))
    repair[pos] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, 3))
    mutated = bytes(repair[: len(repair) - cut])
    link = FecLink()
    for d in sources[1:]:
        link.receive(d)
    link.receive(mutated)
    assert link.fec.datagrams_reconstructed == 0
    assert sum(link.drops.values()) == 1
