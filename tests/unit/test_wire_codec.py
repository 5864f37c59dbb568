"""Wire protocol v1: round trips, edge cases and hostile input (pure, no sockets)."""

from __future__ import annotations

import gzip
import io
import os

import pytest
from fastavro import schemaless_reader

from common.errors import ConfigError, LocalProtocolError
from common.wire import (
    Decoder,
    DropReason,
    Encoder,
    Heartbeat,
    Key,
    KeyRing,
    Record,
    RecordBatch,
    RecordTooLarge,
    ResendMarker,
    WireConfig,
    fragment_capacity,
)
from common.wire.batch_encode import BatchBuilder, encode_headers
from common.wire.control import HEARTBEAT_SCHEMA, encode_control
from common.wire.envelope import ENVELOPE_SCHEMA, HEADER_SIZE, KIND_HEARTBEAT
from tests.wire_support import (
    KEY,
    SESSION,
    add,
    craft,
    drain,
    drops_of,
    encode_all,
    endpoints,
    feed,
    records_of,
    ring,
)

MiB = 1024 * 1024


def rec(offset: int, value: bytes | None = b"v" * 200, **kw) -> Record:
    fields = {
        "topic": "orders",
        "partition": 0,
        "offset": offset,
        "timestamp": 1_700_000_000_000 + offset,
        "timestamp_type": 1,
        "key": b"k" * 50,
        "value": value,
        "headers": (),
    }
    fields.update(kw)
    return Record(**fields)


def test_many_records_share_datagrams_and_round_trip() -> None:
    enc, dec = endpoints()
    records = [rec(i, partition=i % 3) for i in range(200)]
    out = encode_all(enc, records)
    assert len(out) < 60  # batched, not one per record
    assert all(len(d.data) <= WireConfig().max_datagram_size for d in out)
    got = records_of(feed(dec, out))
    assert sorted(got, key=lambda r: (r.partition, r.offset)) == sorted(
        records, key=lambda r: (r.partition, r.offset)
    )


def test_datagram_is_the_avro_envelope_of_the_schema() -> None:
    enc, _ = endpoints()
    data = encode_all(enc, [rec(7)])[0].data
    buf = io.BytesIO(data)
    env = schemaless_reader(buf, ENVELOPE_SCHEMA, None)
    assert buf.tell() == len(data)
    assert env["magic"] == b"KDIO"
    assert env["session_id"] == SESSION
    assert int.from_bytes(env["key_id"], "big") == KEY.key_id
    assert len(env["payload"]) == len(data) - HEADER_SIZE - 2


@pytest.mark.parametrize("topic", ["a_b", "a.b", "a-b", "x" * 249, "ünïcode"])
def test_topic_names(topic: str) -> None:
    enc, dec = endpoints()
    assert records_of(feed(dec, encode_all(enc, [rec(1, topic=topic)]))) == [rec(1, topic=topic)]


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (None, None, ()),
        (b"", b"", ()),
        (None, b"", (("h", None),)),
        (b"", None, (("h", b""), ("h", None), ("h", b"dup"))),
        (b"\x00" * 3, b"\xff" * 5, (("", b""),)),
    ],
)
def test_null_and_empty_fields_are_preserved(key, value, headers) -> None:
    enc, dec = endpoints()
    record = rec(3, key=key, value=value, headers=headers)
    assert records_of(feed(dec, encode_all(enc, [record]))) == [record]


def test_extreme_numbers() -> None:
    enc, dec = endpoints()
    records = [
        rec(0, timestamp=-1, timestamp_type=0),
        rec((1 << 63) - 1, timestamp=(1 << 62), timestamp_type=2),
        rec(5, partition=0x7FFFFFFF),
    ]
    assert sorted(
        records_of(feed(dec, encode_all(enc, records))), key=lambda r: r.offset
    ) == sorted(records, key=lambda r: r.offset)


