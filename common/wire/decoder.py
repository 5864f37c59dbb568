"""The sans-IO decoder: datagrams in, events out; hostile input only ever becomes a counted drop.

Theory of operation (docs/protocol.md §8), per datagram, cheapest checks first:

1. structure: length >= 45, magic ``KDIO``, version 1, the payload length prefix ends exactly at
   the end of the datagram (else TRAILING_BYTES / MALFORMED);
2. codes and limits from the header: cipher, compression, kind known; fragment index < count <=
   ``max_fragments``; declared message length <= ``max_message_size``;
3. anti-replay pre-check (read only): a sequence already seen or below the window is dropped
   before any cryptography, so redundant copies cost almost nothing;
4. authentication: the key id must be in the key ring (consulted on every datagram, so rotation
   needs no restart), AES-256-GCM with the header as associated data; cipher ``none`` only when
   ``allow_cleartext``. The session key is derived (HKDF, then the AES key schedule: ~20 us, the
   dearest step) once per (key, session) and kept: in the authenticated cache once a datagram
   of the session authenticated, before that in a small separate one, so a flood of mangled copies
   of one session's datagrams pays the derivation once and forged sessions cannot evict the
   authenticated ones;
5. anti-replay update, only now that the datagram is authentic;
6. reassembly when fragmented (bounded, see ``fragment.py``), bounded gunzip, payload decoding;
   trailing bytes anywhere are refused.

The cheapest rejection, a wrong magic (random datagrams), is counted without raising an exception.
``receive_datagram`` raises nothing for bad input: every failure is a ``Dropped`` event and a
count in ``drops``. Anything else escaping is a bug (the fuzz tests say so). The caller drains
``next_event`` after each ``receive_datagram``/``handle_timer`` call; each call queues at most one
message event plus the drops it caused.
"""

from __future__ import annotations

import functools
import struct
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from typing import Final

from cryptography.exceptions import InvalidTag

from common.errors import RemoteProtocolError
from common.wire import compression as gzip_codec
from common.wire.batch_decode import decode_record_groups
from common.wire.config import WireConfig
from common.wire.control import (
    HEARTBEAT_SCHEMA,
    RESEND_MARKER_SCHEMA,
    WITHHELD_SCHEMA,
    decode_control,
    heartbeat_offsets_problem,
    resend_marker_problem,
    withheld_problem,
)
from common.wire.crypto import SessionCipher
from common.wire.envelope import (
    CIPHER_AES_256_GCM,
    CIPHER_NONE,
    COMPRESSION_NONE,
    HEADER,
    HEADER_SIZE,
    KIND_HEARTBEAT,
    KIND_RECORD_BATCH,
    KIND_WITHHELD,
    KINDS,
    MAGIC,
    TAG_SIZE,
    VERSION,
    decode_long,
)
from common.wire.events import (
    Dropped,
    DropReason,
    Event,
    Heartbeat,
    RecordBatch,
    ResendMarker,
    Withheld,
)
from common.wire.fragment import Reassembler
from common.wire.keyring import KeyRing
from common.wire.replay import ReplayGuard

_KNOWN_KINDS = frozenset(KINDS)
#: The header as the fast path reads it: the first 8 bytes (magic, version, kind, compression,
#: cipher) whole, session id, sequence, key id, fragment index and count whole, message length.
_FAST_HEADER: Final = struct.Struct(">8s16sQI4sI")
_FAST_PREFIX: Final = MAGIC + bytes(
    (VERSION, KIND_RECORD_BATCH, COMPRESSION_NONE, CIPHER_AES_256_GCM)
)
_ONE_OF_ONE: Final = b"\x00\x00\x00\x01"  # fragment index 0, fragment count 1
_FRAGMENT: Final = struct.Struct(">HH")  # fragment index, fragment count
#: A fragment's whole header: the first 24 bytes (magic to session id), then sequence, key id,
#: fragment index and count, message length.
_FRAGMENT_HEADER: Final = struct.Struct(">24sQIHHI")
#: The AES-GCM nonce: the session id's first 4 bytes and the sequence (docs/protocol.md §7.2).
_NONCE: Final = struct.Struct(">4sQ")
#: What a datagram adds to its chunk: the header, a two-byte payload length, the GCM tag.
_FRAGMENT_OVERHEAD: Final = HEADER_SIZE + 2 + TAG_SIZE
#: Ciphers of sessions not authenticated yet kept at most (a forged-session flood's own LRU).
_MAX_PENDING_CIPHERS: Final = 64
_new = object.__new__
# RecordBatch is frozen; its slot descriptors set fields without the frozen __setattr__.
_set_session, _set_sequence, _set_groups, _set_count, _set_records = (
    getattr(RecordBatch, name).__set__ for name in RecordBatch.__slots__
)


