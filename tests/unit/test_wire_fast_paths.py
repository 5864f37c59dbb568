"""The codec's fast paths give exactly what the general paths (and fastavro) give.

Each speed-up in ``common.wire`` (docs/benchmarks.md "Codec") has a twin here that compares it
with a slower reference: the table varints with the byte loop, the unrolled varint reader with
the reference reader, the column-wide key/value reads with fastavro on the same bytes (valid or
mutated), the replay ring with a set of seen sequence numbers, and the encoder's in-place batch
roll-over with the Avro schema, datagram by datagram.
"""

from __future__ import annotations

import io
import random

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import given
from hypothesis import strategies as st

from common.errors import RemoteProtocolError
from common.wire import (
    Decoder,
    DropReason,
    Encoder,
    Key,
    KeyRing,
    Record,
    RecordTooLarge,
    WireConfig,
    batch_encode,
)
from common.wire import batch_decode as batch_module
from common.wire.batch_decode import decode_record_groups
from common.wire.batch_encode import RECORD_BATCH_SCHEMA, BatchBuilder
from common.wire.crypto import SessionCipher
from common.wire.envelope import (
    CIPHER_AES_256_GCM,
    ENVELOPE_SCHEMA,
    KIND_HEARTBEAT,
    KIND_RECORD_BATCH,
    SMALL_LONGS,
    build_header,
    decode_long,
    encode_long,
    encode_varint,
    frame,
)
from common.wire.events import Headers, records_of
from common.wire.replay import ReplayWindow
from tests.wire_support import SESSION, drain, encode_all, feed
from tests.wire_support import records_of as records_in


def _longs(rnd: random.Random, n: int) -> list[int]:
    edges = [0, -1, 1, 63, 64, -64, -65, 8191, 8192, -(2**63), 2**63 - 1, 2**62, -(2**62)]
    return edges + [rnd.randrange(-(2**63), 2**63) >> rnd.randrange(64) for _ in range(n)]


def test_table_varints_equal_the_byte_loop() -> None:
    for n in _longs(random.Random(1), 20_000):
        assert encode_long(n) == encode_varint((n << 1) ^ (n >> 63)), n
    assert tuple(encode_varint(n << 1) for n in range(1 << 14)) == SMALL_LONGS


def test_unrolled_reader_equals_the_reference_reader() -> None:
    for n in _longs(random.Random(2), 20_000):
        data = encode_long(n) + b"\x07"
        assert batch_module._read_long(data, 0, len(data)) == decode_long(data, 0, len(data))


