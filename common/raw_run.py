"""Raw layout v2: one raw record per run of records (docs/topics.md "Layout v2").

The contract between the receiver, which writes runs, and the dedup, which reads them; the
verifier, ``kafka-diode raw dump`` and the tests read them from here too.

A **run** is a sequence of records of one sender session and one source (topic, partition, timestamp
type) whose offsets form an arithmetic progression ``first, first + stride, ..., last``: stride 1
for an ordinary sender, N for a share chain of N (docs/sender.md "Chains"), whose records are
``N`` apart. Its raw record:

- **key** ``<topic>:<partition>:<first>-<last>`` for stride 1,
  ``<topic>:<partition>:<first>-<last>/<stride>`` otherwise, in canonical decimal (no sign, no
  leading zeros); ``last - first`` is a multiple of ``stride``. A v1 key
  ``<topic>:<partition>:<offset>`` has no ``-``: both forms parse without a regular
  expression (split on the last two ``:``, then on ``-`` and ``/``).
- **value** an Avro ``RecordBatch`` of ``common/schema/record_batch.avsc`` (the wire's own record
  batch, docs/protocol.md §4) holding exactly one partition group: the run's topic, partition,
  timestamp type, base offset ``first``, base timestamp, and the five columns (offset deltas,
  timestamp deltas, keys, values, headers). Null and empty keys, values and header values stay
  apart; any Avro reader given that schema reads it.
- **headers** exactly one, ``diode.session``: the sender session id in lower-case hex.

A key and its value must agree (topic, partition, first offset, count and stride): :func:`check_run`
is the one rule, applied by the dedup before it observes a run's offsets; a run that breaks it is
malformed, counted and never forwarded, so its offsets stay gaps until a resend.

Why runs: the sender already groups consecutive offsets of a partition into each datagram; keeping
them grouped makes every per-row cost of the low side (producing, storing, the dedup's Spark row,
its shuffle and Arrow conversion) per run instead of per record (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from common.errors import RemoteProtocolError
from common.raw_topic import MAX_CHAINS, raw_key, timestamp_type_header
from common.wire.batch_decode import decode_record_groups
from common.wire.batch_encode import NULL_ITEM, bytes_item, encode_headers
from common.wire.envelope import SMALL_LONGS, encode_long
from common.wire.events import DropReason, Headers, RecordGroup

#: The one header of a v2 raw record.
SESSION_HEADER: Final = "diode.session"
#: Largest stride a run key may carry: a share chain's N (``common.raw_topic.MAX_CHAINS``).
MAX_STRIDE: Final = MAX_CHAINS
_MAX_PARTITION: Final = 2**31 - 1
_MAX_OFFSET: Final = 2**63 - 1
_SMALL: Final = 1 << 14
_NULL: Final = b"\x00"
_END: Final = b"\x00"
#: Bytes of a run's value besides its topic, base offset, base timestamp and column items: the
#: groups block and end, topic length, partition, timestamp type, and the five columns' counts
#: (up to 10 bytes each) and ends.
_HEAD: Final = 2 + 2 + 5 + 1 + 5 * 11


def _long(n: int) -> bytes:
    return SMALL_LONGS[n] if 0 <= n < _SMALL else encode_long(n)


# -- keys ---------------------------------------------------------------------------------------


def run_key(topic: str, partition: int, first: int, last: int, stride: int = 1) -> str:
    """The raw key of a run (module docstring)."""
    if stride == 1:
        return f"{topic}:{partition}:{first}-{last}"
    return f"{topic}:{partition}:{first}-{last}/{stride}"


def _canonical(text: str, limit: int) -> int | None:
    """A canonical non-negative decimal up to ``limit``, or None."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    if len(text) > 1 and text[0] == "0":
        return None
    value = int(text)
    return value if value <= limit else None


def parse_run_key(key: str | bytes | None) -> tuple[str, int, int, int, int] | None:
    """``(topic, partition, first, last, stride)`` of a v2 key, or None if it is not one.

    The same rule as the dedup's SQL (``dedup.classify_sql``): canonical decimals,
    ``first <= last``, ``1 <= stride <= MAX_STRIDE`` and ``last - first`` a multiple of ``stride``.
    """
    if key is None:
        return None
    if isinstance(key, bytes):
        try:
            key = key.decode("ascii")
        except UnicodeDecodeError:
            return None
    topic, sep1, rest = key.rpartition(":")
    topic, sep2, part = topic.rpartition(":")
    if not (sep1 and sep2 and topic):
        return None
    span, slash, stride_text = rest.partition("/")
    first_text, dash, last_text = span.partition("-")
    if not dash:
        return None
    partition = _canonical(part, _MAX_PARTITION)
    first = _canonical(first_text, _MAX_OFFSET)
    last = _canonical(last_text, _MAX_OFFSET)
    stride = _canonical(stride_text, MAX_STRIDE) if slash else 1
    if partition is None or first is None or last is None or stride is None:
        return None
    if stride < 1 or first > last or (last - first) % stride or (slash and stride == 1):
        return None
    return topic, partition, first, last, stride


