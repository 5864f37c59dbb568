"""Key files on disk: every key document the project has, read and written here (the I/O half).

The documents are parsed and built in ``common``, purely: a link key ring
(``common.wire.keyring``: ``KeyRing.from_dict`` / ``to_dict``) and the public-key mode's receiver
key pairs, signing keys and public key lists (``common.wire.pubkey``: ``*_from_document`` /
``*_document``). This module reads them from files (errors are ``KeyRingError`` naming the file)
and writes them atomically: a temporary file created 0600, given its owner and mode, fsynced and
renamed over the target, so key material is never readable by anyone else, not even for a moment,
and a failed write leaves the old file as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Final

from common.errors import KeyRingError
from common.wire.keyring import KeyRing
from common.wire.pubkey import (
    RECEIVER,
    SIGNING,
    KeyType,
    PublicKey,
    ReceiverKeys,
    SigningKey,
    TrustedKeys,
    public_keys_from_document,
    receiver_keys_from_document,
    signing_key_from_document,
)

#: Largest public-key mode key file read (a reload reads at most this much).
MAX_KEY_FILE_BYTES: Final = 1 << 20


# -- link key rings ------------------------------------------------------------------------------


def read_keyring(path: str | os.PathLike[str]) -> KeyRing:
    """Load a key ring file (format in ``common.wire.keyring``).

    Raises:
        KeyRingError: unreadable file, not the format, bad key material or ids.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyRingError(f"cannot read key file {path}: {exc}") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise KeyRingError(f"key file {path} is not JSON: {exc.__class__.__name__}") from exc
    return KeyRing.from_dict(doc, source=str(path))


def write_keyring(
    ring: KeyRing,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    mode: int = 0o600,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write ``ring``'s key file atomically (a temporary file renamed over ``path``).

    Args:
        ring: the key ring to write.
        path: the key file.
        overwrite: replace an existing file.
        mode: permission bits; only owner and group bits are allowed (default 0600).
        owner: ``(uid, gid)`` to give the file, e.g. those of the file being replaced, so a
            service user keeps access (needs root, or the same owner and one of its groups).

    Raises:
        KeyRingError: the file exists and ``overwrite`` is false, ``mode`` grants access to
            others (or special bits), the owner cannot be set, or the file cannot be written.
            On any error the existing file is left as it was.
    """
    target = Path(path)
    if mode & ~0o770:
        raise KeyRingError(
            f"refusing to write key file {target} with mode {mode:04o}: key files must not be "
            "accessible to other users (use owner and group bits only, e.g. 0600 or 0640)"
        )
    if target.exists() and not overwrite:
        raise KeyRingError(f"{target} exists; refusing to overwrite it")
    write_json_atomically(target, ring.to_dict(), mode=mode, overwrite=overwrite, owner=owner)


# -- public-key mode ------------------------------------------------------------------------------


def _read_json(path: str | os.PathLike[str]) -> Any:
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyRingError(f"cannot read key file {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyRingError(f"{path} is over {MAX_KEY_FILE_BYTES} bytes: not a key file")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise KeyRingError(f"key file {path} is not JSON: {exc.__class__.__name__}") from exc


def load_public_keys(path: str | os.PathLike[str], key_type: KeyType) -> list[PublicKey]:
    """Read a public key file of ``key_type`` (format in ``common.wire.pubkey``).

    Raises:
        KeyRingError: unreadable, not the format, another key type, or a fingerprint mismatch.
    """
    return public_keys_from_document(_read_json(path), key_type, str(path))


def load_trusted(path: str | os.PathLike[str]) -> TrustedKeys:
    """A trusted-signer list (a public key file of signing keys).

    Raises:
        KeyRingError: as ``load_public_keys``.
    """
    return TrustedKeys(load_public_keys(path, SIGNING))


def load_receiver_public(path: str | os.PathLike[str]) -> PublicKey:
    """The receiver public key a sender seals to (the file's first key).

    Raises:
        KeyRingError: as ``load_public_keys``.
    """
    return load_public_keys(path, RECEIVER)[0]


def load_receiver_keys(path: str | os.PathLike[str]) -> ReceiverKeys:
    """The receiver's private key file (one or more X25519 pairs).

    Raises:
        KeyRingError: unreadable, not the format, a public half that does not match its private
            key, or a fingerprint mismatch.
    """
    return receiver_keys_from_document(_read_json(path), str(path))


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """A signing key file (one Ed25519 key).

    Raises:
        KeyRingError: unreadable, not the format, more than one key, or a mismatch.
    """
    return signing_key_from_document(_read_json(path), str(path))


def write_key_file(
    path: str | os.PathLike[str], doc: dict[str, Any], *, private: bool, overwrite: bool = False
) -> None:
    """Write ``doc`` atomically: mode 0600 for a private file, 0644 for a public one.

    Raises:
        KeyRingError: the file exists and ``overwrite`` is false, or it cannot be written. On any
            error an existing file is left as it was.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise KeyRingError(f"{target} exists; refusing to overwrite it")
    write_json_atomically(target, doc, mode=0o600 if private else 0o644, overwrite=overwrite)


# -- atomic writes --------------------------------------------------------------------------------


def _set_owner(fd: int, owner: tuple[int, int] | None, target: Path) -> None:
    """Give the open file ``fd`` the ``(uid, gid)`` ``owner`` (no-op when already so).

    Raises:
        KeyRingError: not permitted (another user's file while not root).
    """
    if owner is None:
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) == owner:
        return
    try:
        os.fchown(fd, *owner)
    except PermissionError as exc:
        raise KeyRingError(
            f"cannot give the new {target} the owner uid {owner[0]} gid {owner[1]} of the file "
            f"it replaces ({exc.strerror}); run as root or as that user so the service keeps "
            "access; nothing was changed"
        ) from exc


def write_json_atomically(
    target: Path,
    doc: dict[str, Any],
    *,
    mode: int,
    overwrite: bool,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write ``doc`` as JSON to ``target`` atomically (temporary file, fsync, rename), created
    0600 and only then given ``owner`` and ``mode``: key material is never readable by anyone
    else, not even for a moment. Shared by key rings and the public-key mode's key files.

    Raises:
        KeyRingError: ``target`` appeared meanwhile and ``overwrite`` is false, the owner cannot
            be set, or the file cannot be written. On any error an existing file is left as it
            was.
    """
    text = json.dumps(doc, indent=2) + "\n"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fd, 0o600)  # mkstemp's mode, stated: nothing is ever wider
                _set_owner(fd, owner, target)
                os.fchmod(fd, mode)
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            if not overwrite and target.exists():
                raise KeyRingError(f"{target} appeared meanwhile; refusing to overwrite it")
            Path(tmp).replace(target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise KeyRingError(f"cannot write key file {target}: {exc}") from exc