@pytest.mark.parametrize(
    "stamps",
    [
        (-1, (1 << 63) - 1),
        ((1 << 63) - 1, -1, (1 << 63) - 1),
        (-(1 << 62), (1 << 62) + 5, -1),
    ],
)
@pytest.mark.parametrize("gzip_level", [None, 1])
def test_timestamps_whose_delta_is_no_long_open_a_new_batch(
    stamps: tuple[int, ...], gzip_level: int | None
) -> None:
    """Timestamps -1 and 2^63-1 in one group would need a delta beyond 64 bits: the encoder starts
    the next batch instead of sending a datagram no decoder accepts (both used to be lost)."""
    config = WireConfig() if gzip_level is None else WireConfig(compression="gzip")
    enc, dec = endpoints(config)
    records = [rec(i, timestamp=t, timestamp_type=1) for i, t in enumerate(stamps)]
    got = records_of(feed(dec, encode_all(enc, records)))
    assert sorted(got, key=lambda r: r.offset) == records
    assert not dec.drops


def _value_for_exact_size(target: int) -> int:
    """Value length whose single-record batch encodes to exactly ``target`` bytes."""
    for n in range(target - 200, target):
        b = BatchBuilder()
        r = rec(1, value=b"x" * n)
        blob = encode_headers(r.headers)
        b.try_add(r.topic, 0, 1, 1, r.timestamp, r.key, r.value, blob, 0)
        if b.size == target:
            return n
    raise AssertionError("no exact size")


@pytest.mark.parametrize("multiple", [1, 2, 3])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_message_of_exact_multiple_of_fragment_capacity(multiple: int, delta: int) -> None:
    config = WireConfig()
    cap = fragment_capacity(config.max_datagram_size)
    n = _value_for_exact_size(cap * multiple + delta)
    enc, dec = endpoints(config)
    record = rec(1, value=b"x" * n)
    out = encode_all(enc, [record])
    expected = multiple + (1 if delta > 0 else 0)
    assert len(out) == expected
    assert all(len(d.data) <= config.max_datagram_size for d in out)
    assert [d.completes for d in out][-1] == (("orders", 0, 1),)
    assert all(d.completes == () for d in out[:-1])
    assert records_of(feed(dec, out)) == [record]
    assert dec.reassemblies_in_flight == 0


def test_16_mib_record_round_trips_in_order_and_reversed() -> None:
    enc, dec = endpoints()
    record = rec(9, value=os.urandom(16 * MiB - 100))
    out = encode_all(enc, [record])
    assert len(out) > 10_000
    assert records_of(feed(dec, out)) == [record]
    # reversed arrival needs a replay window deeper than the fragment count
    config = WireConfig(replay_window=1 << 15)
    enc, dec = endpoints(config)
    assert records_of(feed(dec, reversed(encode_all(enc, [record])))) == [record]


def test_record_over_max_record_size_is_refused_and_nothing_added() -> None:
    config = WireConfig(max_record_size=1000, max_message_size=8192, max_decompressed_size=8192)
    enc, _ = endpoints(config)
    with pytest.raises(RecordTooLarge):
        add(enc, rec(1, value=b"x" * 1001))
    assert enc.pending_records == 0


def test_linger_poll_and_deadline() -> None:
    enc, _ = endpoints(WireConfig(linger=0.5))
    assert enc.next_deadline() is None
    assert add(enc, rec(1), now=10.0) == []
    assert enc.next_deadline() == 10.5
    assert enc.poll(10.4) == []
    out = enc.poll(10.5)
    assert len(out) == 1
    assert out[0].completes == (("orders", 0, 1),)
    assert enc.pending_records == 0
    assert enc.next_deadline() is None


def test_completes_lists_the_highest_offset_per_partition() -> None:
    enc, _ = endpoints()
    for r in [rec(5), rec(3), rec(9, partition=1), rec(4, topic="x")]:
        add(enc, r)
    (d,) = enc.flush()
    assert set(d.completes) == {("orders", 0, 5), ("orders", 1, 9), ("x", 0, 4)}


