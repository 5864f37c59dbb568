"""``kafka-diode keygen``: write a key file (mode 0600) and print the new key id.

A key is 256 random bits, or derived from a password and salt with scrypt (both sides derive the
same key from the same password and salt). ``--add`` appends a key to an existing ring and makes
it active, for rotation (docs/protocol.md §7). It rewrites the file atomically with the existing
file's owner, group and mode, so the service user that reads it keeps access, and refuses a file
that other users can access (mode bits for "others") rather than carry that on.
"""

from __future__ import annotations

import argparse
import getpass
import os
import stat
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from common.errors import KeyRingError
from common.wire.keyring import (
    MIN_SALT_SIZE,
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    Key,
    KeyRing,
    derive_key,
    format_key_id,
)
from kafka_diode import keygen_pubkey
from runtime import key_files


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write a new 256-bit key file with mode 0600 and print its key id.",
        allow_abbrev=False,
    )
    p.add_argument("--out", type=Path, help="key file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing key file")
    p.add_argument(
        "--add",
        action="store_true",
        help="append a new key to the existing key file and make it active (rotation)",
    )
    p.add_argument(
        "--password",
        action="store_true",
        help="derive the key from a password (read from stdin when it is not a terminal, "
        "otherwise prompted twice) and a salt, with scrypt",
    )
    p.add_argument(
        "--salt",
        help=f"salt as hex (at least {MIN_SALT_SIZE} bytes) for --password; random if omitted "
        "(it is printed: give the same salt to the other side)",
    )
    p.add_argument("--scrypt-n", type=int, default=SCRYPT_N, help="scrypt cost N (power of 2)")
    keygen_pubkey.add_arguments(p)
    return p


def _read_password() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise KeyRingError("the passwords differ")
    return first


def _keep_access(path: Path) -> tuple[int, tuple[int, int]]:
    """Mode and ``(uid, gid)`` of the key file ``--add`` rewrites, so it stays as it was.

    Raises:
        KeyRingError: the file cannot be examined, or others may access it.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise KeyRingError(f"cannot examine {path}: {exc.strerror}") from exc
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o007:
        raise KeyRingError(
            f"{path} is accessible to other users (mode {mode:04o}); "
            f"run 'chmod o-rwx {path}' first, then rotate"
        )
    return mode & 0o770, (st.st_uid, st.st_gid)


def main(argv: Sequence[str], prog: str = "kafka-diode keygen") -> int:
    """Entry point; returns the exit code (0 ok, 1 error, 2 usage)."""
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if keygen_pubkey.wanted(args):
        return keygen_pubkey.run(args, prog)
    if args.out is None:
        parser.error("--out is required")
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        if args.add and args.force:
            raise KeyRingError("--add and --force exclude each other")
        ring = key_files.read_keyring(args.out) if args.add else KeyRing()
        mode, owner = 0o600, None
        if args.add:
            mode, owner = _keep_access(args.out)
        if not args.add and args.out.exists() and not args.force:
            raise KeyRingError(f"{args.out} exists; use --force to overwrite or --add to rotate")
        if args.password:
            try:
                salt = bytes.fromhex(args.salt) if args.salt else os.urandom(MIN_SALT_SIZE)
            except ValueError:
                raise KeyRingError("--salt is not hex") from None
            material = derive_key(_read_password(), salt, n=args.scrypt_n)
            kdf = {"name": "scrypt", "salt": salt.hex(), "n": args.scrypt_n}
            kdf |= {"r": SCRYPT_R, "p": SCRYPT_P}
            key = Key.from_material(material, created=created, kdf=kdf)
            print(f"salt {salt.hex()}", file=sys.stderr)
        else:
            key = Key.generate(created=created)
        ring.add(key, activate=True)
        key_files.write_keyring(
            ring, args.out, overwrite=args.add or args.force, mode=mode, owner=owner
        )
    except KeyRingError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(format_key_id(key.key_id))
    return 0
