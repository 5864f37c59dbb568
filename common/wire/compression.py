"""gzip (RFC 1952) compression of message payloads, with bounded decompression.

Guarantee: :func:`decompress` never produces more than ``limit`` bytes, whatever the input, and it
accepts exactly one complete gzip member with nothing after it. docs/protocol.md §4.3.

Work, not only memory, is bounded (a gzip bomb costs CPU per byte it inflates to): cheap checks
come first. The member's trailer declares its size (ISIZE, RFC 1952 §2.3.1, modulo 2^32): a
declared size over ``limit``, or over ``max_ratio`` times the compressed size when the caller
sets one (cleartext input, which anybody can send), is refused before anything is inflated; and
inflating stops one byte past the declared size, so a trailer that lies costs no more than one
that tells the truth.
"""

from __future__ import annotations

import zlib

from common.errors import RemoteProtocolError
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
