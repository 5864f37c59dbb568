"""``kafka-diode dedup``: run the dedup query; ``kafka-diode dedup reset``: clear one partition.

This module parses arguments, loads the settings and maps outcomes to exit codes; running the
query is ``dedup.runner``. Configuration is validated before Spark starts; a bad value exits 2
with the variable's name and the fix.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from common import logging as diode_logging
from common import raw_topic, settings
from common.errors import ConfigError, DiodeError, GapStateError
from dedup import class_archive
from dedup.config import (
    LOG_LEVELS,
    PASS_THROUGH,
    DedupConfig,
    environment_help,
    from_sources,
    tool_config,
)
from dedup.layouts import Layout, implementation, recorded_layout
from dedup.runner import run
from runtime import config_file
from runtime.named_files import check_files, table_variable

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Spark Structured Streaming job: raw topic(s) -> clean topic(s) exactly once (for "
            "read_committed readers) + gap topic. Settings come from --config (TOML, top level or "
            "a [dedup] table, keys as below in lower case), then the environment (names below), "
            "then flags. 'dedup reset --topic T --partition P' clears one partition."
        ),
        epilog=environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config", type=Path, help="TOML file (top level or [dedup] table) with the settings"
    )
    settings.add_flags(parser, DedupConfig, skip=("log_json",))
    parser.add_argument(
        "--log-json",
        dest="log_json",
        nargs="?",
        const="true",
        default=None,
        metavar="BOOL",
        help="log one JSON object per line; alone means true [boolean; env LOG_JSON; default: "
        "false]",
    )
    # Before --log-json existed the flag was --json-logs: kept, hidden, for old unit files.
    parser.add_argument(
        "--json-logs", dest="log_json", action="store_const", const="true", help=argparse.SUPPRESS
    )
    run = parser.add_argument_group("run control")
    run.add_argument(
        "--until-idle",
        type=float,
        metavar="SECONDS",
        help="stop after this many seconds with nothing left to read, not mid-batch (tests, demo)",
    )
    run.add_argument(
        "--until-settled",
        action="store_true",
        help="stop once a batch finds nothing left to read and every gap is reported, not "
        "mid-batch (tests, a one-off run after a resend)",
    )
    run.add_argument(
        "--max-batches", type=int, metavar="N", help="stop after N micro-batches (tests, demo)"
    )
    run.add_argument(
        "--check-config", action="store_true", help="print the effective settings and exit"
    )
    return parser


def _reset_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{prog} reset",
        description=(
            "Clear the dedup state of one source (topic, partition): the next records of it are "
            "treated as if never seen before (no duplicate detection against older ones, no gaps "
            "below them). Sends a reset record to CONTROL_TOPIC; the running (or next) query "
            "applies it in order with the raw records. Logged by both sides."
        ),
        epilog=environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--topic", required=True, help="source topic")
    parser.add_argument("--partition", required=True, type=int, help="source partition")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument("--bootstrap-servers", dest="bootstrap_servers", default=None)
    parser.add_argument("--control-topic", dest="control_topic", default=None)
    parser.add_argument(
        "--raw-topic",
        dest="raw_topic",
        default=None,
        help=(
            "a direct checkpoint's raw topic: the reset goes into the source partition's raw "
            "partition (found by itself from STATE_DIR_CONFIG's layout file when it is a local "
            "path)"
        ),
    )
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode dedup") -> int:
    """Entry point (see the module docstring); returns the exit code."""
    args_list = list(argv)
    if args_list and args_list[0] == "reset":
        return _reset(args_list[1:], prog, os.environ)
    args = _parser(prog).parse_args(args_list)
    try:
        config = from_sources(
            os.environ, args, file_values=config_file.read_toml_section(args.config, "dedup")
        )
        check_files(config, key=table_variable(PASS_THROUGH))
        class_archive.check_setting(config.jvm_class_archive_dir)
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    diode_logging.configure(config.log_level, json_format=config.log_json)
    if args.check_config:
        print(json.dumps(settings.describe(config), indent=2))
        return EXIT_OK
    try:
        return run(
            config,
            until_idle=args.until_idle,
            until_settled=args.until_settled,
            max_batches=args.max_batches,
        )
    except ConfigError as exc:  # found at start against the host (dedup/memory_limit.py)
        log.error("configuration error: %s", exc)  # noqa: TRY400  the message is the diagnosis
        return EXIT_CONFIG
    except DiodeError as exc:
        log.error("dedup failed: %s", exc)  # noqa: TRY400  the message is the diagnosis
        return EXIT_FAILED


def _reset(argv: Sequence[str], prog: str, env: Mapping[str, str]) -> int:
    args = _reset_parser(prog).parse_args(list(argv))
    try:
        config = tool_config(env, args)
        check_files(config, key=table_variable(PASS_THROUGH))
    except ConfigError as exc:
        print(f"{prog} reset: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    level = config.log_level.upper()
    diode_logging.configure(level if level in LOG_LEVELS else "INFO", json_format=config.log_json)
    control = config.control_topic
    if args.partition < 0 or ":" in args.topic or not args.topic:
        print(f"{prog} reset: --topic must be a topic name, --partition >= 0", file=sys.stderr)
        return EXIT_CONFIG
    target = f"{args.topic}:{args.partition}"
    if not args.yes:
        answer = input(
            f"Clear the dedup state of {target}? Records of it will no longer be checked "
            "against earlier ones. Type 'yes': "
        )
        if answer.strip().lower() != "yes":
            print("not reset")
            return EXIT_FAILED
    from runtime import kafka  # noqa: PLC0415  loads confluent_kafka only to write the reset

    conf: dict[str, Any] = {"bootstrap.servers": config.bootstrap_servers}
    conf.update({"enable.idempotence": True, **config.kafka_conf})
    # where the record goes is the checkpoint's layout's to say (dedup/layouts/)
    raw_topics = (args.raw_topic,) if args.raw_topic else config.raw_topics
    kind = Layout.DIRECT if args.raw_topic else recorded_layout(config.state_dir_config)
    layout = implementation(kind if raw_topics and kind else Layout.BUCKETS)
    try:
        into, partition = layout.reset_target(
            _ResetTopics(raw_topics, control),
            args.partition,
            lambda topic: kafka.topic_partitions(conf, topic, 30.0),
        )
    except GapStateError as exc:
        print(f"{prog} reset: {exc}", file=sys.stderr)
        return EXIT_FAILED
    producer = kafka.producer(conf)
    user = env.get("USER") or env.get("LOGNAME") or "unknown"
    key, value = raw_topic.reset_record(args.topic, args.partition, user, int(time.time() * 1000))
    producer.produce(into, value, key, partition, headers=raw_topic.RESET_HEADERS)
    if producer.flush(30) != 0:
        log.error("reset of %s could not be written to %s", target, into)
        return EXIT_FAILED
    where = into if partition < 0 else f"{into} partition {partition}"
    log.warning("reset of %s requested by %s via %s", target, user, where)
    return EXIT_OK


class _ResetTopics(NamedTuple):
    """The topics a reset may go into (``dedup.layouts.ResetTopics``)."""

    raw_topics: tuple[str, ...]
    control_topic: str
