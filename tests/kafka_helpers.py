"""Helpers for tests against the real local brokers (see tests/conftest.py for the fixtures).

Everything waits on a condition with a deadline; nothing sleeps to synchronise. ``bootstrap``
arguments accept a ``host:port`` string or anything with a ``.bootstrap`` attribute (a fixture's
broker), so ``consume_all(upstream_kafka, topic)`` and ``consume_all("127.0.0.1:9092", topic)``
both work.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from common.raw_run import SESSION_HEADER, RunBuilder, expand_run
from common.raw_topic import CONTROL_HEADER
from kafka_diode.local_kafka.broker import LocalBroker, broker_by_name, free_port, list_brokers

T = TypeVar("T")

Headers = Sequence[tuple[str, bytes | None]]


class HasBootstrap(Protocol):
    """Anything with a ``bootstrap`` address (``LocalBroker``, the session fixtures)."""

    @property
    def bootstrap(self) -> str: ...


Bootstrap = str | HasBootstrap


@dataclass(frozen=True, slots=True)
class Record:
    """A record to produce; ``partition``/``timestamp`` None lets the client choose."""

    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    partition: int | None = None
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """A record read back, with everything a test may assert on."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())
    timestamp: int = 0
    """Milliseconds since the epoch."""
    timestamp_type: int = 0
    """confluent_kafka's TIMESTAMP_CREATE_TIME (1) or TIMESTAMP_LOG_APPEND_TIME (2)."""


def bootstrap_of(target: Bootstrap) -> str:
    """``host:port`` of a broker object or a bootstrap string."""
    return target if isinstance(target, str) else target.bootstrap


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.1,
    message: str = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy and return that; TimeoutError after
    ``timeout`` seconds (the message names ``message`` and the last falsy result)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} not met within {timeout:.1f} s (last: {result!r})")
        time.sleep(interval)  # polling a condition under a deadline


def random_name(prefix: str = "t") -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    target: Bootstrap,
    name: str | None = None,
    partitions: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> str:
    """Create a topic (random name unless given) and wait until every partition has a leader."""
    bootstrap = bootstrap_of(target)
    topic = name or random_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, partitions, 1, config=config or {})], request_timeout=timeout
    )
    try:
        futures[topic].result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise

    def ready() -> bool:
        meta = admin.list_topics(topic, timeout=5.0).topics.get(topic)
        if meta is None or meta.error is not None or len(meta.partitions) != partitions:
            return False
        return all(p.leader >= 0 and p.error is None for p in meta.partitions.values())

    wait_until(ready, timeout, 0.1, f"topic {topic} ready")
    return topic


