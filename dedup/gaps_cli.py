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

from common.errors import DiodeError
from dedup.config import PASS_THROUGH, DedupConfig

READ_TIMEOUT_S = 60.0


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="List open gaps from the gap topic (latest state per gap key).",
        epilog=(
            "environment: BOOTSTRAP_SERVERS, GAP_TOPIC (default kafka-diode.gaps), "
            "KAFKA_CONF_<NAME> (librdkafka properties)"
        ),
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
    """``(open gaps sorted by topic, partition, first; count of unreadable records)``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition  # noqa: PLC0415

    from common.gap_record import GapState, parse_gap  # noqa: PLC0415

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kafka-diode-gaps-{os.getpid()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            **kafka_conf,
        }
    )
    latest: dict[bytes, Any] = {}
    bad = 0
    try:
        meta = consumer.list_topics(gap_topic, timeout=timeout).topics.get(gap_topic)
        if meta is None or meta.error is not None:
            raise DiodeError(f"gap topic {gap_topic!r} not found on {bootstrap}")
        partitions = set(meta.partitions)
        consumer.assign([TopicPartition(gap_topic, p, OFFSET_BEGINNING) for p in partitions])
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while done != partitions:
            if time.monotonic() > deadline:
                raise DiodeError(f"reading {gap_topic!r} did not reach its end in {timeout} s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition() or 0)
                    continue
                raise DiodeError(f"reading {gap_topic!r}: {err}")
            key = msg.key()
            if key is None:
                bad += 1
                continue
            try:
                latest[key] = parse_gap(key, msg.value())
            except DiodeError:
                bad += 1
    finally:
        consumer.close()
    gaps = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "first": r.first,
            "last": r.last,
            "count": r.last - r.first + 1,
            "detected_at": r.detected_at,
            "reported_at": r.reported_at,
        }
        for r in latest.values()
        if r is not None and r.state == GapState.OPEN
    ]
    gaps.sort(key=lambda g: (g["topic"], g["partition"], g["first"]))
    return gaps, bad


def main(argv: Sequence[str], prog: str = "kafka-diode gaps") -> int:
    """Print the open gaps; exit 0 (also when there are none), 1 on a Kafka error."""
    args = _parser(prog).parse_args(list(argv))
    env = os.environ
    bootstrap = args.bootstrap_servers or env.get("BOOTSTRAP_SERVERS", "")
    if not bootstrap:
        print(f"{prog}: BOOTSTRAP_SERVERS is required (or --bootstrap-servers)", file=sys.stderr)
        return 2
    gap_topic = args.gap_topic or env.get("GAP_TOPIC") or DedupConfig.gap_topic
    prefix = PASS_THROUGH["kafka_conf"]
    conf = {
        k[len(prefix) :].lower().replace("_", "."): v
        for k, v in env.items()
        if k.startswith(prefix)
    }
    try:
        gaps, bad = read_open_gaps(bootstrap, gap_topic, conf, args.timeout)
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
