"""gzip (RFC 1952) and zstd (RFC 8878) compression of message payloads, bounded decompression.

Guarantee: :func:`decompress` and :func:`zstd_decompress` never produce more than ``limit`` bytes
(zstd: plus at most one 128 KiB block before libzstd stops it), whatever the input, and accept
exactly one complete gzip member or zstd frame with nothing after it. docs/protocol.md §4.3.

Work, not only memory, is bounded (a bomb costs CPU per byte it inflates to): cheap checks come
first. Both formats declare the size they inflate to (gzip's trailer ISIZE, RFC 1952 §2.3.1,
modulo 2^32; zstd's frame content size): a declared size over ``limit``, or over ``max_ratio``
times the compressed size when the caller sets one (cleartext input, which anybody can send), is
refused before anything is inflated; and inflating stops one byte past the declared size, so a
size that lies costs no more than one that tells the truth.
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
#: The most a cleartext message may inflate per compressed byte (gzip's own maximum is ~1032):
#: anybody can send cleartext where it is allowed, so its inflating work is bounded per byte
#: received. Authenticated messages come from a key holder (our sender) and have no such bound.
CLEARTEXT_MAX_RATIO = 64
_MIN_MEMBER = 18  # 10-byte header, an empty deflate block (2 bytes), CRC32 and ISIZE


def compress(data: bytes, level: int) -> bytes:
    """One gzip member of ``data``; mtime 0 so equal input gives equal bytes."""
    # one call (no compressobj): the same bytes, ~15 % less time on a datagram-sized payload
    return zlib.compress(data, level, _GZIP_WBITS)


def decompress(data: bytes, limit: int, max_ratio: int | None = None) -> bytes:
    """Inflate one gzip member to at most ``limit`` bytes.

    Args:
        data: the gzip member.
        limit: the most bytes it may inflate to.
        max_ratio: when set, the most bytes it may inflate to per compressed byte.

    Raises:
        RemoteProtocolError: TOO_LARGE when the declared or actual output would exceed ``limit``
            (or ``max_ratio`` times ``len(data)``); MALFORMED for a corrupt or truncated stream
            or an output longer than the trailer declares; TRAILING_BYTES for data after the
            member.
    """
    if len(data) < _MIN_MEMBER:
        raise RemoteProtocolError(DropReason.MALFORMED, "gzip member truncated")
    if max_ratio is not None:
        limit = min(limit, max_ratio * len(data))
    cap = limit
    if limit < 1 << 32:  # ISIZE is the size modulo 2^32: a bound only below that
        # the trailer's ISIZE, if ``data`` is one member with nothing after it (checked below)
        declared = int.from_bytes(data[-4:], "little")
        if declared > limit:
            raise RemoteProtocolError(DropReason.TOO_LARGE, f"gzip declares {declared} bytes")
        cap = declared
    d = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = d.decompress(data, cap + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(DropReason.MALFORMED, f"gzip: {exc}") from exc
    if len(out) > cap or (d.unconsumed_tail and not d.eof):
        if cap == limit:
            raise RemoteProtocolError(DropReason.TOO_LARGE, f"gzip output over {limit} bytes")
        # more than the trailer declares: it lies, or something follows the member
        raise RemoteProtocolError(DropReason.MALFORMED, "gzip output longer than declared")
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


def zstd_decompress(data: bytes, limit: int, max_ratio: int | None = None) -> bytes:
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
    if max_ratio is not None and declared > max_ratio * len(data):
        raise RemoteProtocolError(
            DropReason.TOO_LARGE, f"zstd frame expands {declared} / {len(data)} > {max_ratio}x"
        )
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
_DECOMPRESSORS: dict[int, Callable[[bytes, int, int | None], bytes]] = {
    COMPRESSION_GZIP: decompress,
    COMPRESSION_ZSTD: zstd_decompress,
}
#: Codes a decoder reads without any setting (besides none).
DECODABLE = frozenset(_DECOMPRESSORS)


def decompress_code(code: int, data: bytes, limit: int, max_ratio: int | None = None) -> bytes:
    """Inflate ``data`` compressed with wire code ``code`` (gzip or zstd) to at most ``limit``
    bytes and, when set, ``max_ratio`` times its compressed size.

    Raises:
        RemoteProtocolError: UNKNOWN_COMPRESSION for a code this decoder does not implement,
            or any error of the codec.
    """
    codec = _DECOMPRESSORS.get(code)
    if codec is None:
        raise RemoteProtocolError(DropReason.UNKNOWN_COMPRESSION, f"compression {code}")
    return codec(data, limit, max_ratio)
