"""Golden vectors pin wire v1 byte for byte (tests/vectors/wire_v1.json and, for zstd,
wire_v1_zstd.json, made by scripts/make_vectors.py, printed in docs/protocol.md)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import zstandard
from fastavro import schemaless_reader

from common.wire import Decoder, Encoder, Heartbeat, Key, KeyRing, Record, RecordBatch, WireConfig
from common.wire.envelope import ENVELOPE_SCHEMA
from tests.wire_support import drain

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "wire_v1.json").read_text(encoding="utf-8")
)
ZSTD = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "wire_v1_zstd.json").read_text("utf-8")
)
#: zstd's output bytes belong to one libzstd version; its decoder reads them under any.
SAME_ZSTD = tuple(ZSTD["zstd_library_version"]) == tuple(zstandard.ZSTD_VERSION)
ALL_VECTORS = VECTORS["vectors"] + ZSTD["vectors"]
RING = KeyRing([Key.from_material(bytes.fromhex(VECTORS["key_hex"]))])
SESSION = bytes.fromhex(VECTORS["session_id_hex"])


def _h(x):
    return None if x is None else bytes.fromhex(x)


RECORDS = [
    Record(
        r["topic"],
        r["partition"],
        r["offset"],
        r["timestamp"],
        r["timestamp_type"],
        _h(r["key"]),
        _h(r["value"]),
        tuple((n, _h(v)) for n, v in r["headers"]),
    )
    for r in VECTORS["records"]
]


def _config(v) -> WireConfig:
    c = v["config"]
    return WireConfig(
        max_datagram_size=c["max_datagram_size"],
        max_record_size=c["max_record_size"],
        max_message_size=c["max_message_size"],
        max_decompressed_size=c["max_decompressed_size"],
        compression=c["compression"],
        compression_level=c["compression_level"],
        allow_cleartext=c["cipher"] == "none",
    )


@pytest.mark.parametrize("vector", ALL_VECTORS, ids=lambda v: v["name"])
def test_encoder_reproduces_the_vector(vector) -> None:
    if vector["config"]["compression"] == "zstd" and not SAME_ZSTD:
        pytest.skip(f"vector made with libzstd {ZSTD['zstd_library_version']}")
    config = _config(vector)
    ring = None if vector["config"]["cipher"] == "none" else RING
    enc = Encoder(config, ring, session_id=SESSION, first_sequence=VECTORS["first_sequence"])
    if vector["input"] == "records":
        out = []
        for r in RECORDS:
            out += enc.add(
                r.topic,
                r.partition,
                r.offset,
                r.timestamp,
                r.timestamp_type,
                r.key,
                r.value,
                r.headers,
                0.0,
            )
        out += enc.flush()
    elif vector["input"] == "fragmented":
        out = enc.add("big", 1, 9, 1_700_000_000_000, 1, b"key", b"\xab" * 600, (), 0.0)
        out += enc.flush()
    else:
        out = enc.heartbeat(
            sender_id="high-1",
            started_at_ms=1_700_000_000_000,
            sent_at_ms=1_700_000_060_000,
            high_offsets=[("orders", 0, 42), ("a_b.c-d", 3, 7)],
            low_offsets=[("orders", 0, 41), ("a_b.c-d", 3, 7)],
            counters=[("records_sent", 3)],
        )
    assert [d.data.hex() for d in out] == vector["datagrams"]


@pytest.mark.parametrize("vector", ALL_VECTORS, ids=lambda v: v["name"])
def test_decoder_reads_the_vector_and_fastavro_reads_the_envelope(vector) -> None:
    ring = None if vector["config"]["cipher"] == "none" else RING
    dec = Decoder(_config(vector), ring)
    events = []
    for hex_datagram in vector["datagrams"]:
        data = bytes.fromhex(hex_datagram)
        buf = io.BytesIO(data)
        env = schemaless_reader(buf, ENVELOPE_SCHEMA, None)
        assert buf.tell() == len(data)
        assert env["magic"] == b"KDIO"
        assert env["session_id"] == SESSION
        dec.receive_datagram(data, 0.0)
        events += drain(dec)
    assert not dec.drops
    if vector["input"] == "records":
        (batch,) = events
        assert isinstance(batch, RecordBatch)
        assert batch.sequence == VECTORS["first_sequence"]
        assert sorted(batch.records, key=repr) == sorted(RECORDS, key=repr)
    elif vector["input"] == "heartbeat":
        (hb,) = events
        assert isinstance(hb, Heartbeat)
        assert hb.high_offsets == (("orders", 0, 42), ("a_b.c-d", 3, 7))
        assert hb.low_offsets == (("orders", 0, 41), ("a_b.c-d", 3, 7))
    else:
        (batch,) = events
        assert batch.records[0].value == b"\xab" * 600
