"""Bundle files as both sides handle them: the key that signs or verifies them, writing one
atomically, and showing what one lists (file I/O, hence here and not in ``common``). Used by
``bundle create|show|qr`` (low side) and ``bundle join`` and ``resend`` (high side).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import bundle as bundle_format
from common import settings
from common.errors import BundleError, ConfigError, KeyRingError
from runtime.config_file import read_toml_section

#: ``DIODE_BUNDLE_<KEY>`` sets a bundle setting from the environment.
ENV_PREFIX = "DIODE_BUNDLE_"

if TYPE_CHECKING:
    from common.wire import KeyRing
    from common.wire.pubkey import SigningKey, TrustedKeys


@dataclass(frozen=True, kw_only=True)
class BundleKeyConfig:
    """The link key that signs (create) or verifies (show) a bundle."""

    key_file: Path | None = None
    """Key ring file ('kafka-diode keygen'); the active key signs, any key in it verifies."""
    password: str | None = field(default=None, repr=False)
    """Derive the link key from this password (with salt) instead of a key file. Secret."""
    salt: str = ""
    """Salt (hex) of the password derivation; the same as the sender's and receiver's."""
    signing_key_file: Path | None = None
    """Public-key mode: the low side's Ed25519 bundle signing key ('keygen --signing'); bundles
    are signed with it instead of the link key (the sender trusts its public half)."""

    def __post_init__(self) -> None:
        if (self.key_file is not None) + (self.password is not None) + (
            self.signing_key_file is not None
        ) > 1:
            raise ConfigError(
                "key_file", "key_file, password and signing_key_file exclude each other"
            )
        if self.signing_key_file is not None:
            return
        if self.key_file is None and self.password is None:
            raise ConfigError(
                "key_file", "no link key configured", "set key_file (the link's key ring file)"
            )
        if self.password is not None and not self.salt:
            raise ConfigError("salt", "is required with password", "use the link's salt")

    def signing_key(self) -> SigningKey | None:
        """The bundle signing key of the public-key mode, or None.

        Raises:
            ConfigError: unreadable or malformed signing key file.
        """
        from runtime.key_files import load_signing_key  # noqa: PLC0415  keeps --help light

        if self.signing_key_file is None:
            return None
        try:
            return load_signing_key(self.signing_key_file)
        except KeyRingError as exc:
            raise ConfigError("signing_key_file", str(exc), "run 'keygen --signing'") from exc

    def trusted(self) -> TrustedKeys | None:
        """The public half of the signing key, to verify own bundles (public-key mode)."""
        from common.wire.pubkey import TrustedKeys  # noqa: PLC0415  keeps --help light

        key = self.signing_key()
        return TrustedKeys([key.public_entry()]) if key is not None else None

    def keyring(self) -> KeyRing:
        """Load the key ring (empty in the public-key mode).

        Raises:
            ConfigError: unreadable or malformed key file, or a failed derivation.
        """
        from common.wire import KeyRing  # noqa: PLC0415  keeps --help light
        from runtime import link_key  # noqa: PLC0415  as above

        if self.signing_key_file is not None:
            return KeyRing()
        ring = link_key.load(key_file=self.key_file, password=self.password, salt=self.salt)
        assert ring is not None  # __post_init__: a key file or a password is set
        return ring


def summary_table(bundle: bundle_format.Bundle) -> str:
    """Per topic and partition: ranges, records and the first ranges."""
    rows = [("topic", "partition", "ranges", "records", "offsets")]
    rows += [(t, str(p), str(n), str(r), s) for t, p, n, r, s in bundle_format.summary_rows(bundle)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(
            [row[0].ljust(widths[0]), *(row[i].rjust(widths[i]) for i in (1, 2, 3)), row[4]]
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * max(len(line) for line in lines))
    created = datetime.fromtimestamp(bundle.created_at_ms / 1000, UTC).isoformat(timespec="seconds")
    head = (
        f"bundle {bundle.bundle_id} made {created}: {bundle.record_count} records in"
        f" {len(bundle.partitions)} partitions from {bundle.gap_count} open gaps"
    )
    if not bundle.partitions:
        return head + "\nnothing to resend"
    return "\n".join([head, *lines])


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one.

    Raises:
        OSError: the directory is not writable or the disk is full.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def show(
    path: Path,
    keyring: KeyRing,
    echo: Callable[[str], None] = print,
    trusted: TrustedKeys | None = None,
) -> bundle_format.Bundle:
    """Verify and print a bundle.

    Raises:
        BundleError: unreadable or refused.
    """
    return show_bytes(_read(path), keyring, echo, trusted)


def _read(path: Path) -> bytes:
    """At most one byte over the bundle size limit (so an oversized file is refused, unread)."""
    try:
        with path.open("rb") as fh:
            return fh.read(bundle_format.MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror}") from exc


def show_bytes(
    data: bytes,
    keyring: KeyRing,
    echo: Callable[[str], None] = print,
    trusted: TrustedKeys | None = None,
) -> bundle_format.Bundle:
    """Verify and print a bundle given as bytes.

    Raises:
        BundleError: refused.
    """
    bundle = bundle_format.verify(data, {k.key_id: k.material for k in keyring}, trusted=trusted)
    echo(summary_table(bundle))
    if trusted is not None and b'"Ed25519"' in data:
        echo("authentication: OK (Ed25519 with the low side's bundle key)")
    else:
        echo("authentication: OK (HMAC-SHA256 with the link key)")
    return bundle


def load_key_config(
    config_file: Path | None, flags: Mapping[str, Any], env: Mapping[str, str]
) -> BundleKeyConfig:
    """The key settings only (``show``, ``qr``, ``join``): defaults < ``[bundle]`` of the TOML
    file < ``DIODE_BUNDLE_*`` < flags; other keys in the file, environment or flags are ignored.

    Raises:
        ConfigError: naming the key.
    """
    names = {f.name for f in dataclasses.fields(BundleKeyConfig)}
    file_values = {k: v for k, v in read_toml_section(config_file, "bundle").items() if k in names}
    key_env = {
        k: v
        for k, v in env.items()
        if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() in names
    }
    return settings.build(
        BundleKeyConfig,
        file_values=file_values,
        env=key_env,
        env_prefix=ENV_PREFIX,
        flags={k: v for k, v in flags.items() if k in names},
    )


def read_bundle(
    path: Path, keyring: KeyRing | None, trusted: TrustedKeys | None = None
) -> bundle_format.Bundle:
    """Read and verify a bundle with the link keys of ``keyring`` or, in the public-key mode,
    the low side's signing keys ``trusted``.

    Raises:
        BundleError: unreadable, or refused by ``common.bundle.verify`` (the message says why).
    """
    if keyring is None and trusted is None:
        raise BundleError(
            "a bundle can only be verified with the link key (key_file or password) or, in the "
            "public-key mode, the low side's bundle key (bundle_trusted_keys_file)"
        )
    data = _read(path)
    keys = {key.key_id: key.material for key in keyring} if keyring is not None else {}
    return bundle_format.verify(data, keys, trusted=trusted)
