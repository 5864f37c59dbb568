"""The sans-IO encoder: records and control messages in, datagrams out (docs/protocol.md §2-6).

Theory of operation. Records accumulate in one record batch (columns per partition group) until
the next record would not fit one datagram's capacity, or ``linger`` seconds passed since the
first pending record (``poll``), or the caller flushes. Each batch becomes one message; a message
longer than one datagram (a large record alone) is cut into fragments. Without compression, a
record whose key, value and headers fill a datagram's capacity on their own is sealed alone at
once, its batch built in one join (``single_record_batch``, the same bytes as the builder's).
Pipeline per message: Avro batch -> gzip or zstd if configured and smaller -> per fragment
AES-256-GCM with the 44-byte header as associated data -> envelope. Every datagram gets the next
sequence number of the session; copies sent for redundancy are the same bytes (the caller sends
``data`` N times).

Guarantees: no datagram exceeds ``max_datagram_size``; sequence numbers never repeat within the
session (exhaustion at 2**64 raises); ``completes`` on a datagram lists, per partition, the
highest offset whose last byte it carries, so a sender may commit offsets up to that once the
datagram and all before it were handed to the socket. The encoder never reads a clock: ``now``
is passed in, in seconds on any monotonic scale.

With gzip the batch fills to ``capacity x`` a running estimate of the compression ratio (kept a
little pessimistic); a batch that still compresses to more than one datagram is fragmented and
the estimate lowered.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from common.errors import ConfigError, LocalProtocolError, RecordTooLarge
from common.wire import compression as gzip_codec
from common.wire.batch_encode import (
    BYTES_ITEMS,
    NULL_ITEM,
    BatchBuilder,
    bytes_item,
    encode_headers,
    single_record_batch,
)
from common.wire.config import WireConfig, fragment_capacity
from common.wire.control import (
    HEARTBEAT_SCHEMA,
    RESEND_MARKER_SCHEMA,
    WITHHELD_SCHEMA,
    encode_control,
    heartbeat_offsets_problem,
)
from common.wire.crypto import SessionCipher
from common.wire.envelope import (
    CIPHER_AES_256_GCM,
    CIPHER_NONE,
    COMPRESSION_NONE,
    KIND_HEARTBEAT,
    KIND_RECORD_BATCH,
    KIND_RESEND_MARKER,
    KIND_WITHHELD,
    MAGIC,
    MAX_SEQUENCE,
    SESSION_ID_SIZE,
    SMALL_LONGS,
    TAG_SIZE,
    VERSION,
    build_header,
    encode_long,
    frame,
    varint_size,
)
from common.wire.events import RESEND_PHASES
from common.wire.keyring import KeyRing


class SequenceExhaustedError(LocalProtocolError):
    """The session used all 2**64 sequence numbers; start a new session (new session id)."""


@dataclass(frozen=True, slots=True)
class OutgoingDatagram:
    """One datagram to hand to the socket (as many times as the redundancy asks)."""

    data: bytes
    """The datagram bytes."""
    sequence: int
    """Its sequence number in the session."""
    completes: tuple[tuple[str, int, int], ...]
    """``(topic, partition, offset)``: per partition the highest offset whose last byte is here."""


_new = object.__new__
# OutgoingDatagram is frozen; its slot descriptors set fields without the frozen __setattr__.
_set_data, _set_sequence, _set_completes = (
    getattr(OutgoingDatagram, name).__set__ for name in OutgoingDatagram.__slots__
)
_SMALL = len(SMALL_LONGS)
#: A one-datagram message's whole header: its first 24 bytes, then sequence, key id, fragment
#: index 0 and count 1 (as one uint32 of value 1), message length.
_ONE_DATAGRAM_HEADER: Final = struct.Struct(">24sQIII")
#: A fragment's whole header: its first 24 bytes (magic to session id), then sequence, key id,
#: fragment index and count, message length.
_FRAGMENT_HEADER: Final = struct.Struct(">24sQIHHI")
#: The AES-GCM nonce: the session id's first 4 bytes and the sequence (docs/protocol.md §7.2).
_NONCE: Final = struct.Struct(">4sQ")
_NO_HEADERS = b"\x00"  # an empty Avro array
_TABLE = len(BYTES_ITEMS)

#: Withheld ranges per message: ~20-40 bytes each on the wire, so a message stays a few datagrams;
#: reaching it seals the pending batch and sends them.
MAX_WITHHELD_RANGES: Final = 256

_MIN_RATIO = 1.0
_MAX_RATIO = 8.0
_RATIO_SAFETY = 0.85


def _record_size(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> int:
    """What ``max_record_size`` limits: key, value, header names and header values."""
    size = (0 if key is None else len(key)) + (0 if value is None else len(value))
    for name, hval in headers:
        size += len(name) + (0 if hval is None else len(hval))
    return size


class Encoder:
    """Builds the datagrams of one sender session."""

    def __init__(
        self,
        config: WireConfig,
        keyring: KeyRing | None,
        *,
        session_id: bytes,
        first_sequence: int = 0,
        topic_map: Mapping[str, str] | None = None,
    ) -> None:
        """Start a session.

        ``topic_map`` renames topics on the wire (source name -> far-side name): records,
        heartbeats and resend markers carry the far-side name; ``completes`` and every argument
        stay in source names. Unmapped topics keep their name.

        Raises:
            ConfigError: no key ring while ``allow_cleartext`` is false.
            LocalProtocolError: session id not 16 bytes or first sequence out of range.
        """
        if keyring is None and not config.allow_cleartext:
            raise ConfigError(
                "allow_cleartext",
                "an encoder without a key ring would send cleartext",
                "give a key file, or allow cleartext for tests and demos only",
            )
        if not isinstance(session_id, bytes) or len(session_id) != SESSION_ID_SIZE:
            raise LocalProtocolError("session_id must be 16 bytes (os.urandom(16))")
        if not 0 <= first_sequence <= MAX_SEQUENCE:
            raise LocalProtocolError("first_sequence must be a uint64")
        self._config = config
        self._max_record_size = config.max_record_size
        self._max_message_size = config.max_message_size
        self._linger = config.linger
        self._keyring = keyring
        self._session_id = session_id
        self._next_sequence = first_sequence
        self._capacity = fragment_capacity(config.max_datagram_size)
        self._gzip = config.compression != "none"  # compressing (gzip or zstd)
        self._codec = gzip_codec.COMPRESSORS.get(config.compression)
        self._ratio = 2.0 if self._gzip else 1.0
        self._target = self._capacity
        self._retarget()
        self._topic_map: dict[str, str] = dict(topic_map or {})
        self._builder = BatchBuilder(self._topic_map)
        self._deadline: float | None = None
        self._cipher: SessionCipher | None = None
        # _record_datagram's cache, filled by _message (generation -1: not yet)
        self._framing_generation = -1
        self._framing_key_id = 0
        self._framing_aead: AESGCM | None = None
        self._framing_prefix = (
            MAGIC
            + bytes((VERSION, KIND_RECORD_BATCH, COMPRESSION_NONE, CIPHER_AES_256_GCM))
            + session_id
        )
        self._nonce_prefix = session_id[:4]
        self.records_sealed = 0
        """Records put into datagrams so far in this session (the batches already sealed)."""
        # Withheld offsets not yet on the wire: [topic, partition, first, last] runs, and each
        # partition's last run (offsets of a partition come increasing, so runs grow at the end).
        self._runs: list[list[Any]] = []
        self._run_of: dict[tuple[str, int], list[Any]] = {}

    @property
    def session_id(self) -> bytes:
        """This session's id."""
        return self._session_id

    @property
    def next_sequence(self) -> int:
        """The sequence number the next datagram will get."""
        return self._next_sequence

    @property
    def capacity(self) -> int:
        """Plaintext bytes one datagram carries."""
        return self._capacity

    @property
    def pending_records(self) -> int:
        """Records added but not yet in a datagram."""
        return self._builder.records

    def _retarget(self) -> None:
        self._target = int(self._capacity * self._ratio) if self._gzip else self._capacity

    # -- records ----------------------------------------------------------------------------

    def add(  # noqa: PLR0917  the sender calls this per record; the API is positional
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        timestamp_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
        now: float,
    ) -> list[OutgoingDatagram]:
        """Add one record; returns the datagrams that became full (often none).

        Raises:
            RecordTooLarge: key + value + headers over ``max_record_size`` (nothing was added).
            LocalProtocolError: a field out of range (negative offset, bad timestamp type, ...).
        """
        if key is None:
            kprefix, n = NULL_ITEM
        else:
            n = len(key)
            kprefix, n = BYTES_ITEMS[n] if n < _TABLE else bytes_item(n)
        if value is None:
            vprefix, vn = NULL_ITEM
        else:
            vn = len(value)
            vprefix, vn = BYTES_ITEMS[vn] if vn < _TABLE else bytes_item(vn)
        if headers:
            headers_blob = encode_headers(headers)
            n += len(headers_blob)
        else:
            headers_blob = _NO_HEADERS
            n += 1
        n += vn
        # n, the encoded size, is at least the record's size: count that only when n is over
        if n > self._max_record_size:
            size = _record_size(key, value, headers)
            if size > self._max_record_size:
                raise RecordTooLarge(topic, partition, offset, size, self._max_record_size)
        builder = self._builder
        group = builder.last
        if (
            group is not None
            and partition == group.partition
            and topic == group.topic
            and timestamp_type == group.ts_type
            and 0 <= offset < (1 << 63)
        ):  # partition and timestamp type were checked with the group's first record
            # The usual case, the record joins the group of the one before it: BatchBuilder.append
            # inlined (same size arithmetic, same bytes), one call less per record.
            item_size = n
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
            else:
                td = encode_long(d)
                n += len(td)
                if not -(1 << 63) <= d < (1 << 63):
                    n += 1 << 40  # no Avro long: treated as "does not fit", the next batch opens
            c = group.count
            if c >= 63 and (c == 63 or c >= 8191):
                n += 5 * (varint_size((c + 1) << 1) - varint_size(c << 1))
            n += builder.size
            target = self._target
            if n <= target:
                builder.size = n
                builder.records += 1
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
                if offset > group.high:  # noqa: PLR1730  a compare is cheaper than max()
                    group.high = offset
                if n < target:
                    return []
                return self._seal()
            if builder.groups == 1 and not self._gzip and not self._runs:
                # Full, and the record opens the next batch in the same group: seal the batch
                # and restart the builder in place on this record (no new builder or group).
                out = self._record_datagram(
                    builder.encode(), ((topic, partition, group.high),), builder.records
                )
                builder.restart(
                    group, offset, timestamp, kprefix, key, vprefix, value, headers_blob, item_size
                )
            else:
                out = self._seal()
                builder = self._builder
                builder.append(
                    topic, partition, timestamp_type, offset, timestamp, kprefix, key, vprefix,
                    value, headers_blob, item_size, 0,
                )  # fmt: skip
            self._deadline = now + self._linger
            if builder.size >= target:
                out += self._seal()
            return out
        if not (
            0 <= partition <= 0x7FFFFFFF and 0 <= offset < (1 << 63) and 0 <= timestamp_type <= 2
        ):
            raise LocalProtocolError(
                f"record {topic}:{partition}:{offset} has a field out of range"
            )
        if n >= self._target and not self._gzip and not self._runs:
            # A record that fills a datagram on its own is sealed alone (what ``append`` then
            # ``_seal`` do, after sealing what is pending): its batch in one join, no builder.
            out = self._seal() if builder.records else []
            self._deadline = None
            self.records_sealed += 1
            payload = single_record_batch(
                self._topic_map.get(topic, topic), partition, timestamp_type, offset, timestamp,
                kprefix, key, vprefix, value, headers_blob,
            )  # fmt: skip
            return out + self._message(KIND_RECORD_BATCH, payload, ((topic, partition, offset),))
        # A record that cannot fit even before its two delta bytes is not offered to ``append``
        # (which would refuse it): one call less per datagram, the same batches and bytes.
        if (builder.size + n <= self._target or not builder.records) and builder.append(
            topic, partition, timestamp_type, offset, timestamp, kprefix, key, vprefix, value,
            headers_blob, n, self._target,
        ):  # fmt: skip
            if builder.records == 1:
                self._deadline = now + self._linger
            if builder.size < self._target:
                return []
            return self._seal()
        out = self._seal()
        builder = self._builder
        builder.append(
            topic, partition, timestamp_type, offset, timestamp, kprefix, key, vprefix, value,
            headers_blob, n, 0,
        )  # fmt: skip
        self._deadline = now + self._linger
        if builder.size >= self._target:
            out += self._seal()
        return out

    def poll(self, now: float) -> list[OutgoingDatagram]:
        """The pending batch as datagrams if its linger expired at ``now``."""
        if self._deadline is not None and now >= self._deadline:
            return self._seal()
        return []

    def next_deadline(self) -> float | None:
        """When ``poll`` will have something to emit, or None when nothing is pending."""
        return self._deadline

    def flush(self) -> list[OutgoingDatagram]:
        """Everything pending, now."""
        return self._seal()

    def _seal(self) -> list[OutgoingDatagram]:
        builder = self._builder
        if not builder.records:
            if self._runs:
                self._deadline = None
                return self._seal_withheld([])
            return []
        self._builder = BatchBuilder(self._topic_map)
        self._deadline = None
        self.records_sealed += builder.records
        out = self._message(KIND_RECORD_BATCH, builder.encode(), builder.completed())
        return self._seal_withheld(out) if self._runs else out

    # -- withheld offsets (a content filter's) ------------------------------------------------

    def withhold(
        self, topic: str, partition: int, offset: int, now: float
    ) -> list[OutgoingDatagram]:
        """Record that ``offset`` is held back on purpose; returns datagrams that became due.

        Withheld offsets fold into ranges and go out in a withheld message (docs/protocol.md
        §5a) right after the next record batch is sealed, or on their own at the linger deadline
        or a flush. That message carries the ``completes`` of the batch before it as well: an
        offset is vouched for only once the records *and* the withheld ranges around it left,
        whatever the order in which they were added.

        Raises:
            LocalProtocolError: partition or offset out of range.
        """
        if not (0 <= partition <= 0x7FFFFFFF and 0 <= offset < (1 << 63)):
            raise LocalProtocolError(f"withheld {topic}:{partition}:{offset} is out of range")
        run = self._run_of.get((topic, partition))
        if run is not None and run[3] == offset - 1:
            run[3] = offset
        else:
            run = [topic, partition, offset, offset]
            self._runs.append(run)
            self._run_of[topic, partition] = run
            if len(self._runs) >= MAX_WITHHELD_RANGES:
                return self._seal()
        if self._deadline is None:
            self._deadline = now + self._linger
        return []

    @property
    def pending_withheld(self) -> int:
        """Withheld ranges not yet in a datagram."""
        return len(self._runs)

    def _seal_withheld(self, out: list[OutgoingDatagram]) -> list[OutgoingDatagram]:
        """``out`` (a sealed record batch, or nothing) followed by the withheld message, which
        takes over the batch's ``completes`` (see ``withhold``)."""
        runs, self._runs, self._run_of = self._runs, [], {}
        highs: dict[tuple[str, int], int] = {}
        if out:
            last = out[-1]
            for t, p, o in last.completes:
                highs[t, p] = o
            out[-1] = OutgoingDatagram(last.data, last.sequence, ())
        for t, p, _first, high in runs:
            if high > highs.get((t, p), -1):
                highs[t, p] = high
        wire = self._topic_map.get
        payload = encode_control(
            WITHHELD_SCHEMA,
            {
                "ranges": [
                    {"topic": wire(t, t), "partition": p, "first": f, "last": high}
                    for t, p, f, high in runs
                ]
            },
        )
        completes = tuple((t, p, o) for (t, p), o in highs.items())
        return out + self._message(KIND_WITHHELD, payload, completes)

    # -- control messages -------------------------------------------------------------------

    def heartbeat(
        self,
        *,
        sender_id: str,
        started_at_ms: int,
        sent_at_ms: int,
        high_offsets: Sequence[tuple[str, int, int]],
        low_offsets: Sequence[tuple[str, int, int]],
        counters: Sequence[tuple[str, int]],
    ) -> list[OutgoingDatagram]:
        """Pending records first (so every offset it reports precedes it), then a heartbeat.

        ``high_offsets`` and ``low_offsets`` are ``(topic, partition, offset)``: per partition the
        highest and the lowest offset this session has sent; both name the same partitions.

        Raises:
            LocalProtocolError: the offset lists break the rules of docs/protocol.md §5.
        """
        problem = heartbeat_offsets_problem(high_offsets, low_offsets)
        if problem is not None:
            raise LocalProtocolError(f"heartbeat: {problem}")
        wire = self._topic_map.get
        payload = encode_control(
            HEARTBEAT_SCHEMA,
            {
                "sender_id": sender_id,
                "started_at_ms": started_at_ms,
                "sent_at_ms": sent_at_ms,
                "high_offsets": [
                    {"topic": wire(t, t), "partition": p, "offset": o} for t, p, o in high_offsets
                ],
                "low_offsets": [
                    {"topic": wire(t, t), "partition": p, "offset": o} for t, p, o in low_offsets
                ],
                "counters": [{"name": n, "value": v} for n, v in counters],
            },
        )
        return self._seal() + self._message(KIND_HEARTBEAT, payload, ())

    def resend_marker(
        self,
        *,
        bundle_id: str,
        phase: str,
        ranges: Sequence[tuple[str, int, int, int]],
        records_sent: int,
        sent_at_ms: int,
    ) -> list[OutgoingDatagram]:
        """Pending records first, then a resend start/end marker.

        Raises:
            LocalProtocolError: ``phase`` is not "start" or "end".
        """
        if phase not in RESEND_PHASES:
            raise LocalProtocolError(f"resend phase must be start or end, not {phase!r}")
        wire = self._topic_map.get
        payload = encode_control(
            RESEND_MARKER_SCHEMA,
            {
                "bundle_id": bundle_id,
                "phase": phase,
                "ranges": [
                    {"topic": wire(t, t), "partition": p, "first": f, "last": last}
                    for t, p, f, last in ranges
                ],
                "records_sent": records_sent,
                "sent_at_ms": sent_at_ms,
            },
        )
        return self._seal() + self._message(KIND_RESEND_MARKER, payload, ())

    # -- framing ----------------------------------------------------------------------------

    def _record_datagram(
        self, payload: bytes, completes: tuple[tuple[str, int, int], ...], records: int
    ) -> list[OutgoingDatagram]:
        """A sealed record batch without compression: ``_message`` with the header prefix and
        the cipher cached while the key ring is unchanged (``KeyRing.generation``), so one
        datagram costs one ``struct`` pack, one AES-GCM call and one join. The same bytes as
        ``_message`` (``envelope.build_header`` + ``frame``), pinned by
        tests/unit/test_wire_fast_paths.py::test_the_record_datagram_fast_path_is_the_general_framing."""
        total = len(payload)
        keyring = self._keyring
        aead = self._framing_aead
        if (
            total > self._capacity
            or keyring is None
            or aead is None
            or keyring.generation != self._framing_generation
            or self._next_sequence >= MAX_SEQUENCE
        ):
            self.records_sealed += records
            return self._message(KIND_RECORD_BATCH, payload, completes)
        sequence = self._next_sequence
        self._next_sequence = sequence + 1
        self.records_sealed += records
        header = _ONE_DATAGRAM_HEADER.pack(
            self._framing_prefix, sequence, self._framing_key_id, 1, total
        )
        body = aead.encrypt(_NONCE.pack(self._nonce_prefix, sequence), payload, header)
        datagram = _new(OutgoingDatagram)
        n = total + TAG_SIZE
        _set_data(
            datagram, b"".join((header, SMALL_LONGS[n] if n < _SMALL else encode_long(n), body))
        )
        _set_sequence(datagram, sequence)
        _set_completes(datagram, completes)
        return [datagram]

    def _message(
        self, kind: int, payload: bytes, completes: tuple[tuple[str, int, int], ...]
    ) -> list[OutgoingDatagram]:
        compression = COMPRESSION_NONE
        capacity = self._capacity
        if self._codec is not None:
            code, compress = self._codec
            packed = compress(payload, self._config.compression_level)
            if len(packed) < len(payload):
                observed = len(payload) / len(packed)
                compression = code
                if kind == KIND_RECORD_BATCH:
                    if len(packed) > capacity:  # overshot: be more careful next time
                        self._ratio = max(_MIN_RATIO, self._ratio * capacity / len(packed) * 0.9)
                    else:
                        self._ratio += (observed * _RATIO_SAFETY - self._ratio) * 0.25
                        self._ratio = min(_MAX_RATIO, max(_MIN_RATIO, self._ratio))
                    self._retarget()
                payload = packed
            elif kind == KIND_RECORD_BATCH:
                self._ratio = _MIN_RATIO
                self._retarget()
        total = len(payload)
        if total > self._max_message_size:
            raise LocalProtocolError(
                f"message of {total} bytes over max_message_size {self._config.max_message_size}"
            )
        count = max(1, -(-total // capacity))
        if self._keyring is None:
            cipher_code, key_id, cipher = CIPHER_NONE, 0, None
        else:
            keyring = self._keyring
            key = keyring.active
            cipher = self._cipher
            if cipher is None or cipher.key is not key:
                cipher = self._cipher = SessionCipher(key, self._session_id)
            cipher_code, key_id = CIPHER_AES_256_GCM, key.key_id
            # what _record_datagram reuses until the ring changes
            self._framing_generation = keyring.generation
            self._framing_key_id = key_id
            self._framing_aead = cipher.aead
        first = self._next_sequence
        if count == 1:  # the usual case: one datagram, no slicing
            if first > MAX_SEQUENCE:
                raise SequenceExhaustedError("sequence numbers exhausted; start a new session")
            self._next_sequence = first + 1
            header = build_header(
                kind=kind, compression=compression, cipher=cipher_code,
                session_id=self._session_id, sequence=first, key_id=key_id,
                fragment_index=0, fragment_count=1, message_length=total,
            )  # fmt: skip
            body = payload if cipher is None else cipher.seal(first, payload, header)
            datagram = _new(OutgoingDatagram)
            _set_data(datagram, frame(header, body))
            _set_sequence(datagram, first)
            _set_completes(datagram, completes)
            return [datagram]
        if first + count - 1 > MAX_SEQUENCE:
            raise SequenceExhaustedError("sequence numbers exhausted; start a new session")
        self._next_sequence = first + count
        if cipher is not None:
            return self._fragments(
                kind, compression, key_id, cipher, first, count, payload, completes
            )
        out: list[OutgoingDatagram] = []
        session_id = self._session_id
        for index in range(count):
            sequence = first + index
            header = build_header(
                kind=kind, compression=compression, cipher=cipher_code, session_id=session_id,
                sequence=sequence, key_id=key_id, fragment_index=index, fragment_count=count,
                message_length=total,
            )  # fmt: skip
            chunk = payload[index * capacity : (index + 1) * capacity] if count > 1 else payload
            body = chunk if cipher is None else cipher.seal(sequence, chunk, header)
            out.append(
                OutgoingDatagram(
                    frame(header, body), sequence, completes if index == count - 1 else ()
                )
            )
        return out

    def _fragments(  # noqa: PLR0917  private, once per fragmented message
        self,
        kind: int,
        compression: int,
        key_id: int,
        cipher: SessionCipher,
        first: int,
        count: int,
        payload: bytes,
        completes: tuple[tuple[str, int, int], ...],
    ) -> list[OutgoingDatagram]:
        """The encrypted fragments of one message in one pass: ``_message``'s loop with the
        header's first 24 bytes, the nonce prefix, the AES-GCM object and the length prefix of
        the full fragments computed once, one ``struct`` pack, one AES-GCM call and one join per
        fragment, and no dataclass ``__init__`` (the frozen one costs ~1 us). The same bytes as
        ``build_header`` + ``frame`` per fragment, pinned by tests/vectors and
        tests/unit/test_wire_fast_paths.py::test_the_fragment_fast_path_is_the_general_framing."""
        capacity = self._capacity
        total = len(payload)
        prefix = MAGIC + bytes((VERSION, kind, compression, CIPHER_AES_256_GCM)) + self._session_id
        nonce_prefix = self._nonce_prefix
        encrypt = cipher.aead.encrypt
        header_of = _FRAGMENT_HEADER.pack
        nonce_of = _NONCE.pack
        full = capacity + TAG_SIZE
        full_length = SMALL_LONGS[full] if full < _SMALL else encode_long(full)
        view = memoryview(payload)
        join = b"".join
        out: list[OutgoingDatagram] = []
        append = out.append
        last = count - 1
        for index in range(count):
            sequence = first + index
            header = header_of(prefix, sequence, key_id, index, count, total)
            if index < last:
                start = index * capacity
                body = encrypt(
                    nonce_of(nonce_prefix, sequence), view[start : start + capacity], header
                )
                length = full_length
            else:
                body = encrypt(nonce_of(nonce_prefix, sequence), view[index * capacity :], header)
                n = len(body)
                length = SMALL_LONGS[n] if n < _SMALL else encode_long(n)
            datagram = _new(OutgoingDatagram)
            _set_data(datagram, join((header, length, body)))
            _set_sequence(datagram, sequence)
            _set_completes(datagram, completes if index == last else ())
            append(datagram)
        return out