def test_control_messages_round_trip_after_pending_records() -> None:
    enc, dec = endpoints()
    add(enc, rec(1))
    out = enc.heartbeat(
        sender_id="high-1",
        started_at_ms=1,
        sent_at_ms=2,
        high_offsets=[("orders", 0, 1), ("a.b", 7, 1 << 40)],
        low_offsets=[("a.b", 7, 0), ("orders", 0, 1)],
        counters=[("records_sent", 1)],
    )
    out += enc.resend_marker(
        bundle_id="b-1", phase="end", ranges=[("orders", 0, 0, 1)], records_sent=2, sent_at_ms=3
    )
    events = feed(dec, out)
    assert [type(e) for e in events] == [RecordBatch, Heartbeat, ResendMarker]
    hb = events[1]
    assert hb.high_offsets == (("orders", 0, 1), ("a.b", 7, 1 << 40))
    assert hb.low_offsets == (("a.b", 7, 0), ("orders", 0, 1))
    assert hb.counters == (("records_sent", 1),)
    assert hb.session_id == SESSION
    assert events[2].phase == "end"
    assert events[2].ranges == (("orders", 0, 0, 1),)
    with pytest.raises(LocalProtocolError):
        enc.resend_marker(bundle_id="b", phase="middle", ranges=[], records_sent=0, sent_at_ms=0)


def test_a_heartbeat_larger_than_a_datagram_is_fragmented() -> None:
    enc, dec = endpoints()
    highs = [(f"topic-{i}", p, 10**12) for i in range(50) for p in range(20)]
    lows = [(t, p, o - p) for t, p, o in highs]
    out = enc.heartbeat(
        sender_id="s",
        started_at_ms=0,
        sent_at_ms=0,
        high_offsets=highs,
        low_offsets=lows,
        counters=[],
    )
    assert len(out) > 1
    (hb,) = feed(dec, out)
    assert hb.high_offsets == tuple(highs)
    assert hb.low_offsets == tuple(lows)


BAD_HEARTBEAT_OFFSETS = [
    pytest.param([("t", 0, 5)], [], id="low-missing"),
    pytest.param([("t", 0, 5)], [("t", 0, 1), ("t", 1, 1)], id="low-extra-partition"),
    pytest.param([("t", 0, 5)], [("t", 0, 6)], id="low-above-high"),
    pytest.param([("t", 0, 5), ("t", 0, 6)], [("t", 0, 1)], id="high-twice"),
    pytest.param([("t", 0, 5)], [("t", 0, 1), ("t", 0, 2)], id="low-twice"),
    pytest.param([("t", 0, 5)], [("t", 0, -1)], id="negative-low"),
    pytest.param([("t", -1, 5)], [("t", -1, 1)], id="negative-partition"),
]


@pytest.mark.parametrize(("highs", "lows"), BAD_HEARTBEAT_OFFSETS)
def test_inconsistent_heartbeat_offsets_are_refused_by_both_sides(highs, lows) -> None:
    enc, dec = endpoints()
    with pytest.raises(LocalProtocolError, match="heartbeat"):
        enc.heartbeat(
            sender_id="s",
            started_at_ms=0,
            sent_at_ms=0,
            high_offsets=highs,
            low_offsets=lows,
            counters=[],
        )
    # The same lists written by another (buggy or hostile) sender: dropped as malformed.
    payload = encode_control(
        HEARTBEAT_SCHEMA,
        {
            "sender_id": "s",
            "started_at_ms": 0,
            "sent_at_ms": 0,
            "high_offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in highs],
            "low_offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in lows],
            "counters": [],
        },
    )
    assert _assert_drop_only(dec, craft(payload, kind=KIND_HEARTBEAT)) is DropReason.MALFORMED


def test_a_heartbeat_without_partitions_round_trips() -> None:
    enc, dec = endpoints()
    out = enc.heartbeat(
        sender_id="s", started_at_ms=0, sent_at_ms=0, high_offsets=(), low_offsets=(), counters=()
    )
    (hb,) = feed(dec, out)
    assert hb.high_offsets == ()
    assert hb.low_offsets == ()


@pytest.mark.parametrize("compressible", [True, False])
def test_gzip_round_trip_and_is_skipped_when_it_does_not_shrink(compressible: bool) -> None:
    config = WireConfig(compression="gzip")
    enc, dec = endpoints(config)
    records = [
        rec(i, value=(b"log line %d " % i) * 20)
        if compressible
        else rec(i, key=os.urandom(50), value=os.urandom(200))
        for i in range(300)
    ]
    out = encode_all(enc, records)
    codes = {d.data[6] for d in out}
    assert codes == ({1} if compressible else {0})
    if compressible:
        assert len(out) < 300 / 5  # more records per datagram than without compression
    assert sorted(records_of(feed(dec, out)), key=lambda r: r.offset) == records
    assert all(len(d.data) <= config.max_datagram_size for d in out)


