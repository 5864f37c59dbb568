"""Decodable but impossible values are dropped as ``out_of_range``, before any Kafka client sees
them; resend markers with impossible counts likewise; gzip inflating work is bounded.

The fuzz part drives crafted batches with extreme values through the decoder and into the
receiver's sink over a producer that validates every argument with the real confluent-kafka
``produce()`` (it only queues locally): whatever the decoder lets through, the client accepts, so
nothing can surface as an ``internal_error`` or take the rest of a batch with it.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import RemoteProtocolError
from common.wire import Decoder, Dropped, DropReason, RecordBatch, WireConfig
from common.wire import compression as gzip_codec
from common.wire.batch_encode import RECORD_BATCH_SCHEMA
from common.wire.control import RESEND_MARKER_SCHEMA, encode_control
from common.wire.envelope import KIND_RECORD_BATCH, KIND_RESEND_MARKER
from receiver.config import ReceiverConfig
from receiver.kafka_sink import RawTopicSink
from receiver.metrics import ReceiverStats
from tests.unit.test_receiver_sink import ValidatingProducer
from tests.wire_support import craft, drain, ring

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _group(
    *,
    topic: str = "t",
    partition: int = 0,
    ts_type: int = 1,
    base_offset: int = 10,
    base_ts: int = 1_700_000_000_000,
    offset_deltas: list[int] | None = None,
    ts_deltas: list[int] | None = None,
) -> dict[str, Any]:
    offset_deltas = [0, 1, 2] if offset_deltas is None else offset_deltas
    ts_deltas = [0, 1, 2] if ts_deltas is None else ts_deltas
    n = len(offset_deltas)
    return {
        "topic": topic,
        "partition": partition,
        "timestamp_type": ts_type,
        "base_offset": base_offset,
        "base_timestamp": base_ts,
        "offset_deltas": offset_deltas,
        "timestamp_deltas": ts_deltas,
        "keys": [b"k"] * n,
        "values": [b"v" * 10] * n,
        "headers": [[]] * n,
    }


def _batch(*groups: dict[str, Any]) -> bytes:
    return encode_control(RECORD_BATCH_SCHEMA, {"groups": list(groups)})


def _decode(payload: bytes, kind: int = KIND_RECORD_BATCH, config: WireConfig | None = None):
    dec = Decoder(config or WireConfig(), ring())
    dec.receive_datagram(craft(payload, kind=kind), 0.0)
    return dec, drain(dec)


OUT_OF_RANGE_GROUPS = [
    pytest.param({"base_ts": INT64_MAX, "ts_deltas": [0, 1, 2]}, id="ts-consecutive-over"),
    pytest.param({"base_ts": INT64_MAX - 5, "ts_deltas": [0, 3, 9]}, id="ts-small-deltas-over"),
    pytest.param({"base_ts": 1, "ts_deltas": [0, INT64_MAX, 0]}, id="ts-big-delta-over"),
    pytest.param({"base_ts": INT64_MIN, "ts_deltas": [0, -1, 0]}, id="ts-under"),
    pytest.param({"base_ts": -5, "ts_deltas": [0, INT64_MIN, 0]}, id="ts-big-delta-under"),
    pytest.param({"base_offset": -1}, id="negative-offset"),
    pytest.param({"base_offset": INT64_MAX, "offset_deltas": [0, 1, 2]}, id="offset-over"),
    pytest.param({"base_offset": 5, "offset_deltas": [0, -9, 1]}, id="offset-delta-under"),
    pytest.param({"partition": -1}, id="negative-partition"),
    pytest.param({"ts_type": 3}, id="timestamp-type"),
    pytest.param({"topic": ""}, id="empty-topic"),
    pytest.param({"topic": "a\x00b"}, id="nul-in-topic"),
    pytest.param({"topic": "t" * 250}, id="topic-too-long"),
]


@pytest.mark.parametrize("fields", OUT_OF_RANGE_GROUPS)
def test_out_of_range_values_are_dropped_as_out_of_range(fields: dict[str, Any]) -> None:
    # one good group first: the whole message goes (a datagram is authenticated as a whole)
    dec, events = _decode(_batch(_group(), _group(**fields)))
    assert [type(e) for e in events] == [Dropped]
    assert events[0].reason is DropReason.OUT_OF_RANGE
    assert dec.drops == {DropReason.OUT_OF_RANGE: 1}


@pytest.mark.parametrize(
    "fields",
    [
        {"base_ts": INT64_MAX - 2, "ts_deltas": [0, 1, 2]},
        {"base_ts": INT64_MIN, "ts_deltas": [0, 1, 2]},
        {"base_ts": 0, "ts_deltas": [INT64_MAX, INT64_MIN, -1]},
        {"base_offset": INT64_MAX - 2},
        {"partition": 2**31 - 1, "ts_type": 2},
        {"topic": "t" * 249},
        {"topic": "ü:odd but carried"},
    ],
)
def test_values_at_the_edges_still_decode(fields: dict[str, Any]) -> None:
    _, events = _decode(_batch(_group(**fields)))
    assert [type(e) for e in events] == [RecordBatch]


def _marker(ranges: list[tuple[str, int, int, int]], sent: int, at: int = 1) -> bytes:
    return encode_control(
        RESEND_MARKER_SCHEMA,
        {
            "bundle_id": "b",
            "phase": "end",
            "ranges": [
                {"topic": t, "partition": p, "first": a, "last": b} for t, p, a, b in ranges
            ],
            "records_sent": sent,
            "sent_at_ms": at,
        },
    )


@pytest.mark.parametrize(
    ("ranges", "sent", "at"),
    [
        pytest.param([("t", 0, 0, 9)], -1, 1, id="negative-count"),
        pytest.param([("t", 0, 0, 9)], 11, 1, id="more-than-the-ranges-hold"),
        pytest.param([("t", 0, 0, 9)], INT64_MAX, 1, id="absurd-count"),
        pytest.param([("t", 0, 9, 0)], 0, 1, id="inverted-range"),
        pytest.param([("t", 0, -5, 0)], 0, 1, id="negative-first"),
        pytest.param([("t", -1, 0, 5)], 0, 1, id="negative-partition"),
        pytest.param([("t", 0, 0, 9)], 3, -1, id="negative-time"),
        pytest.param([], -7, 1, id="negative-count-no-ranges"),
    ],
)
def test_impossible_resend_markers_are_dropped(ranges, sent: int, at: int) -> None:
    _, events = _decode(_marker(ranges, sent, at), KIND_RESEND_MARKER)
    assert [e.reason for e in events] == [DropReason.OUT_OF_RANGE]


def test_plausible_resend_markers_pass() -> None:
    for ranges, sent in (([("t", 0, 0, 9), ("t", 1, 5, 5)], 11), ([], 0), ([], 10**9)):
        _, events = _decode(_marker(ranges, sent), KIND_RESEND_MARKER)
        assert [type(e).__name__ for e in events] == ["ResendMarker"]


# -- gzip work -------------------------------------------------------------------------------


_DECOMPRESSOBJ = zlib.decompressobj


class _Spy:
    """Records the ``max_length`` each inflate call was allowed (the bound on its work)."""

    def __init__(self) -> None:
        self.max_lengths: list[int] = []

    def __call__(self, wbits: int) -> Any:
        real = _DECOMPRESSOBJ(wbits)
        spy = self

        class Wrapped:
            def decompress(self, data: bytes, max_length: int = 0) -> bytes:
                spy.max_lengths.append(max_length)
                return real.decompress(data, max_length)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        return Wrapped()


def _with_isize(member: bytes, isize: int) -> bytes:
    return member[:-4] + (isize % 2**32).to_bytes(4, "little")


def test_a_declared_size_over_the_limit_is_refused_before_inflating(monkeypatch) -> None:
    spy = _Spy()
    monkeypatch.setattr(gzip_codec.zlib, "decompressobj", spy)
    bomb = gzip.compress(bytes(8 << 20), 9)
    with pytest.raises(RemoteProtocolError) as info:
        gzip_codec.decompress(bomb, 1 << 20)
    assert info.value.reason is DropReason.TOO_LARGE
    assert spy.max_lengths == []


def test_a_lying_trailer_costs_no_more_than_a_true_one(monkeypatch) -> None:
    spy = _Spy()
    monkeypatch.setattr(gzip_codec.zlib, "decompressobj", spy)
    liar = _with_isize(gzip.compress(bytes(8 << 20), 9), 1000)
    with pytest.raises(RemoteProtocolError) as info:
        gzip_codec.decompress(liar, 16 << 20)
    assert info.value.reason is DropReason.MALFORMED
    assert spy.max_lengths == [1001]


def test_cleartext_inflating_is_bounded_per_compressed_byte(monkeypatch) -> None:
    spy = _Spy()
    monkeypatch.setattr(gzip_codec.zlib, "decompressobj", spy)
    bomb = gzip.compress(bytes(1 << 20), 9)  # ~1 KB inflating to 1 MiB
    assert len(bomb) * gzip_codec.CLEARTEXT_MAX_RATIO < 1 << 20
    with pytest.raises(RemoteProtocolError) as info:
        gzip_codec.decompress(bomb, 16 << 20, gzip_codec.CLEARTEXT_MAX_RATIO)
    assert info.value.reason is DropReason.TOO_LARGE
    # an authenticated message of the same bytes is the sender's own: it inflates
    assert gzip_codec.decompress(bomb, 16 << 20) == bytes(1 << 20)
    # ordinary data inflates in cleartext too
    text = b"".join(b"log line %d: all fine\n" % i for i in range(5000))
    assert gzip_codec.decompress(gzip.compress(text), 16 << 20, 64) == text


def test_the_decoder_applies_the_ratio_to_cleartext_only() -> None:
    payload = _batch(_group(ts_deltas=[0, 0, 0]))
    bomb = gzip.compress(payload + bytes(1 << 20), 9)  # trailing zeros: the ratio check is first
    clear = Decoder(WireConfig(allow_cleartext=True), ring())
    clear.receive_datagram(craft(bomb, compression=1, key=None), 0.0)
    assert [e.reason for e in drain(clear)] == [DropReason.TOO_LARGE]
    keyed = Decoder(WireConfig(allow_cleartext=True), ring())
    keyed.receive_datagram(craft(bomb, compression=1), 0.0)
    assert [e.reason for e in drain(keyed)] == [DropReason.TRAILING_BYTES]


# -- fuzz: decoder + sink over the real client's argument checks -----------------------------

_edges = st.sampled_from([0, 1, -1, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 2**62])
_longs = st.one_of(_edges, st.integers(INT64_MIN, INT64_MAX))


@st.composite
def _hostile_groups(draw) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    return _group(
        topic=draw(st.sampled_from(["t", "", "a\x00b", "t" * 249, "t" * 250, "ü", "a:b"])),
        partition=draw(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)])),
        ts_type=draw(st.sampled_from([0, 1, 2, 3, -1])),
        base_offset=draw(_longs),
        base_ts=draw(_longs),
        offset_deltas=draw(st.lists(_longs, min_size=n, max_size=n)),
        ts_deltas=draw(st.lists(_longs, min_size=n, max_size=n)),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_hostile_groups(), min_size=1, max_size=3))
def test_fuzz_out_of_range_values_never_reach_the_client_as_errors(groups) -> None:
    dec = Decoder(WireConfig(), ring())
    dec.receive_datagram(craft(_batch(*groups)), 0.0)
    events = drain(dec)
    assert len(events) == 1
    (event,) = events
    if isinstance(event, Dropped):
        assert event.reason in {DropReason.OUT_OF_RANGE, DropReason.MALFORMED}
        return
    assert isinstance(event, RecordBatch)
    for name in ("raw", "raw.{topic}"):
        topics = {name.replace("{topic}", g["topic"]): 1 for g in groups}
        fake = ValidatingProducer(topics)
        config = ReceiverConfig(
            bootstrap_servers="fake:9092", raw_topic=name, allow_cleartext=True, run_linger=0
        )
        stats = ReceiverStats()
        sink = RawTopicSink(config, stats, producer_factory=lambda _props, f=fake: f)
        try:
            for topic in topics:
                assert asyncio.run(sink.wait_metadata(topic, 5.0))
            sink.write_batch(event)  # raises nothing: an exception here is an internal_error
            assert stats.delivery_errors == 0  # the client took every value the decoder passed
            assert stats.produced == event.count
        finally:
            fake.close()
