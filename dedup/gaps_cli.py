"""``kafka-diode gaps``: the open gaps per source (topic, partition), read from the gap topic.

Reads the gap topic from the beginning to its end with ``read_committed`` (the dedup writes it in
transactions), keeps the latest record per key (what compaction would keep) and lists those
whose state is ``open``. A record that does not parse is counted and skipped, never fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from common.errors import ConfigError, DiodeError
from common.gap_record import latest_gaps
from dedup.config import PASS_THROUGH, tool_config
from runtime.named_files import check_files, table_variable

READ_TIMEOUT_S = 60.0


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="List open gaps from the gap topic (latest state per gap key).",
        epilog=(
            "environment: BOOTSTRAP_SERVERS, GAP_TOPIC (default kafka-diode.gaps), "
            "KAFKA_CONF_<NAME> (librdkafka properties)"
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--bootstrap-servers", dest="bootstrap_servers", default=None)
    parser.add_argument("--gap-topic", dest="gap_topic", default=None)
    parser.add_argument("--topic", default=None, help="only this source topic")
    parser.add_argument("--json", action="store_true", help="one JSON array instead of a table")
    parser.add_argument(
        "--timeout", type=float, default=READ_TIMEOUT_S, help="seconds to read the topic"
    )
    return parser


def read_open_gaps(
    bootstrap: str, gap_topic: str, kafka_conf: Mapping[str, str], timeout: float
) -> tuple[list[dict[str, Any]], int]:
    """``(open gaps sorted by topic, partition, first; count of unreadable records)``.

    Raises:
        DiodeError: the client refused ``kafka_conf``, the broker does not answer, the topic is
            missing, or its end is not reached within ``timeout`` seconds.
    """
    from runtime import kafka  # noqa: PLC0415  loads confluent_kafka only when reading

    conf = {"bootstrap.servers": bootstrap, **kafka_conf}
    scan = latest_gaps(kafka.read_to_end(conf, gap_topic, timeout=timeout, purpose="gaps"))
    gaps = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "first": r.first,
            "last": r.last,
            "count": r.count,
            "detected_at": r.detected_at,
            "reported_at": r.reported_at,
        }
        for r in scan.open_reports
    ]
    gaps.sort(key=lambda g: (g["topic"], g["partition"], g["first"]))
    return gaps, scan.malformed


def main(argv: Sequence[str], prog: str = "kafka-diode gaps") -> int:
    """Print the open gaps; exit 0 (also when there are none), 1 on a Kafka error."""
    args = _parser(prog).parse_args(list(argv))
    try:
        config = tool_config(os.environ, args)
        check_files(config, key=table_variable(PASS_THROUGH))
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    gap_topic = config.gap_topic
    try:
        gaps, bad = read_open_gaps(
            config.bootstrap_servers, gap_topic, config.kafka_conf, args.timeout
        )
    except DiodeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    if args.topic:
        gaps = [g for g in gaps if g["topic"] == args.topic]
    if args.json:
        print(json.dumps(gaps))
    else:
        _table(gaps)
    if bad:
        print(f"{prog}: {bad} unreadable record(s) in {gap_topic} skipped", file=sys.stderr)
    return 0


def _table(gaps: list[dict[str, Any]]) -> None:
    if not gaps:
        print("no open gaps")
        return
    print(f"{'topic':<30} {'partition':>9} {'first':>14} {'last':>14} {'count':>10}  detected")
    for g in gaps:
        detected = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(g["detected_at"] / 1000))
        print(
            f"{g['topic']:<30} {g['partition']:>9} {g['first']:>14} {g['last']:>14} "
            f"{g['count']:>10}  {detected}Z"
        )
    total = sum(g["count"] for g in gaps)
    print(f"{len(gaps)} open gap(s), {total} offset(s) missing")
