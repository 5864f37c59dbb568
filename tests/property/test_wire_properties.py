"""Hypothesis properties of wire protocol v1: round trip under any impairment, fuzzing."""

from __future__ import annotations

import io
from collections import Counter, defaultdict

import fastavro
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire import (
    Decoder,
    Dropped,
    DropReason,
    Encoder,
    Heartbeat,
    Record,
    RecordBatch,
    WireConfig,
)
from common.wire.batch_encode import encode_headers
from common.wire.envelope import HEADER
from tests.wire_support import SESSION, add, drain, feed, records_of, ring

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

topics = st.sampled_from(["t", "a_b", "a.b", "a-b", "ü"])
blobs = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.binary(min_size=300, max_size=3000),
)
#: Avro's ``Header`` record (common/schema/record_batch.avsc; a name does not change encodings).
HEADER_SCHEMA = {
    "type": "record",
    "name": "Header",
    "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": ["null", "bytes"]}],
}
headers = st.lists(
    st.tuples(st.sampled_from(["h", "x-id", ""]), st.one_of(st.none(), st.binary(max_size=8))),
    max_size=3,
).map(tuple)


@st.composite
def record_lists(draw, max_size: int = 40) -> list[Record]:
    n = draw(st.integers(1, max_size))
    out = []
    offsets: dict[tuple[str, int], int] = defaultdict(int)
    for _ in range(n):
        topic = draw(topics)
        partition = draw(st.integers(0, 3))
        offsets[topic, partition] += draw(st.integers(1, 1000))
        out.append(
            Record(
                topic,
                partition,
                offsets[topic, partition],
                draw(st.integers(-(2**40), 2**45)),
                draw(st.integers(0, 2)),
                draw(blobs),
                draw(blobs),
                draw(headers),
            )
        )
    return out


configs = st.builds(
    lambda size, comp: WireConfig(
        max_datagram_size=size,
        compression=comp,
        max_record_size=20_000,
        max_message_size=200_000,
        max_decompressed_size=200_000,
    ),
    st.integers(256, 4000),
    st.sampled_from(["none", "gzip"]),
)


def encode(config: WireConfig, records: list[Record], flush_every: int) -> list:
    enc = Encoder(config, ring(), session_id=SESSION)
    out = []
    for i, r in enumerate(records):
        out += add(enc, r, now=float(i))
        if flush_every and i % flush_every == 0:
            out += enc.flush()
    return out + enc.flush()


def key_of(r: Record):
    return (r.topic, r.partition, r.offset)


@SETTINGS
@given(config=configs, records=record_lists(), flush_every=st.integers(0, 7), data=st.data())
def test_round_trip_under_reordering_and_duplication(config, records, flush_every, data) -> None:
    out = encode(config, records, flush_every)
    assert all(len(d.data) <= config.max_datagram_size for d in out)
    datagrams = [d.data for d in out]
    copies = data.draw(st.lists(st.sampled_from(datagrams), max_size=10)) if datagrams else []
    arrival = data.draw(st.permutations(datagrams + copies))
    dec = Decoder(config, ring())
    got = records_of(feed(dec, arrival))
    assert Counter(map(key_of, got)) == Counter(map(key_of, records))
    assert sorted(got, key=key_of) == sorted(records, key=key_of)
    assert set(dec.drops) <= {DropReason.DUPLICATE}
    assert dec.drops.get(DropReason.DUPLICATE, 0) == len(copies)
    assert dec.reassemblies_in_flight == 0


def _message_id(datagram: bytes) -> int:
    fields = HEADER.unpack_from(datagram)
    return fields[6] - fields[8]  # sequence - fragment_index


@SETTINGS
@given(config=configs, records=record_lists(), flush_every=st.integers(0, 7), data=st.data())
def test_with_loss_exactly_the_records_of_lost_datagrams_are_missing(
    config, records, flush_every, data
) -> None:
    datagrams = [d.data for d in encode(config, records, flush_every)]
    lost = data.draw(st.sets(st.integers(0, len(datagrams) - 1)))
    # reference: the records each message carries, decoded on its own
    by_message: dict[int, list[bytes]] = defaultdict(list)
    for d in datagrams:
        by_message[_message_id(d)].append(d)
    expected = []
    for members in by_message.values():
        if not any(datagrams.index(m) in lost for m in members):
            expected += records_of(feed(Decoder(config, ring()), members))
    survivors = [d for i, d in enumerate(datagrams) if i not in lost]
    dec = Decoder(config, ring())
    got = records_of(feed(dec, data.draw(st.permutations(survivors))))
    assert sorted(got, key=key_of) == sorted(expected, key=key_of)
    # partial messages never deliver anything and time out as counted drops
    dec.handle_timer(1e9)
    assert all(e.reason is DropReason.REASSEMBLY_TIMEOUT for e in drain(dec))
    assert dec.reassemblies_in_flight == 0
    assert set(dec.drops) <= {DropReason.REASSEMBLY_TIMEOUT}


