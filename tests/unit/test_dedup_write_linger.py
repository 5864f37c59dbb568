"""The write producers' defaults: their linger, their batches and their connections
(dedup/fence.py, docs/dedup.md "The writer's linger", docs/dedup-internals.md "A task's fixed
cost")."""

from __future__ import annotations

import dataclasses

import pytest

from common.topic_limits import record_limit
from dedup.clean_topics import batch_bytes_within
from dedup.fence import (
    QUEUED_BATCHES,
    WRITE_BATCH_BYTES,
    WRITE_LINGER_MS,
    _write_linger_ms,
    wait_for_acks,
    writer_conf,
)
from dedup.writer_settings import LIBRDKAFKA_BATCH_BYTES, WriterSettings


def test_the_write_linger_is_long_unless_a_timeout_is_shorter() -> None:
    assert _write_linger_ms({}) == WRITE_LINGER_MS == 2_000
    assert _write_linger_ms({"security.protocol": "SSL"}) == WRITE_LINGER_MS


@pytest.mark.parametrize(
    "name", ["message.timeout.ms", "delivery.timeout.ms", "transaction.timeout.ms"]
)
def test_a_short_timeout_halves_into_the_linger(name: str) -> None:
    # librdkafka refuses linger.ms >= message.timeout.ms: "Invalid argument or configuration"
    assert _write_linger_ms({name: "3000"}) == 1_500
    assert _write_linger_ms({name: 3000}) == 1_500
    assert _write_linger_ms({name: "600000"}) == WRITE_LINGER_MS


def _settings(**conf: str) -> WriterSettings:
    return WriterSettings(
        bootstrap_servers="k:9092",
        clean_topic="clean.{topic}",
        gap_topic="gaps",
        progress_topic="progress",
        state_topic="state",
        transactional_id="txn",
        kafka_conf=conf,
    )


def test_a_write_producer_connects_to_every_broker_at_once_unless_told_otherwise() -> None:
    """docs/dedup-internals.md "A task's fixed cost": a sparse client loses its first request."""
    conf = writer_conf(_settings(), "txn-raw-0")
    assert conf["enable.sparse.connections"] is False
    assert conf["transactional.id"] == "txn-raw-0"
    assert conf["linger.ms"] == WRITE_LINGER_MS
    told = writer_conf(_settings(**{"enable.sparse.connections": "true", "linger.ms": "5"}), "t")
    assert told["enable.sparse.connections"] == "true"
    assert told["linger.ms"] == "5"


def test_a_write_producer_batches_what_the_driver_found_unless_told_otherwise() -> None:
    """docs/dedup-internals.md "A task's fixed cost": full 1 MB batches cost CPU per byte."""
    assert writer_conf(_settings(), "t")["batch.size"] == LIBRDKAFKA_BATCH_BYTES
    found = dataclasses.replace(_settings(), write_batch_bytes=WRITE_BATCH_BYTES)
    assert writer_conf(found, "t")["batch.size"] == WRITE_BATCH_BYTES
    told = dataclasses.replace(_settings(**{"batch.size": "65536"}), write_batch_bytes=1 << 23)
    assert writer_conf(told, "t")["batch.size"] == "65536"


def test_the_write_batch_is_what_every_written_topic_admits() -> None:
    ours = {"max.message.bytes": str(record_limit(16 << 20))}
    assert batch_bytes_within({"gaps": ours, "progress": ours}, 16 << 20) == WRITE_BATCH_BYTES
    # a gap topic created with the brokers' default limit
    theirs = {"max.message.bytes": "1048588"}
    assert batch_bytes_within({"gaps": theirs, "progress": ours}, 16 << 20) == 1_048_588
    # a link of small records: no batch larger than its clean topics must admit
    assert batch_bytes_within({"gaps": ours}, 1 << 20) == record_limit(1 << 20)
    # a limit that cannot be read: librdkafka's own
    assert batch_bytes_within({"gaps": {}}, 16 << 20) == LIBRDKAFKA_BATCH_BYTES


class QueueOf:
    """A producer's queue: a poll serves ``acked`` delivery reports, a flush sends everything."""

    def __init__(self, queued: int, acked: int) -> None:
        self.queued, self.acked, self.calls = queued, acked, []

    def __len__(self) -> int:
        return self.queued

    def poll(self, timeout: float) -> int:
        self.calls.append("poll")
        self.queued -= min(self.acked, self.queued)
        return self.acked

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        self.queued = 0
        return 0


@pytest.mark.parametrize(
    ("queued", "acked", "calls"),
    [
        (10, 3, []),  # at the limit: nothing to wait for
        (13, 3, ["poll"]),
        (20, 3, ["poll", "poll", "poll", "poll"]),
        (11, 0, ["poll", "flush"]),  # no report: partial batches lingering, sent at once
    ],
)
def test_a_task_holding_too_much_waits_for_acknowledgements_first(
    queued: int, acked: int, calls: list[str]
) -> None:
    """A flush first would send every batch at once and poll busily behind the 5 requests in
    flight per partition; only a poll that brings no report flushes."""
    queue = QueueOf(queued, acked)
    wait_for_acks(queue, 10)  # type: ignore[arg-type]
    assert queue.calls == calls
    assert len(queue) <= 10
    assert QUEUED_BATCHES < 5  # below the in-flight requests that make librdkafka spin
