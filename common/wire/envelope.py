"""The datagram envelope: a 44-byte fixed header followed by an Avro ``bytes`` payload.

The envelope is the Avro record in ``common/schema/envelope.avsc``. Every header field is an Avro
``fixed``, so its binary encoding is the raw bytes at a fixed offset and the whole header is one
``struct`` unpack; the payload is an Avro ``bytes`` (zigzag varint length, then the bytes). A
datagram is valid Avro for that schema, byte for byte (the golden-vector tests decode it with
fastavro), but the hot path never pays for a generic Avro reader. docs/protocol.md §3.
"""

from __future__ import annotations

import json
import struct
from importlib import resources
from typing import Any, Final

from fastavro import parse_schema

MAGIC: Final = b"KDIO"
VERSION: Final = 1

KIND_RECORD_BATCH: Final = 0
KIND_HEARTBEAT: Final = 1
KIND_RESEND_MARKER: Final = 2
KIND_KEY_ANNOUNCEMENT: Final = 3  # reserved for the public-key mode; not implemented in v1
#: 4 is the FEC repair datagram (common/wire/fec.py); 5 says which offsets a content filter held
#: back on purpose (docs/protocol.md §5a).
KIND_WITHHELD: Final = 5
KINDS: Final = (KIND_RECORD_BATCH, KIND_HEARTBEAT, KIND_RESEND_MARKER, KIND_WITHHELD)

COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
COMPRESSION_ZSTD: Final = 2

CIPHER_NONE: Final = 0
CIPHER_AES_256_GCM: Final = 1

#: magic, version, kind, compression, cipher, session id, sequence, key id, fragment index,
#: fragment count, message length — all big-endian, no padding.
HEADER: Final = struct.Struct(">4sBBBB16sQIHHI")
HEADER_SIZE: Final = HEADER.size
#: Where a header's fragment index and count are (``HEADER``: ..., key id, index, count, total).
_FRAGMENT_AT: Final = HEADER_SIZE - 8
TAG_SIZE: Final = 16
SESSION_ID_SIZE: Final = 16
MAX_SEQUENCE: Final = (1 << 64) - 1

assert HEADER_SIZE == 44


def load_schema(name: str) -> Any:
    """Parse ``common/schema/<name>.avsc`` (done once per schema, at import); read as the
    package's resource, so that it loads from a zip too (``spark-submit --py-files``)."""
    text = resources.files("common.schema").joinpath(f"{name}.avsc").read_text(encoding="utf-8")
    return parse_schema(json.loads(text))


ENVELOPE_SCHEMA: Final = load_schema("envelope")


def varint_size(n: int) -> int:
    """Bytes a (non-negative, already zigzagged) Avro varint of ``n`` takes."""
    return (n.bit_length() + 6) // 7 or 1


def _encode_long_slow(n: int) -> bytes:
    """Avro long: zigzag then little-endian base-128 varint (one byte at a time)."""
    return encode_varint((n << 1) ^ (n >> 63))


def encode_varint(n: int) -> bytes:
    """The little-endian base-128 varint of ``n >= 0`` (no zigzag), one byte at a time."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: ``MORE14[z]``: the 14 low bits ``z`` of a larger zigzagged long as two varint bytes that both
#: say "more follows"; a long is then at most four table joins instead of a loop per byte.
MORE14: Final = tuple(bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14))
#: ``LAST14[z]``: the varint bytes of ``z`` (already zigzagged, or the high part of a long).
LAST14: Final = tuple(
    bytes((z,)) if z < 0x80 else bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(1 << 14)
)
#: Precomputed zigzag varints for small non-negative longs (lengths, counts, small deltas): the
#: zigzag of ``i`` is ``2 i``, so the first half is every other ``LAST14`` entry and the rest three
#: bytes each, built without a call per entry (every process start builds it: ~35 ms less than
#: ``_encode_long_slow`` per entry; tests/unit/test_wire_fast_paths.py compares the two).
SMALL_LONGS: Final = tuple(LAST14[z] for z in range(0, 1 << 14, 2)) + tuple(
    bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, z >> 14))
    for z in range(1 << 14, 1 << 15, 2)
)


def encode_long(n: int) -> bytes:
    """Avro long: zigzag then little-endian base-128 varint (``n`` in the signed 64-bit range)."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x4000:
        return LAST14[z]
    low = MORE14[z & 0x3FFF]
    z >>= 14
    if z < 0x4000:
        return low + LAST14[z]
    low += MORE14[z & 0x3FFF]
    z >>= 14
    if z < 0x4000:
        return low + LAST14[z]
    low += MORE14[z & 0x3FFF]
    z >>= 14
    if z < 0x4000:
        return low + LAST14[z]
    low += MORE14[z & 0x3FFF]
    return low + LAST14[z >> 14]  # 64 bits: 56 above, at most 8 left


