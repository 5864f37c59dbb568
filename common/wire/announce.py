"""Key announcements of the public-key mode: sealed, signed session keys (docs/protocol.md §7.5).

Theory of operation. A sender in public-key mode has no pre-shared key. At each start, and then
every ``session_key_interval`` seconds or ``session_key_bytes`` bytes, it draws a fresh random
256-bit **session key**, puts it in its own key ring (so the encoder and the data datagrams work
exactly as in shared-key mode: same envelope, same per-session HKDF subkey, same nonces) and
announces it in a **key announcement** (kind 3):

* the session key is sealed to the receiver's X25519 public key with HPKE (RFC 9180, base mode,
  DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM), with an ``info`` that binds it to the
  session id, key id, epoch, signer and receiver fingerprints;
* the whole datagram but its last 64 bytes (header included, so every header field too) is signed
  with the sender's Ed25519 key; the signature is those 64 bytes.

Announcements repeat every ``announce_interval`` (the link is lossy and has no return path),
byte-identical, so a receiver recognises a repeat without any cryptography. A new key is announced
``announce_lead`` seconds before the sender starts using it; the old key is then forgotten by the
sender at once and by the receiver ``retire_grace`` seconds after it learned the newer one.

The receiver (:class:`AnnouncementVerifier`, used by ``common.wire.pubkey_decoder``) accepts an
announcement only when, in this order: it parses exactly; its signer is trusted
(UNTRUSTED_SIGNER); the signature verifies (BAD_SIGNATURE); it is addressed to a receiver key pair
it holds (OTHER_RECEIVER); the receiver's wall clock is inside ``[not_before, not_after]`` widened
by ``max_clock_skew`` (ANNOUNCE_EXPIRED); it is not older than what was accepted for the same
(signer, session) (ANNOUNCE_ROLLBACK: a lower epoch, or the same epoch with another key; the one
exception is the key just before the newest, arriving late, taken as already superseded); and the
sealed key opens and has the announced key id (BAD_SEAL). Signature first: nothing an attacker
without a trusted signing key sends reaches the X25519 work.

Pure: ``now`` (monotonic seconds) and ``wall_ms`` (Unix milliseconds) are passed in.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke

from common.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from common.wire.encoder import OutgoingDatagram
from common.wire.envelope import (
    CIPHER_NONE,
    COMPRESSION_NONE,
    HEADER,
    HEADER_SIZE,
    KIND_KEY_ANNOUNCEMENT,
    MAGIC,
    MAX_SEQUENCE,
    SESSION_ID_SIZE,
    VERSION,
    decode_long,
    encode_long,
    load_schema,
)
from common.wire.events import DropReason
from common.wire.keyring import KEY_SIZE, Key, KeyRing, key_id_for
from common.wire.pubkey import FINGERPRINT_SIZE, PublicKey, ReceiverKeys, SigningKey, TrustedKeys

ANNOUNCEMENT_SCHEMA: Final = load_schema("key_announcement")
#: HPKE suite (RFC 9180 §7): KEM 0x0020, KDF 0x0001, AEAD 0x0002, base mode.
SUITE: Final = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
#: HPKE output for a 32-byte session key: enc (32) || ciphertext (32) || tag (16).
SEALED_SIZE: Final = 32 + KEY_SIZE + 16
SIGNATURE_SIZE: Final = 64
INFO_LABEL: Final = b"kafka-diode key announcement v1\x00"
SIGN_LABEL: Final = b"kafka-diode key announcement signature v1\x00"
_TAIL_SIZE: Final = SEALED_SIZE + SIGNATURE_SIZE
_KEY_ID_EPOCH: Final = struct.Struct(">IQ")
#: Largest announcement payload (three 10-byte longs): always one datagram of at most 256 bytes.
MAX_PAYLOAD_SIZE: Final = 2 * FINGERPRINT_SIZE + 3 * 10 + _TAIL_SIZE


@dataclass(frozen=True, slots=True)
class Announcement:
    """A parsed key announcement (not yet verified unless it came from ``verify``)."""

    session_id: bytes
    """The announcing sender session (envelope header)."""
    epoch: int
    """Per-session counter of session keys, 0 for the first (envelope ``sequence`` field)."""
    key_id: int
    """Key id of the announced session key (envelope ``key_id`` field)."""
    sender_fingerprint: bytes
    """Fingerprint of the signing key."""
    receiver_fingerprint: bytes
    """Fingerprint of the receiver public key the session key is sealed to."""
    issued_at_ms: int
    """When the sender made the key (Unix ms)."""
    not_before_ms: int
    """Start of validity (Unix ms)."""
    not_after_ms: int
    """End of validity (Unix ms)."""
    sealed: bytes
    """HPKE ``enc || ciphertext`` of the session key (80 bytes)."""
    signature: bytes
    """Ed25519 signature (64 bytes) over ``SIGN_LABEL || datagram[:-64]``."""


def hpke_info(
    session_id: bytes, key_id: int, epoch: int, sender_fp: bytes, receiver_fp: bytes
) -> bytes:
    """The HPKE ``info`` binding a sealed key to its announcement."""
    return INFO_LABEL + session_id + _KEY_ID_EPOCH.pack(key_id, epoch) + sender_fp + receiver_fp


def seal_session_key(
    key: Key, receiver: PublicKey, *, session_id: bytes, epoch: int, sender_fp: bytes
) -> bytes:
    """HPKE-seal ``key`` to ``receiver`` (randomised: a fresh ephemeral key each call)."""
    info = hpke_info(session_id, key.key_id, epoch, sender_fp, receiver.fingerprint)
    return SUITE.encrypt(key.material, receiver.x25519(), info=info)


def build_announcement(
    *,
    signing_key: SigningKey,
    receiver_fingerprint: bytes,
    session_id: bytes,
    epoch: int,
    key_id: int,
    issued_at_ms: int,
    not_before_ms: int,
    not_after_ms: int,
    sealed: bytes,
) -> bytes:
    """The announcement datagram (deterministic for given ``sealed``: Ed25519 is).

    Raises:
        LocalProtocolError: a field out of range.
    """
    if len(session_id) != SESSION_ID_SIZE or len(sealed) != SEALED_SIZE:
        raise LocalProtocolError("session id must be 16 bytes and the sealed key 80")
    if len(receiver_fingerprint) != FINGERPRINT_SIZE:
        raise LocalProtocolError("receiver fingerprint must be 16 bytes")
    if not (0 <= epoch <= MAX_SEQUENCE and 0 < key_id <= 0xFFFFFFFF):
        raise LocalProtocolError("epoch must be a uint64 and key id a non-zero uint32")
    if not 0 <= not_before_ms <= not_after_ms < (1 << 63) or not 0 <= issued_at_ms < (1 << 63):
        raise LocalProtocolError("validity must be 0 <= not_before <= not_after (Unix ms)")
    body = b"".join(
        (
            signing_key.fingerprint,
            receiver_fingerprint,
            encode_long(issued_at_ms),
            encode_long(not_before_ms),
            encode_long(not_after_ms),
            sealed,
        )
    )
    length = len(body) + SIGNATURE_SIZE
    header = HEADER.pack(
        MAGIC, VERSION, KIND_KEY_ANNOUNCEMENT, COMPRESSION_NONE, CIPHER_NONE, session_id, epoch,
        key_id, 0, 1, length,
    )  # fmt: skip
    signed = header + encode_long(length) + body
    return signed + signing_key.sign(SIGN_LABEL + signed)


def _bad(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(DropReason.MALFORMED, f"key announcement: {detail}")


def parse_announcement(data: bytes) -> Announcement:
    """Parse an announcement datagram strictly (no cryptography).

    Raises:
        RemoteProtocolError: BAD_MAGIC, UNSUPPORTED_VERSION, UNKNOWN_KIND, MALFORMED,
            TRAILING_BYTES or FRAGMENT_MISMATCH.
    """
    if len(data) <= HEADER_SIZE:
        raise _bad(f"datagram of {len(data)} bytes")
    (magic, version, kind, compression, cipher, session_id, epoch, key_id, index, count, total) = (
        HEADER.unpack_from(data)
    )
    if magic != MAGIC:
        raise RemoteProtocolError(DropReason.BAD_MAGIC, magic.hex())
    if version != VERSION:
        raise RemoteProtocolError(DropReason.UNSUPPORTED_VERSION, f"version {version}")
    if kind != KIND_KEY_ANNOUNCEMENT:
        raise RemoteProtocolError(DropReason.UNKNOWN_KIND, f"kind {kind}")
    if compression != COMPRESSION_NONE or cipher != CIPHER_NONE:
        raise _bad("compression and cipher must be 0")
    if index != 0 or count != 1:
        raise _bad("an announcement is never fragmented")
    if key_id == 0:
        raise _bad("key id 0")
    end = len(data)
    try:
        length, pos = decode_long(data, HEADER_SIZE, end)
    except ValueError:
        raise _bad("bad payload length") from None
    if length < 0 or pos + length > end:
        raise _bad("payload length past the end")
    if pos + length < end:
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the announcement")
    if total != length:
        raise RemoteProtocolError(DropReason.FRAGMENT_MISMATCH, "message length disagrees")
    if length > MAX_PAYLOAD_SIZE:
        raise _bad(f"payload of {length} bytes")
    sender_fp = data[pos : pos + FINGERPRINT_SIZE]
    receiver_fp = data[pos + FINGERPRINT_SIZE : pos + 2 * FINGERPRINT_SIZE]
    pos += 2 * FINGERPRINT_SIZE
    times = []
    try:
        for _ in range(3):
            value, pos = decode_long(data, pos, end)
            times.append(value)
    except ValueError:
        raise _bad("bad validity field") from None
    issued, not_before, not_after = times
    if not (0 <= not_before <= not_after and issued >= 0):
        raise _bad("validity fields out of order or negative")
    left = end - pos
    if left < _TAIL_SIZE:
        raise _bad("truncated")
    if left > _TAIL_SIZE:
        raise RemoteProtocolError(DropReason.TRAILING_BYTES, "bytes after the signature")
    return Announcement(
        session_id,
        epoch,
        key_id,
        sender_fp,
        receiver_fp,
        issued,
        not_before,
        not_after,
        data[pos : pos + SEALED_SIZE],
        data[pos + SEALED_SIZE :],
    )


# -- sender -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AnnounceConfig:
    """When a public-key sender makes, announces and starts using session keys (seconds, bytes)."""

    session_key_interval: float = 3600.0
    """Seconds between fresh session keys (also made at every start)."""
    session_key_bytes: int = 64 * 1024**3
    """Bytes sent under one session key before a fresh one is made (0: time only)."""
    announce_interval: float = 1.0
    """Seconds between repeats of the current key's announcement (the link is lossy)."""
    announce_lead: float = 2.0
    """Seconds a new session key is announced before data uses it."""

    def __post_init__(self) -> None:
        for name in ("session_key_interval", "announce_interval", "announce_lead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ConfigError(name, f"must be a non-negative number, got {value!r}", "e.g. 1")
        if not 0.05 <= self.announce_interval <= 600:
            raise ConfigError("announce_interval", "is outside 0.05..600 s", "e.g. 1")
        if not 1 <= self.session_key_interval <= 7 * 86400:
            raise ConfigError("session_key_interval", "is outside 1..604800 s", "e.g. 3600")
        if self.announce_lead >= self.session_key_interval:
            raise ConfigError(
                "announce_lead", "must be shorter than session_key_interval", "e.g. 2"
            )
        value = self.session_key_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError("session_key_bytes", f"must be a whole number >= 0, got {value!r}")

    @property
    def validity(self) -> float:
        """Seconds a session key is valid from its issue: two intervals plus the lead, so a
        key is always replaced well before it expires, whatever the clocks' small drift."""
        return 2 * self.session_key_interval + self.announce_lead


@dataclass(slots=True)
class _Announced:
    key: Key
    epoch: int
    datagram: OutgoingDatagram


class KeyAnnouncer:
    """The sender's session-key schedule; owns the ring its encoder encrypts with.

    ``start`` makes the first key (active at once: nothing was sent yet) and returns its
    announcement; ``poll`` returns what is due (repeats, a new key's announcement) and switches
    keys when their lead time passed. The caller sends the returned datagrams ahead of data.
    """

    def __init__(
        self,
        config: AnnounceConfig,
        signing_key: SigningKey,
        receiver: PublicKey,
        *,
        session_id: bytes,
        keyring: KeyRing | None = None,
    ) -> None:
        self._config = config
        self._signing_key = signing_key
        self._receiver = receiver
        self._session_id = session_id
        self.keyring = keyring if keyring is not None else KeyRing()
        """The ring the encoder uses; holds only the current (and briefly the next) key."""
        self._current: _Announced | None = None
        self._next: _Announced | None = None
        self._activate_at = 0.0
        self._rotate_at = 0.0
        self._bytes_base = 0
        self._repeat_at = 0.0
        self.keys_made = 0
        """Session keys made in this session."""
        self.announcements = 0
        """Announcement datagrams returned (every repeat counted)."""

    @property
    def epoch(self) -> int:
        """Epoch of the key in use (-1 before ``start``)."""
        return self._current.epoch if self._current is not None else -1

    def _make(self, epoch: int, wall_ms: int) -> _Announced:
        key = Key.generate()
        sealed = seal_session_key(
            key,
            self._receiver,
            session_id=self._session_id,
            epoch=epoch,
            sender_fp=self._signing_key.fingerprint,
        )
        data = build_announcement(
            signing_key=self._signing_key,
            receiver_fingerprint=self._receiver.fingerprint,
            session_id=self._session_id,
            epoch=epoch,
            key_id=key.key_id,
            issued_at_ms=wall_ms,
            not_before_ms=wall_ms,
            not_after_ms=wall_ms + int(self._config.validity * 1000),
            sealed=sealed,
        )
        self.keys_made += 1
        self.keyring.add(key)
        return _Announced(key, epoch, OutgoingDatagram(data, epoch, ()))

    def start(self, now: float, wall_ms: int) -> list[OutgoingDatagram]:
        """Make and activate the first session key; its announcement, to send first."""
        if self._current is not None:
            raise LocalProtocolError("KeyAnnouncer.start called twice")
        self._current = self._make(0, wall_ms)
        self.keyring.activate(self._current.key.key_id)
        self._rotate_at = now + self._config.session_key_interval
        self._repeat_at = now + self._config.announce_interval
        self.announcements += 1
        return [self._current.datagram]

    def next_deadline(self) -> float:
        """When ``poll`` has something to do next."""
        due = min(self._repeat_at, self._rotate_at)
        return min(due, self._activate_at) if self._next is not None else due

    def poll(self, now: float, wall_ms: int, bytes_sent: int) -> list[OutgoingDatagram]:
        """What is due at ``now`` (after ``bytes_sent`` bytes of the session went out)."""
        current = self._current
        if current is None:
            raise LocalProtocolError("KeyAnnouncer.poll before start")
        out: list[OutgoingDatagram] = []
        config = self._config
        if self._next is not None and now >= self._activate_at:
            # the lead is over: data moves to the new key, and the old one is forgotten here
            new = self._next
            self.keyring.activate(new.key.key_id)
            self.keyring.remove(current.key.key_id)
            self._current = current = new
            self._next = None
            self._rotate_at = now + config.session_key_interval
            self._bytes_base = bytes_sent
        limit = config.session_key_bytes
        if self._next is None and (
            now >= self._rotate_at or (limit and bytes_sent - self._bytes_base >= limit)
        ):
            self._next = self._make(current.epoch + 1, wall_ms)
            self._activate_at = now + config.announce_lead
            self._rotate_at = now + config.session_key_interval  # re-armed at activation
            out.append(self._next.datagram)
        if now >= self._repeat_at:
            self._repeat_at = now + config.announce_interval
            out.append(current.datagram)
            if self._next is not None and self._next.datagram not in out:
                out.append(self._next.datagram)
        self.announcements += len(out)
        return out


# -- receiver ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LearnedKey:
    """What a verified announcement yields."""

    key: Key
    """The session key, ready for the decoder's ring."""
    announcement: Announcement
    """The verified announcement."""
    signer_name: str
    """Name of the trusted signer (from the trusted list)."""
    superseded: tuple[int, ...]
    """Key ids of older epochs of the same sender session, now to be retired."""


@dataclass(slots=True)
class _SessionState:
    epoch: int
    key_id: int
    previous_epoch: int | None = None
    """The newest epoch older than ``epoch`` accepted in this session (None: none yet). Unless
    it is ``epoch - 1``, the key of ``epoch - 1`` may still arrive late, once: its announcements
    were all lost (an outage spanning a whole key's life ends with the next key's announcement
    sent first, ``KeyAnnouncer.poll``)."""


class AnnouncementVerifier:
    """Checks announcements against the trusted signers and own key pairs; remembers epochs.

    ``trusted`` and ``receiver_keys`` may be replaced at any time (a reloaded file).
    """

    def __init__(
        self,
        receiver_keys: ReceiverKeys,
        trusted: TrustedKeys,
        *,
        max_clock_skew: float = 300.0,
        max_sessions: int = 64,
    ) -> None:
        self.receiver_keys = receiver_keys
        self.trusted = trusted
        if not 0 <= max_clock_skew <= 86400:
            raise ConfigError(
                "max_clock_skew", f"{max_clock_skew} is outside 0..86400 s", "e.g. 300"
            )
        self.max_clock_skew = max_clock_skew
        """Seconds the sender's and receiver's wall clocks may differ at validity checks."""
        self._skew_ms = int(max_clock_skew * 1000)
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[bytes, bytes], _SessionState] = OrderedDict()

    def verify(self, data: bytes, wall_ms: float) -> LearnedKey:
        """Verify one announcement datagram at receiver time ``wall_ms``; update the epochs.

        Raises:
            RemoteProtocolError: any refusal, with its DropReason (module docstring, in order).
        """
        a = parse_announcement(data)
        verifier = self.trusted.verifier(a.sender_fingerprint)
        if verifier is None:
            raise RemoteProtocolError(
                DropReason.UNTRUSTED_SIGNER, f"signer {a.sender_fingerprint.hex()}"
            )
        try:
            verifier.verify(a.signature, SIGN_LABEL + data[:-SIGNATURE_SIZE])
        except InvalidSignature:
            raise RemoteProtocolError(DropReason.BAD_SIGNATURE, "Ed25519 signature") from None
        pair = self.receiver_keys.get(a.receiver_fingerprint)
        if pair is None:
            raise RemoteProtocolError(
                DropReason.OTHER_RECEIVER, f"sealed to {a.receiver_fingerprint.hex()}"
            )
        if wall_ms < a.not_before_ms - self._skew_ms or wall_ms > a.not_after_ms + self._skew_ms:
            raise RemoteProtocolError(
                DropReason.ANNOUNCE_EXPIRED,
                f"valid {a.not_before_ms}..{a.not_after_ms} ms, now {int(wall_ms)}",
            )
        slot = (a.sender_fingerprint, a.session_id)
        state = self._sessions.get(slot)
        # The key before the newest may arrive after it: its announcements were lost while the
        # sender still used it (the new key is announced ``announce_lead`` ahead). When no key of
        # that epoch was ever accepted it is taken once, as already superseded (the receiver
        # retires it ``retire_grace`` later); any other older epoch, or another key for a seen
        # epoch, is a rollback.
        late_previous = (
            state is not None and a.epoch == state.epoch - 1 and state.previous_epoch != a.epoch
        )
        if (
            state is not None
            and not late_previous
            and (a.epoch < state.epoch or (a.epoch == state.epoch and a.key_id != state.key_id))
        ):
            raise RemoteProtocolError(
                DropReason.ANNOUNCE_ROLLBACK, f"epoch {a.epoch}, newest seen {state.epoch}"
            )
        info = hpke_info(
            a.session_id, a.key_id, a.epoch, a.sender_fingerprint, a.receiver_fingerprint
        )
        try:
            material = SUITE.decrypt(a.sealed, pair.private, info=info)
        except (InvalidTag, ValueError):
            raise RemoteProtocolError(DropReason.BAD_SEAL, "HPKE open failed") from None
        if len(material) != KEY_SIZE or key_id_for(material) != a.key_id:
            raise RemoteProtocolError(DropReason.BAD_SEAL, "key does not match its key id")
        superseded: tuple[int, ...] = ()
        if state is None:
            self._sessions[slot] = _SessionState(a.epoch, a.key_id)
            if len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        elif late_previous:
            superseded = (a.key_id,)
            state.previous_epoch = a.epoch
        elif a.epoch > state.epoch:
            superseded = (state.key_id,)
            state.previous_epoch = state.epoch
            state.epoch, state.key_id = a.epoch, a.key_id
        self._sessions.move_to_end(slot)
        signer = self.trusted.get(a.sender_fingerprint)
        return LearnedKey(
            Key(a.key_id, material), a, signer.name if signer is not None else "", superseded
        )