def produce_records(
    target: Bootstrap,
    topic: str,
    records: Iterable[Record | tuple[bytes | None, bytes | None] | bytes],
    *,
    timeout: float = 60.0,
    config: dict[str, Any] | None = None,
) -> list[tuple[int, int]]:
    """Produce ``records`` (``Record``, ``(key, value)`` or a bare value) with acks=all.

    Returns:
        ``(partition, offset)`` of every record, in the order given.

    Raises:
        RuntimeError: a delivery failed or did not complete within ``timeout``.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_of(target),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            **(config or {}),
        }
    )
    results: list[tuple[int, int] | None] = []
    errors: list[str] = []

    def delivery(index: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"record {index}: {err}")
            else:
                results[index] = (msg.partition(), msg.offset())

        return on_delivery

    for index, item in enumerate(records):
        record = _as_record(item)
        results.append(None)
        kwargs: dict[str, Any] = {"key": record.key, "value": record.value}
        if record.headers:
            kwargs["headers"] = list(record.headers)
        if record.partition is not None:
            kwargs["partition"] = record.partition
        if record.timestamp is not None:
            kwargs["timestamp"] = record.timestamp
        while True:
            try:
                producer.produce(topic, on_delivery=delivery(index), **kwargs)
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: serve deliveries, then retry
    remaining = producer.flush(timeout)
    if errors or remaining:
        raise RuntimeError(f"produce to {topic}: {remaining} undelivered; {errors[:5]}")
    return [r for r in results if r is not None]


def _as_record(item: Record | tuple[bytes | None, bytes | None] | bytes) -> Record:
    if isinstance(item, Record):
        return item
    if isinstance(item, tuple):
        return Record(key=item[0], value=item[1])
    return Record(key=None, value=item)


def expand_run_record(record: ConsumedRecord) -> list[ConsumedRecord]:
    """The v1 records a raw-layout-v2 run stands for (``common.raw_run.expand_run``), each with
    the run's topic, partition, offset and timestamp; any other record (v1, control) unchanged.

    Raises:
        RemoteProtocolError: a run key whose value does not match it.
    """
    is_control = any(name == CONTROL_HEADER for name, _ in record.headers)
    expanded = None if is_control else expand_run(record.key, record.value, record.headers)
    if expanded is None:
        return [record]
    return [
        dataclasses.replace(record, key=key.encode("ascii"), value=value, headers=tuple(headers))
        for key, value, headers in expanded
    ]


def expand_runs(records: Iterable[ConsumedRecord]) -> list[ConsumedRecord]:
    """Every run of ``records`` replaced by the v1 records it stands for (``expand_run_record``)."""
    return [one for record in records for one in expand_run_record(record)]


#: Errors of a partition whose topic was created a moment ago (its leader not elected yet).
_LEADERLESS = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


def _high_watermark(consumer: Consumer, topic: str, partition: int, deadline: float) -> int:
    """The partition's high watermark; retried until ``deadline`` while it has no leader (a
    clean topic the dedup creates is listed before its leader is elected)."""
    while True:
        try:
            return int(
                consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10.0)[1]
            )
        except KafkaException as exc:
            if exc.args[0].code() not in _LEADERLESS or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)  # polling the leader election under a deadline


def wait_committed(target: Bootstrap, topic: str, timeout: float = 30.0) -> None:
    """Wait until no transaction is open in any partition of ``topic``: its last stable offsets
    reach its high watermarks. ``commit_transaction`` returns before the coordinator has written
    the commit markers into every partition, and a ``read_committed`` reader stops short of them
    until then; with no writer left, this is the moment every commit is visible."""
    bootstrap = bootstrap_of(target)
    ends = {
        level: Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": random_name("ends"),
                "isolation.level": level,
            }
        )
        for level in ("read_committed", "read_uncommitted")
    }
    try:
        meta = ends["read_committed"].list_topics(topic, timeout=10.0).topics[topic]
        where = [TopicPartition(topic, p) for p in sorted(meta.partitions)]

        def settled() -> bool:
            return all(
                ends["read_committed"].get_watermark_offsets(tp, timeout=10.0)[1]
                == ends["read_uncommitted"].get_watermark_offsets(tp, timeout=10.0)[1]
                for tp in where
            )

        wait_until(settled, timeout, message=f"no open transaction in {topic}")
    finally:
        for consumer in ends.values():
            consumer.close()


def consume_all(
    target: Bootstrap,
    topic: str,
    expected_count: int | None = None,
    timeout: float = 30.0,
    *,
    isolation_level: str = "read_committed",
    config: dict[str, Any] | None = None,
    expand_runs: bool = False,
) -> list[ConsumedRecord]:
    """Read ``topic`` from the beginning of every partition, without a consumer group.

    Stops when ``expected_count`` records were read, or (with no count) when every partition
    reached its end or what it held when the read began; returns what was read when ``timeout``
    passes first, so the caller's assertion shows what is missing. Records are in per-partition
    offset order. With ``expand_runs`` (a raw topic the receiver wrote), every v2 run is replaced
    by the v1 records it stands for (:func:`expand_runs`), and those are what ``expected_count``
    counts.
    """
    bootstrap = bootstrap_of(target)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": random_name("consume-all"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation_level,
            **(config or {}),
        }
    )
    out: list[ConsumedRecord] = []
    try:
        meta = consumer.list_topics(topic, timeout=10.0).topics[topic]
        if meta.error is not None:
            raise RuntimeError(f"topic {topic}: {meta.error}")
        partitions = sorted(meta.partitions)
        # What the topic held when the read began: a partition is read once its last record
        # reached this, even if a live writer (heartbeats) never lets an end-of-partition event
        # find both partitions at their ends at once.
        high = {p: _high_watermark(consumer, topic, p, time.monotonic() + 10.0) for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if expected_count is not None and len(out) >= expected_count:
                break
            if expected_count is None and at_end.issuperset(partitions):
                break
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        continue
                    raise RuntimeError(f"consume {topic}: {err}")
                if msg.offset() + 1 >= high[msg.partition()]:
                    at_end.add(msg.partition())
                else:
                    at_end.discard(msg.partition())
                ts_type, ts = msg.timestamp()
                record = ConsumedRecord(
                    topic=msg.topic(),
                    partition=msg.partition(),
                    offset=msg.offset(),
                    key=msg.key(),
                    value=msg.value(),
                    headers=tuple(msg.headers() or ()),
                    timestamp=ts,
                    timestamp_type=ts_type,
                )
                if expand_runs:
                    out.extend(expand_run_record(record))
                else:
                    out.append(record)
    finally:
        consumer.close()
    return out


# -- brokers for the session fixtures --------------------------------------------------------------

_TEST_PREFIX = "pytest"
_started: list[LocalBroker] = []


def start_test_broker(role: str, data_dir: Path, partitions: int = 3) -> LocalBroker:
    """Start broker ``pytest-<pid>-<role>`` on a free port; stopped at exit at the latest."""
    reap_orphan_test_brokers()
    last: Exception | None = None
    for _ in range(3):  # a free port can be taken between choosing it and the JVM binding it
        broker = LocalBroker(
            f"{_TEST_PREFIX}-{os.getpid()}-{role}",
            free_port(),
            data_dir=data_dir,
            partitions=partitions,
        )
        _started.append(broker)
        try:
            broker.start()
            keep_old_records(broker.bootstrap)
            return broker
        except Exception as exc:
            broker.stop()
            last = exc
    assert last is not None
    raise last


def keep_old_records(bootstrap: str) -> None:
    """No deletion by age on a test broker (each node's dynamic ``log.retention.ms`` -1). Tests
    write records with fixed timestamps years old, and the broker's retention check (30 s after
    its start, then every 5 minutes) deletes a segment whose records are all older than its 7
    days, the active one included, under a test that reads them back."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("log.retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)
    nodes = admin.list_topics(timeout=30).brokers
    resources = [
        ConfigResource(ConfigResource.Type.BROKER, str(node), incremental_configs=[entry])
        for node in nodes
    ]
    for future in admin.incremental_alter_configs(resources).values():
        future.result(30)


