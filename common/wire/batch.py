"""Payload codecs: the columnar record batch (kind 0) and the control messages (kinds 1, 2).

The record batch is the Avro record of ``common/schema/record_batch.avsc``: an array of partition
groups, each holding topic, partition and timestamp type once, a base offset and timestamp, and
the records as five columns (offset deltas, timestamp deltas, keys, values, headers). The codec
here is hand-written for speed and produces exactly the bytes fastavro produces for that schema
(one block per array); the decoder accepts any valid Avro encoding of it, including multi-block
and negative-count arrays. fastavro reads and writes the rare control messages.

Decoding is hostile-input safe: every length and count is checked against the bytes that remain
before anything is allocated, and any inconsistency raises ``RemoteProtocolError`` (never another
exception). docs/protocol.md §4-5.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Final

from fastavro import schemaless_reader, schemaless_writer

from common.errors import RemoteProtocolError
from common.wire.envelope import SMALL_LONGS, encode_long, load_schema, varint_size
from common.wire.events import RESEND_PHASES, DropReason, Record

RECORD_BATCH_SCHEMA: Final = load_schema("record_batch")
HEARTBEAT_SCHEMA: Final = load_schema("heartbeat")
RESEND_MARKER_SCHEMA: Final = load_schema("resend_marker")

_SMALL: Final = 1 << 14
_NULL: Final = b"\x00"
_PRESENT: Final = b"\x02"
_EMPTY_ARRAY: Final = b"\x00"
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1


def _long(n: int) -> bytes:
    return SMALL_LONGS[n] if 0 <= n < _SMALL else encode_long(n)


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _long(len(raw)) + raw


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """One record's headers as an Avro ``array<Header>``."""
    if not headers:
        return _EMPTY_ARRAY
    parts = [_long(len(headers))]
    for name, value in headers:
        parts.append(_string(name))
        if value is None:
            parts.append(_NULL)
        else:
            parts.append(_PRESENT + _long(len(value)) + value)
    parts.append(_EMPTY_ARRAY)
    return b"".join(parts)


class _Group:
    """The columns of one (topic, partition, timestamp type) inside a batch being built."""

    __slots__ = ("base_offset", "base_ts", "count", "head", "headers", "keys", "od", "td", "values")

    def __init__(self, topic: str, partition: int, ts_type: int, offset: int, ts: int) -> None:
        self.base_offset = offset
        self.base_ts = ts
        self.head = _string(topic) + _long(partition) + _long(ts_type) + _long(offset) + _long(ts)
        self.count = 0
        self.od = bytearray()
        self.td = bytearray()
        self.keys = bytearray()
        self.values = bytearray()
        self.headers = bytearray()

    def encode(self, out: list[bytes | bytearray]) -> None:
        prefix = _long(self.count)
        out.append(self.head)
        for column in (self.od, self.td, self.keys, self.values, self.headers):
            out.append(prefix)
            out.append(column)
            out.append(_EMPTY_ARRAY)