# -- values -------------------------------------------------------------------------------------


class RunBuilder:
    """Encodes one run's value, record by record, tracking its exact encoded size.

    The encoding is the record batch's (one group, one block per column), byte for byte what
    fastavro writes for ``record_batch.avsc``.
    """

    __slots__ = (
        "_headers",
        "_keys",
        "_od",
        "_td",
        "_values",
        "base_ts",
        "count",
        "first",
        "last",
        "partition",
        "size",
        "stride",
        "topic",
        "ts_type",
    )

    def __init__(self, topic: str, partition: int, ts_type: int, first: int, base_ts: int) -> None:
        self.topic = topic
        self.partition = partition
        self.ts_type = ts_type
        self.first = first
        self.last = first
        self.stride = 0  # fixed by the second record
        self.base_ts = base_ts
        self.count = 0
        self._od = bytearray()
        self._td = bytearray()
        self._keys = bytearray()
        self._values = bytearray()
        self._headers = bytearray()
        #: encoded size, exact but for the column counts (at most ``_COUNTS`` bytes more)
        self.size = _HEAD + len(topic) + len(encode_long(first)) + len(encode_long(base_ts))

    def follows(self, offset: int) -> bool:
        """Whether ``offset`` continues this run (the next one of its progression)."""
        if self.count == 1:
            return 0 < offset - self.last <= MAX_STRIDE
        return offset - self.last == self.stride

    def append(
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
    ) -> None:
        """Add the next record (the caller checked :meth:`follows`, except for the first)."""
        if self.count == 1:
            self.stride = offset - self.first
        od = _long(offset - self.first)
        td = _long(timestamp - self.base_ts)
        self._od += od
        self._td += td
        grown = len(od) + len(td)
        if key is None:
            self._keys += _NULL
            grown += 1
        else:
            prefix, n = bytes_item(len(key))
            self._keys += prefix
            self._keys += key
            grown += n
        if value is None:
            self._values += _NULL
            grown += 1
        else:
            prefix, n = bytes_item(len(value))
            self._values += prefix
            self._values += value
            grown += n
        if headers:
            encoded = encode_headers(headers)
            self._headers += encoded
            grown += len(encoded)
        else:
            self._headers += _END
            grown += 1
        self.count += 1
        self.last = offset
        self.size += grown

    def append_next(  # noqa: PLR0917  the receiver's per-record path, positional
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        max_size: int,
    ) -> bool:
        """Append a record that continues the run by stride 1, if its timestamp delta fits a
        long and the value stays within ``max_size``; False (nothing appended) otherwise.

        Why: a record of 1 KB and up fills a datagram alone and arrives as a group of one; here
        it costs about half of what the general checks and :meth:`extend`'s joins cost. The
        bytes are exactly those :meth:`append` adds (tests/property/test_raw_run.py).
        """
        if offset != self.last + 1 or self.stride > 1:
            return False
        d = offset - self.first
        delta = timestamp - self.base_ts
        if not -(1 << 63) <= delta < 1 << 63:
            return False
        od = SMALL_LONGS[d] if d < _SMALL else encode_long(d)
        td = SMALL_LONGS[delta] if 0 <= delta < _SMALL else encode_long(delta)
        kb, kn = NULL_ITEM if key is None else bytes_item(len(key))
        vb, vn = NULL_ITEM if value is None else bytes_item(len(value))
        hb = encode_headers(headers) if headers else _END
        grown = len(od) + len(td) + kn + vn + len(hb)
        if self.size + grown > max_size:
            return False
        self.stride = 1
        self._od += od
        self._td += td
        self._keys += kb
        if key:
            self._keys += key
        self._values += vb
        if value:
            self._values += value
        self._headers += hb
        self.count += 1
        self.last = offset
        self.size += grown
        return True

    def extend(  # noqa: PLR0917  the columns of a group, positional like append
        self,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        headers: Sequence[Headers],
        max_size: int,
        headers_bytes: bytes | None = None,
    ) -> bool:
        """Append records in one piece, if the value stays within ``max_size``; False (nothing
        appended) otherwise.

        The caller checked that ``offsets`` continue the run by stride 1 (``offsets[0]`` follows
        and each is the previous plus one) and that every timestamp's delta from the base fits a
        long. The bytes are exactly those :meth:`append` would add, record by record.
        ``headers_bytes``, when given, is ``headers`` encoded (``RecordGroup.headers_bytes``:
        the decoder read them so), taken instead of encoding them again.
        """
        first, base = self.first, self.base_ts
        start = offsets[0] - first
        n = len(offsets)
        if start + n <= _SMALL:  # consecutive small deltas: one slice of the table
            od = b"".join(SMALL_LONGS[start : start + n])
        else:
            od = b"".join([_long(offset - first) for offset in offsets])
        td = b"".join([_long(timestamp - base) for timestamp in timestamps])
        kb = b"".join([_NULL if k is None else bytes_item(len(k))[0] + k for k in keys])
        vb = b"".join([_NULL if v is None else bytes_item(len(v))[0] + v for v in values])
        if headers_bytes is not None:
            hb = headers_bytes
        elif any(headers):
            hb = b"".join([encode_headers(h) if h else _END for h in headers])
        else:
            hb = _END * n
        grown = len(od) + len(td) + len(kb) + len(vb) + len(hb)
        if self.size + grown > max_size:
            return False
        if self.count == 1:
            self.stride = 1
        self._od += od
        self._td += td
        self._keys += kb
        self._values += vb
        self._headers += hb
        self.count += n
        self.last = offsets[-1]
        self.size += grown
        return True

    def key(self) -> str:
        """The run's raw key."""
        return run_key(self.topic, self.partition, self.first, self.last, max(1, self.stride))

    def encode(self) -> bytes:
        """The run's value (one ``RecordBatch`` with one group)."""
        count = _long(self.count)
        topic = self.topic.encode()
        parts: list[bytes | bytearray] = [
            b"\x02",  # one group
            _long(len(topic)),
            topic,
            _long(self.partition),
            _long(self.ts_type),
            encode_long(self.first),
            encode_long(self.base_ts),
        ]
        for column in (self._od, self._td, self._keys, self._values, self._headers):
            parts.append(count)
            parts.append(column)
            parts.append(_END)
        parts.append(_END)
        return b"".join(parts)


