"""KafkaSource's topic selection (names, ``^regex``, exclude, internal topics), no broker."""

from __future__ import annotations

import asyncio

import pytest

from common import settings
from common.errors import ConfigError
from sender.config import SenderConfig
from sender.kafka_source import KafkaSource

BROKER_TOPICS = [
    "orders", "orders.eu", "orders.us", "audit_log", "telemetry.site-1", "__consumer_offsets",
    "__transaction_state", "_schemas", "orders-tmp",
]  # fmt: skip


def _source(**values: object) -> KafkaSource:
    config = settings.build(
        SenderConfig,
        file_values={
            "bootstrap_servers": "127.0.0.1:1",
            "target": "127.0.0.1:9",
            "insecure_cleartext": True,
            **values,
        },
    )
    loop = asyncio.new_event_loop()
    try:
        return KafkaSource(config, loop=loop)
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("topics", "exclude", "chosen"),
    [
        (["orders"], "", ("orders",)),
        (["^orders\\..*"], "", ("orders.eu", "orders.us")),
        (["^orders"], "-tmp$", ("orders", "orders.eu", "orders.us")),
        (
            ["^.*"],
            "",
            (
                "_schemas",
                "audit_log",
                "orders",
                "orders-tmp",
                "orders.eu",
                "orders.us",
                "telemetry.site-1",
            ),
        ),
        (["audit_log", "^telemetry\\."], "", ("audit_log", "telemetry.site-1")),
        (["missing"], "", ()),
    ],
)
def test_selection_from_broker_metadata(
    topics: list[str], exclude: str, chosen: tuple[str, ...]
) -> None:
    source = _source(topics=topics, exclude_topics=exclude)
    assert source._select(BROKER_TOPICS) == chosen
    assert not any(t.startswith("__") for t in source._select(BROKER_TOPICS))


def test_only_patterns_or_excludes_need_metadata() -> None:
    assert not _source(topics=["orders", "audit_log"]).needs_metadata
    assert _source(topics=["^orders"]).needs_metadata
    assert _source(topics=["orders"], exclude_topics="tmp").needs_metadata


def test_an_invalid_pattern_stops_start_up_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        _source(topics=["^orders("])
    assert info.value.key == "topics"