def decode_long(data: bytes, pos: int, limit: int) -> tuple[int, int]:
    """Read an Avro long at ``pos`` (not past ``limit``); returns ``(value, next pos)``.

    Raises:
        ValueError: truncated, or longer than the 10 bytes a 64-bit long may take.
    """
    shift = 0
    acc = 0
    for i in range(pos, min(limit, pos + 10)):
        b = data[i]
        acc |= (b & 0x7F) << shift
        if b < 0x80:
            return (acc >> 1) ^ -(acc & 1), i + 1
        shift += 7
    raise ValueError("truncated or overlong varint")


def build_header(
    *,
    kind: int,
    compression: int,
    cipher: int,
    session_id: bytes,
    sequence: int,
    key_id: int,
    fragment_index: int,
    fragment_count: int,
    message_length: int,
) -> bytes:
    """The 44 header bytes (also the AES-GCM associated data)."""
    return HEADER.pack(
        MAGIC,
        VERSION,
        kind,
        compression,
        cipher,
        session_id,
        sequence,
        key_id,
        fragment_index,
        fragment_count,
        message_length,
    )


def frame(header: bytes, payload: bytes) -> bytes:
    """Header, Avro length prefix and payload: the datagram."""
    n = len(payload)
    prefix = SMALL_LONGS[n] if n < (1 << 14) else encode_long(n)
    return b"".join((header, prefix, payload))


def message_goes_on(data: bytes, segment: int) -> bool:
    """Whether the last datagram of a coalesced read (datagrams of ``segment`` bytes, the last
    possibly shorter) says it is a fragment before its message's last: the message goes on in
    the next read. Only where a receiver ends a buffer depends on it (receiver/transport.py,
    ``SocketDrainer._join``), never what is decoded, so a datagram that lies costs nothing but
    a join."""
    at = (len(data) - 1) // segment * segment + _FRAGMENT_AT
    if at + 4 > len(data):
        return False
    return (data[at] << 8 | data[at + 1]) + 1 < (data[at + 2] << 8 | data[at + 3])


def coalesced_segment(data: bytes | bytearray | memoryview, nbytes: int) -> int:
    """The size of the first datagram in ``data[:nbytes]`` when another one follows it, else 0.

    A UDP GRO read may hold several datagrams of one flow: each that size but the last, which may
    be shorter. The kernel says the size in a ``UDP_GRO`` control message, which only a
    ``recvmsg`` returns, at ~1 us more per read than a ``recv_into`` (receiver/transport.py); a
    datagram says its own size too (the header, the Avro length of the payload, the payload),
    so a read taken with ``recv_into`` is split here instead. 0 means one datagram: a datagram
    alone, or bytes that do not frame as a datagram followed by another (the decoder judges them
    whole and counts their drop once).
    """
    if nbytes <= HEADER_SIZE + 2:
        return 0
    b = data[HEADER_SIZE]
    if b < 0x80:
        size = HEADER_SIZE + 1 + (b >> 1)
    else:
        c = data[HEADER_SIZE + 1]
        if c < 0x80:
            size = HEADER_SIZE + 2 + (((b & 0x7F) | (c << 7)) >> 1)
        else:
            d = data[HEADER_SIZE + 2]
            if d >= 0x80:  # four or more length bytes: no datagram is that long
                return 0
            size = HEADER_SIZE + 3 + (((b & 0x7F) | ((c & 0x7F) << 7) | (d << 14)) >> 1)
    if b & 1 or size >= nbytes or data[:4] != MAGIC or data[size : size + 4] != MAGIC:
        return 0  # a negative length, one datagram, or not the start of two
    return size
