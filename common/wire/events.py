"""What the wire decoder hands to its caller: small frozen events (docs/protocol.md §8).

Every datagram a :class:`~common.wire.decoder.Decoder` receives ends as exactly one of: part of a
:class:`RecordBatch`, :class:`Heartbeat` or :class:`ResendMarker` (once its message is complete),
or a :class:`Dropped` with a :class:`DropReason`. ``DropReason`` values are used verbatim as
Prometheus label values, so they never change within a protocol version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class DropReason(StrEnum):
    """Why a datagram (or a whole fragmented message) was dropped; a metric label value."""

    MALFORMED = "malformed"
    """Not decodable: too short, bad Avro, inconsistent columns, corrupt gzip, bad values."""
    BAD_MAGIC = "bad_magic"
    """The first four bytes are not ``KDIO``: not our protocol at all."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """Our magic, but a protocol version this decoder does not implement."""
    TRAILING_BYTES = "trailing_bytes"
    """Bytes left over after the envelope, the decompressed stream or the Avro payload."""
    UNKNOWN_KEY = "unknown_key"
    """The key id is not in the receiver's key ring (not yet installed, or already retired)."""
    AUTH_FAILED = "auth_failed"
    """AES-256-GCM authentication failed: forged, corrupted or encrypted under another key."""
    CLEARTEXT_REFUSED = "cleartext_refused"
    """Cipher ``none`` while the decoder does not allow cleartext."""
    REPLAYED = "replayed"
    """Sequence number older than the anti-replay window of its session."""
    DUPLICATE = "duplicate"
    """Sequence number already seen inside the window: redundant copies end here (not an attack)."""
    TOO_LARGE = "too_large"
    """A declared or decompressed size is above the configured limit."""
    TOO_MANY_FRAGMENTS = "too_many_fragments"
    """The fragment count is above ``max_fragments`` (an index not below the count is MALFORMED)."""
    REASSEMBLY_OVERFLOW = "reassembly_overflow"
    """A partial message was evicted because too many (or too large) reassemblies were in flight."""
    REASSEMBLY_TIMEOUT = "reassembly_timeout"
    """A partial message did not complete within ``reassembly_timeout`` (a fragment was lost)."""
    FRAGMENT_MISMATCH = "fragment_mismatch"
    """A fragment disagrees with the rest of its message, or the lengths do not add up."""
    UNKNOWN_COMPRESSION = "unknown_compression"
    """A compression code this decoder does not implement."""
    UNKNOWN_CIPHER = "unknown_cipher"
    """A cipher code this decoder does not implement."""
    UNKNOWN_KIND = "unknown_kind"
    """A message kind this decoder does not implement (for example a key announcement)."""
    OUT_OF_RANGE = "out_of_range"
    """Decodable, but a value no Kafka record or resend marker can have: an offset, partition,
    timestamp (base + delta beyond 64 bits) or count out of range, a topic name Kafka cannot
    carry (empty, over 249 characters, a NUL character)."""
    # Public-key mode: refused key announcements (kind 3, docs/protocol.md §7.5).
    UNTRUSTED_SIGNER = "untrusted_signer"
    """A key announcement signed by a key that is not in the trusted-sender list."""
    BAD_SIGNATURE = "bad_signature"
    """A key announcement whose Ed25519 signature does not verify: tampered or forged."""
    OTHER_RECEIVER = "other_receiver"
    """A key announcement sealed to a receiver public key this receiver does not hold."""
    ANNOUNCE_EXPIRED = "announce_expired"
    """A key announcement outside its validity window (beyond the allowed clock skew)."""
    ANNOUNCE_ROLLBACK = "announce_rollback"
    """A key announcement older than one already accepted for its sender session (replayed)."""
    BAD_SEAL = "bad_seal"
    """A signed key announcement whose sealed session key does not open or match its key id."""


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record as read upstream, carried byte for byte."""

    topic: str
    """Source topic name."""
    partition: int
    """Source partition."""
    offset: int
    """Source offset (signed 64-bit, non-negative)."""
    timestamp: int
    """Record timestamp in milliseconds since the epoch."""
    timestamp_type: int
    """Kafka's timestamp type: 0 not available, 1 create time, 2 log-append time."""
    key: bytes | None
    """Record key; ``None`` (null) and ``b""`` (empty) are different and both preserved."""
    value: bytes | None
    """Record value; ``None`` is a tombstone."""
    headers: tuple[tuple[str, bytes | None], ...]
    """Record headers in order, duplicates allowed; a header value may be null."""


Headers = tuple[tuple[str, bytes | None], ...]
"""One record's headers: ``(name, value)`` pairs in order; a value may be null."""