class Decoder:
    """Turns the datagrams of any number of sender sessions into events."""

    def __init__(self, config: WireConfig, keyring: KeyRing | None) -> None:
        self._config = config
        #: The ring consulted on every datagram; assign a new one, or ``KeyRing.replace`` it.
        self.keyring = keyring
        self._events: deque[Event] = deque()
        self._drops: Counter[DropReason] = Counter()
        #: Datagrams received (valid or not).
        self.datagrams = 0
        #: Datagrams that authenticated and were new to their replay window (FEC keeps these:
        #: a receiver compares it before and after ``receive_datagram``).
        self.authenticated = 0
        #: Fragmented messages ``receive_coalesced`` decoded whole.
        self.coalesced_messages = 0
        self._replay = ReplayGuard(window=config.replay_window, max_sessions=config.max_sessions)
        self._reassembler = Reassembler(
            max_reassemblies=config.max_reassemblies,
            max_bytes=config.max_reassembly_bytes,
            timeout=config.reassembly_timeout,
        )
        self._ciphers: OrderedDict[tuple[int, bytes], SessionCipher] = OrderedDict()
        #: ciphers derived for sessions none of whose datagrams authenticated yet (module doc, 4)
        self._pending: OrderedDict[tuple[int, bytes], SessionCipher] = OrderedDict()
        self._max_message_size = config.max_message_size
        self._max_ciphers = 2 * config.max_sessions

    @property
    def drops(self) -> Mapping[DropReason, int]:
        """Drops so far by reason (reasons never seen are absent)."""
        return self._drops

    @property
    def reassemblies_in_flight(self) -> int:
        """Fragmented messages waiting for more fragments."""
        return len(self._reassembler)

    @property
    def last_sequence(self) -> Mapping[bytes, int]:
        """Highest authenticated sequence per tracked session."""
        return self._replay.last_sequence

    def next_event(self) -> Event | None:
        """The next event, or None when none is queued."""
        return self._events.popleft() if self._events else None

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` has work (a reassembly timing out), or None."""
        return self._reassembler.next_deadline()

    def handle_timer(self, now: float) -> None:
        """Drop partial messages older than ``reassembly_timeout``."""
        for session_id, first in self._reassembler.expire(now):
            self._drop(
                DropReason.REASSEMBLY_TIMEOUT, f"message at sequence {first} incomplete", session_id
            )

    def _drop(self, reason: DropReason, detail: str, session_id: bytes | None) -> None:
        self._drops[reason] += 1
        self._events.append(Dropped(reason, detail, session_id))

    def receive_datagram(self, data: bytes, now: float) -> None:
        """Process one datagram; never raises for bad input."""
        self.datagrams += 1
        if data[:4] != MAGIC:  # random datagrams: the cheapest check, and no exception raised
            why = DropReason.BAD_MAGIC
            if len(data) < 4 and MAGIC.startswith(data):
                why = DropReason.MALFORMED  # a prefix of the magic: too short, not wrong
            self._drops[why] += 1
            self._events.append(Dropped(why, f"datagram of {len(data)} bytes", None))
            return
        session_id: bytes | None = None
        try:
            # Fast path: the usual datagram (a whole AES-GCM record batch, uncompressed, of 64 to
            # 8191 payload bytes, next in order in a session whose window and cipher exist) in
            # one frame with the checks of the general path below, in the same order. Anything
            # else, including every failure before authentication, takes the general path.
            end = len(data)
            if end > HEADER_SIZE + 2 + TAG_SIZE:
                prefix, session_id, sequence, key_id, fragment, total = _FAST_HEADER.unpack_from(
                    data
                )
                b = data[HEADER_SIZE]
                c = data[HEADER_SIZE + 1]
                if (
                    prefix == _FAST_PREFIX
                    and fragment == _ONE_OF_ONE
                    and b >= 0x80
                    and c < 0x80
                    and not b & 1
                    and HEADER_SIZE + 2 + (((b & 0x7F) | (c << 7)) >> 1) == end
                    and total + TAG_SIZE + HEADER_SIZE + 2 == end
                    and total <= self._max_message_size
                ):
                    windows = self._replay.windows
                    window = windows.get(session_id)
                    ciphers = self._ciphers
                    cache_key = (key_id, session_id)
                    cipher = ciphers.get(cache_key)
                    keyring = self.keyring
                    if (
                        window is not None
                        and sequence > window.highest
                        and cipher is not None
                        and keyring is not None
                        and keyring.get(key_id) is cipher.key
                    ):
                        try:
                            payload = cipher.aead.decrypt(
                                data[8:12] + data[24:32],
                                data[HEADER_SIZE + 2 :],
                                data[:HEADER_SIZE],
                            )
                        except InvalidTag:
                            raise RemoteProtocolError(
                                DropReason.AUTH_FAILED, "GCM tag mismatch"
                            ) from None
                        # authentic: the window takes it (ReplayWindow.update, inlined for the
                        # usual advance by one, which clears nothing)
                        if sequence == window.highest + 1:
                            window.seen[sequence % window.size] = 1
                            window.highest = sequence
                        else:
                            window.update(sequence)
                        windows.move_to_end(session_id)
                        ciphers.move_to_end(cache_key)
                        self.authenticated += 1
                        groups, count = decode_record_groups(payload)
                        batch = _new(RecordBatch)
                        _set_session(batch, session_id)
                        _set_sequence(batch, sequence)
                        _set_groups(batch, groups)
                        _set_count(batch, count)
                        _set_records(batch, None)
                        self._events.append(batch)
                        return
                elif (
                    prefix == _FAST_PREFIX
                    and fragment != _ONE_OF_ONE
                    and b >= 0x80
                    and c < 0x80
                    and not b & 1
                    and HEADER_SIZE + 2 + (((b & 0x7F) | (c << 7)) >> 1) == end
                ):
                    # The fragment of a large record batch (uncompressed, AES-GCM), in order in
                    # a known session: the general path's checks, in its order, in one frame.
                    # Every datagram that fails one of them takes the general path below.
                    index, count = _FRAGMENT.unpack(fragment)
                    chunk_length = end - HEADER_SIZE - 2 - TAG_SIZE
                    windows = self._replay.windows
                    window = windows.get(session_id)
                    ciphers = self._ciphers
                    cache_key = (key_id, session_id)
                    cipher = ciphers.get(cache_key)
                    keyring = self.keyring
                    if (
                        index < count <= self._config.max_fragments
                        and index <= sequence
                        and total <= self._max_message_size
                        and chunk_length <= total
                        and window is not None
                        and sequence > window.highest
                        and cipher is not None
                        and keyring is not None
                        and keyring.get(key_id) is cipher.key
                    ):
                        try:
                            chunk = cipher.aead.decrypt(
                                data[8:12] + data[24:32],
                                data[HEADER_SIZE + 2 :],
                                data[:HEADER_SIZE],
                            )
                        except InvalidTag:
                            raise RemoteProtocolError(
                                DropReason.AUTH_FAILED, "GCM tag mismatch"
                            ) from None
                        if sequence == window.highest + 1:
                            window.seen[sequence % window.size] = 1
                            window.highest = sequence
                        else:
                            window.update(sequence)
                        windows.move_to_end(session_id)
                        ciphers.move_to_end(cache_key)
                        self.authenticated += 1
                        message = self._reassembler.add(
                            session_id, sequence, index, count, total, KIND_RECORD_BATCH,
                            COMPRESSION_NONE, chunk, now,
                        )  # fmt: skip
                        if message is not None:
                            groups, records = decode_record_groups(message)
                            batch = _new(RecordBatch)
                            _set_session(batch, session_id)
                            _set_sequence(batch, sequence - index)
                            _set_groups(batch, groups)
                            _set_count(batch, records)
                            _set_records(batch, None)
                            self._events.append(batch)
                        self._evictions()
                        return
            if len(data) <= HEADER_SIZE:
                short = DropReason.BAD_MAGIC if data[:4] != MAGIC[: len(data[:4])] else None
                raise RemoteProtocolError(
                    short or DropReason.MALFORMED, f"datagram of {len(data)} bytes"
                )
            (
                magic,
                version,
                kind,
                compression,
                cipher_code,
                session_id,
                sequence,
                key_id,
                index,
                count,
                total,
            ) = HEADER.unpack_from(data)
            if magic != MAGIC:
                raise RemoteProtocolError(DropReason.BAD_MAGIC, magic.hex())
            if version != VERSION:
                raise RemoteProtocolError(DropReason.UNSUPPORTED_VERSION, f"version {version}")
            # the payload length prefix: two bytes for every payload of 64 to 8191 bytes
            end = len(data)
            b = data[HEADER_SIZE]
            if b >= 0x80 and end > HEADER_SIZE + 1 and data[HEADER_SIZE + 1] < 0x80 and not b & 1:
                length = ((b & 0x7F) | (data[HEADER_SIZE + 1] << 7)) >> 1
                pos = HEADER_SIZE + 2
            else:
                try:
                    length, pos = decode_long(data, HEADER_SIZE, end)
                except ValueError:
                    raise RemoteProtocolError(DropReason.MALFORMED, "bad payload length") from None
            if length < 0 or pos + length > end:
                raise RemoteProtocolError(DropReason.MALFORMED, "payload length past the end")
            if pos + length < end:
                raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the envelope")
            self._receive(
                data, pos, length, kind, compression, cipher_code, session_id, sequence, key_id,
                index, count, total, now,
            )  # fmt: skip
        except RemoteProtocolError as exc:
            reason = exc.reason if isinstance(exc.reason, DropReason) else DropReason.MALFORMED
            self._drop(reason, exc.detail, session_id)
        self._evictions()

    def receive_coalesced(self, data: bytes, start: int, segment: int, now: float) -> int:
        """Decode, in one call, the fragmented message whose fragments are the datagrams of
        ``segment`` bytes from ``data[start:]`` (a UDP GRO read: datagrams of one flow, equal in
        size but the last); return the bytes it took, or 0 having changed nothing.

        Why: a 10 KB record is eight datagrams, and per datagram the general path spends more in
        Python than AES-GCM costs; here the checks of the fragment fast path run once per
        fragment against the header the first one predicts, the chunks are decrypted straight
        into the message, and the reassembler is not involved. It takes a message only when that
        equals what ``receive_datagram`` would do with each datagram in turn (pinned by
        tests/property/test_coalesced_decode.py): fragment 0 at ``start`` and every other one
        after it in order, each with the fast path's header, all authentic, all new to a known
        session's replay window, and room in the reassembler without evicting another message.
        On 0 the caller hands these datagrams to ``receive_datagram`` one by one.
        """
        end = len(data)
        if end - start <= _FRAGMENT_OVERHEAD:
            return 0
        prefix, session_id, sequence, key_id, fragment, total = _FAST_HEADER.unpack_from(
            data, start
        )
        count: int = fragment[2] << 8 | fragment[3]
        if (
            prefix != _FAST_PREFIX
            or fragment[0]
            or fragment[1]
            or count < 2
            or count > self._config.max_fragments
            or total > self._max_message_size
        ):
            return 0
        last = start + (count - 1) * segment
        if end - last <= _FRAGMENT_OVERHEAD:
            return 0  # a fragment is missing (still to come, or lost)
        stop = min(last + segment, end)
        length = _length_prefix(segment)
        last_length = _length_prefix(stop - last)
        if length is None or last_length is None:
            return 0
        chunk = segment - HEADER_SIZE - len(length) - TAG_SIZE
        last_chunk = stop - last - HEADER_SIZE - len(last_length) - TAG_SIZE
        if (count - 1) * chunk + last_chunk != total:
            return 0
        window = self._replay.windows.get(session_id)
        cache_key = (key_id, session_id)
        cipher = self._ciphers.get(cache_key)
        keyring = self.keyring
        if (
            window is None
            or sequence <= window.highest
            or sequence + count > 1 << 64
            or cipher is None
            or keyring is None
            or keyring.get(key_id) is not cipher.key
            or not self._reassembler.has_room(total)
        ):
            return 0
        head = data[start : start + 24]  # magic, version, codes, session id
        salt = data[start + 8 : start + 12]
        # Each fragment's header is packed as expected and found in place (``startswith``: no
        # slice of the datagram), then is the associated data itself; the nonce is the salt and
        # the sequence the header was checked to hold. Fewer objects per fragment than slicing
        # header and nonce out of the datagram: this loop runs once per 1.4 KB received.
        header_of = _FRAGMENT_HEADER.pack
        nonce_of = _NONCE.pack
        found = data.startswith
        decrypt_into = cipher.aead.decrypt_into
        view = memoryview(data)
        message = bytearray(total)
        into = memoryview(message)
        at = start
        last_index = count - 1
        try:
            for index in range(count):
                number = sequence + index
                header = header_of(head, number, key_id, index, count, total)
                if index < last_index:
                    payload = at + HEADER_SIZE + len(length)
                    if not (found(header, at) and found(length, at + HEADER_SIZE)):
                        return 0
                    decrypt_into(
                        nonce_of(salt, number),
                        view[payload : at + segment],
                        header,
                        into[index * chunk : (index + 1) * chunk],
                    )
                else:
                    payload = at + HEADER_SIZE + len(last_length)
                    if not (found(header, at) and found(last_length, at + HEADER_SIZE)):
                        return 0
                    decrypt_into(
                        nonce_of(salt, number), view[payload:stop], header, into[index * chunk :]
                    )
                at += segment
        except InvalidTag:
            return 0  # the one-by-one path counts which datagram failed
        # authentic and new: the window takes every sequence, as it would one by one: the last
        # slides it (clearing what it skips), then the others' flags are set in one or two slices
        window.update(sequence + count - 1)
        ring = window.size
        if count - 1 >= ring:
            window.seen[:] = b"\x01" * ring
        else:
            first = sequence % ring
            after = first + count - 1
            if after <= ring:
                window.seen[first:after] = b"\x01" * (count - 1)
            else:
                window.seen[first:] = b"\x01" * (ring - first)
                window.seen[: after - ring] = b"\x01" * (after - ring)
        self._replay.windows.move_to_end(session_id)
        self._ciphers.move_to_end(cache_key)
        self.datagrams += count
        self.authenticated += count
        self.coalesced_messages += 1
        try:
            groups, records = decode_record_groups(bytes(message))
        except RemoteProtocolError as exc:
            reason = exc.reason if isinstance(exc.reason, DropReason) else DropReason.MALFORMED
            self._drop(reason, exc.detail, session_id)
            return stop - start
        batch = _new(RecordBatch)
        _set_session(batch, session_id)
        _set_sequence(batch, sequence)
        _set_groups(batch, groups)
        _set_count(batch, records)
        _set_records(batch, None)
        self._events.append(batch)
        return stop - start

    def _evictions(self) -> None:
        """Count the partial messages the reassembler evicted to make room."""
        evicted = self._reassembler.evicted
        if evicted:
            for sid, first in evicted:
                self._drop(DropReason.REASSEMBLY_OVERFLOW, f"message at sequence {first}", sid)
            evicted.clear()

    def _receive(  # noqa: PLR0917  private, called once per datagram with the unpacked header
        self,
        data: bytes,
        pos: int,
        length: int,
        kind: int,
        compression: int,
        cipher_code: int,
        session_id: bytes,
        sequence: int,
        key_id: int,
        index: int,
        count: int,
        total: int,
        now: float,
    ) -> None:
        config = self._config
        if cipher_code not in (CIPHER_NONE, CIPHER_AES_256_GCM):
            raise RemoteProtocolError(DropReason.UNKNOWN_CIPHER, f"cipher {cipher_code}")
        if cipher_code == CIPHER_NONE and not config.allow_cleartext:
            raise RemoteProtocolError(DropReason.CLEARTEXT_REFUSED, "cipher none")
        if compression != COMPRESSION_NONE and compression not in gzip_codec.DECODABLE:
            raise RemoteProtocolError(DropReason.UNKNOWN_COMPRESSION, f"compression {compression}")
        if kind not in _KNOWN_KINDS:
            raise RemoteProtocolError(DropReason.UNKNOWN_KIND, f"kind {kind}")
        if count == 0 or index >= count or index > sequence:
            raise RemoteProtocolError(DropReason.MALFORMED, f"fragment {index} of {count}")
        if count > config.max_fragments:
            raise RemoteProtocolError(DropReason.TOO_MANY_FRAGMENTS, f"{count} fragments")
        if total > config.max_message_size:
            raise RemoteProtocolError(DropReason.TOO_LARGE, f"message of {total} bytes")
        chunk_length = length - (TAG_SIZE if cipher_code == CIPHER_AES_256_GCM else 0)
        if chunk_length < 0:
            raise RemoteProtocolError(DropReason.MALFORMED, "payload shorter than the tag")
        if chunk_length > total or (count == 1 and chunk_length != total):
            raise RemoteProtocolError(DropReason.FRAGMENT_MISMATCH, "length disagrees with header")
        replay = self._replay
        reason = replay.precheck(session_id, sequence)
        if reason is not None:
            raise RemoteProtocolError(reason, f"sequence {sequence}")
        if cipher_code == CIPHER_NONE:
            if key_id != 0:
                raise RemoteProtocolError(DropReason.MALFORMED, "key id with cipher none")
            chunk = data[pos:]
        else:
            chunk = self._open(data, pos, session_id, sequence, key_id)
        reason = replay.accept(session_id, sequence)
        if reason is not None:
            raise RemoteProtocolError(reason, f"sequence {sequence}")
        self.authenticated += 1
        first = sequence - index
        if count > 1:
            message = self._reassembler.add(
                session_id, sequence, index, count, total, kind, compression, chunk, now
            )
            if message is None:
                return
            chunk = message
        self._deliver(kind, compression, session_id, first, chunk, cipher_code == CIPHER_NONE)

    def _open(self, data: bytes, pos: int, session_id: bytes, sequence: int, key_id: int) -> bytes:
        keyring = self.keyring
        key = keyring.get(key_id) if keyring is not None else None
        if key is None:
            raise RemoteProtocolError(DropReason.UNKNOWN_KEY, f"key id {key_id:08x}")
        ciphers = self._ciphers
        cache_key = (key_id, session_id)
        cipher = ciphers.get(cache_key)
        if cipher is not None and cipher.key is key:
            ciphers.move_to_end(cache_key)
            return cipher.open(sequence, data[pos:], data[:HEADER_SIZE])
        # New session or replaced key: derive once, keep it among the pending ciphers until a
        # datagram authenticates (mangled copies of a session's datagrams do not derive again),
        # and only then in the authenticated cache, so forged session ids cannot flush that one.
        pending = self._pending
        cipher = pending.get(cache_key)
        if cipher is None or cipher.key is not key:
            cipher = SessionCipher(key, session_id)
            pending[cache_key] = cipher
            if len(pending) > _MAX_PENDING_CIPHERS:
                pending.popitem(last=False)
        else:
            pending.move_to_end(cache_key)
        plaintext = cipher.open(sequence, data[pos:], data[:HEADER_SIZE])
        del pending[cache_key]
        ciphers[cache_key] = cipher
        if len(ciphers) > self._max_ciphers:
            ciphers.popitem(last=False)
        return plaintext

    def _deliver(  # noqa: PLR0917  private, called once per message
        self,
        kind: int,
        compression: int,
        session_id: bytes,
        sequence: int,
        payload: bytes,
        cleartext: bool = False,
    ) -> None:
        if compression != COMPRESSION_NONE:
            ratio = gzip_codec.CLEARTEXT_MAX_RATIO if cleartext else None
            payload = gzip_codec.decompress_code(
                compression, payload, self._config.max_decompressed_size, ratio
            )
        if kind == KIND_RECORD_BATCH:
            groups, count = decode_record_groups(payload)
            batch = _new(RecordBatch)
            _set_session(batch, session_id)
            _set_sequence(batch, sequence)
            _set_groups(batch, groups)
            _set_count(batch, count)
            _set_records(batch, None)
            self._events.append(batch)
        elif kind == KIND_HEARTBEAT:
            d = decode_control(HEARTBEAT_SCHEMA, payload)
            high = tuple((h["topic"], h["partition"], h["offset"]) for h in d["high_offsets"])
            low = tuple((h["topic"], h["partition"], h["offset"]) for h in d["low_offsets"])
            problem = heartbeat_offsets_problem(high, low)
            if problem is not None:
                raise RemoteProtocolError(DropReason.MALFORMED, f"heartbeat: {problem}")
            self._events.append(
                Heartbeat(
                    session_id,
                    sequence,
                    d["sender_id"],
                    d["started_at_ms"],
                    d["sent_at_ms"],
                    high,
                    low,
                    tuple((c["name"], c["value"]) for c in d["counters"]),
                )
            )
        elif kind == KIND_WITHHELD:
            d = decode_control(WITHHELD_SCHEMA, payload)
            problem = withheld_problem(d["ranges"])
            if problem is not None:
                raise RemoteProtocolError(DropReason.OUT_OF_RANGE, f"withheld: {problem}")
            self._events.append(
                Withheld(
                    session_id,
                    sequence,
                    tuple((r["topic"], r["partition"], r["first"], r["last"]) for r in d["ranges"]),
                )
            )
        else:
            d = decode_control(RESEND_MARKER_SCHEMA, payload)
            problem = resend_marker_problem(d["ranges"], d["records_sent"], d["sent_at_ms"])
            if problem is not None:
                raise RemoteProtocolError(DropReason.OUT_OF_RANGE, f"resend marker: {problem}")
            self._events.append(
                ResendMarker(
                    session_id,
                    sequence,
                    d["bundle_id"],
                    d["phase"],
                    tuple((r["topic"], r["partition"], r["first"], r["last"]) for r in d["ranges"]),
                    d["records_sent"],
                    d["sent_at_ms"],
                )
            )


@functools.lru_cache(maxsize=256)
def _length_prefix(size: int) -> bytes | None:
    """The Avro long in front of the payload of a datagram of ``size`` bytes, in the form the
    encoder writes (two bytes for payloads of 64 to 8191 bytes, three up to 1,048,575: datagrams
    of jumbo-frame links), or None for a size no such datagram has. Cached: asked twice per
    coalesced message, mostly for the link's one segment size and its messages' last ones."""
    for width in (2, 3):
        doubled = (size - HEADER_SIZE - width) << 1  # zigzag of a length >= 0
        if doubled >> 7 * width or not doubled >> 7 * (width - 1):
            continue  # needs more bytes, or fewer (a payload under 64 bytes has one)
        out = bytearray()
        for _ in range(width - 1):
            out.append((doubled & 0x7F) | 0x80)
            doubled >>= 7
        out.append(doubled)
        return bytes(out)
    return None
