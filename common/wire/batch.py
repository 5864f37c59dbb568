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
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
from fastavro import schemaless_reader, schemaless_writer

from common.errors import RemoteProtocolError
from common.wire.envelope import (
    LAST14,
    MORE14,
    SMALL_LONGS,
    encode_long,
    encode_varint,
    load_schema,
    varint_size,
)
from common.wire.events import RESEND_PHASES, DropReason, Headers, Record, RecordGroup, records_of

RECORD_BATCH_SCHEMA: Final = load_schema("record_batch")
HEARTBEAT_SCHEMA: Final = load_schema("heartbeat")
RESEND_MARKER_SCHEMA: Final = load_schema("resend_marker")
WITHHELD_SCHEMA: Final = load_schema("withheld")

_SMALL: Final = 1 << 14
_NULL: Final = b"\x00"
_PRESENT: Final = b"\x02"
_EMPTY_ARRAY: Final = b"\x00"
_ONE_GROUP: Final = b"\x02"  # an array block of one item
_TWO_ENDS: Final = b"\x00\x00"  # the end of the last column and of the groups array
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
#: A base this far inside the 64-bit range cannot leave it by adding a one-byte long (-64..63).
_SMALL_DELTA_EDGE: Final = _INT64_MAX - 64
#: Kafka's longest topic name; a NUL in a name makes the Kafka client raise ValueError.
_MAX_TOPIC_LENGTH: Final = 249


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


#: ``(prefix, encoded size)`` of a ``union{null, bytes}`` of each length below 4096: the prefix is
#: ``b"\x02"`` (the bytes branch) and the length; the size counts prefix and bytes.
BYTES_ITEMS: Final = tuple(
    (_PRESENT + SMALL_LONGS[n], 1 + len(SMALL_LONGS[n]) + n) for n in range(4096)
)
NULL_ITEM: Final = (_NULL, 1)


def bytes_item(n: int) -> tuple[bytes, int]:
    """``(prefix, encoded size)`` of a non-null ``union{null, bytes}`` of ``n`` bytes."""
    if n < len(BYTES_ITEMS):
        return BYTES_ITEMS[n]
    prefix = _PRESENT + encode_long(n)
    return prefix, len(prefix) + n


#: Encoded ``topic, partition, timestamp type`` of each group seen, so a group head costs two
#: varints; bounded (cleared when full), as topic names come from the caller.
_HEADS: dict[tuple[str, int, int], bytes] = {}
_MAX_HEADS: Final = 4096


#: Avro longs are signed 64-bit: a timestamp delta outside [-2^63, 2^63) cannot be written.
_LONG_BOUND = 1 << 63


