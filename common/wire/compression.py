"""gzip (RFC 1952) and zstd (RFC 8878) compression of message payloads, bounded decompression.

Guarantee: :func:`decompress` and :func:`zstd_decompress` never produce more than ``limit`` bytes
(zstd: plus at most one 128 KiB block before libzstd stops it), whatever the input (a bomb costs
at most that memory and the CPU to inflate it), and accept exactly one complete gzip member or
zstd frame with nothing after it. docs/protocol.md §4.3.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

import zstandard

from common.errors import RemoteProtocolError
from common.wire.envelope import COMPRESSION_GZIP, COMPRESSION_ZSTD
from common.wire.events import DropReason

_GZIP_WBITS = 16 + zlib.MAX_WBITS


def compress(data: bytes, level: int) -> bytes:
    """One gzip member of ``data``; mtime 0 so equal input gives equal bytes."""
    # one call (no compressobj): the same bytes, ~15 % less time on a datagram-sized payload
    return zlib.compress(data, level, _GZIP_WBITS)


def decompress(data: bytes, limit: int) -> bytes:
    """Inflate one gzip member to at most ``limit`` bytes.

    Raises:
        RemoteProtocolError: TOO_LARGE when the output would exceed ``limit``; MALFORMED for a
            corrupt or truncated stream; TRAILING_BYTES for data after the member.
    """
    d = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(DropReason.MALFORMED, f"gzip: {exc}") from exc
    if len(out) > limit or (d.unconsumed_tail and not d.eof):
        raise RemoteProtocolError(DropReason.TOO_LARGE, f"gzip output over {limit} bytes")
    if not d.eof:
        raise RemoteProtocolError(DropReason.MALFORMED, "gzip stream truncated")
    if d.unused_data:
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the gzip member")
    return out


# -- zstd (compression code 2) -----------------------------------------------------------------
# docs/protocol.md §4.3: one zstd frame (RFC 8878) with its content size in the header, no
# checksum, no dictionary. The declared content size is checked against the limit before any
# work; libzstd then refuses a frame whose blocks inflate past it, so a frame costs at most
# ``limit`` bytes of output and one block (128 KiB) of overshoot before it is dropped.

#: zstd levels accepted (the "ultra" levels 20..22 need up to 1 GiB of window on both sides).
ZSTD_LEVELS = range(1, 20)
#: Window the decoder accepts at most: zstd's own default limit (2^27 = 128 MiB).
_MAX_WINDOW = 1 << 27


def zstd_compress(data: bytes, level: int) -> bytes:
    """One zstd frame of ``data`` with its content size; equal input gives equal bytes."""
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return compressor.compress(data)


@functools.lru_cache(maxsize=8)
def _decompressor(limit: int) -> zstandard.ZstdDecompressor:
    # the window a frame may ask for is bounded by what it may inflate to (a power of two)
    window = min(_MAX_WINDOW, max(1 << 10, 1 << max(0, limit - 1).bit_length()))
    return zstandard.ZstdDecompressor(max_window_size=window)


def zstd_decompress(data: bytes, limit: int) -> bytes:
    """Inflate one zstd frame to at most ``limit`` bytes.

    Raises:
        RemoteProtocolError: TOO_LARGE when the declared size exceeds ``limit``; MALFORMED for a
            corrupt or truncated frame or one without its content size; TRAILING_BYTES for data
            after the frame.
    """
    try:
        declared = zstandard.get_frame_parameters(data).content_size
    except zstandard.ZstdError as exc:
        raise RemoteProtocolError(DropReason.MALFORMED, f"zstd header: {exc}") from exc
    if declared == zstandard.CONTENTSIZE_UNKNOWN:
        raise RemoteProtocolError(DropReason.MALFORMED, "zstd frame without its content size")
    if declared > limit:
        raise RemoteProtocolError(DropReason.TOO_LARGE, f"zstd frame of {declared} > {limit} bytes")
    d = _decompressor(limit).decompressobj()
    try:
        out = d.decompress(data)
    except zstandard.ZstdError as exc:
        raise RemoteProtocolError(DropReason.MALFORMED, f"zstd: {exc}") from exc
    if not d.eof:
        raise RemoteProtocolError(DropReason.MALFORMED, "zstd frame truncated")
    if d.unused_data:
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the zstd frame")
    if len(out) != declared:
        raise RemoteProtocolError(DropReason.MALFORMED, "zstd output differs from its content size")
    return out


# -- by code -----------------------------------------------------------------------------------

#: compression name -> (wire code, compress(data, level)); "none" has no entry.
COMPRESSORS: dict[str, tuple[int, Callable[[bytes, int], bytes]]] = {
    "gzip": (COMPRESSION_GZIP, compress),
    "zstd": (COMPRESSION_ZSTD, zstd_compress),
}
_DECOMPRESSORS: dict[int, Callable[[bytes, int], bytes]] = {
    COMPRESSION_GZIP: decompress,
    COMPRESSION_ZSTD: zstd_decompress,
}
#: Codes a decoder reads without any setting (besides none).
DECODABLE = frozenset(_DECOMPRESSORS)


def decompress_code(code: int, data: bytes, limit: int) -> bytes:
    """Inflate ``data`` compressed with wire code ``code`` (gzip or zstd) to at most ``limit``.

    Raises:
        RemoteProtocolError: UNKNOWN_COMPRESSION for a code this decoder does not implement,
            or any error of the codec.
    """
    codec = _DECOMPRESSORS.get(code)
    if codec is None:
        raise RemoteProtocolError(DropReason.UNKNOWN_COMPRESSION, f"compression {code}")
    return codec(data, limit)
