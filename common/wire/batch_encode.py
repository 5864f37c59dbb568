"""The record batch (kind 0) encoder: ``BatchBuilder`` and the column encoders.

The record batch is the Avro record of ``common/schema/record_batch.avsc``: an array of partition
groups, each holding topic, partition and timestamp type once, a base offset and timestamp, and
the records as five columns (offset deltas, timestamp deltas, keys, values, headers). The encoder
is hand-written for speed and produces exactly the bytes fastavro produces for that schema (one
block per array); ``common/wire/batch_decode.py`` reads it back, ``common/wire/control.py`` holds
the control messages. docs/protocol.md §4.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from common.wire.envelope import (
    LAST14,
    MORE14,
    SMALL_LONGS,
    encode_long,
    encode_varint,
    load_schema,
    varint_size,
)

RECORD_BATCH_SCHEMA: Final = load_schema("record_batch")

_SMALL: Final = 1 << 14
_NULL: Final = b"\x00"
PRESENT: Final = b"\x02"
_EMPTY_ARRAY: Final = b"\x00"
_ONE_GROUP: Final = b"\x02"  # an array block of one item
_TWO_ENDS: Final = b"\x00\x00"  # the end of the last column and of the groups array
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
#: A base this far inside the 64-bit range cannot leave it by adding a one-byte long (-64..63).
_SMALL_DELTA_EDGE: Final = _INT64_MAX - 64
#: Kafka's longest topic name; a NUL in a name makes the Kafka client raise ValueError.
_MAX_TOPIC_LENGTH: Final = 249


def long_bytes(n: int) -> bytes:
    """An Avro long (a table lookup below 2^14)."""
    return SMALL_LONGS[n] if 0 <= n < _SMALL else encode_long(n)


def string_bytes(s: str) -> bytes:
    """An Avro string."""
    raw = s.encode("utf-8")
    return long_bytes(len(raw)) + raw


#: Header name -> its Avro string: records repeat a few names (sender and receiver encode the
#: headers of every record that has any). Bounded (cleared when full): names come from upstream.
_HEADER_NAME_BYTES: dict[str, bytes] = {}
_MAX_HEADER_NAMES: Final = 4096


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """One record's headers as an Avro ``array<Header>``."""
    if not headers:
        return _EMPTY_ARRAY
    n = len(headers)
    parts = [SMALL_LONGS[n] if n < _SMALL else encode_long(n)]
    append = parts.append
    names = _HEADER_NAME_BYTES
    for name, value in headers:
        encoded = names.get(name)
        if encoded is None:
            encoded = string_bytes(name)
            if len(names) >= _MAX_HEADER_NAMES:
                names.clear()
            names[name] = encoded
        append(encoded)
        if value is None:
            append(_NULL)
        else:
            m = len(value)
            append(BYTES_ITEMS[m][0] if m < _ITEM_TABLE else PRESENT + encode_long(m))
            append(value)
    append(_EMPTY_ARRAY)
    return b"".join(parts)


#: ``(prefix, encoded size)`` of a ``union{null, bytes}`` of each length below 4096: the prefix is
#: ``b"\x02"`` (the bytes branch) and the length; the size counts prefix and bytes.
_ITEM_TABLE: Final = 4096
BYTES_ITEMS: Final = tuple(
    (PRESENT + SMALL_LONGS[n], 1 + len(SMALL_LONGS[n]) + n) for n in range(_ITEM_TABLE)
)
NULL_ITEM: Final = (_NULL, 1)


def bytes_item(n: int) -> tuple[bytes, int]:
    """``(prefix, encoded size)`` of a non-null ``union{null, bytes}`` of ``n`` bytes."""
    if n < len(BYTES_ITEMS):
        return BYTES_ITEMS[n]
    prefix = PRESENT + encode_long(n)
    return prefix, len(prefix) + n


#: Encoded ``topic, partition, timestamp type`` of each group seen, so a group head costs two
#: varints; bounded (cleared when full), as topic names come from the caller.
_HEADS: dict[tuple[str, int, int], bytes] = {}
_MAX_HEADS: Final = 4096


def group_head(wire_topic: str, partition: int, ts_type: int) -> bytes:
    """The encoded ``topic, partition, timestamp type`` of a group (cached in ``_HEADS``)."""
    head = _HEADS.get((wire_topic, partition, ts_type))
    if head is None:
        if len(_HEADS) >= _MAX_HEADS:
            _HEADS.clear()
        head = _HEADS[wire_topic, partition, ts_type] = (
            string_bytes(wire_topic) + long_bytes(partition) + long_bytes(ts_type)
        )
    return head


#: A group's count of one and the offset and timestamp columns of its one record (zero deltas),
#: then the count of the keys column: what sits between the group head and the first key.
_ONE_RECORD_DELTAS: Final = b"\x02\x00\x00\x02\x00\x00\x02"
_END_AND_ONE: Final = b"\x00\x02"  # a column's end marker, then the next column's count of one


def single_record_batch(  # noqa: PLR0917  the encoder's large-record path, positional
    wire_topic: str,
    partition: int,
    ts_type: int,
    offset: int,
    timestamp: int,
    kprefix: bytes,
    key: bytes | None,
    vprefix: bytes,
    value: bytes | None,
    headers_blob: bytes,
) -> bytes:
    """The batch of one record: exactly ``BatchBuilder`` with that record alone, ``encode()``d,
    in one join (no builder, no group, the value copied once). ``kprefix``/``vprefix`` are the
    union prefixes of :func:`bytes_item` (or ``NULL_ITEM``)."""
    head = group_head(wire_topic, partition, ts_type) + encode_long(offset) + encode_long(timestamp)
    return b"".join((
        _ONE_GROUP, head, _ONE_RECORD_DELTAS, kprefix, key or b"", _END_AND_ONE, vprefix,
        value or b"", _END_AND_ONE, headers_blob, _TWO_ENDS,
    ))  # fmt: skip


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
        head = group_head(wire_topic, partition, ts_type)
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
        prefix = long_bytes(self.count)
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
            p = long_bytes(g.count)
            return b"".join((
                _ONE_GROUP, g.head, p, g.od, _EMPTY_ARRAY, p, g.td, _EMPTY_ARRAY, p, g.keys,
                _EMPTY_ARRAY, p, g.values, _EMPTY_ARRAY, p, g.headers, _TWO_ENDS,
            ))  # fmt: skip
        if not self._groups:
            return _EMPTY_ARRAY
        out: list[bytes | bytearray] = [long_bytes(len(self._groups))]
        for group in self._groups.values():
            group.encode(out)
        out.append(_EMPTY_ARRAY)
        return b"".join(out)


# -- decoding ---------------------------------------------------------------------------------