class BatchBuilder:
    """Accumulates records into one record-batch payload, tracking its exact encoded size."""

    __slots__ = ("_groups", "completes", "records", "size")

    def __init__(self) -> None:
        self._groups: dict[tuple[str, int, int], _Group] = {}
        #: (topic, partition) -> highest offset added.
        self.completes: dict[tuple[str, int], int] = {}
        self.records = 0
        #: Exact size of ``encode()`` right now (an empty batch encodes as one zero byte).
        self.size = 1

    def try_add(  # noqa: PLR0917  hot path, called per record: positional is cheapest
        self,
        topic: str,
        partition: int,
        ts_type: int,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers_blob: bytes,
        limit: int,
    ) -> bool:
        """Append a record unless the batch would grow past ``limit`` bytes (an empty batch
        always takes it); returns whether it was added. ``size`` stays exact."""
        if key is None:
            kprefix = _NULL
            klen = 0
        else:
            klen = len(key)
            kprefix = _PRESENT + (SMALL_LONGS[klen] if klen < _SMALL else encode_long(klen))
        if value is None:
            vprefix = _NULL
            vlen = 0
        else:
            vlen = len(value)
            vprefix = _PRESENT + (SMALL_LONGS[vlen] if vlen < _SMALL else encode_long(vlen))
        n = len(kprefix) + klen + len(vprefix) + vlen + len(headers_blob)
        gk = (topic, partition, ts_type)
        group = self._groups.get(gk)
        if group is None:
            new = _Group(topic, partition, ts_type, offset, timestamp)
            od = td = b"\x00"
            groups = len(self._groups)
            # the head, two 1-byte zero deltas, five 1-byte counts and five end markers
            n += len(new.head) + 12
            if groups:
                n += varint_size((groups + 1) << 1) - varint_size(groups << 1)
            else:
                n += 1  # the groups count (the end marker is in the empty size already)
        else:
            new = None
            d = offset - group.base_offset
            od = SMALL_LONGS[d] if 0 <= d < _SMALL else encode_long(d)
            d = timestamp - group.base_ts
            td = SMALL_LONGS[d] if 0 <= d < _SMALL else encode_long(d)
            c = group.count
            n += len(od) + len(td)
            if c in {63, 8191} or c > 8191:  # count varints grow at 64 and 8192 items
                n += 5 * (varint_size((c + 1) << 1) - varint_size(c << 1))
        if self.records and self.size + n > limit:
            return False
        if new is not None:
            group = self._groups[gk] = new
        assert group is not None
        group.od += od
        group.td += td
        group.keys += kprefix
        if key:
            group.keys += key
        group.values += vprefix
        if value:
            group.values += value
        group.headers += headers_blob
        group.count += 1
        self.records += 1
        self.size += n
        tp = (topic, partition)
        high = self.completes.get(tp)
        if high is None or offset > high:
            self.completes[tp] = offset
        return True

    def encode(self) -> bytes:
        """The Avro bytes of the batch."""
        if not self._groups:
            return _EMPTY_ARRAY
        out: list[bytes | bytearray] = [_long(len(self._groups))]
        for group in self._groups.values():
            group.encode(out)
        out.append(_EMPTY_ARRAY)
        return b"".join(out)


# -- decoding ---------------------------------------------------------------------------------

_new = object.__new__
# Record is frozen; its slot descriptors set fields without the frozen __setattr__ (2x faster).
(_s_topic, _s_partition, _s_offset, _s_ts, _s_ts_type, _s_key, _s_value, _s_headers) = (
    getattr(Record, name).__set__ for name in Record.__slots__
)


