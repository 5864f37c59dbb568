"""Long-term keys of the public-key mode (docs/protocol.md §7.5): who holds what, in which file.

Roles
    The **receiver** (low side) holds one or more X25519 key pairs; their public halves go to the
    high side, where a sender seals its session keys to one of them. Several pairs exist while the
    receiver's long-term key itself is rotated: the receiver accepts announcements addressed to
    any pair it holds. Each **sender** (high side) holds an Ed25519 signing key; its public half
    goes to the low side, into the receiver's list of trusted senders. The low side's bundle
    signing key (an Ed25519 key too) goes the other way, into the sender's trusted list, so resend
    bundles are verified without a shared secret (``common.bundle``).

Fingerprints
    ``SHA-256(label || public key)[0:16]`` with a label per key type, so a receiver key and a
    signing key never share a fingerprint. On the wire the 16 bytes identify the signer and the
    addressed receiver key; for people they are printed as base32 in groups of four
    (``ABCD-EFGH-...``, 26 characters), which reads well over the phone: compare the fingerprint
    ``keygen`` printed on one side with what ``keygen --show`` prints for the copied file.

Files (JSON; private files are written with mode 0600 atomically, public files 0644)::

    {"kafka_diode_private_key": 1, "type": "x25519-receiver",
     "keys": [{"private": "<64 hex>", "public": "<64 hex>", "fingerprint": "ABCD-...",
               "created": "2026-01-01T00:00:00Z"}]}
    {"kafka_diode_private_key": 1, "type": "ed25519-signing", "name": "high-1",
     "keys": [{"private": "<64 hex>", "public": "<64 hex>", "fingerprint": "...", "created": ...}]}
    {"kafka_diode_public_keys": 1, "type": "x25519-receiver" | "ed25519-signing",
     "keys": [{"name": "high-1", "public": "<64 hex>", "fingerprint": "..."}]}

A public file lists one or more keys, so the same format is a receiver public key (the sender uses
its first key) and a trusted-sender list (every key is trusted). A stated fingerprint must match
the key: a file damaged in transit is refused, not half-trusted. A signing key file holds one key.
Pure: no clock, no sockets, no files. This module parses and builds the documents;
``runtime/key_files.py`` reads them from files and writes them (atomically, with those modes).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from common.errors import KeyRingError

KeyType = Literal["x25519-receiver", "ed25519-signing"]
RECEIVER: Final = "x25519-receiver"
SIGNING: Final = "ed25519-signing"
FINGERPRINT_SIZE: Final = 16
PUBLIC_KEY_SIZE: Final = 32
PRIVATE_FILE_VERSION: Final = 1
PUBLIC_FILE_VERSION: Final = 1
#: Most keys one file may list (a trusted-sender list, a receiver's pairs): bounds what a reload
#: reads, far above any real deployment.
MAX_KEYS_PER_FILE: Final = 1024
_LABELS: Final = {
    RECEIVER: b"kafka-diode receiver key v1\x00",
    SIGNING: b"kafka-diode signing key v1\x00",
}


def fingerprint(public: bytes, key_type: KeyType) -> bytes:
    """The 16-byte fingerprint of a 32-byte public key of ``key_type``."""
    return hashlib.sha256(_LABELS[key_type] + public).digest()[:FINGERPRINT_SIZE]


def format_fingerprint(fp: bytes) -> str:
    """Fingerprint for people: base32, groups of four letters/digits joined by ``-``."""
    text = base64.b32encode(fp).decode("ascii").rstrip("=")
    return "-".join(text[i : i + 4] for i in range(0, len(text), 4))


def _raw_public(key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class ReceiverKeyPair:
    """One receiver X25519 key pair."""

    private: X25519PrivateKey = field(repr=False)
    """The private key; never printed."""
    public: bytes
    """The 32-byte public key."""
    fingerprint: bytes
    """``fingerprint(public, RECEIVER)``."""
    created: str | None = None
    """ISO 8601 creation time, informational."""

    @classmethod
    def generate(cls, *, created: str | None = None) -> ReceiverKeyPair:
        """A new random pair (the OS CSPRNG, through OpenSSL)."""
        return cls.from_private(X25519PrivateKey.generate(), created=created)

    @classmethod
    def from_private(
        cls, private: X25519PrivateKey, *, created: str | None = None
    ) -> ReceiverKeyPair:
        """Wrap a private key, computing its public half and fingerprint."""
        public = _raw_public(private.public_key())
        return cls(private, public, fingerprint(public, RECEIVER), created)


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One Ed25519 signing key (a sender's, or the low side's bundle key)."""

    private: Ed25519PrivateKey = field(repr=False)
    """The private key; never printed."""
    public: bytes
    """The 32-byte public key."""
    fingerprint: bytes
    """``fingerprint(public, SIGNING)``."""
    name: str = ""
    """Who holds it (e.g. the sender id), informational."""
    created: str | None = None
    """ISO 8601 creation time, informational."""

    @classmethod
    def generate(cls, *, name: str = "", created: str | None = None) -> SigningKey:
        """A new random signing key."""
        return cls.from_private(Ed25519PrivateKey.generate(), name=name, created=created)

    @classmethod
    def from_private(
        cls, private: Ed25519PrivateKey, *, name: str = "", created: str | None = None
    ) -> SigningKey:
        """Wrap a private key, computing its public half and fingerprint."""
        public = _raw_public(private.public_key())
        return cls(private, public, fingerprint(public, SIGNING), name, created)

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message`` (deterministic, RFC 8032)."""
        return self.private.sign(message)

    def public_entry(self) -> PublicKey:
        """This key's public half, as a trusted-list entry."""
        return PublicKey(SIGNING, self.public, self.fingerprint, self.name)


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A public key from a public key file: a receiver's, or a trusted signer's."""

    key_type: KeyType
    """``x25519-receiver`` or ``ed25519-signing``."""
    public: bytes
    """The 32 bytes."""
    fingerprint: bytes
    """``fingerprint(public, key_type)``."""
    name: str = ""
    """Who holds the private half, informational."""

    def x25519(self) -> X25519PublicKey:
        """As a cryptography X25519 key (receiver keys only)."""
        return X25519PublicKey.from_public_bytes(self.public)

    def ed25519(self) -> Ed25519PublicKey:
        """As a cryptography Ed25519 key (signing keys only)."""
        return Ed25519PublicKey.from_public_bytes(self.public)


class ReceiverKeys:
    """The receiver's key pairs by fingerprint (several while its long-term key rotates)."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Iterable[ReceiverKeyPair] = ()) -> None:
        self._pairs: dict[bytes, ReceiverKeyPair] = {}
        for pair in pairs:
            self._pairs[pair.fingerprint] = pair

    def __repr__(self) -> str:
        fps = ", ".join(format_fingerprint(fp) for fp in self._pairs)
        return f"ReceiverKeys([{fps}])"

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[ReceiverKeyPair]:
        return iter(self._pairs.values())

    def get(self, fp: bytes) -> ReceiverKeyPair | None:
        """The pair with this fingerprint, or None."""
        return self._pairs.get(fp)

    def add(self, pair: ReceiverKeyPair) -> None:
        """Add a pair (rotation: the new pair joins, the old one stays until retired)."""
        self._pairs[pair.fingerprint] = pair


