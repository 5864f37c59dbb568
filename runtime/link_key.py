"""The link key, loaded and watched the same way by every command that holds it.

A link key ring comes from a key file (``kafka-diode keygen``) or from a password and salt
(scrypt). :func:`load` turns either into a :class:`~common.wire.KeyRing`, refusing a bad one with
a :class:`~common.errors.ConfigError` naming ``key_file``, ``password`` or ``salt``.
:class:`KeyFileWatch` re-reads a key file into the live ring when asked (SIGHUP) or when the
file's modification time changes, and never replaces a working ring with a broken one (the rule
every watched file follows: ``runtime.file_watch``).
"""

from __future__ import annotations

from pathlib import Path

from common.errors import ConfigError, KeyRingError
from common.wire import Key, KeyRing, derive_key
from runtime import key_files
from runtime.file_watch import FileReloader


def load(
    *, key_file: Path | None, password: str | None, salt: str, missing_fix: str = ""
) -> KeyRing | None:
    """The key ring from ``key_file``, else derived from ``password`` + ``salt``, else None.

    Raises:
        ConfigError: the key file is missing, unreadable, malformed or empty (names
            ``key_file``), the salt is not hex (``salt``), or the derivation fails (``password``).
    """
    if key_file is not None:
        if not key_file.exists():
            raise ConfigError(
                "key_file", f"{key_file} does not exist", missing_fix or "run 'kafka-diode keygen'"
            )
        try:
            ring = key_files.read_keyring(key_file)
        except OSError as exc:
            raise ConfigError("key_file", f"{key_file} is unreadable: {exc.strerror}") from exc
        except (KeyRingError, ValueError) as exc:
            raise ConfigError("key_file", f"{key_file}: {exc}") from exc
        if not len(ring):
            raise ConfigError("key_file", f"{key_file} holds no keys")
        return ring
    if password is not None:
        try:
            salt_bytes = bytes.fromhex(salt)
        except ValueError:
            raise ConfigError("salt", "is not hexadecimal", "use 32+ hex digits") from None
        try:
            material = derive_key(password, salt_bytes)
            key = Key.from_material(material, kdf={"name": "scrypt", "salt": salt})
        except KeyRingError as exc:
            raise ConfigError("password", str(exc)) from exc
        return KeyRing([key], active=key.key_id)
    return None


class KeyFileWatch(FileReloader[KeyRing]):
    """One key file and the live ring loaded from it; ``reload`` swaps the file's keys into the
    ring in place (encoders and decoders consult it per datagram), keeping it on any error."""

    def __init__(self, path: Path, ring: KeyRing, *, seen: int | None = None) -> None:
        """``seen``: the file's mtime taken before ``ring`` was read from it (so a change in
        between reloads); by default taken now."""
        self.path = path
        self.ring = ring
        super().__init__(
            [path],
            lambda: key_files.read_keyring(path),
            self._swap,
            what="key ring",
            kept="the previous one stays in use",
            errors=(KeyRingError,),
            seen=None if seen is None else [seen],
        )

    def _swap(self, fresh: KeyRing) -> str:
        old = self.ring.active.key_id
        self.ring.replace(fresh)
        return f", {len(fresh)} keys, active key {fresh.active.key_id:08x} (was {old:08x})"