def test_redundant_copies_are_counted_as_duplicates() -> None:
    enc, dec = endpoints()
    out = encode_all(enc, [rec(i) for i in range(20)])
    events = feed(dec, out + out + out[:1])
    assert len(records_of(events)) == 20
    assert dec.drops == {DropReason.DUPLICATE: len(out) + 1}
    assert dec.last_sequence == {SESSION: out[-1].sequence}


def test_replay_below_the_window_is_replayed() -> None:
    config = WireConfig(replay_window=64)
    enc, dec = endpoints(config)
    first = encode_all(enc, [rec(0)])
    later = []
    for i in range(1, 70):
        later += encode_all(enc, [rec(i)])
    feed(dec, first + later)
    (drop,) = feed(dec, first)
    assert drop.reason is DropReason.REPLAYED


def test_reordering_inside_the_window_is_accepted() -> None:
    enc, dec = endpoints()
    out = []
    for i in range(50):
        out += encode_all(enc, [rec(i)])
    assert len(records_of(feed(dec, out[::-1]))) == 50
    assert not dec.drops


def test_forgery_does_not_poison_the_replay_window() -> None:
    enc, dec = endpoints()
    good = encode_all(enc, [rec(0)])[0]
    forged = bytearray(good.data)
    forged[-1] ^= 1
    # same sequence number, bad tag: must not mark the sequence as seen
    (drop,) = feed(dec, [bytes(forged)])
    assert drop.reason is DropReason.AUTH_FAILED
    assert records_of(feed(dec, [good])) == [rec(0)]
    # forged datagram far ahead must not slide the window either
    far = craft(b"\x00", sequence=10**9, key=Key.generate())
    (drop,) = feed(dec, [far])
    assert drop.reason is DropReason.UNKNOWN_KEY
    assert dec.last_sequence == {SESSION: 0}


def test_key_rotation_without_restart() -> None:
    old, new = Key.generate(), Key.generate()
    sender_ring, receiver_ring = KeyRing([old]), KeyRing([old])
    config = WireConfig()
    enc = Encoder(config, sender_ring, session_id=SESSION)
    dec = Decoder(config, receiver_ring)
    assert len(records_of(feed(dec, encode_all(enc, [rec(0)])))) == 1
    sender_ring.add(new, activate=True)
    pending = encode_all(enc, [rec(1)])
    (drop,) = feed(dec, pending)
    assert drop.reason is DropReason.UNKNOWN_KEY
    receiver_ring.replace(KeyRing([old, new]))
    assert records_of(feed(dec, encode_all(enc, [rec(2)]))) == [rec(2)]
    receiver_ring.remove(old.key_id)
    sender_ring.activate(old.key_id)
    (drop,) = feed(dec, encode_all(enc, [rec(3)]))
    assert drop.reason is DropReason.UNKNOWN_KEY


def test_cleartext_is_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="allow_cleartext"):
        Encoder(WireConfig(), None, session_id=SESSION)
    clear = WireConfig(allow_cleartext=True)
    enc = Encoder(clear, None, session_id=SESSION)
    out = encode_all(enc, [rec(1)])
    (drop,) = feed(Decoder(WireConfig(), ring()), out)
    assert drop.reason is DropReason.CLEARTEXT_REFUSED
    assert records_of(feed(Decoder(clear, None), out)) == [rec(1)]


def test_different_sessions_are_independent_and_lru_bounded() -> None:
    config = WireConfig(max_sessions=2)
    dec = Decoder(config, ring())
    sessions = [bytes([i]) * 16 for i in range(3)]
    for s in sessions:
        enc = Encoder(config, ring(), session_id=s)
        assert len(records_of(feed(dec, encode_all(enc, [rec(1)])))) == 1
    assert set(dec.last_sequence) == set(sessions[1:])


# -- hostile input ---------------------------------------------------------------------------


def _valid() -> bytes:
    enc, _ = endpoints()
    return encode_all(enc, [rec(1, value=b"v" * 20, headers=(("h", None),))])[0].data