def _only_drops(dec: Decoder, datagram: bytes) -> None:
    before = sum(dec.drops.values())
    dec.receive_datagram(datagram, 0.0)
    events = drain(dec)
    assert all(isinstance(e, Dropped) for e in events), events
    assert sum(dec.drops.values()) - before == len(events) >= 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_fuzz_any_bytes_give_only_drops(blob: bytes) -> None:
    _only_drops(Decoder(WireConfig(), ring()), blob)
    _only_drops(Decoder(WireConfig(allow_cleartext=True), ring()), b"KDIO\x01" + blob)


CLEAR = WireConfig(allow_cleartext=True, compression="gzip", max_datagram_size=2000)


@st.composite
def mutated_cleartext(draw) -> bytes:
    records = draw(record_lists(max_size=8))
    enc = Encoder(CLEAR, None, session_id=SESSION)
    out = []
    for r in records:
        out += add(enc, r)
    out += enc.flush()
    out += enc.heartbeat(
        sender_id="s",
        started_at_ms=1,
        sent_at_ms=2,
        high_offsets=[("t", 1, 2)],
        low_offsets=[("t", 1, 0)],
        counters=[],
    )
    data = bytearray(draw(st.sampled_from(out)).data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(mutated_cleartext())
def test_fuzz_mutated_cleartext_reaches_payload_decoders_and_never_escapes(blob: bytes) -> None:
    # cleartext lets mutations through authentication, so the Avro and gzip decoders see them
    dec = Decoder(CLEAR, None)
    dec.receive_datagram(blob, 0.0)
    events = drain(dec)
    assert len(events) <= 1  # none when it became a fragment waiting for the rest
    assert all(isinstance(e, Dropped | RecordBatch | Heartbeat) for e in events)
    dec.handle_timer(1e9)
    assert all(isinstance(e, Dropped) for e in drain(dec))


@st.composite
def heartbeat_offsets(draw) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    partitions = draw(st.sets(st.tuples(topics, st.integers(0, 2**31 - 1)), max_size=60))
    highs, lows = [], []
    for topic, partition in partitions:
        high = draw(st.integers(0, 2**63 - 1))
        highs.append((topic, partition, high))
        lows.append((topic, partition, draw(st.integers(0, high))))
    return highs, draw(st.permutations(lows))


@SETTINGS
@given(heartbeat_offsets(), configs, st.randoms(use_true_random=False))
def test_heartbeat_low_and_high_offsets_round_trip_in_any_order(offsets, config, rnd) -> None:
    highs, lows = offsets
    enc = Encoder(config, ring(), session_id=SESSION)
    out = [
        d.data
        for d in enc.heartbeat(
            sender_id="s",
            started_at_ms=1,
            sent_at_ms=2,
            high_offsets=highs,
            low_offsets=lows,
            counters=[],
        )
    ]
    rnd.shuffle(out)
    dec = Decoder(config, ring())
    for data in out:
        dec.receive_datagram(data, 0.0)
    (hb,) = drain(dec)
    assert isinstance(hb, Heartbeat)
    assert hb.high_offsets == tuple(highs)
    assert hb.low_offsets == tuple(lows)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=70),
            st.none() | st.binary(max_size=70) | st.binary(min_size=4090, max_size=17_000),
        ),
        max_size=70,
    )
)
def test_encoded_headers_are_what_avro_writes(items: list[tuple[str, bytes | None]]) -> None:
    """``encode_headers`` (names kept encoded between calls, value prefixes from a table) writes
    exactly fastavro's ``array<Header>``, for any names, null, short and long values, and more
    than 64 headers."""
    out = io.BytesIO()
    fastavro.schemaless_writer(
        out, {"type": "array", "items": HEADER_SCHEMA}, [{"key": k, "value": v} for k, v in items]
    )
    assert encode_headers(items) == out.getvalue()
    assert encode_headers(tuple(items)) == out.getvalue()  # again: the names from the memo