def stop_test_brokers() -> None:
    """Stop every broker this process started (idempotent; also runs at interpreter exit)."""
    while _started:
        _started.pop().stop()


def reap_orphan_test_brokers() -> None:
    """Stop test brokers left behind by a test process that died without its teardown."""
    for row in list_brokers():
        parts = row.name.split("-", 2)
        if len(parts) != 3 or parts[0] != _TEST_PREFIX or not parts[1].isdigit():
            continue
        owner = int(parts[1])
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            orphan = broker_by_name(row.name)
            if orphan is not None:
                orphan.stop()


atexit.register(stop_test_brokers)


def raw_run_record(
    topic: str, partition: int, first: int, last: int, session: bytes = bytes(range(16))
) -> Record:
    """A run of source offsets ``first..last`` as the receiver writes it (common/raw_run.py), for
    raw partition 0; each record's value is its source offset, its key ``k<offset>``."""
    ts = int(time.time() * 1000) - 3_600_000
    run = RunBuilder(topic, partition, 1, first, ts)
    for offset in range(first, last + 1):
        run.append(offset, ts + offset, b"k%d" % offset, b"%d" % offset, ())
    return Record(
        key=run.key().encode(),
        value=run.encode(),
        headers=((SESSION_HEADER, session.hex().encode()),),
        partition=0,
    )