def _assert_drop_only(dec: Decoder, data: bytes) -> DropReason:
    dec.receive_datagram(data, 0.0)
    events = drain(dec)
    assert len(events) == 1, events
    assert len(drops_of(events)) == 1, events
    return events[0].reason


def test_truncation_at_every_offset_is_a_counted_drop() -> None:
    data = _valid()
    dec = Decoder(WireConfig(), ring())
    for n in range(len(data)):
        _assert_drop_only(dec, data[:n])
    assert sum(dec.drops.values()) == len(data)
    assert len(records_of(feed(dec, [data]))) == 1


def test_every_single_bit_flip_is_a_counted_drop() -> None:
    data = _valid()
    dec = Decoder(WireConfig(), ring())
    reasons = set()
    for i in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[i // 8] ^= 1 << (i % 8)
        reasons.add(_assert_drop_only(dec, bytes(flipped)))
    assert DropReason.AUTH_FAILED in reasons
    assert DropReason.BAD_MAGIC in reasons
    assert DropReason.UNSUPPORTED_VERSION in reasons
    assert len(records_of(feed(dec, [data]))) == 1


def test_trailing_bytes_after_the_envelope() -> None:
    dec = Decoder(WireConfig(), ring())
    assert _assert_drop_only(dec, _valid() + b"\x00") is DropReason.TRAILING_BYTES


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        (0, b"XDIO", DropReason.BAD_MAGIC),
        (4, b"\x02", DropReason.UNSUPPORTED_VERSION),
        (5, b"\x03", DropReason.UNKNOWN_KIND),
        (6, b"\x03", DropReason.UNKNOWN_COMPRESSION),  # code 2 is zstd
        (7, b"\x07", DropReason.UNKNOWN_CIPHER),
        (7, b"\x00", DropReason.CLEARTEXT_REFUSED),
        (32, b"\x00\x00\x00\x01", DropReason.UNKNOWN_KEY),
    ],
)
def test_bad_header_fields(offset: int, value: bytes, reason: DropReason) -> None:
    data = bytearray(_valid())
    data[offset : offset + len(value)] = value
    if reason is DropReason.CLEARTEXT_REFUSED:
        data[32:36] = b"\x00" * 4
    assert _assert_drop_only(Decoder(WireConfig(), ring()), bytes(data)) is reason


def test_random_bytes_and_empty_datagrams() -> None:
    dec = Decoder(WireConfig(), ring())
    for n in [0, 1, 3, 4, 44, 45, 100, 1452, 9000]:
        _assert_drop_only(dec, os.urandom(n))
    assert _assert_drop_only(dec, b"KDIO") is DropReason.MALFORMED


def test_gzip_bomb_is_bounded() -> None:
    config = WireConfig(max_record_size=1000, max_message_size=8192, max_decompressed_size=8192)
    dec = Decoder(config, ring())
    bomb = gzip.compress(b"\x00" * (64 * MiB), compresslevel=9)
    assert len(bomb) < 70_000
    datagrams = []
    cap = fragment_capacity(config.max_datagram_size)
    small = gzip.compress(b"\x00" * MiB, compresslevel=9)
    assert len(small) < cap
    datagrams.append(craft(small, compression=1, sequence=0))
    (drop,) = feed(dec, datagrams)
    assert drop.reason is DropReason.TOO_LARGE
    # garbage and concatenated members
    (drop,) = feed(dec, [craft(b"\x1f\x8bnot gzip", compression=1, sequence=1)])
    assert drop.reason is DropReason.MALFORMED
    two = gzip.compress(b"\x00") + gzip.compress(b"\x00")
    (drop,) = feed(dec, [craft(two, compression=1, sequence=2)])
    assert drop.reason is DropReason.TRAILING_BYTES


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"count": 0}, DropReason.MALFORMED),
        ({"index": 2, "count": 2, "sequence": 5}, DropReason.MALFORMED),
        ({"index": 3, "count": 2, "sequence": 5}, DropReason.MALFORMED),
        ({"index": 1, "count": 2, "sequence": 0}, DropReason.MALFORMED),  # before sequence 0
        ({"count": 65535, "total": 10}, DropReason.TOO_MANY_FRAGMENTS),
        ({"count": 2, "total": 1 << 31}, DropReason.TOO_LARGE),
        ({"count": 1, "total": 3}, DropReason.FRAGMENT_MISMATCH),  # single: length must match
        ({"count": 2, "total": 3}, DropReason.FRAGMENT_MISMATCH),  # chunk longer than message
    ],
)
def test_lying_fragment_fields(fields: dict, reason: DropReason) -> None:
    config = WireConfig(
        max_fragments=1000,
        max_record_size=1000,
        max_message_size=100_000,
        max_decompressed_size=100_000,
    )
    dec = Decoder(config, ring())
    assert _assert_drop_only(dec, craft(b"x" * 10, **fields)) is reason


