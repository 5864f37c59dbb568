"""Forward error correction: repair datagrams over blocks of finished datagrams (sans-IO).

Theory of operation (normative text: docs/protocol.md §13).

Sender (:class:`FecEncoder`). Every datagram the wire ``Encoder`` emitted (already encrypted and
authenticated, header and all) is a **source datagram**. Per *stream* (one stream per target port,
so a block's datagrams and its repairs reach the same receiver socket) the source datagrams are
dealt round-robin into ``interleave`` open blocks. A block closes when it holds ``block_size``
sources, when the next source would stretch it over more than ``max_span`` sequence numbers, or
``block_latency`` seconds after its first source (``poll``), so a slow stream never holds repairs
back for long; such an early close takes the stream's whole round and deals its sources afresh into
as few blocks as ``block_size`` allows (a slow stream would otherwise be split into ``interleave``
small, weak blocks). Closing a block pads every source to the same **symbol** (``uint16 length ||
datagram || zeros``), computes ``m = ceil(k * overhead / 100)`` repair symbols with zfec's
systematic Reed-Solomon code over GF(2^8) (common/wire/reed_solomon.py: the same bytes by ISA-L's
SIMD arithmetic when the library is installed), and wraps each in a **repair datagram**: an
ordinary envelope of kind 4 whose AES-256-GCM payload names the block (lowest source sequence, k,
m, repair index, symbol size, a bitmap of the member sequences) and carries the symbol. Sources go
out unchanged: with FEC on or off they are the same bytes, and a receiver that knows nothing of
kind 4 drops the repairs as ``unknown_kind`` and works as before.

Why over the finished datagrams (ciphertext), not the plaintext records: what the receiver
rebuilds is a datagram, byte for byte, and it goes through the normal decode path, so AES-GCM
authentication and the anti-replay window judge it like any datagram off the wire; FEC adds no
second path into the record stream and needs no key to rebuild. The repair datagrams are
authenticated themselves (own key derivation and nonce space, docs/protocol.md §13.3) and checked
before they are stored, and only sources that the normal decoder authenticated enter a block, so
neither forged repairs nor corrupted sources can bend a reconstruction.

Receiver (:class:`FecDecoder`). It keeps the authenticated source datagrams of the last moments
(bounded by bytes and age) because a block's membership is only known when its first repair
arrives. On an authentic repair it opens (or joins) the pending block: all sources present means
the block is **complete**; enough repairs for the missing sources means they are decoded and
returned (**recovered**); otherwise the block waits for more repairs or late sources until
``block_timeout`` and then counts as **unrecoverable** (its missing records become gaps
downstream, as without FEC). Pending blocks are bounded in number and bytes. Nothing here reads
a clock: ``now`` is passed in.
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import zfec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.errors import ConfigError, LocalProtocolError
from common.wire.envelope import (
    CIPHER_AES_256_GCM,
    CIPHER_NONE,
    COMPRESSION_NONE,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_SEQUENCE,
    SESSION_ID_SIZE,
    TAG_SIZE,
    VERSION,
    decode_long,
    frame,
)
from common.wire.keyring import Key, KeyRing
from common.wire.reed_solomon import RepairEncoder, bounded_get
from common.wire.replay import ReplayGuard

#: Envelope kind of a repair datagram (docs/protocol.md §3 and §13).
KIND_FEC_REPAIR: Final = 4
#: The same as envelope byte 5 in a one-byte slice (``data[5:6]``), the hot paths' first check.
REPAIR_KIND_BYTE: Final = bytes((KIND_FEC_REPAIR,))
#: The only code so far: zfec's systematic Reed-Solomon over GF(2^8) (docs/protocol.md §13.2).
SCHEME_ZFEC_RS: Final = 1
#: block_sequence, scheme, k, m, repair_index, symbol_size, span (big-endian, no padding).
FEC_HEADER: Final = struct.Struct(">QBBBBHH")
#: zfec's limit: at most 256 symbols (sources plus repairs) per block.
MAX_SYMBOLS: Final = 256
#: The protocol's bound on a block's sequence span (bitmap of at most 256 bytes).
MAX_SPAN: Final = 2048
FEC_KEY_INFO: Final = b"kafka-diode v1 fec repair key"
#: Bytes a repair datagram adds around a symbol, bitmap excluded: envelope header, payload length
#: (3 varint bytes for any payload up to 64 KiB), GCM tag, FEC header, the symbol's length prefix.
_FIXED_OVERHEAD: Final = HEADER_SIZE + 3 + TAG_SIZE + FEC_HEADER.size + 2
_U16: Final = struct.Struct(">H")
_SEQ: Final = struct.Struct(">Q")
_MIN_DATAGRAM: Final = HEADER_SIZE + 1
_ZEROS: Final = memoryview(bytes(0xFFFF))
_CODEC_CACHE: Final = 64
#: Upper bounds of the decoder's ``margin_used`` histogram: the share of a block's m repairs its
#: losses used (0: nothing lost, 1: every repair needed; a failed block is above 1). Quarters,
#: so the KafkaDiodeFecMarginLow alert can ask "how many blocks used more than half".
MARGIN_BUCKETS: Final = (0.0, 0.25, 0.5, 0.75, 1.0)


def repair_overhead(max_span: int) -> int:
    """How much larger a repair datagram is than the largest source of its block."""
    return _FIXED_OVERHEAD + (max_span + 7) // 8


def is_repair(data: bytes) -> bool:
    """True when ``data`` claims to be a repair datagram (magic, version, kind 4): route it to
    :meth:`FecDecoder.receive_repair` instead of the normal decoder."""
    return len(data) > HEADER_SIZE and data[5] == KIND_FEC_REPAIR and data[:5] == _PREFIX


_PREFIX: Final = MAGIC + bytes((VERSION,))


def _fec_aead(key: Key, session_id: bytes) -> AESGCM:
    """AES-256-GCM under ``HKDF(key, salt=session_id, info=FEC_KEY_INFO)`` (§13.3)."""
    derived = HKDF(algorithm=SHA256(), length=32, salt=session_id, info=FEC_KEY_INFO).derive(
        key.material
    )
    return AESGCM(derived)


def _bitmap(offsets: list[int], span: int) -> bytes:
    bits = bytearray((span + 7) // 8)
    for off in offsets:
        bits[off >> 3] |= 1 << (off & 7)
    return bytes(bits)


@functools.cache
def _all_set(span: int) -> bytes:
    """The member bitmap of ``span`` consecutive sequences (at most MAX_SPAN cached)."""
    return _bitmap(list(range(span)), span)


@functools.lru_cache(maxsize=_CODEC_CACHE)
def _offsets(bitmap: bytes, span: int) -> tuple[int, ...] | None:
    """Set bit offsets of a member bitmap, or None when bits beyond ``span`` are set.

    Cached: every repair of a block carries the same bitmap, and interleaved blocks share their
    pattern (every D-th bit), so the bit loop (up to 2048 steps) runs about once per pattern
    instead of once per repair."""
    out = tuple(
        (i << 3) | b for i, byte in enumerate(bitmap) if byte for b in range(8) if byte >> b & 1
    )
    if out and out[-1] >= span:
        return None
    return out


def _symbol(datagram: bytes, size: int) -> bytes:
    n = len(datagram)
    return b"".join((_U16.pack(n), datagram, bytes(size - 2 - n)))


class _Decoders:
    """zfec decoder objects by (k, m): building one computes a matrix, so reuse them."""

    def __init__(self) -> None:
        self._dec: OrderedDict[tuple[int, int], zfec.Decoder] = OrderedDict()

    def get(self, k: int, m: int) -> zfec.Decoder:
        return bounded_get(self._dec, (k, m), lambda: zfec.Decoder(k, k + m), _CODEC_CACHE)


# -- sender ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class FecConfig:
    """How the sender builds blocks (the receiver needs none of this: it is on the wire)."""

    overhead: float
    """Repair datagrams per 100 source datagrams (``--fec-overhead``); > 0 (0 means no FEC and
    no ``FecEncoder`` at all)."""
    block_size: int = 160
    """Source datagrams per block at most (k). Larger blocks ride out more loss at the same
    overhead, but the Reed-Solomon cost per datagram grows with the repairs per block
    (docs/sender.md, "Forward error correction"). The default (with ``interleave`` 4) is chosen
    from common/wire/fec_odds.py: at 20 % overhead fewer than one failed block per 10^9 source
    datagrams at 5 % random loss and at 2 % Gilbert-Elliott loss in bursts of 5."""
    block_latency: float = 0.2
    """Seconds after its first source a block closes even when not full, so a slow stream gets
    its repairs promptly; at most 1 s, half the time a receiver keeps sources for a block."""
    interleave: int = 4
    """Blocks filled round-robin per stream: a burst of B consecutive losses costs each block
    about B / interleave sources."""
    streams: int = 1
    """Independent block sets (the sender's target ports)."""

    def __post_init__(self) -> None:
        if not 0 < self.overhead <= 100:
            raise ConfigError("fec_overhead", f"{self.overhead} is not in (0, 100]", "e.g. 20")
        if not 1 <= self.block_size < MAX_SYMBOLS:
            raise ConfigError("fec_block_size", f"{self.block_size} is not in 1..255")
        if self.block_size + self.repairs_for(self.block_size) > MAX_SYMBOLS:
            raise ConfigError(
                "fec_block_size",
                f"{self.block_size} sources plus {self.repairs_for(self.block_size)} repairs "
                f"exceed {MAX_SYMBOLS} symbols",
                "lower fec_block_size or fec_overhead",
            )
        if not 0 < self.block_latency <= 1:
            raise ConfigError(
                "fec_block_latency",
                f"{self.block_latency} is not in (0, 1] s",
                "a receiver keeps sources 2 s for their block's repairs",
            )
        if not 1 <= self.interleave <= 16:
            raise ConfigError("fec_interleave", f"{self.interleave} is not in 1..16")
        if self.streams < 1:
            raise ConfigError("target_ports", "at least one stream")

    def repairs_for(self, k: int) -> int:
        """Repair symbols of a block of ``k`` sources: ``ceil(k * overhead / 100)``, at least 1."""
        return max(1, math.ceil(k * self.overhead / 100 - 1e-9))

    @property
    def max_span(self) -> int:
        """Sequence span a block may cover: twice what its sources need when every stream and
        interleaved block takes its turn (room for control messages sent to every stream)."""
        return min(MAX_SPAN, 2 * self.block_size * self.interleave * self.streams)

    @property
    def overhead_bytes(self) -> int:
        """How much smaller than ``max_datagram_size`` sources must be for repairs to fit."""
        return repair_overhead(self.max_span)


class _OpenBlock:
    __slots__ = ("datagrams", "first", "last", "longest", "opened", "sequences", "stream")

    def __init__(self, stream: int, now: float, sequence: int) -> None:
        self.stream = stream
        self.opened = now
        self.first = sequence
        """The block sequence (lowest member)."""
        self.last = sequence
        """The highest member so far."""
        self.sequences: list[int] = []
        self.datagrams: list[bytes] = []
        self.longest = 0


class FecEncoder:
    """Turns a session's finished datagrams into repair datagrams (see the module docstring)."""

    def __init__(
        self,
        config: FecConfig,
        keyring: KeyRing | None,
        *,
        session_id: bytes,
        max_source_size: int,
        first_repair_sequence: int = 0,
    ) -> None:
        """Start the repair stream of a session.

        ``max_source_size`` is the largest source datagram the wire encoder emits (its
        ``max_datagram_size``); a repair is at most ``max_source_size + config.overhead_bytes``.

        Raises:
            LocalProtocolError: session id not 16 bytes.
        """
        if len(session_id) != SESSION_ID_SIZE:
            raise LocalProtocolError("session_id must be 16 bytes")
        if not _MIN_DATAGRAM <= max_source_size <= 0xFFFF - 2:
            raise LocalProtocolError(f"max_source_size {max_source_size} out of range")
        self.config = config
        self._keyring = keyring
        self._session_id = session_id
        self._max_source = max_source_size
        self._max_span = config.max_span
        self._block_size = config.block_size
        self._interleave = config.interleave
        self._next_repair = first_repair_sequence
        self._aead: AESGCM | None = None
        self._aead_key: Key | None = None
        self._repairs = RepairEncoder()
        self._open: list[list[_OpenBlock | None]] = [
            [None] * config.interleave for _ in range(config.streams)
        ]
        self._dealt = [0] * config.streams
        #: Per stream, repairs of closed blocks waiting for the rest of their interleave round,
        #: so the round's repairs go out interleaved too (a burst then hits every block alike).
        self._ready: list[list[list[bytes]]] = [[] for _ in range(config.streams)]
        self._ready_since: list[float] = [0.0] * config.streams
        self.blocks = 0
        """Blocks closed (each sent its repairs)."""
        self.repairs = 0
        """Repair datagrams built."""
        self.unprotected = 0
        """Datagrams left out of every block (another session's, or too large)."""

    @property
    def accelerated(self) -> bool:
        """True when ISA-L computes the repair symbols (common/wire/reed_solomon.py)."""
        return self._repairs.accelerated

    def add(self, data: bytes, stream: int, now: float) -> list[bytes]:
        """Put one source datagram into its stream's next block.

        Returns the repair datagrams of a block this source filled (else an empty list); they
        go to the same stream, after the source.
        """
        n = len(data)
        if (
            n > self._max_source
            or n < _MIN_DATAGRAM
            or data[5] == KIND_FEC_REPAIR
            or not data.startswith(self._session_id, 8)
        ):
            self.unprotected += 1
            return []
        sequence = _SEQ.unpack_from(data, 24)[0]
        slots = self._open[stream]
        if self._interleave == 1:
            slot = 0
        else:
            dealt = self._dealt[stream]
            self._dealt[stream] = dealt + 1
            slot = dealt % self._interleave
        out: list[bytes] | None = None
        block = slots[slot]
        if block is None:
            block = slots[slot] = _OpenBlock(stream, now, sequence)
        elif sequence <= block.last or sequence - block.first >= self._max_span:
            out = self._finish(stream, self._close(block), now)
            block = slots[slot] = _OpenBlock(stream, now, sequence)
        block.last = sequence
        block.sequences.append(sequence)
        block.datagrams.append(data)
        if n > block.longest:  # noqa: PLR1730  a compare is cheaper than max()
            block.longest = n
        if len(block.datagrams) >= self._block_size:
            slots[slot] = None
            repairs = self._finish(stream, self._close(block), now)
            return repairs if out is None else out + repairs
        return [] if out is None else out

    def _finish(self, stream: int, repairs: list[bytes], now: float) -> list[bytes]:
        """Repairs to send now: at once without interleaving, else once per round, interleaved
        (held at most ``block_latency``: ``next_deadline`` counts them)."""
        if len(self._open[stream]) == 1:
            return repairs
        ready = self._ready[stream]
        if not ready:
            self._ready_since[stream] = now
        ready.append(repairs)
        return self._release(stream) if len(ready) >= len(self._open[stream]) else []

    def _release(self, stream: int) -> list[bytes]:
        ready = self._ready[stream]
        longest = max((len(r) for r in ready), default=0)
        out = [r[i] for i in range(longest) for r in ready if i < len(r)]
        ready.clear()
        return out

    def next_deadline(self) -> float | None:
        """When the oldest open block must close (``poll``), or None."""
        opened = [b.opened for slots in self._open for b in slots if b is not None]
        opened += [t for t, ready in zip(self._ready_since, self._ready, strict=True) if ready]
        return min(opened) + self.config.block_latency if opened else None

    def poll(self, now: float) -> list[tuple[int, bytes]]:
        """Close blocks open for ``block_latency``; returns ``(stream, repair datagram)``."""
        return self._close_where(lambda b: now >= b.opened + self.config.block_latency)

    def flush(self) -> list[tuple[int, bytes]]:
        """Close every open block (before a drain or shutdown)."""
        return self._close_where(lambda _b: True)

    def _close_where(self, due: Callable[[_OpenBlock], bool]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for stream, slots in enumerate(self._open):
            if any(b is not None and due(b) for b in slots):
                # The round closes early (a slow stream, or a flush): its open blocks are not
                # full, so deal their sources afresh into as few blocks as ``block_size``
                # allows; a slow stream then gets one block of everything the latency bound
                # let in instead of ``interleave`` small ones (docs/sender.md, slow streams).
                # Closing a block before its own deadline is always allowed.
                opened = [b for b in slots if b is not None]
                slots[:] = [None] * len(slots)
                ready = self._ready[stream]
                if not ready:
                    self._ready_since[stream] = min(b.opened for b in opened)
                ready.extend(self._close(b) for b in self._regroup(opened))
            out.extend((stream, r) for r in self._release(stream))
        return out

    def _regroup(self, blocks: list[_OpenBlock]) -> list[_OpenBlock]:
        """The sources of ``blocks`` dealt round-robin, in sequence order, into
        ``ceil(n / block_size)`` blocks (the original blocks when that would stretch one over
        more than ``max_span`` sequences)."""
        if len(blocks) < 2:
            return blocks
        members = sorted(
            (s, d) for b in blocks for s, d in zip(b.sequences, b.datagrams, strict=True)
        )
        if members[-1][0] - members[0][0] >= self._max_span:
            return blocks
        count = -(-len(members) // self._block_size)
        opened = min(b.opened for b in blocks)
        out: list[_OpenBlock] = []
        for i in range(count):
            part = members[i::count]
            block = _OpenBlock(blocks[0].stream, opened, part[0][0])
            block.last = part[-1][0]
            block.sequences = [s for s, _ in part]
            block.datagrams = [d for _, d in part]
            block.longest = max(len(d) for d in block.datagrams)
            out.append(block)
        return out

    def _close(self, block: _OpenBlock) -> list[bytes]:
        k = len(block.datagrams)
        m = min(self.config.repairs_for(k), MAX_SYMBOLS - k)
        size = 2 + block.longest
        # The k symbols back to back in one buffer: one allocation, and ISA-L reads it in place.
        parts: list[bytes | memoryview] = []
        for d in block.datagrams:
            n = len(d)
            parts += (_U16.pack(n), d, _ZEROS[: size - 2 - n])
        first = block.first
        span = block.last - first + 1
        if span == k:  # consecutive members, the usual case: every bit set, no loop per member
            bitmap = _all_set(span)
        else:
            bitmap = _bitmap([s - first for s in block.sequences], span)
        room = FEC_HEADER.size + len(bitmap)  # the repair plaintext before its symbol (§13.4)
        out = self._repairs.encode(bytearray().join(parts), k, m, size, room=room)
        stride = room + size
        for i in range(m):
            at = i * stride
            FEC_HEADER.pack_into(out, at, first, SCHEME_ZFEC_RS, k, m, i, size, span)
            out[at + FEC_HEADER.size : at + room] = bitmap
        self.blocks += 1
        self.repairs += m
        view = memoryview(out)
        return [self._seal(view[at : at + stride]) for at in range(0, m * stride, stride)]

    def _seal(self, plaintext: memoryview) -> bytes:
        sequence = self._next_repair
        if sequence > MAX_SEQUENCE:
            raise LocalProtocolError("repair sequence numbers exhausted; start a new session")
        self._next_repair = sequence + 1
        keyring = self._keyring
        if keyring is None:
            cipher_code, key_id, aead = CIPHER_NONE, 0, None
        else:
            key = keyring.active
            if self._aead is None or self._aead_key is not key:
                self._aead = _fec_aead(key, self._session_id)
                self._aead_key = key
            cipher_code, key_id, aead = CIPHER_AES_256_GCM, key.key_id, self._aead
        header = HEADER.pack(
            MAGIC, VERSION, KIND_FEC_REPAIR, COMPRESSION_NONE, cipher_code, self._session_id,
            sequence, key_id, 0, 1, len(plaintext),
        )  # fmt: skip
        if aead is None:
            return frame(header, bytes(plaintext))
        nonce = self._session_id[:4] + _SEQ.pack(sequence)
        return frame(header, aead.encrypt(nonce, plaintext, header))


# -- receiver --------------------------------------------------------------------------------


class FecDropReason(StrEnum):
    """Why a repair datagram (or a pending block) was dropped; a metric label value."""

    MALFORMED = "fec_malformed"
    """Not a valid repair: bad lengths, fields out of range, inconsistent member bitmap."""
    UNKNOWN_CIPHER = "fec_unknown_cipher"
    """Cipher code not implemented."""
    CLEARTEXT_REFUSED = "fec_cleartext_refused"
    """Cipher none while cleartext is not allowed."""
    UNKNOWN_KEY = "fec_unknown_key"
    """Key id not in the ring."""
    AUTH_FAILED = "fec_auth_failed"
    """GCM tag mismatch: forged, corrupted, truncated or under another key."""
    DUPLICATE = "fec_duplicate"
    """Repair sequence already seen (redundant copies end here)."""
    REPLAYED = "fec_replayed"
    """Repair sequence older than the replay window."""
    MISMATCH = "fec_mismatch"
    """An authentic repair disagrees with its block, or a reconstruction is not the block's."""
    OVERFLOW = "fec_overflow"
    """A pending block was evicted for room (count or bytes)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FecLimits:
    """Receiver bounds (fixed defaults, derived from the wire config: no user setting)."""

    block_timeout: float = 2.0
    """Seconds a block waits for missing sources or repairs, then counts as unrecoverable."""
    max_pending_blocks: int = 1024
    """Blocks waiting at once; the oldest is evicted (OVERFLOW, unrecoverable)."""
    max_pending_bytes: int = 64 * 1024 * 1024
    """Repair symbol bytes held by pending blocks."""
    max_source_bytes: int = 32 * 1024 * 1024
    """Recent authenticated source datagrams kept for blocks whose repairs have not arrived."""
    replay_window: int = 8192
    """Anti-replay window of the repair sequence space, per session."""
    max_sessions: int = 64
    """Sessions with a repair replay window (LRU)."""
    allow_cleartext: bool = False
    """Accept cipher none (tests and demos only)."""

    def __post_init__(self) -> None:
        for name in ("max_pending_blocks", "max_pending_bytes", "max_source_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be at least 1")
        if self.block_timeout <= 0:
            raise ConfigError("block_timeout", "must be positive")


class _Pending:
    __slots__ = (
        "bitmap", "bytes", "created", "k", "key", "keys", "m", "repairs", "sequences", "size",
        "span",
    )  # fmt: skip

    def __init__(  # noqa: PLR0917  private
        self,
        key: tuple[bytes, int],
        k: int,
        m: int,
        size: int,
        span: int,
        bitmap: bytes,
        sequences: tuple[int, ...],
        created: float,
    ) -> None:
        self.key = key
        self.k = k
        self.m = m
        self.size = size
        self.span = span
        self.bitmap = bitmap
        """The member bitmap as received: later repairs must carry the same bytes."""
        self.sequences = sequences
        self.keys = [key[0] + _SEQ.pack(s) for s in sequences]
        """The members' source-buffer keys (session id || sequence), built once per block."""
        self.created = created
        self.repairs: dict[int, bytes] = {}
        self.bytes = 0


class _Reject(Exception):  # noqa: N818  internal control flow, never escapes
    def __init__(self, reason: FecDropReason, detail: str) -> None:
        self.reason = reason
        self.detail = detail


class FecDecoder:
    """Reconstructs lost source datagrams from repair datagrams (see the module docstring).

    Feed every source datagram the normal decoder *authenticated* to :meth:`add_source`, and
    every datagram for which :func:`is_repair` holds to :meth:`receive_repair`; hand the
    datagrams either returns to the normal decoder. Drain :meth:`pop_drops` for logging.
    """

    def __init__(self, limits: FecLimits, keyring: KeyRing | None) -> None:
        self._limits = limits
        self.keyring = keyring
        """The ring consulted on every repair; assign a new one, or ``KeyRing.replace`` it."""
        self._replay = ReplayGuard(window=limits.replay_window, max_sessions=limits.max_sessions)
        self._aeads: OrderedDict[tuple[int, bytes], tuple[Key, AESGCM]] = OrderedDict()
        self._decoders = _Decoders()
        #: Recent authenticated sources by envelope bytes 8..31 (session id || sequence), in
        #: arrival order in ``_order``. Reads handed in since a block last looked (``_reads``:
        #: arrival time, buffer, start, stop, datagram size) join them only when a block looks
        #: (``_index``): without FEC a read costs one append, not a slice and two stores per
        #: datagram (~1.4 us, a fifth of the receiver's CPU per byte at 10 KB records).
        self._sources: dict[bytes, bytes] = {}
        self._order: deque[tuple[float, bytes, int]] = deque()
        self._reads: deque[tuple[float, bytes, int, int, int]] = deque()
        self._source_bytes = 0
        self._pending: OrderedDict[tuple[bytes, int], _Pending] = OrderedDict()
        self._pending_bytes = 0
        self._waiting: dict[bytes, tuple[bytes, int]] = {}
        self._finished: OrderedDict[tuple[bytes, int], None] = OrderedDict()
        self._drops: Counter[FecDropReason] = Counter()
        self._drop_log: deque[tuple[FecDropReason, str]] = deque(maxlen=256)
        self.repairs_received = 0
        """Repair datagrams handed in (valid or not)."""
        self.repairs_unused = 0
        """Authentic repairs of a block already decided (not needed)."""
        self.blocks_complete = 0
        """Blocks whose sources all arrived (nothing to repair)."""
        self.blocks_recovered = 0
        """Blocks with lost sources, rebuilt from repairs."""
        self.datagrams_reconstructed = 0
        """Source datagrams rebuilt (handed back for the normal decode path)."""
        self.blocks_unrecoverable = 0
        """Blocks with lost sources that too few repairs reached (timed out or evicted)."""
        self.margin_used = [0] * (len(MARGIN_BUCKETS) + 1)
        """Decided blocks by the share of their m repairs the losses used, one count per
        ``MARGIN_BUCKETS`` bound (share <= bound, above the previous) plus one for failed blocks
        (share > 1): how close the link runs to its FEC's limit (docs/operations.md)."""
        self.margin_used_sum = 0.0
        """Sum of those shares (the histogram's ``_sum``)."""

    @property
    def drops(self) -> Mapping[FecDropReason, int]:
        """Drops so far by reason."""
        return self._drops

    @property
    def pending_blocks(self) -> int:
        """Blocks waiting for repairs or sources."""
        return len(self._pending)

    @property
    def buffered_source_bytes(self) -> int:
        """Bytes of recent source datagrams kept for blocks not yet announced."""
        return self._source_bytes

    def pop_drops(self) -> list[tuple[FecDropReason, str]]:
        """Drops since the last call (reason, detail), at most the last 256, for logging."""
        out = list(self._drop_log)
        self._drop_log.clear()
        return out

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` has work (the oldest pending block times out), or None."""
        if not self._pending:
            return None
        return next(iter(self._pending.values())).created + self._limits.block_timeout

    def handle_timer(self, now: float) -> None:
        """Give up on blocks older than ``block_timeout``; forget old sources."""
        limit = now - self._limits.block_timeout
        while self._pending:
            block = next(iter(self._pending.values()))
            if block.created > limit:
                break
            self._give_up(block)
        self._trim_sources(now)

    # -- sources ---------------------------------------------------------------------------

    def add_source(self, data: bytes, now: float) -> list[bytes]:
        """Keep an authenticated source datagram; returns datagrams it let a block rebuild."""
        n = len(data)
        if n < _MIN_DATAGRAM:
            return []
        self._keep(data, 0, n, n, now)
        if self._waiting:
            self._index()
            block_key = self._waiting.get(data[8:32])
            if block_key is not None:
                block = self._pending.get(block_key)
                if block is not None:
                    return self._attempt(block)
        return []

    @property
    def awaiting_sources(self) -> bool:
        """Whether a block waits for a source datagram to arrive (``add_source`` may then
        rebuild, and the order of the decode matters to what it rebuilds)."""
        return bool(self._waiting)

    def add_sources(self, data: bytes, start: int, stop: int, step: int, now: float) -> list[bytes]:
        """``add_source`` for each datagram of ``step`` bytes (the last may be shorter) in
        ``data[start:stop]``, a coalesced read the decoder authenticated whole."""
        if not self._waiting:  # no block can rebuild now: the read is kept whole
            if stop > start:
                self._keep(data, start, stop, step, now)
            return []
        rebuilt: list[bytes] = []
        for at in range(start, stop, step):
            more = self.add_source(data[at : min(at + step, stop)], now)
            if more:
                rebuilt += more
        return rebuilt

    def _keep(self, data: bytes, start: int, stop: int, step: int, now: float) -> None:
        """Keep the datagrams of ``step`` bytes in ``data[start:stop]`` for ``_index``."""
        self._reads.append((now, data, start, stop, step))
        self._source_bytes += stop - start
        oldest = self._order[0][0] if self._order else self._reads[0][0]
        if (
            self._source_bytes > self._limits.max_source_bytes
            or oldest < now - self._limits.block_timeout
        ):
            self._trim_sources(now)

    def _index(self) -> None:
        """Every kept read's datagrams into ``_sources`` (a repeat of a source kept already, or
        a datagram too short to be one, is let go and its bytes uncounted)."""
        reads, sources, order = self._reads, self._sources, self._order
        while reads:
            now, data, start, stop, step = reads.popleft()
            for at in range(start, stop, step):
                end = min(at + step, stop)
                n = end - at
                key = data[at + 8 : at + 32]
                if n < _MIN_DATAGRAM or key in sources:
                    self._source_bytes -= n
                    continue
                sources[key] = data if n == len(data) else data[at:end]
                order.append((now, key, n))

    def _trim_sources(self, now: float) -> None:
        """Forget the oldest sources while over ``max_source_bytes`` or older than the block
        timeout: indexed ones first, then whole reads (all newer than any indexed one)."""
        order, sources, reads = self._order, self._sources, self._reads
        too_old = now - self._limits.block_timeout
        limit = self._limits.max_source_bytes
        while order and (self._source_bytes > limit or order[0][0] < too_old):
            _, key, size = order.popleft()
            self._source_bytes -= size
            sources.pop(key, None)
        while reads and (self._source_bytes > limit or reads[0][0] < too_old):
            _, _, start, stop, _ = reads.popleft()
            self._source_bytes -= stop - start

    # -- repairs ---------------------------------------------------------------------------

    def receive_repair(self, data: bytes, now: float) -> list[bytes]:
        """Process one repair datagram; returns reconstructed source datagrams (maybe none).

        Never raises for bad input: every failure is a counted drop.
        """
        self.repairs_received += 1
        try:
            return self._receive(data, now)
        except _Reject as exc:
            self._drop(exc.reason, exc.detail)
            return []

    def _drop(self, reason: FecDropReason, detail: str) -> None:
        self._drops[reason] += 1
        self._drop_log.append((reason, detail))

    def _give_up(self, block: _Pending) -> None:
        """Forget a block that cannot be rebuilt (timed out, evicted, or inconsistent)."""
        self._forget(block)
        self.blocks_unrecoverable += 1
        self._index()
        have = self._sources
        missing = sum(k not in have for k in block.keys)
        self._observe(block, missing, failed=True)

    def _observe(self, block: _Pending, missing: int, *, failed: bool) -> None:
        """Count a decided block in ``margin_used``. Its losses are the missing sources plus
        the repairs known lost: at a rebuild, those below the highest repair index received
        (repairs leave in index order; later ones are not waited for); for a failed block
        every repair that never came, and at least m + 1 (its sources may have aged out of the
        buffer, and an inconsistent block failed whatever it lost)."""
        if failed:
            lost = max(block.m + 1, missing + block.m - len(block.repairs))
        else:
            lost = missing + max(block.repairs, default=-1) + 1 - len(block.repairs)
        share = lost / block.m
        self.margin_used_sum += share
        self.margin_used[bisect.bisect_left(MARGIN_BUCKETS, share)] += 1

    def _receive(self, data: bytes, now: float) -> list[bytes]:
        bad = FecDropReason.MALFORMED
        if not is_repair(data):
            raise _Reject(bad, "not a repair datagram")
        (_, _, _, compression, cipher, session, sequence, key_id, index, count, total) = (
            HEADER.unpack_from(data)
        )
        try:
            length, pos = decode_long(data, HEADER_SIZE, len(data))
        except ValueError:
            raise _Reject(bad, "bad payload length") from None
        if length < 0 or pos + length != len(data):
            raise _Reject(bad, "payload length disagrees with the datagram")
        if compression != COMPRESSION_NONE or index != 0 or count != 1:
            raise _Reject(bad, "repairs are one uncompressed datagram")
        if cipher == CIPHER_AES_256_GCM:
            if total + TAG_SIZE != length:
                raise _Reject(bad, "message length disagrees with the payload")
        elif cipher == CIPHER_NONE:
            if not self._limits.allow_cleartext:
                raise _Reject(FecDropReason.CLEARTEXT_REFUSED, "cipher none")
            if total != length or key_id != 0:
                raise _Reject(bad, "message length or key id disagrees")
        else:
            raise _Reject(FecDropReason.UNKNOWN_CIPHER, f"cipher {cipher}")
        replay = self._replay
        seen = replay.precheck(session, sequence)
        if seen is not None:
            raise _Reject(FecDropReason(f"fec_{seen}"), f"repair sequence {sequence}")
        plaintext = (
            data[pos:]
            if cipher == CIPHER_NONE
            else self._open(data, pos, session, sequence, key_id)
        )
        seen = replay.accept(session, sequence)
        if seen is not None:
            raise _Reject(FecDropReason(f"fec_{seen}"), f"repair sequence {sequence}")
        # authentic from here on: a failure below is the sender's bug or a keyholder's forgery
        if len(plaintext) < FEC_HEADER.size:
            raise _Reject(bad, "repair shorter than its header")
        first, scheme, k, m, rindex, size, span = FEC_HEADER.unpack_from(plaintext)
        if scheme != SCHEME_ZFEC_RS:
            raise _Reject(bad, f"scheme {scheme}")
        if not (k >= 1 and m >= 1 and k + m <= MAX_SYMBOLS and rindex < m):
            raise _Reject(bad, f"k={k} m={m} index={rindex}")
        if not (k <= span <= MAX_SPAN and first + span - 1 <= MAX_SEQUENCE):
            raise _Reject(bad, f"span {span} for k={k}")
        if size < 2 + _MIN_DATAGRAM:
            raise _Reject(bad, f"symbol size {size}")
        start = FEC_HEADER.size + (span + 7) // 8
        if len(plaintext) != start + size:
            raise _Reject(bad, "symbol length disagrees with symbol size")
        bitmap = plaintext[FEC_HEADER.size : start]
        offsets = _offsets(bitmap, span)
        if offsets is None or len(offsets) != k or offsets[0] != 0 or offsets[-1] != span - 1:
            raise _Reject(bad, "member bitmap disagrees with k and span")
        key = (session, first)
        if key in self._finished:
            self.repairs_unused += 1
            return []
        block = self._pending.get(key)
        if block is None:
            sequences = tuple(first + o for o in offsets)
            block = _Pending(key, k, m, size, span, bitmap, sequences, now)
            self._pending[key] = block
            if len(self._pending) > self._limits.max_pending_blocks:
                self._evict()
        elif (block.k, block.m, block.size, block.span, block.bitmap) != (k, m, size, span, bitmap):
            # same first sequence and span: equal bitmaps are equal member sets
            raise _Reject(FecDropReason.MISMATCH, f"repair disagrees with block at {first}")
        if rindex in block.repairs:
            return []
        block.repairs[rindex] = plaintext[start:]
        block.bytes += size
        self._pending_bytes += size
        while self._pending_bytes > self._limits.max_pending_bytes and self._pending:
            self._evict()
        if key not in self._pending:  # evicted itself
            return []
        return self._attempt(block)

    def _evict(self) -> None:
        oldest = next(iter(self._pending.values()))
        self._give_up(oldest)
        self._drop(FecDropReason.OVERFLOW, f"block at {oldest.key[1]} evicted")

    def _open(self, data: bytes, pos: int, session: bytes, sequence: int, key_id: int) -> bytes:
        keyring = self.keyring
        key = keyring.get(key_id) if keyring is not None else None
        if key is None:
            raise _Reject(FecDropReason.UNKNOWN_KEY, f"key id {key_id:08x}")
        cache_key = (key_id, session)
        cached = self._aeads.get(cache_key)
        fresh = cached is None or cached[0] is not key
        aead = _fec_aead(key, session) if fresh else cached[1]  # type: ignore[index]
        nonce = session[:4] + _SEQ.pack(sequence)
        try:
            plaintext = aead.decrypt(nonce, data[pos:], data[:HEADER_SIZE])
        except InvalidTag:
            raise _Reject(FecDropReason.AUTH_FAILED, "GCM tag mismatch") from None
        # cached only once authentic, so forged session ids cannot flush the cache
        self._aeads[cache_key] = (key, aead)
        self._aeads.move_to_end(cache_key)
        if len(self._aeads) > 2 * self._limits.max_sessions:
            self._aeads.popitem(last=False)
        return plaintext

    def _forget(self, block: _Pending) -> None:
        self._pending.pop(block.key, None)
        self._pending_bytes -= block.bytes
        if self._waiting:
            for k in block.keys:
                self._waiting.pop(k, None)
        self._finished[block.key] = None
        if len(self._finished) > 4 * self._limits.max_pending_blocks:
            self._finished.popitem(last=False)

    def _attempt(self, block: _Pending) -> list[bytes]:
        session = block.key[0]
        self._index()
        have = self._sources
        keys = block.keys
        missing = [i for i, key in enumerate(keys) if key not in have]
        if not missing:
            self._forget(block)
            self.blocks_complete += 1
            self._observe(block, 0, failed=False)
            return []
        if len(block.repairs) < len(missing):
            for i in missing:
                self._waiting[keys[i]] = block.key
            return []
        size = block.size
        symbols: list[bytes] = []
        numbers: list[int] = []
        for i, key in enumerate(keys):
            s = block.sequences[i]
            datagram = have.get(key)
            if datagram is not None:
                if len(datagram) > size - 2:
                    self._give_up(block)
                    self._drop(FecDropReason.MISMATCH, f"source {s} longer than the symbol")
                    return []
                symbols.append(_symbol(datagram, size))
                numbers.append(i)
        for rindex, symbol in block.repairs.items():
            if len(symbols) == block.k:
                break
            symbols.append(symbol)
            numbers.append(block.k + rindex)
        decoded = self._decoders.get(block.k, block.m).decode(tuple(symbols), tuple(numbers))
        out: list[bytes] = []
        for i in missing:
            symbol = bytes(decoded[i])
            n = _U16.unpack_from(symbol)[0]
            datagram = symbol[2 : 2 + n]
            if (
                not _MIN_DATAGRAM <= n <= size - 2
                or datagram[8:24] != session
                or _SEQ.unpack_from(datagram, 24)[0] != block.sequences[i]
            ):
                self._give_up(block)
                self._drop(FecDropReason.MISMATCH, f"block at {block.key[1]} rebuilt garbage")
                return []
            out.append(datagram)
        self._forget(block)
        self.blocks_recovered += 1
        self.datagrams_reconstructed += len(out)
        self._observe(block, len(missing), failed=False)
        return out
