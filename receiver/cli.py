"""``kafka-diode receive``: parse settings (file < environment < flags), check, run.

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT) or a passing ``--check-config``; 2 when the
configuration is invalid (the message names the key and the fix) or the key file is unusable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common import logging as common_logging
from common import settings
from common.errors import ConfigError, KeyRingError
from receiver.config import ENV_PREFIX, ReceiverConfig
from receiver.memory_bound import check_memory_fits
from runtime import cgroup_memory, config_file
from runtime.named_files import check_files

log = logging.getLogger(__name__)

EXIT_CONFIG = 2

_DESCRIPTION = """\
Receive datagrams from the diode, authenticate and decode them, and write every record to the
downstream raw topic (key <topic>:<partition>:<offset>, provenance headers; docs/topics.md).
Settings come from --config FILE (TOML), then DIODE_RECEIVER_* environment variables, then flags.
librdkafka properties: [kafka] table in the file, DIODE_RECEIVER_KAFKA__PROP_NAME=value, or
--kafka prop.name=value. Signals: SIGTERM/SIGINT stop after flushing, SIGHUP reloads the key file.
See docs/receiver.md.
"""


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The argument parser (one flag per ReceiverConfig field)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="TOML file with the settings (keys as below)")
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the settings, print them (secrets masked) as JSON and exit",
    )
    settings.add_flags(parser, ReceiverConfig)
    return parser


def load_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ReceiverConfig:
    """Merge file, environment and flags into a validated configuration.

    Raises:
        ConfigError: unreadable file or any invalid key.
    """
    # a receiver file has no [receiver] table of its own: the whole file is the receiver's
    file_values = config_file.read_toml_section(args.config, "receiver")
    return settings.build(
        ReceiverConfig,
        file_values=file_values,
        env=os.environ if env is None else env,
        env_prefix=ENV_PREFIX,
        flags=args,
    )


def main(argv: Sequence[str], prog: str = "kafka-diode receive") -> int:
    """Entry point of ``kafka-diode receive``; returns the exit code."""
    parser = build_parser(prog)
    args = parser.parse_args(list(argv))
    try:
        config = load_config(args)
        if config.key_file is not None:
            from runtime import link_key  # noqa: PLC0415  keep --help light

            link_key.load(key_file=config.key_file, password=None, salt="")
        if config.receiver_key_file is not None:
            from receiver.pubkey_glue import load_verifier  # noqa: PLC0415  keep --help light

            load_verifier(config)
        check_files(config)  # every other file it names (ssl.ca.location, ...)
        check_memory_fits(config, cgroup_memory.service_memory_limit())
    except (ConfigError, KeyRingError) as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_config:
        print(json.dumps(settings.describe(config), indent=2, sort_keys=True))
        return 0
    common_logging.configure(config.log_level, json_format=config.log_json)
    log.info("settings: %s", json.dumps(settings.describe(config), sort_keys=True))
    from receiver import app  # noqa: PLC0415  loads confluent_kafka and uvloop only to run

    if config.worker_processes and config.socket_count() > 1:
        return app.run_workers(config)
    return app.run(config)