class _Group:
    """The columns of one (topic, partition, timestamp type) inside a batch being built."""

    __slots__ = (
        "base_offset",
        "base_ts",
        "const_head",
        "count",
        "head",
        "headers",
        "high",
        "keys",
        "od",
        "offset_high",
        "offset_high_bytes",
        "partition",
        "td",
        "topic",
        "ts_high",
        "ts_high_bytes",
        "ts_type",
        "values",
    )

    def __init__(  # noqa: PLR0917  once per group
        self, topic: str, partition: int, ts_type: int, offset: int, ts: int, wire_topic: str
    ) -> None:
        """``topic``: the caller's name (compared, reported in ``completes``); ``wire_topic``:
        the name written (the same unless the sender renames topics on the wire)."""
        self.topic = topic
        self.partition = partition
        self.ts_type = ts_type
        self.base_offset = offset
        self.base_ts = ts
        self.high = offset
        head = _HEADS.get((wire_topic, partition, ts_type))
        if head is None:
            if len(_HEADS) >= _MAX_HEADS:
                _HEADS.clear()
            head = _HEADS[wire_topic, partition, ts_type] = (
                _string(wire_topic) + _long(partition) + _long(ts_type)
            )
        self.const_head = head
        self.head = head + encode_long(offset) + encode_long(ts)
        self.offset_high = self.ts_high = -1
        self.offset_high_bytes = self.ts_high_bytes = b""
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
    """Accumulates records into one record-batch payload, tracking its exact encoded size.

    Speed: ``try_add`` runs once per record on the sender, so it does the least per record:
    length prefixes come from tables, the columns are ``bytearray`` appends, the per-partition
    high offset is kept per group and merged only in ``completes``.
    """

    __slots__ = ("_groups", "_topic_map", "last", "records", "size")

    def __init__(self, topic_map: Mapping[str, str] | None = None) -> None:
        """``topic_map``: source topic -> the name written on the wire (topic rename)."""
        self._topic_map = topic_map or {}
        self._groups: dict[tuple[str, int, int], _Group] = {}
        #: The group the last record went to (the encoder appends to it directly while the
        #: records stay in one partition, which is how a consumer hands them out).
        self.last: _Group | None = None
        self.records = 0
        #: Exact size of ``encode()`` right now (an empty batch encodes as one zero byte).
        self.size = 1

    @property
    def groups(self) -> int:
        """Number of partition groups in the batch."""
        return len(self._groups)

    def restart(  # noqa: PLR0917  the encoder's roll-over path, once per datagram
        self,
        group: _Group,
        offset: int,
        timestamp: int,
        kprefix: bytes,
        key: bytes | None,
        vprefix: bytes,
        value: bytes | None,
        headers_blob: bytes,
        n: int,
    ) -> None:
        """Empty the batch (already encoded by the caller) down to ``group``, its only group,
        and put one record in it: what a new builder and ``append`` would hold, without
        allocating either. ``n`` is the record's key, value and headers size as for ``append``."""
        # The group head's base offset and timestamp varints: the low 14 bits from a table, the
        # rest (which changes every 8192 offsets or 8.192 s) cached on the group.
        z = offset << 1  # zigzag of a non-negative offset
        if z < 0x4000:  # 14 bits
            head = group.const_head + LAST14[z]
        else:
            high = z >> 14
            if high != group.offset_high:
                group.offset_high = high
                group.offset_high_bytes = encode_varint(high)
            head = group.const_head + MORE14[z & 0x3FFF] + group.offset_high_bytes
        z = (timestamp << 1) ^ (timestamp >> 63)
        if z < 0x4000:  # 14 bits
            head += LAST14[z]
        else:
            high = z >> 14
            if high != group.ts_high:
                group.ts_high = high
                group.ts_high_bytes = encode_varint(high)
            head += MORE14[z & 0x3FFF] + group.ts_high_bytes
        group.head = head
        group.base_offset = group.high = offset
        group.base_ts = timestamp
        group.count = 1
        group.od = bytearray(_NULL)
        group.td = bytearray(_NULL)
        keys = group.keys = bytearray(kprefix)
        if key:
            keys += key
        values = group.values = bytearray(vprefix)
        if value:
            values += value
        group.headers = bytearray(headers_blob)
        self.records = 1
        # empty batch (1), groups count (1), head, two 1-byte deltas, 5 counts, 5 end markers
        self.size = n + len(head) + 14

    @property
    def completes(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> highest offset added, in order of first appearance."""
        out: dict[tuple[str, int], int] = {}
        for group in self._groups.values():
            tp = (group.topic, group.partition)
            high = out.get(tp)
            if high is None or group.high > high:
                out[tp] = group.high
        return out

    def completed(self) -> tuple[tuple[str, int, int], ...]:
        """``completes`` as ``(topic, partition, highest offset)`` triples."""
        groups = self._groups
        if len(groups) == 1:
            for group in groups.values():
                return ((group.topic, group.partition, group.high),)
        return tuple((t, p, o) for (t, p), o in self.completes.items())

    def try_add(  # noqa: PLR0917  positional like the encoder's hot path
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
        kprefix, n = NULL_ITEM if key is None else bytes_item(len(key))
        vprefix, vn = NULL_ITEM if value is None else bytes_item(len(value))
        return self.append(
            topic, partition, ts_type, offset, timestamp, kprefix, key, vprefix, value,
            headers_blob, n + vn + len(headers_blob), limit,
        )  # fmt: skip

    def append(  # noqa: PLR0917  hot path, called per record: positional is cheapest
        self,
        topic: str,
        partition: int,
        ts_type: int,
        offset: int,
        timestamp: int,
        kprefix: bytes,
        key: bytes | None,
        vprefix: bytes,
        value: bytes | None,
        headers_blob: bytes,
        n: int,
        limit: int,
    ) -> bool:
        """``try_add`` with the key and value prefixes (:func:`bytes_item`) and ``n``, the
        encoded size of key, value and headers, already computed by the caller."""
        group = self._groups.get((topic, partition, ts_type))
        if group is None:
            return self._try_add_group(
                topic, partition, ts_type, offset, timestamp, kprefix, key, vprefix, value,
                headers_blob, n, limit,
            )  # fmt: skip
        self.last = group
        d = offset - group.base_offset
        if 0 <= d < 64:
            od = SMALL_LONGS[d]
            n += 1
        else:
            od = encode_long(d)
            n += len(od)
        d = timestamp - group.base_ts
        if 0 <= d < 64:
            td = SMALL_LONGS[d]
            n += 1
        elif -_LONG_BOUND <= d < _LONG_BOUND:
            td = encode_long(d)
            n += len(td)
        else:  # e.g. -1 after 2^63-1: the delta is no Avro long; the record opens the next batch
            return False
        c = group.count
        if c >= 63 and (c == 63 or c >= 8191):  # count varints grow at 64 and 8192 items
            n += 5 * (varint_size((c + 1) << 1) - varint_size(c << 1))
        n += self.size
        if n > limit and self.records:
            return False
        self.size = n
        self.records += 1
        group.count = c + 1
        group.od += od
        group.td += td
        keys = group.keys
        keys += kprefix
        if key:
            keys += key
        values = group.values
        values += vprefix
        if value:
            values += value
        group.headers += headers_blob
        if offset > group.high:  # noqa: PLR1730  per record: a compare is cheaper than max()
            group.high = offset
        return True

    def _try_add_group(  # noqa: PLR0917  the first record of a new group
        self,
        topic: str,
        partition: int,
        ts_type: int,
        offset: int,
        timestamp: int,
        kprefix: bytes,
        key: bytes | None,
        vprefix: bytes,
        value: bytes | None,
        headers_blob: bytes,
        n: int,
        limit: int,
    ) -> bool:
        group = _Group(
            topic, partition, ts_type, offset, timestamp, self._topic_map.get(topic, topic)
        )
        groups = len(self._groups)
        # the head, two 1-byte zero deltas, five 1-byte counts and five end markers
        n += len(group.head) + 12
        if groups:
            n += varint_size((groups + 1) << 1) - varint_size(groups << 1)
        else:
            n += 1  # the groups count (the end marker is in the empty size already)
        n += self.size
        if n > limit and self.records:
            return False
        self._groups[topic, partition, ts_type] = group
        self.last = group
        self.size = n
        self.records += 1
        group.count = 1
        group.od += _NULL
        group.td += _NULL
        group.keys += kprefix
        if key:
            group.keys += key
        group.values += vprefix
        if value:
            group.values += value
        group.headers += headers_blob
        return True

    def encode(self) -> bytes:
        """The Avro bytes of the batch."""
        if len(self._groups) == 1:  # the usual case: one join
            g = self.last
            assert g is not None
            p = _long(g.count)
            return b"".join((
                _ONE_GROUP, g.head, p, g.od, _EMPTY_ARRAY, p, g.td, _EMPTY_ARRAY, p, g.keys,
                _EMPTY_ARRAY, p, g.values, _EMPTY_ARRAY, p, g.headers, _TWO_ENDS,
            ))  # fmt: skip
        if not self._groups:
            return _EMPTY_ARRAY
        out: list[bytes | bytearray] = [_long(len(self._groups))]
        for group in self._groups.values():
            group.encode(out)
        out.append(_EMPTY_ARRAY)
        return b"".join(out)


# -- decoding ---------------------------------------------------------------------------------
#
# Speed: the decoder works column by column over the payload bytes with the common cases done
# by C-level operations on a whole column: offset/timestamp deltas that are all one-byte varints
# (``bytes.isascii``) become ints through a lookup table, consecutive deltas (0, 1, 2, ...) are
# recognised by one bytes comparison, and a column of empty header arrays by another. Only keys
# and values need a Python step per item. Anything unusual falls back to the general reader,
# which accepts every valid Avro encoding (several blocks, negative counts with a byte size).

_new = object.__new__
(_g_topic, _g_partition, _g_ts_type, _g_offsets, _g_timestamps, _g_keys, _g_values, _g_headers) = (
    getattr(RecordGroup, name).__set__ for name in RecordGroup.__slots__
)

#: The value of each one-byte Avro long (bytes 0x00-0x7f).
_ZIGZAG: Final = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))
#: ``_RUNS[n]``: the deltas 0, 1, ..., n-1 as one-byte longs (consecutive offsets or timestamps).
_RUNS: Final = tuple(bytes(range(0, 2 * n, 2)) for n in range(64))
_NO_HEADERS: Final[Headers] = ()
#: ``_RUNS_END[n]``: ``_RUNS[n]`` and the end of the array.
_RUNS_END: Final = tuple(r + b"\x00" for r in _RUNS)
#: ``_ZEROS[n]``: n + 1 zero bytes (n empty header arrays and the end of the column).
_ZEROS: Final = tuple(bytes(n + 1) for n in range(64))
#: ``_TWOS[n]``: n union branch bytes of ``bytes`` (``0x02``).
_TWOS: Final = tuple(b"\x02" * n for n in range(64))
#: ``struct`` unpackers of same-length item columns by (count, stride); bounded, cleared when full.
_UNPACKERS: dict[tuple[int, int], Any] = {}
_MAX_UNPACKERS: Final = 256
#: Runs (raw layout v2, ``common.raw_run``) hold hundreds or thousands of records per group: the
#: fast paths below also take columns of 64 items or more (a multi-byte count). ``_CONSECUTIVE``
#: holds the deltas 0, 1, ..., _MAX_CONSECUTIVE - 1 as Avro longs; ``_CONSECUTIVE_END[n]`` is
#: where the first n of them end. Built at first use.
_MAX_CONSECUTIVE: Final = 1 << 16
_CONSECUTIVE: list[bytes] = []
_CONSECUTIVE_END: list[int] = []


def _consecutive(n: int) -> bytes | None:
    """The encoded deltas 0..n-1 followed by the end of the array, or None for n too large."""
    if n >= _MAX_CONSECUTIVE:
        return None
    if not _CONSECUTIVE:
        parts = [encode_long(i) for i in range(_MAX_CONSECUTIVE)]
        ends, total = [0], 0
        for part in parts:
            total += len(part)
            ends.append(total)
        _CONSECUTIVE_END[:] = ends
        _CONSECUTIVE.append(b"".join(parts))
    return _CONSECUTIVE[0][: _CONSECUTIVE_END[n]] + b"\x00"


def _big_count(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(n, position of the first item)`` of an array whose one block counts 64 items or more
    (a multi-byte count), or ``(0, pos)`` when the array at ``pos`` is not of that shape."""
    if data[pos] < 0x80:
        return 0, pos
    n, start = _read_long(data, pos, end)
    if not 0 < n <= end - start:
        return 0, pos
    return n, start


def _big_consecutive(data: bytes, pos: int, end: int) -> int:
    """Items of a column of consecutive deltas 0..n-1 (n >= 64) at ``pos``, or 0."""
    n, start = _big_count(data, pos, end)
    if n:
        expected = _consecutive(n)
        if expected is not None and data[start : start + len(expected)] == expected:
            return n
    return 0


def _big_same_length(data: bytes, pos: int, end: int) -> tuple[tuple[bytes, ...] | None, int]:
    """``_same_length_items`` for 64 items or more (one block, then the end of the array)."""
    n, first = _big_count(data, pos, end)
    if not n or data[first] != 2:
        return None, pos
    c = data[first + 1]
    if c < 0x80:
        if c & 1:
            return None, pos
        length, prefix = c >> 1, 2
    else:
        d = data[first + 2]
        if d >= 0x80 or c & 1:
            return None, pos
        length, prefix = ((c & 0x7F) | (d << 7)) >> 1, 3
    stride = prefix + length
    stop = first + n * stride
    if (
        stop >= end
        or data[stop] != 0
        or data[first:stop:stride] != b"\x02" * n
        or data[first + 1 : stop : stride].count(c) != n
        or (prefix == 3 and data[first + 2 : stop : stride].count(data[first + 2]) != n)
    ):
        return None, pos
    skip, size = prefix, prefix + length
    return tuple([data[i + skip : i + size] for i in range(first, stop, stride)]), stop + 1


def _bad(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(DropReason.MALFORMED, detail)


def _out_of_range(detail: str) -> RemoteProtocolError:
    # Decodable but impossible values: dropped before they reach a Kafka client, whose
    # produce() raises OverflowError / ValueError for them (docs/protocol.md §9).
    return RemoteProtocolError(DropReason.OUT_OF_RANGE, detail)


def _read_long(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Any Avro long at ``pos``; returns ``(value, next pos)``.

    Unrolled (a loop costs twice as much per byte): a read past the end of ``data`` raises
    ``IndexError``, which the callers turn into MALFORMED; ``end`` is ``len(data)`` everywhere.
    Up to 9 bytes hold at most 63 bits, so only a 10-byte long can leave the 64-bit range.
    """
    b = data[pos]
    if b < 0x80:
        return _ZIGZAG[b], pos + 1
    acc = b & 0x7F
    b = data[pos + 1]
    if b < 0x80:
        acc |= b << 7
        return (acc >> 1) ^ -(acc & 1), pos + 2
    acc |= (b & 0x7F) << 7
    b = data[pos + 2]
    if b < 0x80:
        acc |= b << 14
        return (acc >> 1) ^ -(acc & 1), pos + 3
    acc |= (b & 0x7F) << 14
    b = data[pos + 3]
    if b < 0x80:
        acc |= b << 21
        return (acc >> 1) ^ -(acc & 1), pos + 4
    acc |= (b & 0x7F) << 21
    b = data[pos + 4]
    if b < 0x80:
        acc |= b << 28
        return (acc >> 1) ^ -(acc & 1), pos + 5
    acc |= (b & 0x7F) << 28
    b = data[pos + 5]
    if b < 0x80:
        acc |= b << 35
        return (acc >> 1) ^ -(acc & 1), pos + 6
    acc |= (b & 0x7F) << 35
    b = data[pos + 6]
    if b < 0x80:
        acc |= b << 42
        return (acc >> 1) ^ -(acc & 1), pos + 7
    acc |= (b & 0x7F) << 42
    b = data[pos + 7]
    if b < 0x80:
        acc |= b << 49
        return (acc >> 1) ^ -(acc & 1), pos + 8
    acc |= (b & 0x7F) << 49
    b = data[pos + 8]
    if b < 0x80:
        acc |= b << 56
        return (acc >> 1) ^ -(acc & 1), pos + 9
    acc |= (b & 0x7F) << 56
    b = data[pos + 9]
    if b < 0x80 and pos + 10 <= end:
        acc |= b << 63
        value = (acc >> 1) ^ -(acc & 1)
        if _INT64_MIN <= value <= _INT64_MAX:
            return value, pos + 10
        raise _bad("long out of 64-bit range")
    raise _bad("truncated or overlong varint")


def _block(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Item count of the array block at ``pos`` (0 ends the array), checked against the bytes
    left (every item of our arrays takes at least one byte); returns ``(count, next pos)``."""
    b = data[pos]
    if b < 0x80:
        n = _ZIGZAG[b]
        pos += 1
    else:
        n, pos = _read_long(data, pos, end)
    if n < 0:
        n = -n
        _, pos = _read_long(data, pos, end)  # block size in bytes, allowed by Avro; not needed
    if n > end - pos:
        raise _bad("array count larger than the bytes left")
    return n, pos


def _read_raw(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    n, pos = _read_long(data, pos, end)
    nxt = pos + n
    if n < 0 or nxt > end:
        raise _bad("bytes length out of range")
    return data[pos:nxt], nxt


def _read_string(data: bytes, pos: int, end: int) -> tuple[str, int]:
    raw, pos = _read_raw(data, pos, end)
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError:
        raise _bad("string is not UTF-8") from None


def _read_nullable(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise _bad("bad union branch")
    return _read_raw(data, pos + 1, end)


def _longs(data: bytes, pos: int, end: int, base: int) -> tuple[tuple[int, ...], int]:
    """An ``array<long>`` column of deltas, returned added to ``base``."""
    b = data[pos]
    if 0 < b < 0x80 and not b & 1:  # one block of n < 64 items, the usual case
        n = b >> 1
        start = pos + 1
        nxt = start + n
        if nxt < end and data[nxt] == 0:  # ...followed by the end of the array
            chunk = data[start:nxt]
            if chunk == _RUNS[n]:
                if base + n > _INT64_MAX + 1:
                    raise _out_of_range("base + delta beyond 64 bits")
                return tuple(range(base, base + n)), nxt + 1
            if chunk.isascii():  # every delta a one-byte long, in -64..63
                items = tuple(map(base.__add__, map(_ZIGZAG.__getitem__, chunk)))
                # base + delta leaves 64 bits only for a base within 64 of either end
                if -_SMALL_DELTA_EDGE <= base <= _SMALL_DELTA_EDGE or _in_int64(items):
                    return items, nxt + 1
                raise _out_of_range("base + delta beyond 64 bits")
    elif b >= 0x80:  # 64 items or more in one block: one-byte deltas take one bytes test
        n, start = _big_count(data, pos, end)
        nxt = start + n
        if n and nxt < end and data[nxt] == 0 and (chunk := data[start:nxt]).isascii():
            items = tuple(map(base.__add__, map(_ZIGZAG.__getitem__, chunk)))
            if -_SMALL_DELTA_EDGE <= base <= _SMALL_DELTA_EDGE or _in_int64(items):
                return items, nxt + 1
            raise _out_of_range("base + delta beyond 64 bits")
        if n:
            found = _vector_longs(data, start, n, end)
            if found is not None:
                deltas, nxt = found
                items = tuple(map(base.__add__, deltas))
                if _in_int64(items):
                    return items, nxt + 1
                raise _out_of_range("base + delta beyond 64 bits")
    out: list[int] = []
    while True:
        n, pos = _block(data, pos, end)
        if not n:
            if out and not _in_int64(out):
                raise _out_of_range("base + delta beyond 64 bits")
            return tuple(out), pos
        for _ in range(n):
            b = data[pos]
            if b < 0x80:
                out.append(base + _ZIGZAG[b])
                pos += 1
            else:
                value, pos = _read_long(data, pos, end)
                out.append(base + value)


def _vector_longs(data: bytes, start: int, n: int, end: int) -> tuple[list[int], int] | None:
    """``n`` Avro longs from ``start``, decoded with numpy (runs hold thousands of timestamp
    deltas of two or three bytes each); ``(values, position after them)`` when they are followed
    by the end of the array, else None (the caller reads them one by one). Longs of 10 bytes
    also take the slow path, which checks their range."""
    window = np.frombuffer(data, dtype=np.uint8, count=min(end - start, 9 * n + 1), offset=start)
    stops = np.flatnonzero(window < 0x80)
    if len(stops) <= n:
        return None
    stops = stops[:n]
    size = int(stops[-1]) + 1
    if window[size] != 0:  # the end of the array must follow
        return None
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = stops[:-1] + 1
    lengths = stops - starts + 1
    if int(lengths.max()) > 9:
        return None
    shift = (np.arange(size) - np.repeat(starts, lengths)) * 7
    parts = (window[:size].astype(np.uint64) & np.uint64(0x7F)) << shift.astype(np.uint64)
    acc = np.add.reduceat(parts, starts)
    values = (acc >> np.uint64(1)).astype(np.int64) ^ -(acc & np.uint64(1)).astype(np.int64)
    return values.tolist(), start + size


def _in_int64(items: Sequence[int]) -> bool:
    return min(items) >= _INT64_MIN and max(items) <= _INT64_MAX


def _nullables(data: bytes, pos: int, end: int) -> tuple[tuple[bytes | None, ...], int]:
    """An ``array<union{null, bytes}>`` column (keys or values)."""
    out: list[bytes | None] = []
    append = out.append
    b = data[pos]
    if 0 < b < 0x80 and not b & 1:  # one block of n < 64 items: a lying n only over-reads
        n = b >> 1
        pos += 1
    else:
        n, pos = _block(data, pos, end)
    while n:
        for _ in range(n):
            branch = data[pos]
            if branch == 2:
                b = data[pos + 1]
                if b < 0x80:  # length < 64
                    if b & 1:
                        raise _bad("negative bytes length")
                    pos += 2
                    nxt = pos + (b >> 1)
                else:
                    c = data[pos + 2]
                    if c < 0x80:  # length < 8192
                        if b & 1:
                            raise _bad("negative bytes length")
                        pos += 3
                        nxt = pos + (((b & 0x7F) | (c << 7)) >> 1)
                    else:
                        n, pos = _read_long(data, pos + 1, end)
                        if n < 0:
                            raise _bad("negative bytes length")
                        nxt = pos + n
                if nxt > end:
                    raise _bad("bytes length past the end")
                append(data[pos:nxt])
                pos = nxt
            elif branch == 0:
                append(None)
                pos += 1
            else:
                raise _bad("bad union branch")
        if data[pos] == 0:  # the end of the array
            return tuple(out), pos + 1
        n, pos = _block(data, pos, end)
    return tuple(out), pos


#: Header names decoded so far (raw UTF-8 -> str): a run's records repeat the same few names.
#: Bounded (cleared when full): names come from the wire.
_HEADER_NAMES: dict[bytes, str] = {}
_MAX_HEADER_NAMES: Final = 4096
#: A header *layout* (names in order, each value's length, no null value) -> a compiled pattern
#: of its canonical encoding with the values as groups, and the names. Every structural byte is
#: fixed in the pattern and only the value bytes are free, so whatever it matches decodes, by the
#: general reading, to exactly those names and the matched values. Bounded (cleared when full),
#: and at most ``_COMPILES_PER_COLUMN`` compiled per column: layouts come from the wire.
_LAYOUTS: dict[tuple[tuple[str, int], ...], tuple[re.Pattern[bytes], tuple[str, ...]]] = {}
_MAX_LAYOUTS: Final = 256
_COMPILES_PER_COLUMN: Final = 2


def _layout(key: tuple[tuple[str, int], ...]) -> tuple[re.Pattern[bytes], tuple[str, ...]]:
    """The pattern of a header layout (see :data:`_LAYOUTS`)."""
    parts = [re.escape(_long(len(key)))]
    for name, n in key:
        parts.append(re.escape(_string(name) + _PRESENT + _long(n)))
        parts.append(b"(.{%d})" % n)
    parts.append(b"\x00")
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    layout = _LAYOUTS[key] = (re.compile(b"".join(parts), re.DOTALL), tuple(n for n, _ in key))
    return layout


def _headers(data: bytes, pos: int, end: int) -> tuple[tuple[Headers, ...], int]:
    """The ``array<array<Header>>`` column.

    Fast paths, each exactly what the general reading gives (the fuzz and property tests hold
    them to it): a column of empty arrays; a record whose header bytes are byte for byte the
    previous record's (constant headers: the same bytes parse to the same headers, so the
    previous tuple is reused after one comparison); a record in the layout of the two records
    before it (same names, same value lengths: trace ids, content types), matched by one compiled
    pattern (:data:`_LAYOUTS`); otherwise names and values with one-byte lengths read inline,
    names looked up in :data:`_HEADER_NAMES` instead of decoded again.
    """
    b = data[pos]
    if 0 < b < 0x80 and not b & 1:  # one block of n < 64 items...
        n = b >> 1
        nxt = pos + 1 + n
        if data[pos + 1 : nxt + 1] == bytes(n + 1):  # ...all empty, then the end of the array
            return (_NO_HEADERS,) * n, nxt + 1
    out: list[Headers] = []
    names = _HEADER_NAMES
    previous = b""  # the previous record's header bytes, and what they decoded to
    previous_headers: Headers = _NO_HEADERS
    layout: re.Pattern[bytes] | None = None  # the layout of the last two records, if any
    layout_names: tuple[str, ...] = ()
    last_key: tuple[tuple[str, int], ...] | None = None
    compiles = 0
    while True:
        n, pos = _block(data, pos, end)
        if not n:
            return tuple(out), pos
        for _ in range(n):
            if previous and data.startswith(previous, pos) and pos + len(previous) <= end:
                out.append(previous_headers)
                pos += len(previous)
                continue
            if layout is not None:
                match = layout.match(data, pos, end)
                if match is not None:
                    out.append(tuple(zip(layout_names, match.groups(), strict=True)))
                    pos = match.end()
                    continue
            start = pos
            items: list[tuple[str, bytes | None]] = []
            while True:
                m, pos = _block(data, pos, end)
                if not m:
                    break
                for _ in range(m):
                    b = data[pos]
                    if b < 0x80 and not b & 1:  # a name shorter than 64 bytes
                        nxt = pos + 1 + (b >> 1)
                        if nxt > end:
                            raise _bad("bytes length out of range")
                        raw = data[pos + 1 : nxt]
                        name = names.get(raw)
                        if name is None:
                            name = raw.decode("utf-8")  # UnicodeDecodeError: MALFORMED (caller)
                            if len(names) >= _MAX_HEADER_NAMES:
                                names.clear()
                            names[raw] = name
                        pos = nxt
                    else:
                        name, pos = _read_string(data, pos, end)
                    b = data[pos]
                    if b == 0:
                        value = None
                        pos += 1
                    elif b == 2 and data[pos + 1] < 0x80 and not data[pos + 1] & 1:
                        nxt = pos + 2 + (data[pos + 1] >> 1)  # a value shorter than 64 bytes
                        if nxt > end:
                            raise _bad("bytes length out of range")
                        value = data[pos + 2 : nxt]
                        pos = nxt
                    else:
                        value, pos = _read_nullable(data, pos, end)
                    items.append((name, value))
            headers = tuple(items) if items else _NO_HEADERS
            out.append(headers)
            previous, previous_headers = data[start:pos], headers
            if headers and compiles < _COMPILES_PER_COLUMN:
                key = tuple((name, -1 if value is None else len(value)) for name, value in headers)
                if key == last_key and len(key) < 64 and min(n for _, n in key) >= 0:
                    found = _LAYOUTS.get(key)
                    if found is None:
                        compiles += 1
                        found = _layout(key)
                    layout, layout_names = found
                last_key = key


def _same_length_items(data: bytes, pos: int, end: int) -> tuple[tuple[bytes, ...] | None, int]:
    """An ``array<union{null, bytes}>`` column whose items are all non-null and of one length
    below 8192, in one block followed by the end of the array, read by C-level operations: three
    strided slices check every item's branch and length bytes (item ``i`` then starts exactly
    ``i`` strides in, by induction) and one cached ``struct`` unpacks all items. Returns
    ``(None, pos)`` when the column is not of that shape (the caller reads it item by item)."""
    b = data[pos]
    if not (0 < b < 0x80 and not b & 1) or data[pos + 1] != 2:
        return None, pos
    n = b >> 1
    first = pos + 1
    c = data[first + 1]
    if c < 0x80:  # length < 64: one length byte
        if c & 1:
            return None, pos
        length = c >> 1
        prefix = 2
    else:
        d = data[first + 2]
        if d >= 0x80 or c & 1:
            return None, pos
        length = ((c & 0x7F) | (d << 7)) >> 1
        prefix = 3
    stride = prefix + length
    stop = first + n * stride
    if (
        stop >= end
        or data[stop] != 0
        or data[first:stop:stride] != _TWOS[n]
        or data[first + 1 : stop : stride].count(c) != n
        or (prefix == 3 and data[first + 2 : stop : stride].count(d) != n)
    ):
        return None, pos
    unpack = _UNPACKERS.get((n, stride))
    if unpack is None:
        unpack = _unpacker(n, prefix, stride)
    return unpack(data, first), stop + 1


def _unpacker(n: int, prefix: int, stride: int) -> Any:
    """The cached ``unpack_from`` of ``n`` items of ``stride`` bytes, each ``prefix`` bytes of
    union branch and length, then the bytes."""
    if len(_UNPACKERS) >= _MAX_UNPACKERS:  # bounded: lengths come from the wire
        _UNPACKERS.clear()
    unpack = _UNPACKERS[n, stride] = struct.Struct(f"{prefix}x{stride - prefix}s" * n).unpack_from
    return unpack


def _decode_groups(data: bytes) -> tuple[tuple[RecordGroup, ...], int]:
    end = len(data)
    groups: list[RecordGroup] = []
    total = 0
    zigzag = _ZIGZAG
    runs = _RUNS_END
    unpackers = _UNPACKERS
    g = data[0]
    if 0 < g < 0x80 and not g & 1:  # one block of fewer than 64 groups
        g >>= 1
        pos = 1
    else:
        g, pos = _block(data, 0, end)
    while g:
        for _ in range(g):
            b = data[pos]
            if b < 0x80 and not b & 1:  # a topic name of fewer than 64 bytes
                nxt = pos + 1 + (b >> 1)
                if nxt > end:
                    raise _bad("string length past the end")
                topic = data[pos + 1 : nxt].decode("utf-8")  # UnicodeDecodeError: see caller
                pos = nxt
            else:
                topic, pos = _read_string(data, pos, end)
            # partition and timestamp type: one byte each unless the partition is >= 64
            partition = data[pos]
            if partition < 0x80:
                partition = zigzag[partition]
                pos += 1
            else:
                partition, pos = _read_long(data, pos, end)
            ts_type = data[pos]
            if ts_type < 0x80:
                ts_type = zigzag[ts_type]
                pos += 1
            else:
                ts_type, pos = _read_long(data, pos, end)
            base_offset, pos = _read_long(data, pos, end)
            base_ts, pos = _read_long(data, pos, end)
            # Offset and timestamp deltas: consecutive (0, 1, 2, ...: one bytes comparison) is
            # the usual case, and then the offsets' range check is on the ends only.
            b = data[pos]
            n = b >> 1
            nxt = pos + 1 + n
            if 0 < b < 0x80 and not b & 1 and data[pos + 1 : nxt + 1] == runs[n]:
                offsets: tuple[int, ...] = tuple(range(base_offset, base_offset + n))
                pos = nxt + 1
                if base_offset < 0 or base_offset + n - 1 > _INT64_MAX:
                    raise _out_of_range("offset out of range")
            elif b >= 0x80 and (n := _big_consecutive(data, pos, end)):
                offsets = tuple(range(base_offset, base_offset + n))
                pos += len(encode_long(n)) + _CONSECUTIVE_END[n] + 1
                if base_offset < 0 or base_offset + n - 1 > _INT64_MAX:
                    raise _out_of_range("offset out of range")
            else:
                offsets, pos = _longs(data, pos, end, base_offset)
                if offsets and (min(offsets) < 0 or max(offsets) > _INT64_MAX):
                    raise _out_of_range("offset out of range")
            b = data[pos]
            n = b >> 1
            nxt = pos + 1 + n
            if 0 < b < 0x80 and not b & 1 and data[pos + 1 : nxt + 1] == runs[n]:
                timestamps: tuple[int, ...] = tuple(range(base_ts, base_ts + n))
                pos = nxt + 1
                if base_ts + n - 1 > _INT64_MAX:
                    raise _out_of_range("timestamp beyond 64 bits")
            elif b >= 0x80 and (n := _big_consecutive(data, pos, end)):
                timestamps = tuple(range(base_ts, base_ts + n))
                pos += len(encode_long(n)) + _CONSECUTIVE_END[n] + 1
                if base_ts + n - 1 > _INT64_MAX:
                    raise _out_of_range("timestamp beyond 64 bits")
            else:
                # base + delta: each fits 64 bits, their sum need not; _longs refuses it
                timestamps, pos = _longs(data, pos, end, base_ts)
            # keys, then values: all of one length (_same_length_items, inlined) or item by item
            column: tuple[bytes | None, ...] | None = None
            b = data[pos]
            if 0 < b < 0x80 and not b & 1 and data[pos + 1] == 2:
                n = b >> 1
                first = pos + 1
                c = data[first + 1]
                if c < 0x80 and not c & 1:  # one length byte
                    stride = 2 + (c >> 1)
                    stop = first + n * stride
                    if (
                        stop < end
                        and data[stop] == 0
                        and data[first:stop:stride] == _TWOS[n]
                        and data[first + 1 : stop : stride].count(c) == n
                    ):
                        unpack = unpackers.get((n, stride))
                        if unpack is None:
                            unpack = _unpacker(n, 2, stride)
                        column = unpack(data, first)
                        pos = stop + 1
                else:
                    column, pos = _same_length_items(data, pos, end)
            if column is None and b >= 0x80:
                column, pos = _big_same_length(data, pos, end)
            if column is None:
                column, pos = _nullables(data, pos, end)
            keys = column
            column = None
            b = data[pos]
            if 0 < b < 0x80 and not b & 1 and data[pos + 1] == 2:
                n = b >> 1
                first = pos + 1
                c = data[first + 1]
                d = data[first + 2] if c >= 0x80 else 0x80
                if d < 0x80 and not c & 1:  # two length bytes: 64..8191
                    stride = 3 + (((c & 0x7F) | (d << 7)) >> 1)
                    stop = first + n * stride
                    if (
                        stop < end
                        and data[stop] == 0
                        and data[first:stop:stride] == _TWOS[n]
                        and data[first + 1 : stop : stride].count(c) == n
                        and data[first + 2 : stop : stride].count(d) == n
                    ):
                        unpack = unpackers.get((n, stride))
                        if unpack is None:
                            unpack = _unpacker(n, 3, stride)
                        column = unpack(data, first)
                        pos = stop + 1
                elif c < 0x80 and not c & 1:
                    column, pos = _same_length_items(data, pos, end)
            if column is None and b >= 0x80:
                column, pos = _big_same_length(data, pos, end)
            if column is None:
                column, pos = _nullables(data, pos, end)
            values = column
            # headers: a column of empty arrays is one comparison
            b = data[pos]
            n = b >> 1
            if 0 < b < 0x80 and not b & 1 and data[pos + 1 : pos + n + 2] == _ZEROS[n]:
                headers = (_NO_HEADERS,) * n
                pos += n + 2
            elif (
                b >= 0x80
                and (big := _big_count(data, pos, end))[0]
                and data[big[1] : big[1] + big[0] + 1] == bytes(big[0] + 1)
            ):
                headers = (_NO_HEADERS,) * big[0]
                pos = big[1] + big[0] + 1
            else:
                headers, pos = _headers(data, pos, end)
            n = len(offsets)
            if not (len(timestamps) == len(keys) == len(values) == len(headers) == n):
                raise _bad("record batch columns differ in length")
            if not 0 <= partition <= 0x7FFFFFFF or not 0 <= ts_type <= 2:
                raise _out_of_range("partition or timestamp type out of range")
            if not 0 < len(topic) <= _MAX_TOPIC_LENGTH or "\x00" in topic:
                raise _out_of_range("topic name Kafka cannot carry")
            group = _new(RecordGroup)
            _g_topic(group, topic)
            _g_partition(group, partition)
            _g_ts_type(group, ts_type)
            _g_offsets(group, offsets)
            _g_timestamps(group, timestamps)
            _g_keys(group, keys)
            _g_values(group, values)
            _g_headers(group, headers)
            groups.append(group)
            total += n
        if data[pos] == 0:
            g = 0
            pos += 1
        else:
            g, pos = _block(data, pos, end)
    if pos != end:
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the record batch")
    return tuple(groups), total


def decode_record_groups(data: bytes) -> tuple[tuple[RecordGroup, ...], int]:
    """The groups of a record-batch payload (columns, no per-record objects) and the number of
    records in them.

    Raises:
        RemoteProtocolError: MALFORMED (bad Avro, inconsistent columns, out-of-range values) or
            TRAILING_BYTES. Nothing else: a read past the end (IndexError) is MALFORMED.
    """
    try:
        return _decode_groups(data)
    except IndexError:
        raise _bad("truncated record batch") from None
    except UnicodeDecodeError:
        raise _bad("string is not UTF-8") from None


def decode_record_batch(data: bytes) -> tuple[Record, ...]:
    """Records of a record-batch payload, in order (see :func:`decode_record_groups`).

    Raises:
        RemoteProtocolError: as :func:`decode_record_groups`.
    """
    return records_of(decode_record_groups(data)[0])


def heartbeat_offsets_problem(
    high_offsets: Sequence[tuple[str, int, int]], low_offsets: Sequence[tuple[str, int, int]]
) -> str | None:
    """Why a heartbeat's offset lists are inconsistent, or None when they are fine.

    Rules (docs/protocol.md §5): partitions in ``0 .. 2^31-1``, offsets in ``0 .. 2^63-1``, no
    (topic, partition) twice in a list, ``low_offsets`` names exactly the partitions of
    ``high_offsets``, and each low is at most its high. Both lists came from a bounded payload,
    so the work here is bounded by the message size.
    """
    highs: dict[tuple[str, int], int] = {}
    for name, items in (("high", high_offsets), ("low", low_offsets)):
        seen: dict[tuple[str, int], int] = {}
        for topic, partition, offset in items:
            if not (0 <= partition <= 0x7FFFFFFF and 0 <= offset <= _INT64_MAX):
                return f"{name} offset {topic}:{partition}:{offset} out of range"
            if (topic, partition) in seen:
                return f"{name} offsets list {topic}:{partition} twice"
            seen[topic, partition] = offset
        if name == "high":
            highs = seen
            continue
        if seen.keys() != highs.keys():
            return "low offsets do not name the same partitions as high offsets"
        for tp, low in seen.items():
            if low > highs[tp]:
                return f"low offset {low} above high offset {highs[tp]} for {tp[0]}:{tp[1]}"
    return None


def resend_marker_problem(
    ranges: Sequence[Mapping[str, Any]], records_sent: int, sent_at_ms: int
) -> str | None:
    """Why a decoded resend marker cannot be genuine, or None (docs/protocol.md §5).

    Rules: each range names a partition in ``0 .. 2^31-1`` and offsets ``0 <= first <= last``;
    ``records_sent`` is not negative and, when there are ranges, not more than they hold;
    ``sent_at_ms`` is not negative.
    """
    held = 0
    for r in ranges:
        if not 0 <= r["partition"] <= 0x7FFFFFFF or not 0 <= r["first"] <= r["last"]:
            return f"range {r['topic']}:{r['partition']}:{r['first']}-{r['last']} out of range"
        held += r["last"] - r["first"] + 1
    if records_sent < 0 or (ranges and records_sent > held):
        return f"records_sent {records_sent} for ranges holding {held}"
    if sent_at_ms < 0:
        return f"sent_at_ms {sent_at_ms}"
    return None


def withheld_problem(ranges: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a decoded withheld message cannot be genuine, or None (docs/protocol.md §5a).

    Rules: at least one range; each names a non-empty topic, a partition in ``0 .. 2^31-1`` and
    offsets ``0 <= first <= last``.
    """
    if not ranges:
        return "no ranges"
    for r in ranges:
        if (
            not r["topic"]
            or not 0 <= r["partition"] <= 0x7FFFFFFF
            or not 0 <= r["first"] <= r["last"]
        ):
            return f"range {r['topic']}:{r['partition']}:{r['first']}-{r['last']} out of range"
    return None


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
