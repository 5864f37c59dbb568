"""Check the promise (docs/design.md, first paragraph) record by record, from the topics alone.

Reads the upstream topics, the clean topic(s) and the gap topic and sorts every upstream record into
exactly one bucket:

- ``exactly_once``: in its clean topic once, byte-identical (key, value, headers, timestamp) and in
  the right partition;
- ``duplicated``: in the clean topic more often than upstream holds it (a broken promise; a
  record a producer's retry wrote twice upstream is two records);
- ``missing_reported``: not in the clean topic, but inside an open gap (the promise kept: the
  operator knows and a resend can fix it);
- ``missing_silent``: not in the clean topic and in no open gap (a broken promise);
- ``wrong_partition``: present but in another partition than the rule says.

and also counts ``false_gap_offsets``: offsets an open gap reports missing although the record is in
the clean topic. The verdict never comes from a component's own counters. Clean and gap topics are
read with ``isolation.level=read_committed`` because the dedup writes them in transactions.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from runtime import kafka

Identity = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


@dataclass(frozen=True, slots=True)
class Message:
    """One record read back from a topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@dataclass(kw_only=True)
class Verdict:
    """The outcome of a verification; ``ok`` when the promise holds with nothing missing."""

    produced: int = 0
    exactly_once: int = 0
    duplicated: int = 0
    missing_reported: int = 0
    missing_silent: int = 0
    wrong_partition: int = 0
    false_gap_offsets: int = 0
    open_gaps: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def promise_kept(self) -> bool:
        """Nothing lost silently, nothing duplicated, nothing misplaced, no false alarms."""
        return not (
            self.duplicated or self.missing_silent or self.wrong_partition or self.false_gap_offsets
        )

    @property
    def ok(self) -> bool:
        """Every record delivered exactly once and no gap open."""
        return self.promise_kept and self.exactly_once == self.produced and self.open_gaps == 0

    def line(self) -> str:
        """The one-line verdict, in the form the demo prints."""
        head = f"{self.exactly_once}/{self.produced} records delivered exactly once; "
        head += f"{self.open_gaps} open gaps"
        if self.ok:
            return head
        problems = []
        if self.missing_reported:
            problems.append(f"{self.missing_reported} missing and reported in gaps")
        if self.missing_silent:
            problems.append(f"{self.missing_silent} MISSING WITHOUT A GAP REPORT")
        if self.duplicated:
            problems.append(f"{self.duplicated} DUPLICATED in the clean topic")
        if self.wrong_partition:
            problems.append(f"{self.wrong_partition} in the wrong clean partition")
        if self.false_gap_offsets:
            problems.append(f"{self.false_gap_offsets} offsets in gaps although delivered")
        return head + " — " + "; ".join(problems)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly figures."""
        return {
            "produced": self.produced,
            "exactly_once": self.exactly_once,
            "duplicated": self.duplicated,
            "missing_reported": self.missing_reported,
            "missing_silent": self.missing_silent,
            "wrong_partition": self.wrong_partition,
            "false_gap_offsets": self.false_gap_offsets,
            "open_gaps": self.open_gaps,
            "promise_kept": self.promise_kept,
            "ok": self.ok,
        }


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    committed_only: bool = False,
    timeout: float = 60.0,
    conf: Mapping[str, str] | None = None,
) -> list[Message]:
    """Read every record of ``topic`` from the beginning to its current end; ``conf``: client
    properties such as security."""
    consumer = kafka.consumer(
        {
            **(conf or {}),
            "bootstrap.servers": bootstrap,
            "group.id": f"kafka-diode-verify-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
            "auto.offset.reset": "earliest",
            "log_level": 4,  # no informational librdkafka lines on a demo's terminal
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]
        pending = set()
        for tp in parts:
            low, high = _watermarks(consumer, tp, time.monotonic() + timeout)
            if high > low:
                pending.add(tp.partition)
        consumer.assign(parts)
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic}: partitions {sorted(pending)} did not reach end"
                )
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {err}")
                ts_type, ts = msg.timestamp()
                del ts_type
                out.append(
                    Message(
                        topic=topic,
                        partition=msg.partition() or 0,
                        offset=msg.offset() or 0,
                        key=_as_bytes(msg.key()),
                        value=_as_bytes(msg.value()),
                        headers=_headers(msg.headers()),
                        timestamp=ts,
                    )
                )
        return out
    finally:
        consumer.close()


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _headers(
    raw: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
) -> tuple[tuple[str, bytes | None], ...]:
    if not raw:
        return ()
    items = raw.items() if isinstance(raw, dict) else raw
    return tuple((str(k), _as_bytes(v)) for k, v in items)


def latest_gaps(messages: Iterable[Message]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """Open gaps per source partition: the latest JSON state per gap key, kept if ``open``."""
    latest: dict[bytes, bytes | None] = {}
    for msg in messages:
        if msg.key is not None:
            latest[msg.key] = msg.value
    gaps: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for value in latest.values():
        if value is None:
            continue
        doc = json.loads(value)
        if doc.get("state") == "open":
            gaps.setdefault((doc["topic"], int(doc["partition"])), []).append(
                (int(doc["first"]), int(doc["last"]))
            )
    return gaps


def clean_topic_for(template: str, source_topic: str) -> str:
    """The clean topic a source topic's records go to (``CLEAN_TOPIC`` may hold ``{topic}``)."""
    return template.replace("{topic}", source_topic)