def test_fragments_that_disagree_or_overrun() -> None:
    dec = Decoder(WireConfig(), ring())
    assert feed(dec, [craft(b"a" * 10, sequence=0, index=0, count=3, total=25)]) == []
    (drop,) = feed(dec, [craft(b"b" * 10, sequence=1, index=1, count=4, total=25)])
    assert drop.reason is DropReason.FRAGMENT_MISMATCH
    (drop,) = feed(dec, [craft(b"b" * 10, sequence=2, index=2, count=3, total=25, kind=1)])
    assert drop.reason is DropReason.FRAGMENT_MISMATCH
    assert dec.reassemblies_in_flight == 1
    assert feed(dec, [craft(b"a" * 10, sequence=10, index=0, count=3, total=25)]) == []
    assert feed(dec, [craft(b"b" * 10, sequence=11, index=1, count=3, total=25)]) == []
    (drop,) = feed(dec, [craft(b"c" * 10, sequence=12, index=2, count=3, total=25)])
    assert drop.reason is DropReason.FRAGMENT_MISMATCH  # 30 bytes for a 25-byte message
    assert dec.reassemblies_in_flight == 1
    # all fragments present but shorter than declared
    feed(dec, [craft(b"a", sequence=20, index=0, count=2, total=5)])
    (drop,) = feed(dec, [craft(b"a", sequence=21, index=1, count=2, total=5)])
    assert drop.reason is DropReason.FRAGMENT_MISMATCH


def test_reassembly_timeout_and_overflow() -> None:
    config = WireConfig(max_reassemblies=2, reassembly_timeout=5.0)
    dec = Decoder(config, ring())
    for i in range(3):
        dec.receive_datagram(craft(b"a", sequence=10 * i, count=2, total=2), now=float(i))
    (drop,) = drain(dec)
    assert drop.reason is DropReason.REASSEMBLY_OVERFLOW
    assert dec.reassemblies_in_flight == 2
    assert dec.next_deadline() == 6.0
    dec.handle_timer(5.9)
    assert drain(dec) == []
    dec.handle_timer(7.0)
    assert [d.reason for d in drain(dec)] == [DropReason.REASSEMBLY_TIMEOUT] * 2
    assert dec.next_deadline() is None
    assert dec.drops[DropReason.REASSEMBLY_TIMEOUT] == 2


def test_reassembly_byte_budget_evicts_oldest() -> None:
    config = WireConfig(
        max_record_size=1000,
        max_message_size=8192,
        max_decompressed_size=8192,
        max_reassembly_bytes=10000,
    )
    dec = Decoder(config, ring())
    dec.receive_datagram(craft(b"a", sequence=0, count=2, total=6000), 0.0)
    dec.receive_datagram(craft(b"a", sequence=10, count=2, total=6000), 0.0)
    (drop,) = drain(dec)
    assert drop.reason is DropReason.REASSEMBLY_OVERFLOW
    assert dec.reassemblies_in_flight == 1


def test_malformed_payloads_after_authentication() -> None:
    dec = Decoder(WireConfig(), ring())
    cases = [b"\x02", b"\x02\x02", b"\x01", b"\x00\x00", b"\x80" * 11, b"\x7f"]
    for i, payload in enumerate(cases):
        reason = _assert_drop_only(dec, craft(payload, sequence=i))
        assert reason in {DropReason.MALFORMED, DropReason.TRAILING_BYTES}
    reason = _assert_drop_only(dec, craft(b"\x02\x00", sequence=99, kind=KIND_HEARTBEAT))
    assert reason is DropReason.MALFORMED