class TrustedKeys:
    """Trusted Ed25519 public keys by fingerprint (a receiver's senders, a sender's low side)."""

    __slots__ = ("_keys", "_verifiers")

    def __init__(self, keys: Iterable[PublicKey] = ()) -> None:
        self._keys: dict[bytes, PublicKey] = {}
        self._verifiers: dict[bytes, Ed25519PublicKey] = {}
        for key in keys:
            if key.key_type != SIGNING:
                raise KeyRingError(
                    f"key {format_fingerprint(key.fingerprint)} is a {key.key_type} key, "
                    "not a signing key; a trusted list holds ed25519-signing keys"
                )
            self._keys[key.fingerprint] = key
            self._verifiers[key.fingerprint] = key.ed25519()

    def __repr__(self) -> str:
        names = ", ".join(f"{k.name}={format_fingerprint(fp)}" for fp, k in self._keys.items())
        return f"TrustedKeys([{names}])"

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[PublicKey]:
        return iter(self._keys.values())

    def verifier(self, fp: bytes) -> Ed25519PublicKey | None:
        """The Ed25519 key with this fingerprint, or None when not trusted."""
        return self._verifiers.get(fp)

    def get(self, fp: bytes) -> PublicKey | None:
        """The trusted entry with this fingerprint, or None."""
        return self._keys.get(fp)


# -- documents ------------------------------------------------------------------------------------


def _hex32(entry: dict[str, Any], name: str, where: str) -> bytes:
    value = entry.get(name)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != PUBLIC_KEY_SIZE:
        raise KeyRingError(f"{where}: '{name}' must be 64 hex digits")
    return raw


def _entries(doc: Any, marker: str, version: int, where: str) -> tuple[KeyType, list[Any]]:
    if not isinstance(doc, dict) or doc.get(marker) != version:
        raise KeyRingError(
            f"{where}: not a kafka-diode file of this kind (want {marker}: {version})"
        )
    key_type = doc.get("type")
    if key_type not in (RECEIVER, SIGNING):
        raise KeyRingError(f"{where}: 'type' must be {RECEIVER} or {SIGNING}")
    entries = doc.get("keys")
    if not isinstance(entries, list) or not entries or len(entries) > MAX_KEYS_PER_FILE:
        raise KeyRingError(f"{where}: 'keys' must list 1..{MAX_KEYS_PER_FILE} keys")
    if not all(isinstance(e, dict) for e in entries):
        raise KeyRingError(f"{where}: every entry of 'keys' must be an object")
    return key_type, entries


