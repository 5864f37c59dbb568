"""zstd (compression code 2): round trips, no receiver setting, bounded, hostile-safe decoding."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ConfigError, RemoteProtocolError
from common.wire import Decoder, DropReason, Record, WireConfig, compression
from common.wire.compression import DECODABLE, decompress_code, zstd_compress, zstd_decompress
from common.wire.envelope import COMPRESSION_ZSTD
from tests.wire_support import craft, encode_all, endpoints, feed, records_of, ring

MiB = 1024 * 1024


def rec(offset: int, value: bytes, key: bytes | None = None) -> Record:
    return Record(
        topic="logs",
        partition=1,
        offset=offset,
        timestamp=1_700_000_000_000 + offset,
        timestamp_type=1,
        key=b"host-%d" % (offset % 7) if key is None else key,
        value=value,
        headers=(("trace", b"t%d" % offset),) if key is None else (),
    )


@pytest.mark.parametrize("compressible", [True, False])
def test_zstd_round_trip_read_by_a_decoder_without_settings(compressible: bool) -> None:
    enc, _ = endpoints(WireConfig(compression="zstd", compression_level=3))
    records = [
        rec(i, (b'{"level":"INFO","msg":"served %d"} ' % i) * 20)
        if compressible
        else rec(i, os.urandom(200), key=os.urandom(50))
        for i in range(300)
    ]
    out = encode_all(enc, records)
    assert {d.data[6] for d in out} == ({COMPRESSION_ZSTD} if compressible else {0})
    if compressible:
        assert len(out) < 300 / 5
    decoder = Decoder(WireConfig(), ring())  # the receiver's defaults: no compression setting
    assert sorted(records_of(feed(decoder, out)), key=lambda r: r.offset) == records


def test_zstd_beats_gzip_on_log_like_data() -> None:
    """Ratio only (speed is measured in bench/codec.py, never in a unit test)."""
    data = b"".join(
        b'{"ts":%d,"level":"INFO","host":"web-%d","msg":"GET /api/items/%d 200 %d ms"}\n'
        % (1_700_000_000 + i, i % 5, i, i % 97)
        for i in range(200)
    )
    gz = WireConfig(compression="gzip")
    zs = WireConfig(compression="zstd")
    assert gz.compression_level == zs.compression_level == 1
    from common.wire.compression import compress  # noqa: PLC0415

    assert len(zstd_compress(data, 1)) < len(compress(data, 1))


def test_level_ranges_per_compression() -> None:
    assert WireConfig(compression="zstd", compression_level=19).compression_level == 19
    with pytest.raises(ConfigError, match="compression_level"):
        WireConfig(compression="zstd", compression_level=20)
    with pytest.raises(ConfigError, match="compression_level"):
        WireConfig(compression="gzip", compression_level=10)


def _reason(data: bytes, limit: int = 8192) -> DropReason:
    with pytest.raises(RemoteProtocolError) as info:
        zstd_decompress(data, limit)
    return info.value.reason  # type: ignore[no-any-return]


def test_bomb_is_refused_from_its_header_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = zstd_compress(b"\x00" * (64 * MiB), 19)
    assert len(bomb) < 4096

    def no_inflating(_limit: int) -> None:
        raise AssertionError("the bomb reached the decompressor")

    monkeypatch.setattr(compression, "_decompressor", no_inflating)
    assert _reason(bomb, limit=MiB) is DropReason.TOO_LARGE


def test_a_frame_lying_about_its_size_is_stopped() -> None:
    data = os.urandom(64) * 3000  # 192,000 bytes
    frame = bytearray(zstd_compress(data, 1))
    params = zstandard.get_frame_parameters(bytes(frame))
    assert params.content_size == len(data)
    # single-segment frame, 4-byte content size right after the descriptor (RFC 8878 §3.1.1.1)
    assert frame[4] >> 6 == 2
    assert (frame[4] >> 5) & 1 == 1
    frame[5:9] = (1000).to_bytes(4, "little")
    assert _reason(bytes(frame)) is DropReason.MALFORMED


def test_frames_without_size_truncated_or_followed_by_bytes() -> None:
    data = b"abc" * 100
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert _reason(no_size) is DropReason.MALFORMED
    good = zstd_compress(data, 3)
    assert zstd_decompress(good, 8192) == data
    assert _reason(good[:-2]) is DropReason.MALFORMED
    assert _reason(good + b"x") is DropReason.TRAILING_BYTES
    assert _reason(good + good) is DropReason.TRAILING_BYTES
    assert _reason(b"\x28\xb5\x2f\xfd") is DropReason.MALFORMED
    assert _reason(b"") is DropReason.MALFORMED


def test_unknown_codes_and_both_known_ones() -> None:
    assert {1, 2} == DECODABLE
    with pytest.raises(RemoteProtocolError) as info:
        decompress_code(3, b"", 10)
    assert info.value.reason is DropReason.UNKNOWN_COMPRESSION


def test_zstd_bomb_in_an_authentic_datagram_is_dropped_and_counted() -> None:
    config = WireConfig(max_record_size=1000, max_message_size=8192, max_decompressed_size=8192)
    decoder = Decoder(config, ring())
    bomb = zstd_compress(b"\x00" * MiB, 19)
    (drop,) = feed(decoder, [craft(bomb, compression=COMPRESSION_ZSTD, sequence=0)])
    assert drop.reason is DropReason.TOO_LARGE
    (drop,) = feed(decoder, [craft(b"\x28\xb5\x2f\xfdjunk", compression=2, sequence=1)])
    assert drop.reason is DropReason.MALFORMED


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(max_size=300),
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 399), st.integers(1, 255)), max_size=4),
    junk=st.binary(max_size=8),
)
def test_mangled_frames_give_the_remote_error_or_the_data(
    payload: bytes, cut: int, flips: list[tuple[int, int]], junk: bytes
) -> None:
    """Whatever is done to a frame, decoding returns bytes within the limit or the remote error."""
    frame = bytearray(zstd_compress(payload, 3))
    for at, xor in flips:
        if at < len(frame):
            frame[at] ^= xor
    data = bytes(frame[:cut]) + junk
    try:
        out = zstd_decompress(data, 4096)
    except RemoteProtocolError:
        return
    assert len(out) <= 4096
    if not flips and not junk and cut >= len(frame):
        assert out == payload


def test_zstd_vectors_are_printed_in_protocol_md() -> None:
    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "tests" / "vectors" / "wire_v1_zstd.json").read_text("utf-8"))
    text = (root / "docs" / "protocol.md").read_text("utf-8")
    flat = "".join(text.split())
    for vector in doc["vectors"]:
        assert f"#### {vector['name']}" in text
        for datagram in vector["datagrams"]:
            assert datagram in flat
