"""``kafka-diode keygen`` for the public-key mode: receiver pairs, signing keys, trusted lists.

* ``--receiver --out receiver.key`` writes a receiver X25519 key pair (private file 0600) and its
  public half (``receiver.pub``, or ``--public-out``), shareable, for the high side. ``--add``
  appends a new pair to an existing receiver file (rotation of the receiver's long-term key: the
  receiver accepts both until the old pair is removed) and writes the new public key.
* ``--signing --name high-1 --out sender.key`` writes an Ed25519 signing key (0600) and its public
  half (``sender.pub``): a sender's, for the receiver's trusted list, or the low side's bundle
  key, for the sender's.
* ``--merge A.pub B.pub --out trusted.pub`` joins signing public keys into one trusted list.
* ``--show FILE`` prints the type and fingerprint of every key in a key file, to compare over the
  phone with what the other side printed.

Every command prints fingerprints as ``ABCD-EFGH-...`` (docs/security.md, "Public-key mode").
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from common import settings
from common.errors import KeyRingError
from common.wire.pubkey import (
    RECEIVER,
    SIGNING,
    PublicKey,
    ReceiverKeyPair,
    ReceiverKeys,
    SigningKey,
    format_fingerprint,
    public_keys_document,
    receiver_keys_document,
    signing_key_document,
)
from runtime.key_files import load_public_keys, load_receiver_keys, load_signing_key, write_key_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The public-key options of ``keygen`` (one mode at most)."""
    mode = p.add_argument_group("public-key mode (docs/operations.md, 'Public-key mode')")
    mode.add_argument(
        "--receiver",
        action="store_true",
        help="write a receiver X25519 key pair to --out (0600) and its public key (shareable)",
    )
    mode.add_argument(
        "--signing",
        action="store_true",
        help="write an Ed25519 signing key (a sender's, or the low side's bundle key) to --out "
        "(0600) and its public key (shareable)",
    )
    settings.add_list_argument(
        mode,
        "--merge",
        nargs="+",
        split=False,
        item_type=Path,
        metavar="PUB",
        help="join signing public key files into one trusted list written to --out",
    )
    mode.add_argument(
        "--show", type=Path, metavar="FILE", help="print the fingerprints of a key file"
    )
    mode.add_argument(
        "--public-out",
        type=Path,
        help="where the public key goes (default: --out with .key replaced by .pub)",
    )
    mode.add_argument("--name", default="", help="name recorded with a signing key (--signing)")


def wanted(args: argparse.Namespace) -> bool:
    """True when one of the public-key modes was chosen."""
    return bool(args.receiver or args.signing or args.merge or args.show)


def _public_path(args: argparse.Namespace) -> Path:
    if args.public_out is not None:
        return Path(args.public_out)
    out = Path(args.out)
    return out.with_suffix(".pub") if out.suffix == ".key" else out.with_name(out.name + ".pub")


def _show(path: Path) -> list[str]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise KeyRingError(f"cannot read {path}: {exc}") from exc
    if isinstance(doc, dict) and "kafka_diode_public_keys" in doc:
        key_type = doc.get("type")
        if key_type not in (RECEIVER, SIGNING):
            raise KeyRingError(f"{path}: unknown key type {key_type!r}")
        keys = load_public_keys(path, RECEIVER if key_type == RECEIVER else SIGNING)
        return [f"{k.key_type} public {format_fingerprint(k.fingerprint)} {k.name}" for k in keys]
    if isinstance(doc, dict) and doc.get("type") == RECEIVER:
        return [
            f"{RECEIVER} private {format_fingerprint(p.fingerprint)}"
            for p in load_receiver_keys(path)
        ]
    if isinstance(doc, dict) and doc.get("type") == SIGNING:
        key = load_signing_key(path)
        return [f"{SIGNING} private {format_fingerprint(key.fingerprint)} {key.name}"]
    raise KeyRingError(f"{path} is not a public-key mode key file")


def run(args: argparse.Namespace, prog: str) -> int:
    """Run the chosen public-key mode; the exit code."""
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        if sum(map(bool, (args.receiver, args.signing, args.merge, args.show))) > 1:
            raise KeyRingError("--receiver, --signing, --merge and --show exclude each other")
        if args.show:
            for line in _show(args.show):
                print(line)
            return 0
        if args.out is None:
            raise KeyRingError("--out is required")
        out = Path(args.out)
        if args.merge:
            merged: dict[bytes, PublicKey] = {}
            for path in args.merge:
                for entry in load_public_keys(path, SIGNING):
                    merged[entry.fingerprint] = entry
            write_key_file(
                out, public_keys_document(SIGNING, merged.values()), private=False, overwrite=True
            )
            for entry in merged.values():
                print(f"trusted {format_fingerprint(entry.fingerprint)} {entry.name}")
            return 0
        public_path = _public_path(args)
        if args.receiver:
            keys = load_receiver_keys(out) if args.add else ReceiverKeys()
            pair = ReceiverKeyPair.generate(created=created)
            keys.add(pair)
            write_key_file(
                out, receiver_keys_document(keys), private=True, overwrite=args.add or args.force
            )
            entry = PublicKey(RECEIVER, pair.public, pair.fingerprint, args.name)
            write_key_file(
                public_path, public_keys_document(RECEIVER, [entry]), private=False, overwrite=True
            )
            fp = pair.fingerprint
        else:
            if args.add:
                raise KeyRingError("--add applies to --receiver; a signing key file holds one key")
            key = SigningKey.generate(name=args.name, created=created)
            write_key_file(out, signing_key_document(key), private=True, overwrite=args.force)
            write_key_file(
                public_path,
                public_keys_document(SIGNING, [key.public_entry()]),
                private=False,
                overwrite=True,
            )
            fp = key.fingerprint
    except KeyRingError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(f"fingerprint {format_fingerprint(fp)}")
    print(f"private key {out} (mode 0600), public key {public_path} (share it)", file=sys.stderr)
    return 0