def _check_stated(entry: dict[str, Any], fp: bytes, where: str) -> None:
    stated = entry.get("fingerprint")
    if stated is not None and stated != format_fingerprint(fp):
        raise KeyRingError(
            f"{where}: stated fingerprint {stated!r} does not match the key "
            f"({format_fingerprint(fp)}): the file was altered or damaged"
        )


def public_keys_from_document(doc: Any, key_type: KeyType, where: str) -> list[PublicKey]:
    """The keys of a public key file's parsed JSON ``doc`` of ``key_type`` (format in the module
    docstring); ``where`` names the file in errors.

    Raises:
        KeyRingError: not the format, another key type, or a fingerprint mismatch.
    """
    found, entries = _entries(doc, "kafka_diode_public_keys", 1, where)
    if found != key_type:
        raise KeyRingError(f"{where} holds {found} keys; this setting needs {key_type} keys")
    out = []
    for i, entry in enumerate(entries):
        public = _hex32(entry, "public", f"{where} keys[{i}]")
        fp = fingerprint(public, key_type)
        _check_stated(entry, fp, f"{where} keys[{i}]")
        name = entry.get("name")
        out.append(PublicKey(key_type, public, fp, name if isinstance(name, str) else ""))
    return out


def receiver_keys_from_document(doc: Any, where: str) -> ReceiverKeys:
    """The receiver's private key file (one or more X25519 pairs), from its parsed JSON ``doc``;
    ``where`` names the file in errors.

    Raises:
        KeyRingError: not the format, a public half that does not match its private key, or a
            fingerprint mismatch.
    """
    found, entries = _entries(doc, "kafka_diode_private_key", 1, where)
    if found != RECEIVER:
        raise KeyRingError(f"{where} is a {found} file; this setting needs {RECEIVER} keys")
    keys = ReceiverKeys()
    for i, entry in enumerate(entries):
        private = X25519PrivateKey.from_private_bytes(
            _hex32(entry, "private", f"{where} keys[{i}]")
        )
        created = entry.get("created")
        pair = ReceiverKeyPair.from_private(
            private, created=created if isinstance(created, str) else None
        )
        if "public" in entry and _hex32(entry, "public", f"{where} keys[{i}]") != pair.public:
            raise KeyRingError(f"{where} keys[{i}]: 'public' does not belong to 'private'")
        _check_stated(entry, pair.fingerprint, f"{where} keys[{i}]")
        keys.add(pair)
    return keys


def signing_key_from_document(doc: Any, where: str) -> SigningKey:
    """A signing key file (one Ed25519 key), from its parsed JSON ``doc``; ``where`` names the
    file in errors.

    Raises:
        KeyRingError: not the format, more than one key, or a mismatch.
    """
    found, entries = _entries(doc, "kafka_diode_private_key", 1, where)
    if found != SIGNING or len(entries) != 1:
        raise KeyRingError(f"{where}: not a signing key file (want one {SIGNING} key)")
    entry = entries[0]
    private = Ed25519PrivateKey.from_private_bytes(_hex32(entry, "private", where))
    created = entry.get("created")
    name = doc.get("name")
    key = SigningKey.from_private(
        private,
        name=name if isinstance(name, str) else "",
        created=created if isinstance(created, str) else None,
    )
    if "public" in entry and _hex32(entry, "public", where) != key.public:
        raise KeyRingError(f"{where}: 'public' does not belong to 'private'")
    _check_stated(entry, key.fingerprint, where)
    return key


def _private_hex(private: X25519PrivateKey | Ed25519PrivateKey) -> str:
    return private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()).hex()


def receiver_keys_document(keys: ReceiverKeys) -> dict[str, Any]:
    """The JSON document of a receiver private key file (contains private keys)."""
    entries = []
    for pair in keys:
        entry = {
            "private": _private_hex(pair.private),
            "public": pair.public.hex(),
            "fingerprint": format_fingerprint(pair.fingerprint),
        }
        if pair.created:
            entry["created"] = pair.created
        entries.append(entry)
    return {"kafka_diode_private_key": PRIVATE_FILE_VERSION, "type": RECEIVER, "keys": entries}


def signing_key_document(key: SigningKey) -> dict[str, Any]:
    """The JSON document of a signing key file (contains the private key)."""
    entry = {
        "private": _private_hex(key.private),
        "public": key.public.hex(),
        "fingerprint": format_fingerprint(key.fingerprint),
    }
    if key.created:
        entry["created"] = key.created
    return {
        "kafka_diode_private_key": PRIVATE_FILE_VERSION,
        "type": SIGNING,
        "name": key.name,
        "keys": [entry],
    }


def public_keys_document(key_type: KeyType, keys: Iterable[PublicKey]) -> dict[str, Any]:
    """The JSON document of a public key file (shareable)."""
    return {
        "kafka_diode_public_keys": PUBLIC_FILE_VERSION,
        "type": key_type,
        "keys": [
            {
                "name": k.name,
                "public": k.public.hex(),
                "fingerprint": format_fingerprint(k.fingerprint),
            }
            for k in keys
        ],
    }
