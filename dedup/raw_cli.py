"""``kafka-diode raw dump``: an operator's view of a raw topic, whatever its layout.

Reads raw records (docs/topics.md: v1 records, v2 runs, control records) from a raw topic and
prints one block per raw record: its position, its layout, the source partition and offsets it
carries and, with ``--records``, every source record inside it (offset, timestamp, key, value and
headers, shown as Python byte literals cut at ``--width``). What the dedup would count as
malformed is printed as such, with the reason. Reads ``read_uncommitted`` as the dedup does, never
commits, never joins a consumer group.

The decoding is :func:`describe`, pure and unit-tested; ``main`` is the thin Kafka part.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from common.errors import ConfigError, DiodeError, RemoteProtocolError
from common.gap_record import MAX_OFFSET
from common.raw_run import check_run, parse_run_key
from common.raw_topic import CONTROL_HEADER, TICK, parse_raw_key, restore
from dedup.config import PASS_THROUGH, tool_config
from runtime.named_files import check_files, table_variable

READ_TIMEOUT_S = 30.0

RawHeaders = Sequence[tuple[str, bytes | None]]


def describe(key: bytes | None, value: bytes | None, headers: RawHeaders) -> dict[str, Any]:
    """What a raw record is: ``layout`` (``v1``, ``v2``, ``control``, ``tick``, ``malformed``),
    the source ``topic``, ``partition``, ``first``/``last``/``stride`` and ``records`` (a list
    of dicts), or the ``reason`` it is malformed."""
    control = next((v for n, v in headers if n == CONTROL_HEADER), None)
    run = parse_run_key(key)
    if run is not None and control is None:
        topic, partition, first, last, stride = run
        if last > MAX_OFFSET:
            return {"layout": "malformed", "reason": "offset beyond 2^63-2", "key": _show(key, 200)}
        try:
            group = check_run(value, topic, partition, first, last, stride)
        except RemoteProtocolError as exc:
            return {"layout": "malformed", "reason": str(exc), "key": _show(key, 200)}
        records = [
            {"offset": o, "timestamp": ts, "key": k, "value": v, "headers": list(h)}
            for o, ts, k, v, h in zip(
                group.offsets, group.timestamps, group.keys, group.values, group.headers,
                strict=True,
            )
        ]  # fmt: skip
        return {
            "layout": "v2",
            "topic": topic,
            "partition": partition,
            "first": first,
            "last": last,
            "stride": stride,
            "timestamp_type": group.timestamp_type,
            "records": records,
        }
    if control == TICK:  # the direct layout's idle tick (docs/dedup.md "The direct layout")
        return {"layout": "tick"}
    parsed = parse_raw_key(key)
    if parsed is None or not 0 <= parsed[2] <= MAX_OFFSET:
        return {"layout": "malformed", "reason": "key does not parse", "key": _show(key, 200)}
    topic, partition, offset = parsed
    if control is not None:
        return {
            "layout": "control",
            "control": control.decode(errors="replace"),
            "topic": topic,
            "partition": partition,
            "first": offset,
            "value": (value or b"").decode(errors="replace"),
        }
    restored = restore(list(headers))
    if restored is None:
        return {"layout": "malformed", "reason": "provenance headers", "key": _show(key, 200)}
    source_key, timestamp, source_headers = restored
    return {
        "layout": "v1",
        "topic": topic,
        "partition": partition,
        "first": offset,
        "last": offset,
        "stride": 1,
        "records": [
            {
                "offset": offset,
                "timestamp": timestamp,
                "key": source_key,
                "value": value,
                "headers": source_headers,
            }
        ],
    }


def _show(data: bytes | None, width: int) -> str:
    if data is None:
        return "null"
    text = repr(data)
    return text if len(text) <= width else f"{text[: width - 1]}…"


def render(raw: str, described: dict[str, Any], *, records: bool, width: int) -> list[str]:
    """The text lines of one raw record (``raw``: its ``topic:partition@offset``)."""
    layout = described["layout"]
    if layout == "malformed":
        return [f"{raw}  malformed ({described['reason']}): key {described['key']}"]
    if layout == "tick":
        return [f"{raw}  tick (the dedup's, no input)"]
    where = f"{described['topic']}:{described['partition']}"
    if layout == "control":
        return [f"{raw}  control {described['control']} {where}:{described['first']} "
                f"{described['value'][:width]}"]  # fmt: skip
    span = f"{described['first']}-{described['last']}"
    if described["stride"] != 1:
        span += f"/{described['stride']}"
    lines = [f"{raw}  {layout} {where} offsets {span} ({len(described['records'])} records)"]
    if records:
        for r in described["records"]:
            headers = ", ".join(f"{n}={_show(v, width)}" for n, v in r["headers"])
            lines.append(
                f"    {r['offset']}  ts {r['timestamp']}  key {_show(r['key'], width)}  "
                f"value {_show(r['value'], width)}" + (f"  headers {headers}" if headers else "")
            )
    return lines


def _jsonable(described: dict[str, Any]) -> dict[str, Any]:
    def conv(x: Any) -> Any:
        if isinstance(x, bytes):
            return x.decode("utf-8", "backslashreplace")
        if isinstance(x, (list, tuple)):
            return [conv(i) for i in x]
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x

    return conv(described)  # type: ignore[no-any-return]


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print a raw topic's records (layout v1, v2 runs, control), decoded.",
        epilog="environment: BOOTSTRAP_SERVERS, KAFKA_CONF_<NAME> (librdkafka properties)",
        allow_abbrev=False,
    )
    parser.add_argument("action", choices=("dump",), help="dump: print raw records")
    parser.add_argument("--bootstrap-servers", dest="bootstrap_servers", default=None)
    parser.add_argument("--topic", required=True, help="the raw topic")
    parser.add_argument("--partition", type=int, default=None, help="only this raw partition")
    parser.add_argument("--from-offset", type=int, default=0, help="first raw offset to read")
    parser.add_argument("--limit", type=int, default=100, help="raw records at most (default 100)")
    parser.add_argument("--records", action="store_true", help="also every source record inside")
    parser.add_argument("--width", type=int, default=60, help="characters per shown value")
    parser.add_argument("--json", action="store_true", help="one JSON object per raw record")
    parser.add_argument("--timeout", type=float, default=READ_TIMEOUT_S)
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode raw") -> int:
    """Dump raw records; exit 0, 1 on a Kafka error, 2 on bad settings."""
    args = _parser(prog).parse_args(list(argv))
    try:
        config = tool_config(os.environ, {"bootstrap_servers": args.bootstrap_servers})
        check_files(config, key=table_variable(PASS_THROUGH))
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.limit < 1 or args.width < 8:
        print(f"{prog}: --limit must be >= 1 and --width >= 8", file=sys.stderr)
        return 2
    from confluent_kafka import KafkaError, KafkaException, TopicPartition  # noqa: PLC0415

    from runtime import kafka  # noqa: PLC0415  loads confluent_kafka only when reading

    conf = {
        "bootstrap.servers": config.bootstrap_servers,
        "group.id": f"kafka-diode-raw-dump-{uuid.uuid4().hex}",  # never committed
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        **config.kafka_conf,
    }
    try:
        client = kafka.consumer(conf)
    except DiodeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            meta = client.list_topics(args.topic, timeout=args.timeout).topics.get(args.topic)
        except KafkaException as exc:
            print(f"{prog}: Kafka did not answer: {exc}", file=sys.stderr)
            return 1
        if meta is None or meta.error is not None or not meta.partitions:
            print(f"{prog}: topic {args.topic!r} does not exist", file=sys.stderr)
            return 1
        parts = sorted(meta.partitions) if args.partition is None else [args.partition]
        client.assign([TopicPartition(args.topic, p, args.from_offset) for p in parts])
        pending, shown = set(parts), 0
        deadline = time.monotonic() + args.timeout
        while pending and shown < args.limit and time.monotonic() < deadline:
            msg = client.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition() or 0)
                    continue
                print(f"{prog}: {err}", file=sys.stderr)
                return 1
            raw = f"{args.topic}:{msg.partition()}@{msg.offset()}"
            headers = cast("RawHeaders", msg.headers() or ())
            described = describe(msg.key(), msg.value(), headers)
            if args.json:
                print(json.dumps({"raw": raw, **_jsonable(described)}))
            else:
                print("\n".join(render(raw, described, records=args.records, width=args.width)))
            shown += 1
    finally:
        client.close()
    return 0
