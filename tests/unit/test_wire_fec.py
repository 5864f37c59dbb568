"""FEC encoder/decoder (common/wire/fec.py): recovery, bounds, and hostile repair datagrams."""

from __future__ import annotations

import struct

import pytest

from common.errors import ConfigError
from common.wire import Key, KeyRing
from common.wire.envelope import HEADER, HEADER_SIZE
from common.wire.fec import (
    FEC_HEADER,
    KIND_FEC_REPAIR,
    MAX_SPAN,
    SCHEME_ZFEC_RS,
    FecConfig,
    FecDecoder,
    FecDropReason,
    FecEncoder,
    FecLimits,
    is_repair,
)
from tests.fec_support import FecLink, encode_with_repairs, fec_config, records, sender
from tests.wire_support import SESSION, ring

RECORDS = records(400)
ALL = {(r.topic, r.partition, r.offset) for r in RECORDS}


def _blocks(wire: list[bytes]) -> list[tuple[list[bytes], list[bytes]]]:
    """Split a send-ordered stream into (sources, repairs) per block (one stream, interleave 1)."""
    out: list[tuple[list[bytes], list[bytes]]] = []
    sources: list[bytes] = []
    repairs: list[bytes] = []
    for d in wire:
        if is_repair(d):
            repairs.append(d)
        else:
            if repairs:
                out.append((sources, repairs))
                sources, repairs = [], []
            sources.append(d)
    out.append((sources, repairs))
    return out


def _offsets_in(datagrams: list[bytes]) -> set[tuple[str, int, int]]:
    link = FecLink()
    for d in datagrams:
        link.receive(d)
    return set(link.offsets)