def _bad(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(DropReason.MALFORMED, detail)


class _Reader:
    """Bounds-checked Avro primitives over one payload."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.end = len(data)

    def long(self) -> int:
        data = self.data
        pos = self.pos
        if pos < self.end:
            b = data[pos]
            if b < 0x80:
                self.pos = pos + 1
                return (b >> 1) ^ -(b & 1)
        shift = 0
        acc = 0
        for i in range(pos, min(self.end, pos + 10)):
            b = data[i]
            acc |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = i + 1
                value = (acc >> 1) ^ -(acc & 1)
                if not _INT64_MIN <= value <= _INT64_MAX:
                    raise _bad("long out of 64-bit range")
                return value
            shift += 7
        raise _bad("truncated or overlong varint")

    def raw(self) -> bytes:
        n = self.long()
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise _bad("bytes length out of range")
        self.pos = pos + n
        return self.data[pos : pos + n]

    def string(self) -> str:
        try:
            return self.raw().decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("string is not UTF-8") from None

    def nullable(self) -> bytes | None:
        pos = self.pos
        if pos >= self.end:
            raise _bad("truncated union")
        branch = self.data[pos]
        self.pos = pos + 1
        if branch == 0:
            return None
        if branch != 2:
            raise _bad("bad union branch")
        return self.raw()

    def block(self) -> int:
        """Item count of the next array block (0 ends the array); checked against what remains."""
        n = self.long()
        if n < 0:
            n = -n
            self.long()  # block size in bytes, allowed by the Avro spec; not needed
        if n > self.end - self.pos:
            raise _bad("array count larger than the bytes left")
        return n

    def longs(self) -> list[int]:
        out: list[int] = []
        while n := self.block():
            data = self.data
            pos = self.pos
            end = self.end
            for _ in range(n):
                if pos < end and (b := data[pos]) < 0x80:
                    out.append((b >> 1) ^ -(b & 1))
                    pos += 1
                else:
                    self.pos = pos
                    out.append(self.long())
                    pos = self.pos
            self.pos = pos
        return out

    def nullables(self) -> list[bytes | None]:
        out: list[bytes | None] = []
        while n := self.block():
            for _ in range(n):
                out.append(self.nullable())
        return out

    def headers(self) -> list[tuple[tuple[str, bytes | None], ...]]:
        out: list[tuple[tuple[str, bytes | None], ...]] = []
        empty: tuple[tuple[str, bytes | None], ...] = ()
        while n := self.block():
            for _ in range(n):
                pos = self.pos
                if pos < self.end and self.data[pos] == 0:
                    self.pos = pos + 1
                    out.append(empty)
                    continue
                items: list[tuple[str, bytes | None]] = []
                while m := self.block():
                    for _ in range(m):
                        items.append((self.string(), self.nullable()))
                out.append(tuple(items))
        return out


def decode_record_batch(data: bytes) -> tuple[Record, ...]:
    """Records of a record-batch payload, in order.

    Raises:
        RemoteProtocolError: MALFORMED (bad Avro, inconsistent columns, out-of-range values) or
            TRAILING_BYTES.
    """
    r = _Reader(data)
    records: list[Record] = []
    append = records.append
    while g := r.block():
        for _ in range(g):
            topic = r.string()
            partition = r.long()
            ts_type = r.long()
            base_offset = r.long()
            base_ts = r.long()
            od = r.longs()
            td = r.longs()
            keys = r.nullables()
            values = r.nullables()
            headers = r.headers()
            n = len(od)
            if not (len(td) == len(keys) == len(values) == len(headers) == n):
                raise _bad("record batch columns differ in length")
            if not 0 <= partition <= 0x7FFFFFFF or not 0 <= ts_type <= 2:
                raise _bad("partition or timestamp type out of range")
            if n and (base_offset + min(od) < 0 or base_offset + max(od) > _INT64_MAX):
                raise _bad("offset out of range")
            for i in range(n):
                rec = _new(Record)
                _s_topic(rec, topic)
                _s_partition(rec, partition)
                _s_offset(rec, base_offset + od[i])
                _s_ts(rec, base_ts + td[i])
                _s_ts_type(rec, ts_type)
                _s_key(rec, keys[i])
                _s_value(rec, values[i])
                _s_headers(rec, headers[i])
                append(rec)
    if r.pos != r.end:
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the record batch")
    return tuple(records)


def encode_control(schema: Any, datum: dict[str, Any]) -> bytes:
    """A control message payload with fastavro."""
    out = io.BytesIO()
    schemaless_writer(out, schema, datum)
    return out.getvalue()


def decode_control(schema: Any, data: bytes) -> dict[str, Any]:
    """Parse a control message payload; reject trailing bytes.

    Raises:
        RemoteProtocolError: MALFORMED or TRAILING_BYTES.
    """
    buf = io.BytesIO(data)
    try:
        datum = schemaless_reader(buf, schema, None)
    except (ValueError, EOFError, IndexError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise _bad(f"control message: {exc.__class__.__name__}") from exc
    if buf.tell() != len(data):
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the control message")
    if not isinstance(datum, dict):
        raise _bad("control message is not a record")
    if datum.get("phase", "start") not in RESEND_PHASES:
        raise _bad("unknown resend phase")
    return datum
