"""``kafka-diode resend``: re-read listed offsets upstream and send them again (high side).

Input: a bundle carried over from the low side (``--bundle FILE``, verified with the link key
before anything is read), or, when no bundle can be carried, ``--topic T [--partition P]`` with
``--from-offset A --to-offset B`` or ``--from-time X [--to-time Y]``.

The engine and its guarantees: ``sender.resend_job`` (docs/resend.md). This module parses the
command line, loads the configuration, keys and bundle, and maps outcomes to exit codes.

Exit codes: 0 everything recoverable was sent (and nothing was unrecoverable); 1 failure
(upstream unreachable, interrupted, sending incomplete); 2 configuration or usage error;
3 everything recoverable was sent but some offsets were unrecoverable; 4 bundle refused
(unreadable, tampered, truncated, wrong key, wrong version).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from common import bundle as bundle_format
from common import logging as diode_logging
from common import settings
from common.errors import (
    BundleError,
    ConfigError,
    DiodeError,
)
from sender.config import ENV_PREFIX, SenderConfig, load_keyring
from sender.key_announcer import load_bundle_trust
from sender.pacing_advice import pacing_warning
from sender.record_filter import build_filter
from sender.resend import (
    DEFAULT_MAX_SKIP,
    check_offset_range,
)
from sender.transport import resolve

if TYPE_CHECKING:
    pass

from runtime import config_file
from runtime.bundle_files import read_bundle
from runtime.named_files import check_files
from sender.resend_job import (
    EXIT_BAD_BUNDLE,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNRECOVERABLE,
    ResendJob,
    ResendRequest,
)

#: The command's exit codes (module docstring), defined with the engine that decides them.
__all__ = [
    "EXIT_BAD_BUNDLE",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNRECOVERABLE",
    "build_parser",
    "main",
]

log = logging.getLogger(__name__)


#: Live-sender settings a resend does not use (it reads what the bundle or the range names, never
#: commits, sends no heartbeats and serves no metrics, so it can run beside the live sender).
_LIVE_ONLY = (
    "topics",
    "exclude_topics",
    "group_id",
    "static_membership",
    "start_position",
    "start_timestamp",
    "heartbeat_interval",
    "commit_interval",
    "metrics_port",
    "metrics_addr",
)
_PLACEHOLDER_TOPIC = "kafka-diode-resend"


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The argument parser; sender settings are documented from ``SenderConfig``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "Re-read the offsets listed in a bundle (or a range) from upstream Kafka and send them "
            "again through the diode, with the live sender's wire settings and pacing. Never "
            "commits offsets. Sender settings come from --config (TOML, the live sender's file), "
            f"then {ENV_PREFIX}* environment variables, then these flags."
        ),
        epilog=(
            "Exit codes: 0 all sent; 1 failure; 2 configuration error; 3 all recoverable offsets "
            "sent, some unrecoverable (listed); 4 bundle refused. See docs/resend.md."
        ),
    )
    what = parser.add_argument_group("what to resend (a bundle, or a topic with a range)")
    what.add_argument("--bundle", type=Path, help="bundle file made by 'kafka-diode bundle create'")
    what.add_argument("--topic", help="topic to resend from (without a bundle)")
    settings.add_list_argument(
        what,
        "--partition",
        item_type=int,
        dest="partitions",
        help="partition(s); required with --from-offset, default all with --from-time",
    )
    what.add_argument("--from-offset", type=int, help="first offset to resend (inclusive)")
    what.add_argument("--to-offset", type=int, help="last offset to resend (inclusive)")
    what.add_argument(
        "--from-time", help="resend records with timestamp >= this (ISO 8601 with zone, or ms)"
    )
    what.add_argument(
        "--to-time", help="... and <= this (ISO 8601 with zone, or ms); default: up to the end"
    )
    run = parser.add_argument_group("run")
    run.add_argument("--config", type=Path, help="TOML file with sender settings (the live one)")
    run.add_argument(
        "--no-progress", action="store_true", help="no progress bar (log a line every 10 s)"
    )
    run.add_argument(
        "--max-skip",
        type=int,
        default=DEFAULT_MAX_SKIP,
        help=f"read ranges closer than this many offsets as one span [default: {DEFAULT_MAX_SKIP}]",
    )
    run.add_argument(
        "--read-timeout",
        type=float,
        default=60.0,
        help="give up when upstream Kafka returns nothing for this many seconds [default: 60]",
    )
    run.add_argument(
        "--check-config",
        action="store_true",
        help="validate, print the effective sender configuration (secrets masked) and exit",
    )
    sender = parser.add_argument_group("sender settings (same keys as 'kafka-diode send')")
    settings.add_flags(sender, SenderConfig, skip=_LIVE_ONLY)  # type: ignore[arg-type]
    return parser


def parse_time(flag: str, text: str) -> int:
    """ISO 8601 with a zone, or milliseconds since the epoch.

    Raises:
        ConfigError: naming ``flag``.
    """
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            flag, f"{text!r} is not a time", "use ISO 8601 (2024-05-01T12:00:00Z) or ms"
        ) from None
    if moment.tzinfo is None:
        raise ConfigError(flag, "has no time zone", "add Z or +00:00")
    return int(moment.timestamp() * 1000)


def request_from_args(args: argparse.Namespace) -> ResendRequest:
    """Check that exactly one kind of request was given.

    Raises:
        ConfigError: naming the flag and the fix.
    """
    ranged = args.topic is not None
    if args.bundle is not None and ranged:
        raise ConfigError("--bundle", "and --topic are both given", "resend a bundle or a range")
    if args.bundle is not None:
        for flag in ("from_offset", "to_offset", "from_time", "to_time", "partitions"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')}", "only applies with --topic")
        return ResendRequest(bundle=args.bundle)
    if not ranged:
        raise ConfigError(
            "--bundle", "nothing to resend", "give --bundle FILE, or --topic with a range"
        )
    partitions = tuple(args.partitions or ())
    if any(p < 0 for p in partitions):
        raise ConfigError("--partition", "is negative")
    by_offset = args.from_offset is not None or args.to_offset is not None
    by_time = args.from_time is not None or args.to_time is not None
    if by_offset == by_time:
        raise ConfigError(
            "--from-offset", "give either --from-offset/--to-offset or --from-time [--to-time]"
        )
    if by_offset:
        if args.from_offset is None or args.to_offset is None:
            raise ConfigError("--to-offset", "needs both --from-offset and --to-offset")
        if not partitions:
            raise ConfigError("--partition", "is required with --from-offset")
        first, last = check_offset_range(args.from_offset, args.to_offset)
        return ResendRequest(
            topic=args.topic, partitions=partitions, from_offset=first, to_offset=last
        )
    if args.from_time is None:
        raise ConfigError("--from-time", "is required with --to-time")
    start = parse_time("--from-time", args.from_time)
    end = parse_time("--to-time", args.to_time) if args.to_time is not None else None
    if end is not None and end < start:
        raise ConfigError("--to-time", "is before --from-time")
    return ResendRequest(
        topic=args.topic, partitions=partitions, from_time_ms=start, to_time_ms=end
    )


def load_config(args: argparse.Namespace, env: Mapping[str, str]) -> SenderConfig:
    """Merge the live sender's file, ``DIODE_SENDER_*`` and flags into a ``SenderConfig``.

    ``topics`` is the live sender's subscription; a resend reads exactly what it is asked for, so
    the key is satisfied with a placeholder that is never used.

    Raises:
        ConfigError: naming the offending key.
    """
    file_values = config_file.read_toml_section(args.config, "sender")
    names = {k for k in vars(args) if k not in _LIVE_ONLY}
    flags = {k: v for k, v in vars(args).items() if k in names}
    flags["topics"] = _PLACEHOLDER_TOPIC
    return settings.build(
        SenderConfig, file_values=file_values, env=env, env_prefix=ENV_PREFIX, flags=flags
    )


def main(argv: Sequence[str], prog: str = "kafka-diode resend") -> int:
    """Run one resend; returns the exit code (module docstring)."""
    args = build_parser(prog).parse_args(list(argv))
    try:
        request = request_from_args(args)
        config = load_config(args, os.environ)
        keyring = load_keyring(config)
        trusted = load_bundle_trust(config)
        build_filter(config)  # an unreadable or wrong filter_file fails now, naming it
        check_files(config)  # and any other file it names (ssl.ca.location, ...)
        for host, port in config.targets():
            resolve("target", host, port)
        if args.max_skip < 0:
            raise ConfigError("--max-skip", "is negative", "use 0 or more")
        if not 0 < args.read_timeout <= 3600:
            raise ConfigError("--read-timeout", f"is {args.read_timeout}", "use 0 < s <= 3600")
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    advice = pacing_warning(config)
    bundle: bundle_format.Bundle | None = None
    if request.bundle is not None:  # read and verified before --check-config says yes
        try:
            bundle = read_bundle(request.bundle, keyring, trusted)
        except BundleError as exc:
            print(
                f"{prog}: --bundle: bundle refused: {exc} (give the file 'kafka-diode bundle "
                "create' wrote, carried over unchanged, and the link's key)",
                file=sys.stderr,
            )
            return EXIT_BAD_BUNDLE
    if args.check_config:
        print(json.dumps(settings.describe(config), indent=2, sort_keys=True))
        if advice:
            print(f"{prog}: warning: {advice}", file=sys.stderr)
        return EXIT_OK
    diode_logging.configure(config.log_level, json_format=config.log_json)
    if advice:
        log.warning("%s", advice)
    try:
        job = ResendJob(
            config,
            keyring,
            request=request,
            bundle=bundle,
            max_skip=args.max_skip,
            read_timeout=args.read_timeout,
            progress=not args.no_progress,
        )
        return job.run()
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except DiodeError as exc:
        print(f"{prog}: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