def test_no_loss_every_block_is_complete_and_nothing_is_rebuilt() -> None:
    cfg = fec_config()
    sources, wire = encode_with_repairs(cfg, RECORDS)
    link = FecLink()
    for d in wire:
        link.receive(d)
    assert set(link.offsets) == ALL
    assert len(link.offsets) == len(ALL)
    blocks = -(-len(sources) // cfg.block_size)
    assert link.fec.blocks_complete == blocks
    assert link.fec.blocks_recovered == link.fec.datagrams_reconstructed == 0
    assert link.fec.repairs_unused == sum(len(r) for _, r in _blocks(wire)) - blocks
    assert link.drops == {}


def test_losing_m_sources_of_every_block_loses_nothing() -> None:
    cfg = fec_config()
    _, wire = encode_with_repairs(cfg, RECORDS)
    link = FecLink()
    lost = 0
    for sources, repairs in _blocks(wire):
        keep = sources[len(repairs) :]  # the first m sources of each block are lost
        lost += len(sources) - len(keep)
        for d in keep + repairs:
            link.receive(d)
    assert set(link.offsets) == ALL
    assert len(link.offsets) == len(ALL)
    assert link.fec.datagrams_reconstructed == lost
    assert link.fec.blocks_unrecoverable == 0


def test_repairs_before_late_sources_still_recover() -> None:
    cfg = fec_config()
    _, wire = encode_with_repairs(cfg, RECORDS)
    link = FecLink()
    for sources, repairs in _blocks(wire):
        # repairs first (reordering), then all sources but one: the block waits, then completes
        for d in repairs[:1] + sources[1:]:
            link.receive(d)
    assert set(link.offsets) == ALL
    assert link.fec.pending_blocks == 0


def test_loss_beyond_the_overhead_loses_exactly_the_missing_datagrams_records() -> None:
    cfg = fec_config()
    _, wire = encode_with_repairs(cfg, RECORDS)
    blocks = _blocks(wire)
    link = FecLink()
    missing: set[tuple[str, int, int]] = set()
    for n, (sources, repairs) in enumerate(blocks):
        kept = sources
        if n == 1:  # one more source lost than the block has repairs
            missing |= _offsets_in(sources[: len(repairs) + 1])
            kept = sources[len(repairs) + 1 :]
        for d in kept + repairs:
            link.receive(d)
    assert missing
    assert set(link.offsets) == ALL - missing
    assert link.fec.pending_blocks == 1
    link.timer(100.0)
    assert link.fec.blocks_unrecoverable == 1
    assert link.fec.pending_blocks == 0


def test_a_corrupted_source_is_repaired_not_trusted() -> None:
    """A bit-flipped source fails GCM, never joins its block, and the block rebuilds it."""
    _, wire = encode_with_repairs(fec_config(), RECORDS)
    first_sources, first_repairs = _blocks(wire)[0]
    flipped = bytearray(first_sources[0])
    flipped[-1] ^= 1
    link = FecLink()
    for d in [bytes(flipped), *first_sources[1:], *first_repairs]:
        link.receive(d)
    assert link.drops.get("auth_failed") == 1
    assert link.fec.datagrams_reconstructed == 1
    assert set(link.offsets) == _offsets_in(first_sources)


def test_a_late_source_after_its_reconstruction_is_a_duplicate() -> None:
    _, wire = encode_with_repairs(fec_config(), RECORDS)
    sources, repairs = _blocks(wire)[0]
    link = FecLink()
    for d in [*sources[1:], *repairs, sources[0]]:
        link.receive(d)
    assert len(link.offsets) == len(set(link.offsets))
    assert link.drops.get("duplicate") == 1


def test_repair_copies_die_in_the_repair_replay_window() -> None:
    _, wire = encode_with_repairs(fec_config(), RECORDS)
    sources, repairs = _blocks(wire)[0]
    link = FecLink()
    for d in [*sources[1:], repairs[0], repairs[0]]:
        link.receive(d)
    assert link.drops == {"fec_duplicate": 1}


def test_every_repair_fits_max_datagram_size_and_sources_are_unchanged() -> None:
    cfg = fec_config(overhead=50, interleave=4, streams=3)
    sources, wire = encode_with_repairs(cfg, records(300, size=900))
    repairs = [d for d in wire if is_repair(d)]
    assert repairs
    assert max(len(d) for d in repairs) <= 1452
    assert [d for d in wire if not is_repair(d)] == sources


def test_block_latency_closes_a_block_that_is_not_full() -> None:
    cfg = fec_config(block_latency=0.05)
    encoder, fec = sender(cfg)
    d = encoder.add("t", 0, 0, 0, 1, None, b"x", (), 0.0) + encoder.flush()
    assert fec.add(d[0].data, 0, 10.0) == []
    assert fec.next_deadline() == pytest.approx(10.05)
    assert fec.poll(10.04) == []
    closed = fec.poll(10.05)
    assert [stream for stream, _ in closed] == [0]  # k=1: one repair (20 % rounded up)
    assert fec.next_deadline() is None
    link = FecLink()
    link.receive(closed[0][1])  # the source was lost: a repair of a 1-block is a copy
    assert link.offsets == [("t", 0, 0)]


def test_interleaving_spreads_a_burst_over_blocks() -> None:
    """With interleave D, D x m consecutive losses leave at most m per block: all recovered."""
    cfg = fec_config(interleave=4, block_size=16)
    sources, wire = encode_with_repairs(cfg, records(600))
    m = cfg.repairs_for(cfg.block_size)
    burst = set(sources[20 : 20 + 4 * m])
    link = FecLink()
    for d in wire:
        if d not in burst:
            link.receive(d)
    assert set(link.offsets) == {(r.topic, r.partition, r.offset) for r in records(600)}
    assert link.fec.datagrams_reconstructed == 4 * m


def test_streams_have_separate_blocks() -> None:
    cfg = fec_config(streams=2, block_size=4)
    encoder, fec = sender(cfg)
    out = []
    for i in range(8):
        for d in encoder.add("t", 0, i, 0, 1, None, b"x" * 1300, (), 0.0):
            out += [(s, r) for r in fec.add(d.data, i % 2, 0.0) for s in [i % 2]]
    assert sorted({s for s, _ in out}) == [0, 1]


# -- hostile repairs ------------------------------------------------------------------------


def _one_repair() -> tuple[list[bytes], bytes]:
    _, wire = encode_with_repairs(fec_config(), RECORDS)
    sources, repairs = _blocks(wire)[0]
    return sources, repairs[0]


def test_forged_repair_is_dropped_as_auth_failed_and_builds_nothing() -> None:
    sources, repair = _one_repair()
    forged = bytearray(repair)
    forged[HEADER_SIZE + 10] ^= 0xFF
    link = FecLink()
    for d in sources[1:]:
        link.receive(d)
    link.receive(bytes(forged))
    assert link.drops == {"fec_auth_failed": 1}
    assert link.fec.pending_blocks == 0
    assert link.fec.datagrams_reconstructed == 0


def test_every_single_bit_flip_of_a_repair_is_dropped() -> None:
    sources, repair = _one_repair()
    for bit in range(0, len(repair) * 8, 7):
        flipped = bytearray(repair)
        flipped[bit // 8] ^= 1 << (bit % 8)
        link = FecLink()
        for d in sources[1:]:
            link.receive(d)
        link.receive(bytes(flipped))
        assert link.fec.datagrams_reconstructed == 0, bit
        assert sum(link.drops.values()) == 1, (bit, link.drops)


@pytest.mark.parametrize("cut", [1, 16, 17, 100, 1000])
def test_truncated_repair_is_dropped(cut: int) -> None:
    _, repair = _one_repair()
    link = FecLink()
    link.receive(repair[:-cut])
    assert sum(link.drops.values()) == 1
    assert next(iter(link.drops)) in {"fec_malformed", "fec_auth_failed"}


def test_unknown_key_and_cleartext_are_refused() -> None:
    _, repair = _one_repair()
    other = FecDecoder(FecLimits(), KeyRing([Key.generate()]))
    assert other.receive_repair(repair, 0.0) == []
    assert dict(other.drops) == {FecDropReason.UNKNOWN_KEY: 1}
    cfg = fec_config()
    clear = FecEncoder(cfg, None, session_id=SESSION, max_source_size=1300)
    encoder, _ = sender(cfg)
    d = encoder.add("t", 0, 0, 0, 1, None, b"x", (), 0.0) + encoder.flush()
    clear.add(d[0].data, 0, 0.0)
    ((_, repair_clear),) = clear.flush()
    refusing = FecDecoder(FecLimits(), ring())
    refusing.receive_repair(repair_clear, 0.0)
    assert dict(refusing.drops) == {FecDropReason.CLEARTEXT_REFUSED: 1}
    allowing = FecDecoder(FecLimits(allow_cleartext=True), None)
    assert allowing.receive_repair(repair_clear, 0.0) == [d[0].data]


def _authentic(plaintext_head: bytes, symbol: bytes, *, sequence: int = 0) -> bytes:
    """A correctly encrypted repair datagram around arbitrary FEC fields (keyholder forgery)."""
    fec = FecEncoder(fec_config(), ring(), session_id=SESSION, max_source_size=1300)
    fec._next_repair = sequence
    return fec._seal(memoryview(plaintext_head + symbol))


@pytest.mark.parametrize(
    ("fields", "bitmap", "symbol_len"),
    [
        ((100, 2, 1, 1, 0, 100, 1), b"\x01", 100),  # unknown scheme
        ((100, SCHEME_ZFEC_RS, 0, 1, 0, 100, 1), b"\x01", 100),  # k = 0
        ((100, SCHEME_ZFEC_RS, 1, 0, 0, 100, 1), b"\x01", 100),  # m = 0
        ((100, SCHEME_ZFEC_RS, 200, 100, 0, 100, 200), bytes(25), 100),  # k + m > 256
        ((100, SCHEME_ZFEC_RS, 1, 1, 1, 100, 1), b"\x01", 100),  # index >= m
        ((100, SCHEME_ZFEC_RS, 2, 1, 0, 100, 1), b"\x01", 100),  # span < k
        ((100, SCHEME_ZFEC_RS, 1, 1, 0, 100, MAX_SPAN + 1), bytes(257), 100),  # span too long
        ((2**64 - 2, SCHEME_ZFEC_RS, 2, 1, 0, 100, 3), b"\x05", 100),  # past the last sequence
        ((100, SCHEME_ZFEC_RS, 2, 1, 0, 100, 2), b"\x01", 100),  # bitmap has 1 bit, k = 2
        ((100, SCHEME_ZFEC_RS, 1, 1, 0, 100, 1), b"\x03", 100),  # bit beyond the span
        ((100, SCHEME_ZFEC_RS, 1, 1, 0, 100, 1), b"\x01", 99),  # symbol shorter than declared
        ((100, SCHEME_ZFEC_RS, 1, 1, 0, 10, 1), b"\x01", 10),  # symbol too small for a datagram
    ],
)
def test_absurd_block_fields_are_malformed(
    fields: tuple[int, ...], bitmap: bytes, symbol_len: int
) -> None:
    link = FecLink()
    link.receive(_authentic(FEC_HEADER.pack(*fields) + bitmap, bytes(symbol_len)))
    assert link.drops == {"fec_malformed": 1}
    assert link.fec.pending_blocks == 0


def test_an_authentic_repair_that_contradicts_its_block_is_a_mismatch() -> None:
    link = FecLink()
    link.receive(
        _authentic(FEC_HEADER.pack(100, SCHEME_ZFEC_RS, 1, 2, 0, 100, 1) + b"\x01", bytes(100))
    )
    link.receive(
        _authentic(
            FEC_HEADER.pack(100, SCHEME_ZFEC_RS, 1, 3, 1, 100, 1) + b"\x01", bytes(100), sequence=1
        )
    )
    assert link.drops == {"fec_mismatch": 1}


def test_a_repair_that_rebuilds_a_foreign_datagram_is_a_mismatch_and_nothing_is_decoded() -> None:
    """A keyholder's repair whose symbol is garbage: the rebuilt bytes are not the block's."""
    link = FecLink()
    link.receive(
        _authentic(
            FEC_HEADER.pack(100, SCHEME_ZFEC_RS, 1, 1, 0, 100, 1) + b"\x01", b"\x00\x60" + bytes(98)
        )
    )
    assert link.drops == {"fec_mismatch": 1}
    assert link.offsets == []
    assert link.fec.blocks_unrecoverable == 1


def test_not_a_repair_and_short_input_never_raise() -> None:
    dec = FecDecoder(FecLimits(), ring())
    for junk in (b"", b"KDIO", b"KDIO\x01\x04" + bytes(50), bytes(200)):
        assert dec.receive_repair(junk, 0.0) == []
        assert dec.add_source(junk, 0.0) == []
    header = HEADER.pack(b"KDIO", 1, KIND_FEC_REPAIR, 0, 1, SESSION, 0, 1, 0, 1, 10)
    assert dec.receive_repair(header + b"\xff" * 11, 0.0) == []
    assert sum(dec.drops.values()) == 5


# -- bounds -------------------------------------------------------------------------------------


def test_pending_blocks_are_bounded_and_time_out() -> None:
    cfg = fec_config(block_size=4)
    _, wire = encode_with_repairs(cfg, records(400, size=1000))
    fec = FecDecoder(FecLimits(max_pending_blocks=3, block_timeout=1.0), ring())
    for d in wire:  # no source ever arrives: every block waits
        if is_repair(d):
            fec.receive_repair(d, 0.0)
    assert fec.pending_blocks == 3
    assert fec.drops[FecDropReason.OVERFLOW] > 0
    assert fec.next_deadline() == 1.0
    fec.handle_timer(1.0)
    assert fec.pending_blocks == 0
    assert fec.blocks_unrecoverable == fec.drops[FecDropReason.OVERFLOW] + 3


def test_source_buffer_is_bounded_by_bytes_and_age() -> None:
    sources, _ = encode_with_repairs(fec_config(), RECORDS)
    fec = FecDecoder(FecLimits(max_source_bytes=10_000, block_timeout=1.0), ring())
    for d in sources:
        fec.add_source(d, 0.0)
    assert 0 < fec.buffered_source_bytes <= 10_000
    fec.handle_timer(5.0)
    assert fec.buffered_source_bytes == 0


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"overhead": 0}, "fec_overhead"),
        ({"overhead": 101}, "fec_overhead"),
        ({"block_size": 0}, "fec_block_size"),
        ({"block_size": 200, "overhead": 50}, "fec_block_size"),
        ({"block_latency": 0}, "fec_block_latency"),
        ({"interleave": 17}, "fec_interleave"),
    ],
)
def test_config_errors_name_the_key(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        FecConfig(**{"overhead": 20, **changes})  # type: ignore[arg-type]
    assert err.value.key == key


def test_repairs_round_up_and_overhead_bytes_cover_the_bitmap() -> None:
    cfg = FecConfig(overhead=20, block_size=64, interleave=1)
    assert [cfg.repairs_for(k) for k in (1, 5, 10, 64)] == [1, 1, 2, 13]
    assert cfg.max_span == 128
    assert cfg.overhead_bytes == HEADER_SIZE + 3 + 16 + FEC_HEADER.size + 2 + 16
    assert struct.calcsize(">QBBBBHH") == FEC_HEADER.size == 16


def test_interleaved_repairs_go_out_interleaved_and_never_wait_past_the_latency() -> None:
    cfg = fec_config(interleave=2, block_size=1, overhead=100)
    encoder, fec = sender(cfg)
    out = []
    for i in range(3):
        for d in encoder.add("t", 0, i, 0, 1, None, b"x", (), 0.0) + encoder.flush():
            out.append(fec.add(d.data, 0, 1.0))
    # blocks of one: the first two close together and their repairs leave as one round
    assert [len(o) for o in out] == [0, 2, 0]
    assert fec.next_deadline() == pytest.approx(1.0 + cfg.block_latency)
    assert len(fec.poll(1.0 + cfg.block_latency)) == 1  # the third block's repair, alone
    assert fec.next_deadline() is None


def test_sources_kept_a_read_at_a_time_rebuild_what_the_repairs_allow() -> None:
    """The receiver hands its GRO reads over whole (``add_sources``), and they are indexed only
    when a block looks: a block whose repairs come after its sources still finds them and
    rebuilds the one source lost, exactly as with the sources handed over one by one."""
    sources, wire = encode_with_repairs(fec_config(), RECORDS)
    lost = sources[5]
    outcomes = []
    for whole in (True, False):
        fec = FecDecoder(FecLimits(block_timeout=10.0), ring())
        rebuilt: list[bytes] = []
        run: list[bytes] = []
        for d in [*wire, b""]:  # b"": the end, which hands over the last run
            if run and (not d or is_repair(d) or len(d) != len(run[0])):
                data = b"".join(run)
                if whole:
                    rebuilt += fec.add_sources(data, 0, len(data), len(run[0]), 0.0)
                else:
                    for x in run:
                        rebuilt += fec.add_source(x, 0.0)
                run = []
            if is_repair(d):
                rebuilt += fec.receive_repair(d, 0.0)
            elif d and d is not lost:
                run.append(d)
        outcomes.append((rebuilt, fec.blocks_recovered, fec.blocks_complete))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == [lost]
    assert outcomes[0][1] == 1


def test_sources_age_out_as_new_ones_arrive_without_any_timer() -> None:
    sources, _ = encode_with_repairs(fec_config(), RECORDS)
    fec = FecDecoder(FecLimits(block_timeout=1.0), ring())
    for i, d in enumerate(sources):
        fec.add_source(d, i * 0.1)
    kept = fec.buffered_source_bytes
    assert 0 < kept <= 11 * max(len(d) for d in sources)  # about the last second's worth


def test_margin_used_counts_each_decided_block_by_the_share_of_repairs_its_losses_took() -> None:
    """The receiver's fec_margin_used histogram (KafkaDiodeFecMarginLow): losses of sources and
    of repairs both use the margin; a failed block lands above 1."""
    cfg = fec_config()  # blocks of 16 sources, 4 repairs
    _, wire = encode_with_repairs(cfg, RECORDS)
    blocks = _blocks(wire)
    assert len(blocks) >= 4
    assert all(len(r) == 4 for _, r in blocks[:4])
    link = FecLink(FecLimits(block_timeout=1.0))
    plans = [
        (0, 0),  # nothing lost: share 0
        (1, 0),  # one source: 1/4
        (1, 1),  # one source and repair 0 (seen missing once repair 1 arrives): 2/4
        (3, 2),  # three sources, repairs 0 and 1: 3 missing, 2 repairs left, fails (> 1)
    ]
    for (sources, repairs), (lost_sources, lost_repairs) in zip(blocks, plans, strict=False):
        for d in sources[lost_sources:] + repairs[lost_repairs:]:
            link.receive(d)
    link.timer(10.0)  # the failed block times out
    fec = link.fec
    assert (fec.blocks_complete, fec.blocks_recovered, fec.blocks_unrecoverable) == (1, 2, 1)
    # buckets: <= 0, <= 0.25, <= 0.5, <= 0.75, <= 1, above 1
    assert fec.margin_used == [1, 1, 1, 0, 0, 1]
    assert fec.margin_used_sum == pytest.approx(0 + 0.25 + 0.5 + 5 / 4)


@pytest.mark.parametrize(("sources", "blocks"), [(20, 1), (160, 1), (200, 2), (500, 4)])
def test_a_round_closed_by_the_latency_bound_is_dealt_into_as_few_blocks_as_fit(
    sources: int, blocks: int
) -> None:
    """A slow stream: the default interleave 4 would split what the latency bound lets in into
    four small blocks (20 sources: 5 + 1 repair each, ~6,600 failed per million at 5 % loss);
    dealt afresh it is one block of 20 + 4 (~300). The rebuilt blocks decode like any other."""
    cfg = FecConfig(overhead=20, block_size=160, interleave=4)
    encoder, fec = sender(cfg)
    wire: list[bytes] = []
    n = 0
    for i in range(10 * sources):
        for d in encoder.add("t", 0, i, 0, 1, None, bytes(600), (), 0.0):
            n += 1
            wire.append(d.data)
            assert fec.add(d.data, 0, 0.0) == []  # nothing fills: 4 blocks of 160 wait
        if n == sources:
            break
    assert n == sources
    repairs = [r for _, r in fec.poll(cfg.block_latency)]
    assert fec.blocks == blocks
    per_block = -(-sources // blocks)
    assert len(repairs) == sum(
        cfg.repairs_for(len(range(b, sources, blocks))) for b in range(blocks)
    )
    # every block may lose as many sources as it has repairs: drop the first m of each block
    # (sources are dealt round-robin: source i is in block i mod blocks)
    m = cfg.repairs_for(sources // blocks)
    lost = {i for i in range(sources) if i // blocks < m}
    link = FecLink()
    for i, d in enumerate(wire):
        if i not in lost:
            link.receive(d)
    for r in repairs:
        link.receive(r)
    assert link.fec.datagrams_reconstructed == len(lost)
    assert link.fec.blocks_recovered == blocks
    assert len({o for _, _, o in link.offsets}) == sources
    assert per_block <= cfg.block_size
