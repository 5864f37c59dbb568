"""``kafka-diode bundle create|show``: write and inspect resend bundles (low side).

``create`` and ``qr``: ``dedup.bundle_create`` (its guarantees are there); ``join`` (high side):
``sender.bundle_join``, routed there by the dispatcher; this module parses arguments, loads
settings and maps outcomes to exit codes.

``show`` verifies a bundle with the link key and prints it per topic and partition; a tampered,
truncated, wrong-key or wrong-version file is refused with the reason.

Settings: ``--config FILE`` (TOML, top level or a ``[bundle]`` table), then the environment, then
flags. The environment is the dedup's (``BOOTSTRAP_SERVERS``, ``GAP_TOPIC``, ``KAFKA_CONF_*``, so
the bundle unit reads the dedup's env file) overridden by ``DIODE_BUNDLE_*``.

Exit codes: 0 done; 1 failure (Kafka unreachable, file not writable); 2 configuration or usage
error; 4 bundle refused (``show``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common import logging as diode_logging
from common import settings
from common.errors import BundleError, ConfigError, DiodeError
from dedup.bundle_create import BundleConfig, create, write_qr
from runtime import config_file
from runtime.bundle_files import ENV_PREFIX, BundleKeyConfig, load_key_config, show
from runtime.named_files import check_files

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_BAD_BUNDLE = 4

#: The dedup's own variable names, read first so the bundle unit can share the dedup's env file.
DEDUP_ENV = {"BOOTSTRAP_SERVERS": "bootstrap_servers", "GAP_TOPIC": "gap_topic"}
DEDUP_KAFKA_PREFIX = "KAFKA_CONF_"


def bundle_env(env: Mapping[str, str]) -> dict[str, str]:
    """The dedup's variables translated to ``DIODE_BUNDLE_*``, then the real ``DIODE_BUNDLE_*``."""
    out: dict[str, str] = {}
    for var, name in DEDUP_ENV.items():
        if var in env:
            out[settings.env_name(ENV_PREFIX, name)] = env[var]
    for var, raw in env.items():
        if var.startswith(DEDUP_KAFKA_PREFIX) and len(var) > len(DEDUP_KAFKA_PREFIX):
            out[f"{ENV_PREFIX}KAFKA__{var[len(DEDUP_KAFKA_PREFIX) :]}"] = raw
    out.update({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    return out


def load_config(args: argparse.Namespace, env: Mapping[str, str]) -> BundleConfig:
    """defaults < file < environment < flags.

    Raises:
        ConfigError: naming the key.
    """
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "command")}
    return settings.build(
        BundleConfig,
        file_values=config_file.read_toml_section(args.config, "bundle"),
        env=bundle_env(env),
        env_prefix=ENV_PREFIX,
        flags=flags,
    )


def build_parser(prog: str) -> argparse.ArgumentParser:
    """``create``, ``show`` (and ``qr`` when available)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "Resend bundles: the signed list of missing offsets carried to the high side. "
            "'join' (high side) has its own help: kafka-diode bundle join --help."
        ),
        epilog="Exit codes: 0 done, 1 failure, 2 configuration error, 4 bundle refused.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{create,show,qr,join}")
    c = sub.add_parser(
        "create",
        allow_abbrev=False,
        help="read the gap topic and write a signed bundle",
        description=(
            "Read the open gaps from the gap topic and write a signed bundle. Settings: --config "
            "(TOML), then BOOTSTRAP_SERVERS / GAP_TOPIC / KAFKA_CONF_* (the dedup's env), then "
            f"{ENV_PREFIX}*, then flags."
        ),
    )
    c.add_argument("--config", type=Path, help="TOML file (top level or [bundle] table)")
    c.add_argument("--out", type=Path, help="bundle file to write (atomically)")
    c.add_argument("--dry-run", action="store_true", help="print the summary only; write nothing")
    settings.add_list_argument(
        c, "--topic", "--topics", dest="topics", help="only gaps of these source topics"
    )
    settings.add_flags(c, BundleConfig, skip=("topics",))
    s = sub.add_parser("show", allow_abbrev=False, help="verify a bundle and print what it lists")
    s.add_argument("file", type=Path, help="bundle file")
    s.add_argument("--config", type=Path, help="TOML file with key_file (or password + salt)")
    settings.add_flags(s, BundleKeyConfig)
    q = sub.add_parser(
        "qr",
        allow_abbrev=False,
        help="verify a small bundle and render it as QR code images (paper transfer)",
    )
    q.add_argument("file", type=Path, help="bundle file")
    q.add_argument("--out-dir", type=Path, required=True, help="directory for the images")
    q.add_argument("--format", choices=("png", "svg"), default="png", help="image format [png]")
    q.add_argument("--config", type=Path, help="TOML file with key_file (or password + salt)")
    settings.add_flags(q, BundleKeyConfig)
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode bundle") -> int:
    """Run ``bundle create``, ``show`` or ``qr``; returns the exit code."""
    args = build_parser(prog).parse_args(list(argv))
    try:
        if args.command == "create":
            config = load_config(args, os.environ)
            if args.out is None and not args.dry_run:
                raise ConfigError("--out", "is required", "give --out FILE, or --dry-run")
            config.keyring()
            config.signing_key()
            check_files(config)  # and every other file it names (ssl.ca.location, ...)
        else:
            key_config = load_key_config(args.config, vars(args), os.environ)
            keyring = key_config.keyring()
            trusted = key_config.trusted()
            check_files(key_config)
    except ConfigError as exc:
        print(f"{prog} {args.command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command != "create":
        try:
            if args.command == "show":
                show(args.file, keyring, trusted=trusted)
            else:
                for image in write_qr(args.file, keyring, args.out_dir, args.format, trusted):
                    print(image)
        except BundleError as exc:
            print(f"{prog} {args.command}: bundle refused: {exc}", file=sys.stderr)
            return EXIT_BAD_BUNDLE
        except OSError as exc:
            print(f"{prog} {args.command}: failed: {exc}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    diode_logging.configure(config.log_level)
    try:
        create(config, out=args.out, dry_run=args.dry_run)
    except ConfigError as exc:
        print(f"{prog} create: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (DiodeError, OSError) as exc:
        print(f"{prog} create: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
