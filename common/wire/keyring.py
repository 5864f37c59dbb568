"""Pre-shared AES-256 keys with ids, for rotation without restarts (docs/protocol.md §7).

A :class:`KeyRing` holds any number of 256-bit keys by key id and names one of them active (the
one an encoder uses). A decoder accepts every key in its ring, so rotation is: install the ring
with the new key on the receiver, then on the sender; later remove the old key. The ring can be
swapped in place at runtime (:meth:`KeyRing.replace`), and encoders and decoders consult it on
every datagram.

Key id
    ``uint32`` = the first four bytes (big-endian) of ``SHA-256(b"kafka-diode key id v1\\0" ||
    key)``. It is derived, never chosen, so both sides agree without coordination; id 0 is
    reserved for cipher ``none`` and such a key is refused (probability 2**-32).

Key file (JSON, mode 0600 when new; a rewrite may keep an existing file's owner, group and a
mode without access for others)::

    {"kafka_diode_keyring": 1,
     "active": "9f86d081",
     "keys": [{"id": "9f86d081", "key": "<64 hex digits>", "created": "2025-01-01T00:00:00Z",
               "kdf": {"name": "scrypt", "salt": "<hex>", "n": 131072, "r": 8, "p": 1}}]}

``kdf`` is present only for keys derived from a password and records how (the password is never
stored). Key material is never part of a ``repr`` and never logged. The file is read and written
by ``runtime/key_files.py`` (``read_keyring``, ``write_keyring``); this module only turns the
document into a ring and back.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from common.errors import KeyRingError

KEY_SIZE: Final = 32
FILE_FORMAT_VERSION: Final = 1
_KEY_ID_LABEL: Final = b"kafka-diode key id v1\x00"

#: scrypt parameters for password-derived keys (RFC 7914): N=2**17, r=8, p=1 uses 128 MiB and
#: roughly 0.3-1 s of CPU, OWASP's recommended minimum for scrypt.
SCRYPT_N: Final = 1 << 17
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
MIN_SALT_SIZE: Final = 16


def key_id_for(material: bytes) -> int:
    """The key id of 32 bytes of key material (see the module docstring)."""
    return int.from_bytes(hashlib.sha256(_KEY_ID_LABEL + material).digest()[:4], "big")


def derive_key(
    password: str | bytes,
    salt: bytes,
    *,
    n: int = SCRYPT_N,
    r: int = SCRYPT_R,
    p: int = SCRYPT_P,
) -> bytes:
    """A 256-bit key from a password and a salt with scrypt (same inputs, same key).

    Raises:
        KeyRingError: empty password, salt shorter than 16 bytes, or invalid scrypt parameters.
    """
    secret = password.encode("utf-8") if isinstance(password, str) else password
    if not secret:
        raise KeyRingError("the password is empty")
    if len(salt) < MIN_SALT_SIZE:
        raise KeyRingError(f"the salt must be at least {MIN_SALT_SIZE} bytes, got {len(salt)}")
    try:
        return Scrypt(salt=salt, length=KEY_SIZE, n=n, r=r, p=p).derive(secret)
    except (ValueError, MemoryError) as exc:
        raise KeyRingError(f"scrypt with n={n} r={r} p={p} failed: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Key:
    """One 256-bit key and its id."""

    key_id: int
    """uint32 derived from the material (``key_id_for``)."""
    material: bytes = field(repr=False)
    """The 32 secret bytes; never printed."""
    created: str | None = None
    """ISO 8601 creation time, informational."""
    kdf: Mapping[str, Any] | None = None
    """How the key was derived from a password (no password stored), or None for random keys."""

    @classmethod
    def from_material(
        cls, material: bytes, *, created: str | None = None, kdf: Mapping[str, Any] | None = None
    ) -> Key:
        """Wrap 32 bytes of key material, computing its id.

        Raises:
            KeyRingError: not 32 bytes, or the (reserved) id 0.
        """
        if not isinstance(material, bytes) or len(material) != KEY_SIZE:
            raise KeyRingError(f"a key must be {KEY_SIZE} bytes")
        key_id = key_id_for(material)
        if key_id == 0:
            raise KeyRingError("this key has the reserved id 0; generate another one")
        return cls(key_id, material, created, kdf)

    @classmethod
    def generate(cls, *, created: str | None = None) -> Key:
        """A new random key (from ``os.urandom``)."""
        while True:
            material = os.urandom(KEY_SIZE)
            if key_id_for(material) != 0:
                return cls.from_material(material, created=created)


def format_key_id(key_id: int) -> str:
    """Key ids are shown and stored as 8 lowercase hex digits."""
    return f"{key_id:08x}"


class KeyRing:
    """Keys by id, one of them active. Mutations are visible at once to every holder."""

    __slots__ = ("_active", "_keys", "generation")

    def __init__(self, keys: Iterable[Key] = (), *, active: int | None = None) -> None:
        self._keys: dict[int, Key] = {}
        self._active: int | None = None
        #: Incremented on every change, so holders can tell that cached state is stale.
        self.generation = 0
        for key in keys:
            self.add(key)
        if active is not None:
            self.activate(active)

    def __repr__(self) -> str:
        ids = ", ".join(format_key_id(k) for k in self._keys)
        active = format_key_id(self._active) if self._active is not None else None
        return f"KeyRing(ids=[{ids}], active={active})"

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys.values())

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    @property
    def ids(self) -> tuple[int, ...]:
        """Key ids in the order they were added."""
        return tuple(self._keys)

    def add(self, key: Key | bytes, *, activate: bool = False) -> Key:
        """Add a key (or 32 bytes of material); the first key added becomes active.

        Raises:
            KeyRingError: malformed material, or another key with the same id (a 32-bit id
                collision between different keys is refused rather than guessed at).
        """
        if isinstance(key, bytes):
            key = Key.from_material(key)
        elif key.key_id != key_id_for(key.material) or len(key.material) != KEY_SIZE:
            raise KeyRingError(f"key {format_key_id(key.key_id)} does not match its material")
        existing = self._keys.get(key.key_id)
        if existing is not None and existing.material != key.material:
            raise KeyRingError(f"two different keys share the id {format_key_id(key.key_id)}")
        self._keys[key.key_id] = key
        if activate or self._active is None:
            self._active = key.key_id
        self.generation += 1
        return key

    def activate(self, key_id: int) -> None:
        """Make ``key_id`` the key encoders use from their next datagram on.

        Raises:
            KeyRingError: the id is not in the ring.
        """
        if key_id not in self._keys:
            raise KeyRingError(f"key id {format_key_id(key_id)} is not in the ring")
        self._active = key_id
        self.generation += 1

    def remove(self, key_id: int) -> None:
        """Forget a key (retire it). Removing the active key leaves no active key.

        Raises:
            KeyRingError: the id is not in the ring.
        """
        if self._keys.pop(key_id, None) is None:
            raise KeyRingError(f"key id {format_key_id(key_id)} is not in the ring")
        if self._active == key_id:
            self._active = None
        self.generation += 1

    def get(self, key_id: int) -> Key | None:
        """The key with this id, or None."""
        return self._keys.get(key_id)

    @property
    def active(self) -> Key:
        """The key encoders use.

        Raises:
            KeyRingError: the ring is empty or has no active key.
        """
        if self._active is None:
            raise KeyRingError("the key ring has no active key")
        return self._keys[self._active]

    def replace(self, other: KeyRing) -> None:
        """Take over ``other``'s keys and active id in place (a reloaded key file)."""
        self._keys = dict(other._keys)
        self._active = other._active
        self.generation += 1

    # -- key file document (read and written by runtime/key_files.py) ---------------------------

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "key ring") -> KeyRing:
        """Build a ring from the parsed JSON document of a key file.

        Raises:
            KeyRingError: not the documented format.
        """
        if not isinstance(doc, dict) or doc.get("kafka_diode_keyring") != FILE_FORMAT_VERSION:
            raise KeyRingError(
                f"{source}: not a kafka-diode key file (want kafka_diode_keyring: 1)"
            )
        entries = doc.get("keys")
        if not isinstance(entries, list) or not entries:
            raise KeyRingError(f"{source}: 'keys' must be a non-empty list")
        ring = cls()
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                raise KeyRingError(f"{source}: keys[{i}] needs a 'key' of 64 hex digits")
            try:
                material = bytes.fromhex(entry["key"])
            except ValueError:
                raise KeyRingError(f"{source}: keys[{i}].key is not hex") from None
            kdf = entry.get("kdf")
            created = entry.get("created")
            key = Key.from_material(
                material,
                created=created if isinstance(created, str) else None,
                kdf=kdf if isinstance(kdf, dict) else None,
            )
            stated = entry.get("id")
            if stated is not None and stated != format_key_id(key.key_id):
                raise KeyRingError(
                    f"{source}: keys[{i}].id {stated!r} does not match its key "
                    f"({format_key_id(key.key_id)}); the id is derived from the key"
                )
            ring.add(key)
        active = doc.get("active")
        if active is not None:
            try:
                ring.activate(int(str(active), 16))
            except ValueError:
                raise KeyRingError(f"{source}: 'active' is not a hex key id") from None
        return ring

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of this ring's key file (contains key material)."""
        keys = []
        for key in self._keys.values():
            entry: dict[str, Any] = {"id": format_key_id(key.key_id), "key": key.material.hex()}
            if key.created:
                entry["created"] = key.created
            if key.kdf:
                entry["kdf"] = dict(key.kdf)
            keys.append(entry)
        doc: dict[str, Any] = {"kafka_diode_keyring": FILE_FORMAT_VERSION}
        if self._active is not None:
            doc["active"] = format_key_id(self._active)
        doc["keys"] = keys
        return doc