def test_unrolled_reader_refuses_overlong_and_out_of_range_longs() -> None:
    for data in (b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x02"):
        with pytest.raises(RemoteProtocolError):
            batch_module._read_long(data, 0, len(data))
    with pytest.raises(IndexError):  # decode_record_groups turns this into MALFORMED
        batch_module._read_long(b"\x80\x80", 0, 2)


def _fastavro_records(data: bytes) -> list[Record]:
    buf = io.BytesIO(data)
    datum = schemaless_reader(buf, RECORD_BATCH_SCHEMA, None)
    assert buf.tell() == len(data)
    out = []
    for g in datum["groups"]:
        offset, ts = g["base_offset"], g["base_timestamp"]
        for od, td, k, v, h in zip(
            g["offset_deltas"],
            g["timestamp_deltas"],
            g["keys"],
            g["values"],
            g["headers"],
            strict=True,
        ):
            headers = tuple((x["key"], x["value"]) for x in h)
            out.append(Record(g["topic"], g["partition"], offset + od, ts + td,
                              g["timestamp_type"], k, v, headers))  # fmt: skip
    return out


@pytest.mark.parametrize("length", [0, 1, 50, 63, 64, 200, 8191, 8192])
@pytest.mark.parametrize("count", [1, 5, 63, 64])
def test_same_length_columns_decode_as_fastavro_does(length: int, count: int) -> None:
    builder = BatchBuilder()
    for i in range(count):
        builder.try_add("t", 0, 1, i, i, bytes([i % 251]) * length, b"v" * length, b"\x00", 1 << 24)
    data = builder.encode()
    groups, n = decode_record_groups(data)
    assert n == count
    assert list(records_of(groups)) == _fastavro_records(data)


def test_mutated_batches_decode_as_fastavro_or_are_malformed() -> None:
    """Lying lengths, branches and counts: our column reads never disagree with fastavro."""
    rnd = random.Random(3)
    builder = BatchBuilder()
    for i in range(5):
        builder.try_add("events", 0, 1, 100 + i, 7 + i, b"k" * 50, b"v" * 200, b"\x00", 1 << 20)
    valid = builder.encode()
    agreed = 0
    for _ in range(3000):
        data = bytearray(valid)
        for _ in range(rnd.randint(1, 3)):
            data[rnd.randrange(len(data))] = rnd.choice(
                [0, 2, 4, 100, 0x80, 0x90, 0xFF, rnd.randrange(256)]
            )
        data = bytes(data)
        try:
            reference = _fastavro_records(data)
        except Exception:  # any fastavro failure: ours must then be MALFORMED
            reference = None
        try:
            ours = list(records_of(decode_record_groups(data)[0]))
        except RemoteProtocolError:
            continue
        # ours accepted it: fastavro must read the same records (our checks are stricter)
        assert ours == reference, data.hex()
        agreed += 1
    assert agreed  # some mutations (inside values) stay valid and must agree


_HEADER_NAMES = st.sampled_from(["trace-id", "content-type", "", "ü", "n" * 70])
_HEADER_VALUES = (
    st.none() | st.sampled_from([b"", b"x", b"t" * 16, b"y" * 70]) | st.binary(max_size=20)
)


@given(
    st.lists(
        st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=4).map(tuple),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.integers(0, 2), min_size=1, max_size=40),
    st.integers(0, 2**32),
)
def test_header_fast_paths_decode_as_fastavro_does(layouts, picks, seed) -> None:
    """Repeated header bytes, repeated layouts (same names and value lengths, other values) and
    irregular ones, valid or mutated, each read after the one before (whose last layout the
    next column starts from): the header column reads as fastavro reads it, or MALFORMED; a
    group's ``headers_bytes`` is None or its headers' canonical encoding, and given for every
    valid group of several records with headers."""
    rnd = random.Random(seed)
    builder = BatchBuilder()
    for i, pick in enumerate(picks):
        layout = layouts[pick % len(layouts)]
        headers = tuple(  # the layout's names and value lengths, values varied now and then
            (name, None if value is None else bytes(rnd.choice(b"ab") for _ in value))
            for name, value in layout
        )
        encoded = batch_encode.encode_headers(headers)
        assert builder.try_add("t", 0, 1, i, i, None, b"v", encoded, 1 << 24)
    valid = builder.encode()
    for _ in range(2):  # the second time from the hint the first left
        groups = decode_record_groups(valid)[0]
        assert list(records_of(groups)) == _fastavro_records(valid)
        for group in groups:  # a group of several records with headers has them
            wanted = len(group) > 1 and any(group.headers)
            assert group.headers_bytes in {None, _canonical(group.headers)}
            assert group.headers_bytes is not None or not wanted
    for _ in range(20):
        data = bytearray(valid)
        data[rnd.randrange(len(data))] = rnd.choice([0, 2, 4, 0x20, 0x80, rnd.randrange(256)])
        try:
            reference = _fastavro_records(bytes(data))
        except Exception:  # any fastavro failure: ours must then be MALFORMED
            reference = None
        try:
            groups = decode_record_groups(bytes(data))[0]
        except RemoteProtocolError:
            continue
        assert list(records_of(groups)) == reference, bytes(data).hex()
        for group in groups:
            assert group.headers_bytes in {None, _canonical(group.headers)}, bytes(data).hex()


def _canonical(headers: tuple[Headers, ...]) -> bytes:
    return b"".join(batch_encode.encode_headers(h) for h in headers)


