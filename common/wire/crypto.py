"""AES-256-GCM per sender session, with nonces that never repeat under one key.

Theory (docs/protocol.md §7.2): each (key, session) pair gets its own AES key,
``K_s = HKDF-SHA256(ikm=K, salt=session_id, info=b"kafka-diode v1 session key", L=32)``, and
the 96-bit nonce is ``session_id[0:4] || sequence (uint64 big-endian)``. Under ``K_s`` a nonce
repeats only if a sequence number repeats within the session, which the encoder never does (it
raises before wrapping at 2**64). Two sessions share ``K_s`` only if their random 128-bit session
ids are equal: with 2**32 sender starts per key the chance is below 2**-65. A restart draws a new
session id, so sequences may start again at 0 safely.
"""

from __future__ import annotations

from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.errors import RemoteProtocolError
from common.wire.events import DropReason
from common.wire.keyring import Key

SESSION_KEY_INFO: Final = b"kafka-diode v1 session key"


def session_key(key: Key, session_id: bytes) -> bytes:
    """The per-session AES-256 key (see the module docstring)."""
    return HKDF(algorithm=SHA256(), length=32, salt=session_id, info=SESSION_KEY_INFO).derive(
        key.material
    )


def nonce(session_id: bytes, sequence: int) -> bytes:
    """The 96-bit GCM nonce of a datagram."""
    return session_id[:4] + sequence.to_bytes(8, "big")


class SessionCipher:
    """Seals and opens the datagrams of one session under one key."""

    __slots__ = ("_prefix", "aead", "key", "session_id")

    def __init__(self, key: Key, session_id: bytes) -> None:
        self.key = key
        self.session_id = session_id
        #: The AES-GCM object under the session key: created once per (key, session), because
        #: ``AESGCM`` construction (key schedule) costs as much as sealing a datagram.
        self.aead = AESGCM(session_key(key, session_id))
        self._prefix = session_id[:4]

    def __repr__(self) -> str:
        return f"SessionCipher(key_id={self.key.key_id:08x}, session={self.session_id.hex()})"

    def seal(self, sequence: int, plaintext: bytes, aad: bytes) -> bytes:
        """Ciphertext with the 16-byte tag appended."""
        return self.aead.encrypt(self._prefix + sequence.to_bytes(8, "big"), plaintext, aad)

    def open(self, sequence: int, ciphertext: bytes, aad: bytes) -> bytes:
        """Plaintext, if the tag verifies.

        Raises:
            RemoteProtocolError: AUTH_FAILED.
        """
        try:
            return self.aead.decrypt(self._prefix + sequence.to_bytes(8, "big"), ciphertext, aad)
        except InvalidTag:
            raise RemoteProtocolError(DropReason.AUTH_FAILED, "GCM tag mismatch") from None