@dataclass(frozen=True, slots=True)
class RecordGroup:
    """The records of one (topic, partition, timestamp type) in one batch, as parallel columns.

    This is the wire layout itself (docs/protocol.md §4): the fast way to consume a batch without
    building one :class:`Record` per record. All five columns have ``len(group)`` items; item
    ``i`` of each column belongs to the same record.
    """

    topic: str
    """Source topic name."""
    partition: int
    """Source partition."""
    timestamp_type: int
    """Kafka's timestamp type of every record here: 0 not available, 1 create, 2 log-append."""
    offsets: tuple[int, ...]
    """Source offsets, in the order the sender added the records."""
    timestamps: tuple[int, ...]
    """Timestamps (ms since the epoch)."""
    keys: tuple[bytes | None, ...]
    """Keys; ``None`` (null) and ``b""`` are different and both preserved."""
    values: tuple[bytes | None, ...]
    """Values; ``None`` is a tombstone."""
    headers: tuple[Headers, ...]
    """Headers of each record."""
    headers_bytes: bytes | None = field(default=None, compare=False, repr=False)
    """Every record's headers in their canonical Avro encoding
    (``common.wire.batch_encode.encode_headers``), concatenated, when the decoder read them in
    it; else None. What a raw run stores, so the receiver need not encode them again."""

    def __len__(self) -> int:
        return len(self.offsets)


_new = object.__new__
# Record is frozen; its slot descriptors set fields without the frozen __setattr__ (2x faster).
(_s_topic, _s_partition, _s_offset, _s_ts, _s_ts_type, _s_key, _s_value, _s_headers) = (
    getattr(Record, name).__set__ for name in Record.__slots__
)


def records_of(groups: tuple[RecordGroup, ...]) -> tuple[Record, ...]:
    """One :class:`Record` per record of ``groups``, group after group."""
    out: list[Record] = []
    append = out.append
    for g in groups:
        topic = g.topic
        partition = g.partition
        ts_type = g.timestamp_type
        for offset, ts, key, value, headers in zip(
            g.offsets, g.timestamps, g.keys, g.values, g.headers, strict=True
        ):
            rec = _new(Record)
            _s_topic(rec, topic)
            _s_partition(rec, partition)
            _s_offset(rec, offset)
            _s_ts(rec, ts)
            _s_ts_type(rec, ts_type)
            _s_key(rec, key)
            _s_value(rec, value)
            _s_headers(rec, headers)
            append(rec)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """The records of one complete message (one datagram, or one reassembled fragmented message).

    ``groups`` is the columnar form (no per-record objects: what a hot loop should read);
    ``records`` builds :class:`Record` objects on first access and keeps them.
    """

    session_id: bytes
    """16-byte id of the sending session (random per sender start)."""
    sequence: int
    """Sequence number of the message's first datagram."""
    groups: tuple[RecordGroup, ...]
    """The records per (topic, partition, timestamp type), in order of first appearance."""
    count: int
    """Number of records in all groups."""
    _records: tuple[Record, ...] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def records(self) -> tuple[Record, ...]:
        """Records grouped by (topic, partition, timestamp type) in order of first appearance;
        within a group in the order the sender added them. Built on first access."""
        records = self._records
        if records is None:
            records = records_of(self.groups)
            object.__setattr__(self, "_records", records)  # a cache: frozen for the caller
        return records


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A sender's periodic status: where every partition's stream starts and ends in the session."""

    session_id: bytes
    """16-byte id of the sending session."""
    sequence: int
    """Sequence number of the heartbeat's first datagram."""
    sender_id: str
    """Operator-chosen name of the sender instance."""
    started_at_ms: int
    """When the sender session started (ms since the epoch)."""
    sent_at_ms: int
    """When this heartbeat was built (ms since the epoch)."""
    high_offsets: tuple[tuple[str, int, int], ...]
    """``(topic, partition, highest offset sent)`` for every partition the sender reads."""
    low_offsets: tuple[tuple[str, int, int], ...]
    """``(topic, partition, lowest offset sent)``: per partition of ``high_offsets`` (the same
    partitions, in any order), the lowest offset this session has sent, so the far side knows
    where the session started and reports loss of its first records (docs/protocol.md §5)."""
    counters: tuple[tuple[str, int], ...]
    """Free-form sender counters (records sent, skipped, ...), name -> value."""


@dataclass(frozen=True, slots=True)
class ResendMarker:
    """Start or end of a resend run, so the far side can tell resent records from live ones."""

    session_id: bytes
    """16-byte id of the sending session."""
    sequence: int
    """Sequence number of the marker's first datagram."""
    bundle_id: str
    """Id of the bundle (or time range description) being resent."""
    phase: str
    """``"start"`` or ``"end"``."""
    ranges: tuple[tuple[str, int, int, int], ...]
    """``(topic, partition, first offset, last offset)`` covered by the run (inclusive)."""
    records_sent: int
    """Records sent so far in this run (0 at start, the total at end)."""
    sent_at_ms: int
    """When the marker was built (ms since the epoch)."""


@dataclass(frozen=True, slots=True)
class Withheld:
    """Offsets the sender's content filter held back on purpose: never sent, never a gap."""

    session_id: bytes
    """16-byte id of the sending session."""
    sequence: int
    """Sequence number of the message's first datagram."""
    ranges: tuple[tuple[str, int, int, int], ...]
    """``(topic, partition, first offset, last offset)``, inclusive, as the far side names the
    topic."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A datagram or partial message the decoder refused; counted in ``Decoder.drops``."""

    reason: DropReason
    """Why; also the metric label."""
    detail: str
    """Human-readable detail for a rate-limited log line (never contains key material)."""
    session_id: bytes | None
    """Session of the datagram when it could be read (unauthenticated unless after AUTH)."""


Event = RecordBatch | Heartbeat | ResendMarker | Withheld | Dropped
"""Everything ``Decoder.next_event`` can return."""

RESEND_PHASES = ("start", "end")