@pytest.mark.parametrize("count", [2, 5, 63, 64, 200])
def test_header_bytes_that_are_not_canonical_are_not_handed_on(count: int) -> None:
    """Headers in valid Avro that is not ``encode_headers``'s (a two-byte length, a
    negative block count with its size, two blocks): read alike, no ``headers_bytes``."""
    headers = (("trace-id", b"t" * 16),)
    canonical = batch_encode.encode_headers(headers)
    body = canonical[1:-1]  # the item
    variants = [
        b"\x02" + b"\x90\x00" + b"trace-id" + body[9:] + b"\x00",  # name length 8 in two bytes
        b"\x01" + bytes([len(body) * 2]) + body + b"\x00",  # a block of -1 with its size
        b"\x02" + body + b"\x02" + body + b"\x00",  # two blocks of one (two headers)
    ]
    for variant in variants:
        builder = BatchBuilder()
        for i in range(count):  # the canonical ones first: the hint then holds their layout
            assert builder.try_add("t", 0, 1, i, i, None, b"v", canonical, 1 << 24)
        assert builder.try_add("t", 0, 1, count, count, None, b"v", variant, 1 << 24)
        data = builder.encode()
        groups = decode_record_groups(data)[0]
        assert list(records_of(groups)) == _fastavro_records(data)
        assert [g.headers_bytes for g in groups] == [None]
    builder = BatchBuilder()
    for i in range(count):
        assert builder.try_add("t", 0, 1, i, i, None, b"v", canonical, 1 << 24)
    assert decode_record_groups(builder.encode())[0][0].headers_bytes == canonical * count
    # the column itself in two blocks: the second block's count would sit between records
    column = batch_encode.long_bytes(count) + canonical * count
    for blocks in (column + b"\x00", column + b"\x02" + canonical + b"\x00"):
        read, end, raw = batch_module._headers(blocks, 0, len(blocks))
        assert read == (headers,) * (len(blocks) // len(canonical))
        assert end == len(blocks)
        one_block = blocks.endswith(canonical * count + b"\x00")
        assert raw == (canonical * count if one_block else None)


def test_header_layout_cache_is_bounded() -> None:
    for n in range(300):
        builder = BatchBuilder()
        for i in range(3):
            encoded = batch_encode.encode_headers((("h", b"x" * n),))
            builder.try_add("t", 0, 1, i, i, None, b"v", encoded, 1 << 24)
        decode_record_groups(builder.encode())
    assert len(batch_module._LAYOUTS) <= batch_module._MAX_LAYOUTS


def test_struct_unpacker_cache_is_bounded() -> None:
    for length in range(300):
        builder = BatchBuilder()
        for i in range(3):
            builder.try_add("t", 0, 1, i, i, None, b"x" * (64 + length), b"\x00", 1 << 20)
        decode_record_groups(builder.encode())
    assert len(batch_module._UNPACKERS) <= batch_module._MAX_UNPACKERS


@pytest.mark.parametrize("size", [64, 100])
@pytest.mark.parametrize("jump", [5, 70, 300])  # forward steps below, near and above the size
def test_replay_ring_equals_a_set_of_seen_sequences(size: int, jump: int) -> None:
    rnd = random.Random(size * jump)
    window = ReplayWindow(size)
    seen: set[int] = set()
    highest = -1
    base = rnd.choice([0, 2**64 - 5000])
    for _ in range(20_000):
        seq = min(
            2**64 - 1,
            max(0, base + highest + rnd.randint(-3 * size, jump) if highest >= 0 else base),
        )
        if highest - seq >= size:
            expected = DropReason.REPLAYED
        elif seq in seen:
            expected = DropReason.DUPLICATE
        else:
            expected = None
        assert window.check(seq) is expected, (seq, highest)
        if expected is None:
            window.update(seq)
            seen.add(seq)
            highest = max(highest, seq)
        base = 0 if highest >= 0 else base


def test_replay_window_at_the_top_of_the_sequence_space() -> None:
    window = ReplayWindow(64)
    window.update(2**64 - 2)
    assert window.check(2**64 - 1) is None
    window.update(2**64 - 1)
    assert window.check(2**64 - 1) is DropReason.DUPLICATE
    assert window.check(2**64 - 3) is None


def _payloads(datagrams: list[bytes], key: Key) -> list[bytes]:
    cipher = SessionCipher(key, SESSION)
    out = []
    for data in datagrams:
        env = schemaless_reader(io.BytesIO(data), ENVELOPE_SCHEMA, None)
        header = data[:44]
        out.append(cipher.open(int.from_bytes(env["sequence"], "big"), env["payload"], header))
    return out


@pytest.mark.parametrize("value_size", [0, 37, 200, 1300])
def test_encoder_roll_over_batches_are_the_schema_bytes(value_size: int) -> None:
    key = Key.generate()
    enc = Encoder(WireConfig(max_datagram_size=1472), KeyRing([key]), session_id=SESSION)
    records = [
        Record("events", p, 10_000 + i, 1_700_000_000_000 + i // 3, 1, b"k" * 50,
               b"v" * value_size, ())
        for p in (0, 1) for i in range(40)
    ]  # fmt: skip
    out = encode_all(enc, records)
    assert len(out) > 2
    assert [d.sequence for d in out] == list(range(len(out)))
    decoded = []
    for payload in _payloads([d.data for d in out], key):
        buf = io.BytesIO()
        schemaless_writer(
            buf,
            RECORD_BATCH_SCHEMA,
            schemaless_reader(io.BytesIO(payload), RECORD_BATCH_SCHEMA, None),
        )
        assert buf.getvalue() == payload  # byte for byte what fastavro writes
        decoded += _fastavro_records(payload)
    assert decoded == records
    for d in out:  # every datagram says which offsets it completes
        assert d.completes


def test_decoder_fast_path_follows_key_replacement_and_reordering() -> None:
    old, new = Key.generate(), Key.generate()
    sender, receiver = KeyRing([old]), KeyRing([old])
    enc = Encoder(WireConfig(), sender, session_id=SESSION)
    dec = Decoder(WireConfig(), receiver)
    first = encode_all(enc, [Record("t", 0, i, i, 1, b"k", b"v", ()) for i in range(3)])
    second = encode_all(enc, [Record("t", 0, i, i, 1, b"k", b"v", ()) for i in range(3, 6)])
    assert len(records_in(feed(dec, second + first))) == 6  # out of order: the general path
    (drop,) = feed(dec, second)
    assert drop.reason is DropReason.DUPLICATE
    receiver.replace(KeyRing([new]))  # the cached cipher's key left the ring
    sender.add(new, activate=True)
    third = encode_all(enc, [Record("t", 0, 9, 9, 1, b"k", b"v", ())])
    stale = Encoder(WireConfig(), KeyRing([old]), session_id=SESSION, first_sequence=100)
    (drop,) = feed(dec, encode_all(stale, [Record("t", 0, 1, 1, 1, None, None, ())]))
    assert drop.reason is DropReason.UNKNOWN_KEY
    assert len(records_in(feed(dec, third))) == 1
    assert not drain(dec)


@pytest.mark.parametrize(
    ("key", "value", "headers", "fits"),
    [
        (b"k" * 50, b"v" * 50, (), True),  # exactly max_record_size; encoded it is more
        (b"k" * 50, b"v" * 51, (), False),
        (None, b"v" * 90, (("h" * 5, b"x" * 5),), True),
        (None, b"v" * 90, (("h" * 5, b"x" * 6),), False),
    ],
)
def test_max_record_size_counts_raw_bytes_at_the_boundary(key, value, headers, fits) -> None:
    enc = Encoder(WireConfig(max_record_size=100), KeyRing([Key.generate()]), session_id=SESSION)
    if fits:
        enc.add("t", 0, 0, 0, 1, key, value, headers, 0.0)
        assert enc.pending_records == 1
    else:
        with pytest.raises(RecordTooLarge):
            enc.add("t", 0, 0, 0, 1, key, value, headers, 0.0)
        assert enc.pending_records == 0


@given(st.binary(min_size=1, max_size=1400), st.integers(0, 2**40))
def test_the_record_datagram_fast_path_is_the_general_framing(payload: bytes, start: int) -> None:
    """``Encoder._record_datagram`` (hot) == ``_message`` (build_header + frame, readable)."""
    key = Key.generate()
    fast = Encoder(WireConfig(max_datagram_size=1472), KeyRing([key]), session_id=SESSION)
    general = Encoder(WireConfig(max_datagram_size=1472), KeyRing([key]), session_id=SESSION)
    for enc in (fast, general):
        enc._message(KIND_RECORD_BATCH, b"prime", ())  # caches the framing (first key use)
        enc._next_sequence = start
    fast._message = None  # type: ignore[method-assign,assignment]  # the fast path must not fall back
    hot = fast._record_datagram(payload, (("t", 0, 7),), 1)
    readable = general._message(KIND_RECORD_BATCH, payload, (("t", 0, 7),))
    assert [(d.data, d.sequence, d.completes) for d in hot] == [
        (d.data, d.sequence, d.completes) for d in readable
    ]


@given(st.integers(1400, 40_000), st.integers(0, 2**32 - 1))
def test_decoder_fragment_fast_path_equals_the_general_path(size: int, seed: int) -> None:
    """Fragments in order (after a session's first datagram: the fast path) and the same
    fragments in reverse order (all on the general path) give the same records; a repeated or
    mangled fragment is dropped by the same reason as before."""
    rng = random.Random(seed)
    key = Key.generate()
    enc = Encoder(WireConfig(), KeyRing([key]), session_id=SESSION)
    records = [Record("t", 0, i, i, 1, b"k", rng.randbytes(size), ()) for i in range(3)]
    datagrams = encode_all(enc, records)
    assert len(datagrams) > 3  # fragmented
    fast, general = Decoder(WireConfig(), KeyRing([key])), Decoder(WireConfig(), KeyRing([key]))
    assert records_in(feed(fast, datagrams)) == records
    backwards = records_in(feed(general, datagrams[::-1]))  # out of order: the general path
    assert sorted(backwards, key=lambda r: r.offset) == records
    (drop,) = feed(fast, datagrams[1:2])
    assert drop.reason is DropReason.DUPLICATE
    enc2 = Encoder(
        WireConfig(), KeyRing([key]), session_id=SESSION, first_sequence=enc.next_sequence
    )
    more = encode_all(enc2, [Record("t", 0, 9, 9, 1, None, rng.randbytes(size), ())])
    bad = bytearray(more[1].data)
    bad[-1] ^= 1
    (drop,) = feed(fast, [bytes(bad)])
    assert drop.reason is DropReason.AUTH_FAILED
    assert len(records_in(feed(fast, more))) == 1
    assert not drain(fast)


@given(
    st.integers(1, 40_000),
    st.integers(0, 2**40),
    st.sampled_from([KIND_RECORD_BATCH, KIND_HEARTBEAT]),
    st.integers(0, 2),
    st.sampled_from([1200, 1452, 8952]),
)
def test_the_fragment_fast_path_is_the_general_framing(
    size: int, start: int, kind: int, compression: int, datagram: int
) -> None:
    """``Encoder._fragments`` (one pass per message) == ``build_header`` + ``SessionCipher.seal``
    + ``frame`` per fragment (the readable framing, docs/protocol.md §3, §6), byte for byte, with
    the same sequences and ``completes`` on the last fragment only."""
    key = Key.generate()
    enc = Encoder(WireConfig(max_datagram_size=datagram), KeyRing([key]), session_id=SESSION)
    cipher = SessionCipher(key, SESSION)
    payload = random.Random(size).randbytes(size)
    completes = (("t", 0, 7),)
    capacity = enc.capacity
    count = max(1, -(-size // capacity))
    out = enc._fragments(kind, compression, key.key_id, cipher, start, count, payload, completes)
    expected = []
    for index in range(count):
        header = build_header(
            kind=kind, compression=compression, cipher=CIPHER_AES_256_GCM, session_id=SESSION,
            sequence=start + index, key_id=key.key_id, fragment_index=index, fragment_count=count,
            message_length=size,
        )  # fmt: skip
        chunk = payload[index * capacity : (index + 1) * capacity]
        expected.append(
            (
                frame(header, cipher.seal(start + index, chunk, header)),
                start + index,
                completes if index == count - 1 else (),
            )
        )
    assert [(d.data, d.sequence, d.completes) for d in out] == expected


_maybe_bytes = st.one_of(
    st.none(), st.binary(max_size=64), st.integers(4000, 20_000).map(lambda n: b"x" * n)
)


@given(
    st.sampled_from(["t", "events.a", "é" * 100]),
    st.booleans(),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2),
    st.integers(0, 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    _maybe_bytes,
    _maybe_bytes,
    st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=3),
)
def test_the_single_record_batch_is_the_builders(
    topic: str,
    renamed: bool,
    partition: int,
    ts_type: int,
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
) -> None:
    """``single_record_batch`` (the encoder's path for a record that fills a datagram alone) ==
    ``BatchBuilder`` with that one record, byte for byte, and what fastavro writes."""
    topic_map = {topic: "far." + topic} if renamed else {}
    builder = BatchBuilder(topic_map)
    blob = batch_encode.encode_headers(headers)
    assert builder.try_add(topic, partition, ts_type, offset, timestamp, key, value, blob, 0)
    kprefix = batch_encode.NULL_ITEM[0] if key is None else batch_encode.bytes_item(len(key))[0]
    vprefix = batch_encode.NULL_ITEM[0] if value is None else batch_encode.bytes_item(len(value))[0]
    single = batch_encode.single_record_batch(
        topic_map.get(topic, topic), partition, ts_type, offset, timestamp, kprefix, key,
        vprefix, value, blob,
    )  # fmt: skip
    assert single == builder.encode()
    assert len(single) == builder.size
    [record] = _fastavro_records(single)
    assert (record.offset, record.timestamp, record.key, record.value) == (
        offset, timestamp, key, value,
    )  # fmt: skip


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([0, 300, 1300, 1400, 1500, 3000, 25_000])),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([1200, 1472]),
)
def test_records_that_fill_a_datagram_alone_go_out_alone(
    stream: list[tuple[int, int]], datagram: int
) -> None:
    """Mixed small and large records: a record whose encoded key, value and headers fill a
    datagram's capacity is sealed in a batch of its own (after what was pending), every record
    arrives once, and ``completes`` reaches each partition's last offset."""
    key = Key.generate()
    wire = WireConfig(max_datagram_size=datagram, max_record_size=30_000)
    enc = Encoder(wire, KeyRing([key]), session_id=SESSION)
    records = [
        Record("t", p, 100 + i, 1_700_000_000_000 + i, 0, b"k", b"v" * size, ())
        for i, (p, size) in enumerate(stream)
    ]
    out = encode_all(enc, records)
    assert [d.sequence for d in out] == list(range(len(out)))
    assert enc.records_sealed == len(records)
    batches = feed(Decoder(wire, KeyRing([key])), out)
    received = [r for b in batches for r in b.records]  # a batch groups them by partition
    assert sorted(received, key=lambda r: r.offset) == records
    for batch in batches:
        big = [r for r in batch.records if 3 + len(r.value) >= enc.capacity]
        assert not big or len(batch.records) == 1
    highs: dict[int, int] = {}
    for d in out:
        for _, partition, offset in d.completes:
            highs[partition] = max(highs.get(partition, -1), offset)
    assert highs == {r.partition: r.offset for r in records}  # offsets grow: the last wins
