"""``kafka-diode bundle join`` (high side): scanned QR payloads back into a verified bundle file.

The payload texts (one file per scanned code, any order, duplicates allowed) are joined
(``common.bundle_qr``), the bundle is verified with the link key (or, in public-key mode, the
low side's bundle key) before anything is written, its summary printed, and the file written
atomically for ``kafka-diode resend --bundle``.

Exit codes: 0 written; 1 the file could not be written; 2 configuration or usage error;
4 the payloads or the bundle are refused (missing or mixed codes, damaged, wrong key).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from common import settings
from common.bundle_qr import join_parts
from common.errors import BundleError, ConfigError
from runtime.bundle_files import BundleKeyConfig, load_key_config, show_bytes, write_atomically
from runtime.named_files import check_files

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_BAD_BUNDLE = 4


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The ``join`` arguments (as ``kafka-diode bundle join``)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "Rebuild a bundle from scanned QR payloads (one text file per code), verify, write."
        ),
        epilog="Exit codes: 0 written, 1 failure, 2 configuration error, 4 bundle refused.",
    )
    parser.add_argument(
        "parts", type=Path, nargs="+", help="text files, each one scanned QR payload"
    )
    parser.add_argument("--out", type=Path, required=True, help="bundle file to write (atomically)")
    parser.add_argument("--config", type=Path, help="TOML file with key_file (or password + salt)")
    settings.add_flags(parser, BundleKeyConfig)
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode bundle join") -> int:
    """Join, verify, write; returns the exit code."""
    args = build_parser(prog).parse_args(list(argv))
    try:
        key_config = load_key_config(args.config, vars(args), os.environ)
        keyring = key_config.keyring()
        trusted = key_config.trusted()
        check_files(key_config)
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        data = join_parts(p.read_text(encoding="utf-8") for p in args.parts)
        show_bytes(data, keyring, trusted=trusted)
        write_atomically(args.out, data)
    except BundleError as exc:
        print(f"{prog}: bundle refused: {exc}", file=sys.stderr)
        return EXIT_BAD_BUNDLE
    except OSError as exc:
        print(f"{prog}: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {args.out}")
    return EXIT_OK
