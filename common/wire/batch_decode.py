"""The record batch (kind 0) decoder: hostile-input safe, column by column.

Accepts any valid Avro encoding of ``common/schema/record_batch.avsc`` (several blocks, negative
counts with a byte size), whether a datagram's batch (a few records per group) or a raw topic's
run (``common/raw_run.py``: thousands of records in one group). Every length and count is
checked against the bytes that remain before anything is allocated, and any inconsistency raises
``RemoteProtocolError`` (never another exception). docs/protocol.md §4.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import numpy as np

from common.errors import RemoteProtocolError
from common.wire.batch_encode import (
    PRESENT,
    RECORD_BATCH_SCHEMA,
    encode_headers,
    long_bytes,
    string_bytes,
)
from common.wire.envelope import (
    encode_long,
)
from common.wire.events import DropReason, Headers, Record, RecordGroup, records_of

__all__ = ["RECORD_BATCH_SCHEMA", "decode_record_batch", "decode_record_groups"]

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
#: A base this far inside the 64-bit range cannot leave it by adding a one-byte long (-64..63).
_SMALL_DELTA_EDGE: Final = _INT64_MAX - 64
#: Kafka's longest topic name; a NUL in a name makes the Kafka client raise ValueError.
_MAX_TOPIC_LENGTH: Final = 249


#
# Speed: the decoder works column by column over the payload bytes with the common cases done
# by C-level operations on a whole column: offset/timestamp deltas that are all one-byte varints
# (``bytes.isascii``) become ints through a lookup table, consecutive deltas (0, 1, 2, ...) are
# recognised by one bytes comparison, and a column of empty header arrays by another. Only keys
# and values need a Python step per item. Anything unusual falls back to the general reader,
# which accepts every valid Avro encoding (several blocks, negative counts with a byte size).

_new = object.__new__
(
    _g_topic,
    _g_partition,
    _g_ts_type,
    _g_offsets,
    _g_timestamps,
    _g_keys,
    _g_values,
    _g_headers,
    _g_headers_bytes,
) = (getattr(RecordGroup, name).__set__ for name in RecordGroup.__slots__)

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


class _Layout(NamedTuple):
    """A header *layout* (names in order, each value's length, no null value): ``pattern`` is
    its canonical encoding with the values as groups. Every structural byte is fixed in it and
    only the value bytes are free, so whatever it matches decodes, by the general reading, to
    exactly ``names`` and the matched values. Each record in the layout takes ``size`` bytes,
    so ``column`` (the same without groups, repeated) matched over ``n * size`` bytes proves
    that ``n`` records in a row are in it."""

    pattern: re.Pattern[bytes]
    names: tuple[str, ...]
    size: int
    column: re.Pattern[bytes]


#: Layouts by ``(name, value length)`` pairs. Bounded (cleared when full), and at most
#: ``_COMPILES_PER_COLUMN`` compiled per column: layouts come from the wire.
_LAYOUTS: dict[tuple[tuple[str, int], ...], _Layout] = {}
_MAX_LAYOUTS: Final = 256
_COMPILES_PER_COLUMN: Final = 2
#: Where the last column of canonically encoded headers ended: its last record's header bytes
#: and headers, and the layout of its last records (or None). The next column starts from them,
#: so a column of small records in the same layout is read in one piece, not record by record
#: from the third on; a hint only (what matches it decodes to the same headers either way).
_LAST_HEADERS: list[tuple[bytes, Headers, _Layout | None]] = [(b"", (), None)]


def _layout(key: tuple[tuple[str, int], ...]) -> _Layout:
    """The layout of ``key`` (see :class:`_Layout`), compiled and kept in :data:`_LAYOUTS`."""
    head = long_bytes(len(key))
    fixed = [re.escape(head)]
    size = len(head) + 1
    for name, n in key:
        literal = string_bytes(name) + PRESENT + long_bytes(n)
        fixed.append(re.escape(literal))
        size += len(literal) + n
    grouped = [fixed[0]]
    bare = [fixed[0]]
    for literal, (_, n) in zip(fixed[1:], key, strict=True):
        grouped += [literal, b"(.{%d})" % n]
        bare += [literal, b".{%d}" % n]
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    layout = _LAYOUTS[key] = _Layout(
        re.compile(b"".join(grouped) + b"\x00", re.DOTALL),
        tuple(n for n, _ in key),
        size,
        re.compile(b"(?:" + b"".join(bare) + b"\x00)*", re.DOTALL),
    )
    return layout


def _headers(data: bytes, pos: int, end: int) -> tuple[tuple[Headers, ...], int, bytes | None]:
    """The ``array<array<Header>>`` column, its end, and its records' header bytes when each is
    canonical (``encode_headers``'s bytes) in one block (``RecordGroup.headers_bytes``; else None).

    Fast paths, each exactly what the general reading gives (the fuzz and property tests hold
    them to it): a column of empty arrays; a record whose header bytes are byte for byte the
    previous record's (constant headers: the same bytes parse to the same headers, so the
    previous tuple is reused after one comparison); a record in the layout of the two records
    before it (same names, same value lengths: trace ids, content types), matched by one compiled
    pattern (:data:`_LAYOUTS`); a whole block of either kind in one piece, the previous record
    and layout being the last column's to begin with (:data:`_LAST_HEADERS`); otherwise names
    and values with one-byte lengths read inline, names looked up in :data:`_HEADER_NAMES`
    instead of decoded again. A record read that way counts as canonical only if
    ``encode_headers`` gives its bytes back.
    """
    b = data[pos]
    if 0 < b < 0x80 and not b & 1:  # one block of n < 64 items...
        n = b >> 1
        nxt = pos + 1 + n
        if data[pos + 1 : nxt + 1] == bytes(n + 1):  # ...all empty, then the end of the array
            return (_NO_HEADERS,) * n, nxt + 1, data[pos + 1 : nxt]
    out: list[Headers] = []
    names = _HEADER_NAMES
    # the previous record's header bytes and what they decoded to, and the layout of the last
    # two records, if any: to begin with, the last canonical column's (_LAST_HEADERS)
    previous, previous_headers, layout = _LAST_HEADERS[0]
    last_key: tuple[tuple[str, int], ...] | None = None
    compiles = 0
    canonical = True  # every record so far in encode_headers's bytes, in one block
    records_start = -1
    while True:
        n, pos = _block(data, pos, end)
        if not n:
            if canonical and records_start >= 0:
                _LAST_HEADERS[0] = (previous, previous_headers, layout)
                return tuple(out), pos, data[records_start : pos - 1]
            return tuple(out), pos, None
        if records_start < 0:
            records_start = pos
        else:  # a second block: its count sits between records
            canonical = False
        stop = pos + n * len(previous)
        if previous and stop <= end and data[pos:stop] == previous * n:  # all the same
            out += [previous_headers] * n
            pos = stop
            continue
        if layout is not None:  # the whole block in the last records' layout: two calls
            stop = pos + n * layout.size
            if stop <= end and layout.column.fullmatch(data, pos, stop) is not None:
                found = layout.pattern.findall(data, pos, stop)
                if len(layout.names) == 1:  # findall gives the one group's values
                    only = layout.names[0]
                    out += [((only, value),) for value in found]
                else:
                    names_of = layout.names
                    out += [tuple(zip(names_of, values, strict=True)) for values in found]
                previous, previous_headers = data[stop - layout.size : stop], out[-1]
                pos = stop
                continue
        for _ in range(n):
            if previous and data.startswith(previous, pos) and pos + len(previous) <= end:
                out.append(previous_headers)
                pos += len(previous)
                continue
            if layout is not None:
                match = layout.pattern.match(data, pos, end)
                if match is not None:
                    out.append(tuple(zip(layout.names, match.groups(), strict=True)))
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
            if canonical and previous != encode_headers(headers):
                canonical = False
            if headers and compiles < _COMPILES_PER_COLUMN:
                key = tuple((name, -1 if value is None else len(value)) for name, value in headers)
                if key == last_key and len(key) < 64 and min(n for _, n in key) >= 0:
                    layout = _LAYOUTS.get(key)
                    if layout is None:
                        compiles += 1
                        layout = _layout(key)
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
                headers_bytes: bytes | None = None  # RunBuilder.extend's fast path needs none
            elif (
                b >= 0x80
                and (big := _big_count(data, pos, end))[0]
                and data[big[1] : big[1] + big[0] + 1] == bytes(big[0] + 1)
            ):
                headers = (_NO_HEADERS,) * big[0]
                pos = big[1] + big[0] + 1
                headers_bytes = None
            else:
                headers, pos, headers_bytes = _headers(data, pos, end)
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
            _g_headers_bytes(group, headers_bytes)
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


#: What follows the offset and timestamp of a one-record batch: its offset and timestamp delta
#: columns (one zero each, then their ends) and the keys column's count of one.
_ONE_RECORD_DELTAS: Final = b"\x02\x00\x00\x02\x00\x00\x02"
#: The end of the keys column and the values column's count of one.
_END_AND_ONE: Final = b"\x00\x02"
#: After a one-record batch's value: the end of the values column, the headers column's count of
#: one, the record's empty header array, the ends of the headers column and of the groups.
_ONE_RECORD_END: Final = b"\x00\x02\x00\x00\x00"


def _item(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    """The ``union{null, bytes}`` item at ``pos`` and where it ends, or ``(None, -1)``."""
    b = data[pos]
    if b == 0:
        return None, pos + 1
    if b != 2:
        return None, -1
    c = data[pos + 1]
    if c < 0x80:  # a length below 64, or (two bytes) below 8192: no call
        n, pos = _ZIGZAG[c], pos + 2
    elif (d := data[pos + 2]) < 0x80:
        acc = (c & 0x7F) | d << 7
        n, pos = (acc >> 1) ^ -(acc & 1), pos + 3
    else:
        n, pos = _read_long(data, pos + 1, end)
    if n < 0 or pos + n > end:
        return None, -1
    return data[pos : pos + n], pos + n


#: The head (topic length, topic, partition, timestamp type) and the timestamp of the last
#: one-record batch read, raw and decoded: a stream's consecutive datagrams repeat both, and a
#: varint's bytes say where it ends, so equal bytes are the same values. Tuples: one read each.
_LAST_HEAD: list[tuple[bytes, str, int, int]] = [(b"", "", 0, 0)]
_LAST_TS: list[tuple[bytes, int]] = [(b"\x00", 0)]


def _short_headers(data: bytes, pos: int, end: int) -> Headers | None:
    """The headers of a one-record batch's only record at ``pos``, when they are one block of
    fewer than 64 headers, each name and value shorter than 64 bytes, followed by the ends of
    the record's array, of the headers column and of the groups (the batch's last three bytes);
    else None, and ``_headers`` reads them. What ``_headers`` reads from the same bytes: its
    per-header reading, names from :data:`_HEADER_NAMES` (its four block reads and its layout
    bookkeeping are what a single record does not need). UnicodeDecodeError: see the caller."""
    b = data[pos]
    if not 0 < b < 0x80 or b & 1:
        return None
    names = _HEADER_NAMES
    items: list[tuple[str, bytes | None]] = []
    pos += 1
    for _ in range(b >> 1):
        b = data[pos]
        if b >= 0x80 or b & 1:
            return None
        nxt = pos + 1 + (b >> 1)
        raw = data[pos + 1 : nxt]
        name = names.get(raw)
        if name is None:
            name = raw.decode("utf-8")
            if len(names) >= _MAX_HEADER_NAMES:
                names.clear()
            names[raw] = name
        b = data[nxt]
        if b == 0:
            items.append((name, None))
            pos = nxt + 1
        elif b == 2 and (c := data[nxt + 1]) < 0x80 and not c & 1:
            pos = nxt + 2 + (c >> 1)
            items.append((name, data[nxt + 2 : pos]))
        else:
            return None
    if pos != end - 3 or data[pos:] != _THREE_ENDS:
        return None
    return tuple(items)


#: The ends of a record's header array, of the headers column and of the groups.
_THREE_ENDS: Final = b"\x00\x00\x00"


def _one_record(data: bytes) -> tuple[tuple[RecordGroup, ...], int] | None:
    """The batch of one record, in the shape the encoder writes it
    (``batch_encode.single_record_batch``, and ``BatchBuilder`` with one record): one group,
    short topic name, partition below 64; else None, and the general reader decides. Its
    headers, if any, are read by ``_short_headers``, or by the general reader's ``_headers``
    when they are not that short.

    Why: a record that fills a datagram alone (1 KB and up) is such a batch, and here it costs
    about half of what the general reader's column checks cost (10 KB: ~3 us against ~6
    without headers, ~4 against ~9 with one). Every value
    it returns is what ``_decode_groups`` returns for the same bytes, and it returns None for
    anything the general reader would refuse (tests/property/test_batch_decode_one_record.py).
    """
    end = len(data)
    if end < 20:  # the shortest: a one-byte topic, null key and value
        return None
    b = data[1]
    pos = 2 + (b >> 1)
    if b >= 0x80 or b & 1 or pos + 2 > end:
        return None
    raw_head, topic, partition, ts_type = _LAST_HEAD[0]
    if data[1 : pos + 2] != raw_head:
        partition = data[pos]
        ts_type = data[pos + 1]
        if partition >= 0x80 or partition & 1 or ts_type > 4 or ts_type & 1:
            return None
        try:
            topic = data[2:pos].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not 0 < len(topic) <= _MAX_TOPIC_LENGTH or "\x00" in topic:
            return None
        partition >>= 1
        ts_type >>= 1
        _LAST_HEAD[0] = (data[1 : pos + 2], topic, partition, ts_type)
    try:
        offset, pos = _read_long(data, pos + 2, end)
        raw_ts, timestamp = _LAST_TS[0]
        if data[pos : pos + len(raw_ts)] == raw_ts:
            pos += len(raw_ts)
        else:
            start = pos
            timestamp, pos = _read_long(data, pos, end)
            _LAST_TS[0] = (data[start:pos], timestamp)
        if data[pos : pos + 7] != _ONE_RECORD_DELTAS:
            return None
        key, pos = _item(data, pos + 7, end)
        if pos < 0 or data[pos : pos + 2] != _END_AND_ONE:
            return None
        value, pos = _item(data, pos + 2, end)
        if pos < 0:
            return None
        if data[pos:] == _ONE_RECORD_END:
            headers: tuple[Headers, ...] = (_NO_HEADERS,)
        elif data[pos : pos + 2] == _END_AND_ONE:  # a headers column of one record's headers
            one = _short_headers(data, pos + 2, end)
            if one is None:
                headers, pos, _ = _headers(data, pos + 1, end)
                if len(headers) != 1 or pos != end - 1 or data[pos] != 0:  # then the groups' end
                    return None
            else:
                headers = (one,)
        else:
            return None
    except (IndexError, RemoteProtocolError, UnicodeDecodeError):
        return None
    if not 0 <= offset <= _INT64_MAX or not _INT64_MIN <= timestamp <= _INT64_MAX:
        return None
    group = _new(RecordGroup)
    _g_topic(group, topic)
    _g_partition(group, partition)
    _g_ts_type(group, ts_type)
    _g_offsets(group, (offset,))
    _g_timestamps(group, (timestamp,))
    _g_keys(group, (key,))
    _g_values(group, (value,))
    _g_headers(group, headers)
    _g_headers_bytes(group, None)
    return (group,), 1


def decode_record_groups(data: bytes) -> tuple[tuple[RecordGroup, ...], int]:
    """The groups of a record-batch payload (columns, no per-record objects) and the number of
    records in them.

    Raises:
        RemoteProtocolError: MALFORMED (bad Avro, inconsistent columns, out-of-range values) or
            TRAILING_BYTES. Nothing else: a read past the end (IndexError) is MALFORMED.
    """
    if data[:1] == b"\x02" and (one := _one_record(data)) is not None:
        return one
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