def check_run(  # noqa: PLR0917  the key's parts, as parse_run_key returns them
    value: bytes | None, topic: str, partition: int, first: int, last: int, stride: int
) -> RecordGroup:
    """The run's one group, if ``value`` is a run that agrees with its key; raises otherwise.

    Raises:
        RemoteProtocolError: MALFORMED: not a record batch, not exactly one group, or topic,
            partition or offsets other than the key's.
    """
    if value is None:
        raise RemoteProtocolError(DropReason.MALFORMED, "a run without a value")
    groups, _ = decode_record_groups(value)
    if len(groups) != 1:
        raise RemoteProtocolError(DropReason.MALFORMED, "a run holds exactly one group")
    group = groups[0]
    offsets = group.offsets
    if (
        group.topic != topic
        or group.partition != partition
        or not offsets
        or offsets[0] != first
        or offsets[-1] != last
        or len(offsets) != (last - first) // stride + 1
        or (len(offsets) > 1 and not _progression(offsets, stride))
    ):
        raise RemoteProtocolError(DropReason.MALFORMED, "run value does not match its key")
    return group


def _progression(offsets: Sequence[int], stride: int) -> bool:
    first = offsets[0]
    return offsets == tuple(range(first, first + stride * len(offsets), stride))


# -- reading back (tests, ``raw dump``, the verifier) ---------------------------------------------


def expand_run(
    key: str | bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> list[tuple[str, bytes | None, list[tuple[str, bytes | None]]]] | None:
    """The v1 raw records a v2 run stands for, as ``(key, value, headers)``; None if ``key`` is not
    a run key.

    Each record as the v1 layout wrote it (common/raw_topic.py): key
    ``<topic>:<partition>:<offset>``, the source value, the source headers followed by the four
    provenance headers. For readers that reason per source record (tests, the verifier); the
    dedup reads runs as they are.

    Raises:
        RemoteProtocolError: MALFORMED: a run key whose value does not match it (:func:`check_run`)
            or a run without its ``diode.session`` header.
    """
    parsed = parse_run_key(key)
    if parsed is None:
        return None
    group = check_run(value, *parsed)
    session = next((v for name, v in headers if name == SESSION_HEADER), None)
    if session is None:
        raise RemoteProtocolError(DropReason.MALFORMED, "a run without its diode.session header")
    kind = timestamp_type_header(group.timestamp_type)
    return [
        (
            raw_key(group.topic, group.partition, offset),
            record_value,
            [
                *record_headers,
                ("diode.key", record_key),
                ("diode.timestamp", b"%d" % timestamp),
                kind,
                (SESSION_HEADER, session),
            ],
        )
        for offset, timestamp, record_key, record_value, record_headers in zip(
            group.offsets, group.timestamps, group.keys, group.values, group.headers, strict=True
        )
    ]