def verify(
    *,
    upstream: str,
    downstream: str,
    source_topics: Iterable[str],
    clean_template: str,
    gap_topic: str,
    timeout: float = 60.0,
    upstream_conf: Mapping[str, str] | None = None,
    downstream_conf: Mapping[str, str] | None = None,
) -> Verdict:
    """Compare upstream with the clean and gap topics; see the module docstring."""
    verdict = Verdict()
    sources = list(source_topics)
    clean_by_topic: dict[str, list[Message]] = {}
    for source in sources:
        name = clean_topic_for(clean_template, source)
        if name not in clean_by_topic:
            clean_by_topic[name] = read_topic(
                downstream, name, committed_only=True, timeout=timeout, conf=downstream_conf
            )
    gaps = latest_gaps(
        read_topic(
            downstream, gap_topic, committed_only=True, timeout=timeout, conf=downstream_conf
        )
    )
    verdict.open_gaps = sum(len(v) for v in gaps.values())

    delivered_offsets: set[tuple[str, int, int]] = set()
    for source in sources:
        name = clean_topic_for(clean_template, source)
        clean = clean_by_topic[name]
        n_parts = _partition_count(downstream, name, downstream_conf) or (
            1 + max((m.partition for m in clean), default=0)
        )
        upstream_records = read_topic(upstream, source, timeout=timeout, conf=upstream_conf)
        delivered_offsets |= sort_records(verdict, upstream_records, clean, n_parts, gaps)
    for (topic, partition), ranges in gaps.items():
        for first, last in ranges:
            for offset in range(first, last + 1):
                if (topic, partition, offset) in delivered_offsets:
                    verdict.false_gap_offsets += 1
    return verdict


def _identity(m: Message) -> Identity:
    return (m.key, m.value, m.headers, m.timestamp)


def sort_records(
    verdict: Verdict,
    upstream: list[Message],
    clean: list[Message],
    clean_partitions: int,
    gaps: Mapping[tuple[str, int], list[tuple[int, int]]],
) -> set[tuple[str, int, int]]:
    """Sort one source topic's upstream records into the verdict's buckets against its clean
    topic (which may hold other sources' records too); returns the delivered offsets.

    Records are matched by content. A producer may write one record twice upstream (a retry
    across a leader change, even idempotent: seen in a rolling restart), at two offsets, each
    of which the link carries once: an identity is delivered exactly once as often as upstream
    holds it, duplicated if the clean topic holds it more often, and its later offsets missing if
    less often.
    """
    in_clean = Counter(_identity(m) for m in clean)
    clean_where: dict[Identity, set[int]] = {}
    for m in clean:
        clean_where.setdefault(_identity(m), set()).add(m.partition)
    upstream_count = Counter(_identity(rec) for rec in upstream)
    upstream_where: dict[Identity, set[int]] = {}
    for rec in upstream:
        upstream_where.setdefault(_identity(rec), set()).add(rec.partition % clean_partitions)
    matched: Counter[Identity] = Counter()
    delivered: set[tuple[str, int, int]] = set()
    for rec in upstream:
        verdict.produced += 1
        ident = _identity(rec)
        seen, expected = in_clean[ident], upstream_count[ident]
        if seen > expected:
            verdict.duplicated += 1
            delivered.add((rec.topic, rec.partition, rec.offset))
            _example(verdict, f"{rec.topic}:{rec.partition}:{rec.offset} delivered {seen} times")
        elif matched[ident] < seen:
            matched[ident] += 1
            if not clean_where[ident] <= upstream_where[ident]:
                verdict.wrong_partition += 1
                _example(verdict, f"{rec.topic}:{rec.partition}:{rec.offset} in wrong partition")
            else:
                verdict.exactly_once += 1
            delivered.add((rec.topic, rec.partition, rec.offset))
        elif _in_gaps(gaps.get((rec.topic, rec.partition), []), rec.offset):
            verdict.missing_reported += 1
        else:
            verdict.missing_silent += 1
            _example(verdict, f"{rec.topic}:{rec.partition}:{rec.offset} missing, no gap")
    return delivered


def _in_gaps(ranges: list[tuple[int, int]], offset: int) -> bool:
    return any(first <= offset <= last for first, last in ranges)


def _example(verdict: Verdict, text: str) -> None:
    if len(verdict.examples) < 20:
        verdict.examples.append(text)


#: Answers while a partition's leader changes: asked again. ``_DESTROY_BROKER``: the request
#: was queued on the handle of a node that is down when librdkafka's metadata dropped that node.
_LEADERSHIP_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
    }
)


def _watermarks(consumer: Any, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """``(low, high)`` of ``tp``, asked again while its leadership moves (a broker of a cluster
    restarted a moment ago answers ``NOT_LEADER_FOR_PARTITION`` to stale metadata)."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            moving = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _LEADERSHIP_MOVING
            )
            if not moving or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # poll interval of a retry under a deadline


def _partition_count(
    bootstrap: str, topic: str, conf: Mapping[str, str] | None = None
) -> int | None:
    consumer = kafka.consumer(
        {
            **(conf or {}),
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-diode-verify-meta",
            "log_level": 4,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return len(meta.partitions)
    finally:
        consumer.close()
