"""The write producers' defaults: their linger and their connections (dedup/fence.py, docs/dedup.md
"The writer's linger", "A task's fixed cost")."""

from __future__ import annotations

import pytest

from dedup.fence import WRITE_LINGER_MS, _write_linger_ms, writer_conf
from dedup.writer_settings import WriterSettings


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
