"""``kafka-diode netem``: the impairment relay, tc netem apply/clear/show, and the profile list.

``relay`` settings come from a TOML file (``--config``, keys at top level or under ``[relay]``),
then ``DIODE_NETEM_*`` environment variables, then flags. Exit codes: 0 success (SIGINT/SIGTERM
on the relay is a success), 1 runtime failure (tc or netem unavailable, cannot bind), 2 usage or
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from common import logging as diode_logging
from common import settings
from common.errors import ConfigError, ServiceError
from common.metrics import CollectorRegistry
from netem.kind_loss import KindLoss
from netem.profile import NAMED_PROFILES, Profile, override, resolve
from netem.relay import Relay, parse_address
from netem.tc import NetemUnavailableError, TcNetem
from runtime import config_file, service
from runtime.metrics_http import serve

ENV_PREFIX = "DIODE_NETEM_"
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class RelaySettings:
    """Settings of ``kafka-diode netem relay``."""

    listen: str = "127.0.0.1:0"
    """Address to receive datagrams on, HOST:PORT (port 0: any free port, printed at start)."""
    forward: str = ""
    """Address to forward impaired datagrams to, HOST:PORT."""
    profile: str = "clean"
    """A named profile, a TOML file, or netem words in quotes (docs/netem.md)."""
    seed: int | None = None
    """Seed of the random decisions (default: the profile's, else a fresh one, printed)."""
    metrics_port: int = 0
    """Serve Prometheus metrics on this port (0: off)."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics endpoint binds to."""
    kind_loss: str = ""
    """Extra loss aimed at one envelope kind (byte 5), KIND:PERCENT[:FIRST]: e.g. 3:20:2 drops
    the first 2 key announcements and 20 percent of the later ones (public-key mode tests)."""
    stats_interval: float = 0.0
    """Print a JSON line of counters every this many seconds (0: only at exit)."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """Event loop implementation."""
    log_level: str = "INFO"
    """Log level (DEBUG, INFO, WARNING, ERROR)."""
    log_json: bool = False
    """Log one JSON object per line."""

    def __post_init__(self) -> None:
        parse_address("listen", self.listen)
        if not self.forward:
            raise ConfigError("forward", "is required", "pass --forward HOST:PORT")
        parse_address("forward", self.forward)
        if self.kind_loss:
            KindLoss.parse(self.kind_loss)
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", "must be 0 to 65535")
        if not 0 <= self.stats_interval <= 86_400:
            raise ConfigError("stats_interval", "must be 0 to 86400 seconds")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ConfigError("seed", "must be 0 to 2**64-1")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log_level", f"is {self.log_level!r}", "use DEBUG, INFO, ...")


#: Profile keys with a flag of their own on ``relay`` and ``apply`` (``--seed`` is already there).
PROFILE_FLAGS = tuple(f.name for f in fields(Profile) if f.name != "seed")


def _add_profile_flags(parser: argparse.ArgumentParser) -> None:
    """``--loss``, ``--ge-p``, ``--delay`` ...: one flag per profile key, over ``--profile``."""
    docs = settings.field_docs(Profile)
    group = parser.add_argument_group(
        "profile keys: each replaces the --profile's value (netem's words such as 5%, 10ms, "
        "10mbit, or a bare number of percent, milliseconds or bits/s); a key of one loss model "
        "(--loss, --ge-p ...) replaces the profile's other one"
    )
    for name in PROFILE_FLAGS:
        group.add_argument(
            settings.flag_name(name),
            dest=f"profile_{name}",
            metavar="VALUE",
            default=None,
            help=docs.get(name, ""),
        )


def profile_from(args: argparse.Namespace, spec: str, seed: int | None) -> Profile:
    """``--profile`` resolved, with the profile-key flags given on top.

    Raises:
        ConfigError: naming the flag (``--loss``) when its value is refused.
    """
    profile = resolve(spec, seed=seed)
    given = {
        name: value
        for name in PROFILE_FLAGS
        if (value := getattr(args, f"profile_{name}", None)) is not None
    }
    try:
        return override(profile, given)
    except ConfigError as exc:
        if exc.key in given:
            raise ConfigError(settings.flag_name(exc.key), exc.problem, exc.fix) from exc
        raise


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Network impairment in netem's words: a userspace UDP relay (runs anywhere) "
        "or the kernel's tc netem (where the kernel has it). See docs/netem.md.",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    relay = sub.add_parser(
        "relay",
        help="userspace impairment relay: receive UDP, impair, forward",
        description="Receive UDP datagrams, impair them by a profile and forward them. Prints "
        "a JSON summary of what it did on exit (SIGINT/SIGTERM) and, optionally, periodically. "
        f"Settings: --config file < {ENV_PREFIX}* environment < flags.",
        allow_abbrev=False,
    )
    relay.add_argument("--config", type=Path, help="TOML file with relay settings")
    settings.add_flags(relay, RelaySettings)
    _add_profile_flags(relay)

    for name, text in (
        ("apply", "install a profile with 'tc qdisc replace dev DEV root netem ...'"),
        ("clear", "remove the root qdisc of DEV"),
        ("show", "show the qdiscs of DEV"),
    ):
        cmd = sub.add_parser(name, help=text, description=text, allow_abbrev=False)
        cmd.add_argument("--dev", required=True, help="network device, e.g. eth0")
        cmd.add_argument("--netns", help="run tc inside this network namespace")
        if name == "apply":
            cmd.add_argument(
                "--profile", required=True, help="a named profile, a TOML file, or netem words"
            )
            cmd.add_argument("--seed", type=int, help="netem seed (needs kernel/iproute2 6.3+)")
            cmd.add_argument(
                "--dry-run", action="store_true", help="print the tc command, run nothing"
            )
            _add_profile_flags(cmd)

    show = sub.add_parser(
        "profiles",
        help="list the named profiles",
        description="List the named profiles.",
        allow_abbrev=False,
    )
    show.add_argument("name", nargs="?", help="print one profile's netem words and fields")
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode netem") -> int:
    """Run ``kafka-diode netem ...``; returns the exit code."""
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    try:
        if args.command == "relay":
            return _relay(args)
        if args.command == "profiles":
            return _profiles(args.name)
        tc = TcNetem(args.dev, netns=args.netns)
        if args.command == "apply":
            profile = profile_from(args, args.profile, args.seed)
            with_seed = args.seed is not None
            if args.dry_run:
                print(" ".join(tc.command_for(profile, include_seed=with_seed)))
                return EXIT_OK
            tc.apply(profile, include_seed=with_seed)
            print(f"netem on {args.dev}: {' '.join(profile.to_tc_args(include_seed=with_seed))}")
            return EXIT_OK
        if args.command == "clear":
            removed = tc.clear()
            print(f"{args.dev}: root qdisc removed" if removed else f"{args.dev}: nothing to clear")
            return EXIT_OK
        print(tc.show(), end="")
        return EXIT_OK
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NetemUnavailableError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAIL
    except ServiceError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAIL


def _profiles(name: str | None) -> int:
    if name is not None:
        profile = resolve(name)
        print(json.dumps({"netem": profile.to_netem_words(), **profile.to_dict()}, indent=2))
        return EXIT_OK
    width = max(len(n) for n in NAMED_PROFILES)
    for pname, profile in NAMED_PROFILES.items():
        print(f"{pname.ljust(width)}  {_words(profile)}")
    return EXIT_OK


def _words(profile: Profile) -> str:
    words = profile.to_tc_args()
    # "limit 1000" is the default everywhere; leave it out of the listing.
    if words[:2] == ["limit", str(Profile().limit)]:
        words = words[2:]
    return " ".join(words) or "(no impairment)"


def _load_config(path: Path | None) -> dict[str, Any]:
    return config_file.read_toml_section(path, "relay")


def _relay(args: argparse.Namespace) -> int:
    cfg = settings.build(
        RelaySettings,
        file_values=_load_config(args.config),
        env=os.environ,
        env_prefix=ENV_PREFIX,
        flags=args,
    )
    diode_logging.configure(cfg.log_level, json_format=cfg.log_json)
    profile = profile_from(args, cfg.profile, cfg.seed)
    listen, forward = parse_address("listen", cfg.listen), parse_address("forward", cfg.forward)
    return service.run(lambda: _serve(cfg, profile, listen, forward), cfg.event_loop)


async def _serve(
    cfg: RelaySettings, profile: Profile, listen: tuple[str, int], forward: tuple[str, int]
) -> int:
    registry = CollectorRegistry()
    kind_loss = KindLoss.parse(cfg.kind_loss, seed=profile.seed or 0) if cfg.kind_loss else None
    relay = Relay(listen, forward, profile, registry=registry, kind_loss=kind_loss)
    await relay.start()
    host, port = relay.listen_address
    print(
        json.dumps({"event": "listening", "listen": f"{host}:{port}", "seed": relay.seed}),
        flush=True,
    )
    serve(registry, cfg.metrics_port, cfg.metrics_addr)
    stop = asyncio.Event()
    try:
        with service.loop_signals(service.StopRequests(lambda _signame: stop.set())):
            while not stop.is_set():
                timeout = cfg.stats_interval or None
                try:
                    await asyncio.wait_for(stop.wait(), timeout)
                except TimeoutError:
                    print(json.dumps({"event": "stats", **relay.summary()}), flush=True)
    finally:
        await relay.stop()
    print(json.dumps({"event": "summary", **relay.summary()}), flush=True)
    return EXIT_OK
