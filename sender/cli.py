"""``kafka-diode send``: read upstream Kafka, send paced, encrypted datagrams into the diode.

Configuration: ``--config FILE`` (TOML), then ``DIODE_SENDER_*`` environment variables, then flags
(docs/sender.md has the full table). Exit codes: 0 after a clean stop (SIGTERM/SIGINT: drain, send,
commit), 1 when the sender failed or could not send everything before ``shutdown_timeout``,
2 for a configuration error (the message names the key). A second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common import logging as diode_logging
from common import settings
from common.errors import ConfigError, DiodeError
from runtime import config_file, service
from runtime.metrics_http import serve
from runtime.named_files import check_files
from sender.chain_plan import plan_problems, summary
from sender.config import ENV_PREFIX, SenderConfig, load_keyring
from sender.pacing_advice import pacing_warning
from sender.record_filter import build_filter
from sender.transport import resolve

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The argument parser (every option documented from the config's field docstrings)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "Read Kafka topics and send them as paced, AES-256-GCM encrypted UDP datagrams "
            "through a one-way link. Settings come from --config (TOML), then "
            f"{ENV_PREFIX}* environment variables, then these flags."
        ),
        epilog="Exit codes: 0 clean stop, 1 failure, 2 configuration error.",
    )
    parser.add_argument("--config", type=Path, help="TOML file with the settings below")
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate, print the effective configuration (secrets masked) and exit",
    )
    settings.add_list_argument(
        parser,
        "--check-chains",
        nargs="+",
        split=False,
        item_type=Path,
        metavar="FILE",
        help="with chain set: read the other chains' TOML files and check that together with "
        "this configuration every offset is carried exactly once (share) or by every chain "
        "(copy); print the plan and exit (docs/sender.md, Chains)",
    )
    settings.add_flags(parser, SenderConfig)
    return parser


def load_config(args: argparse.Namespace, env: Mapping[str, str]) -> SenderConfig:
    """Merge file, environment and flags.

    Raises:
        ConfigError: naming the offending key (``--config`` for an unreadable file).
    """
    file_values = config_file.read_toml_section(args.config, "sender")
    flags = {
        k: v for k, v in vars(args).items() if k not in ("config", "check_config", "check_chains")
    }
    return settings.build(
        SenderConfig, file_values=file_values, env=env, env_prefix=ENV_PREFIX, flags=flags
    )


def main(argv: Sequence[str], prog: str = "kafka-diode send") -> int:
    """Run the sender until SIGTERM/SIGINT; returns the exit code."""
    args = build_parser(prog).parse_args(list(argv))
    try:
        config = load_config(args, os.environ)
        load_keyring(config)  # missing/unreadable key file fails now, naming key_file
        build_filter(config)  # so does an unreadable or wrong filter_file, naming it
        check_files(config)  # and any other file it names (ssl.ca.location, ...)
        for host, port in config.targets():
            resolve("target", host, port)
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_chains:
        return check_chains(config, args.check_chains, prog)
    advice = pacing_warning(config)
    if args.check_config:
        print(json.dumps(settings.describe(config), indent=2, sort_keys=True))
        if advice:
            print(f"{prog}: warning: {advice}", file=sys.stderr)
        return EXIT_OK
    diode_logging.configure(config.log_level, json_format=config.log_json)
    if advice:
        log.warning("%s", advice)
    return run(config)


def check_chains(config: SenderConfig, others: Sequence[Path], prog: str) -> int:
    """``--check-chains``: this configuration and the other chains' files as one plan."""
    members = [("this configuration", config)]
    for path in others:
        try:
            values = config_file.read_toml_section(path, "sender")
            members.append((str(path), settings.build(SenderConfig, file_values=values)))
        except ConfigError as exc:
            print(f"{prog}: {path}: configuration error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    problems = plan_problems(members)
    for problem in problems:
        print(f"{prog}: chains: {problem}", file=sys.stderr)
    if problems:
        return EXIT_CONFIG
    print(summary(members))
    return EXIT_OK


def run(config: SenderConfig) -> int:
    """Run the sender on the configured event loop until a signal stops it."""
    try:
        return service.run(lambda: _serve(config), config.loop)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400  message is enough
        return EXIT_CONFIG
    except DiodeError as exc:
        log.error("sender failed: %s", exc)  # noqa: TRY400  message is enough
        return EXIT_FAILED


async def _serve(config: SenderConfig) -> int:
    from sender.app import SenderApp  # noqa: PLC0415  loads confluent_kafka only when running

    app = SenderApp(config)
    if config.metrics_port:
        try:
            serve(app.metrics.registry, config.metrics_port, config.metrics_addr)
        except OSError as exc:
            raise ConfigError("metrics_port", f"cannot listen: {exc.strerror}") from exc
    stop_requested = asyncio.Event()

    def on_stop(signame: str) -> None:
        log.info("signal %s: draining, sending, committing", signame)
        stop_requested.set()

    with service.loop_signals(service.StopRequests(on_stop), reload=app.reload):
        await app.start()
        stopper = asyncio.ensure_future(stop_requested.wait())
        failed = asyncio.ensure_future(app.wait())
        await asyncio.wait({stopper, failed}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        failed.cancel()
        clean = await app.stop()
    if app.failure is not None:
        return EXIT_FAILED
    log.info(
        "stopped: %d records read, %d sent, %d datagrams",
        app.records_read,
        app.pipeline.records_sent if app.pipeline else 0,
        app.pipeline.datagrams_sent if app.pipeline else 0,
    )
    return EXIT_OK if clean else EXIT_FAILED
