"""The topics the dedup creates take NEW_TOPIC_PARTITIONS and NEW_TOPIC_REPLICATION from its
environment (docs/deployment.md §3), not the broker's defaults. The creation itself, on a real
three-node cluster: tests/integration/test_dedup_new_topics.py (whose cluster's default is
already three replicas, so only this test tells the setting from the default)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from common.topic_limits import created_topic_config, record_limit
from dedup import clean_topics
from dedup.config import from_sources
from dedup.runner import writer_settings
from dedup.writer_settings import WriterSettings
from runtime import kafka

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/var/lib/d"}


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[kafka.TopicSpec]:
    """The specs the dedup asks runtime.kafka to create (no broker: pure logic)."""
    specs: list[kafka.TopicSpec] = []

    def create(
        _conf: Mapping[str, Any], wanted: Iterable[kafka.TopicSpec], **_kw: Any
    ) -> kafka.EnsuredTopics:
        specs.extend(wanted)
        return kafka.EnsuredTopics(
            created=tuple(s.name for s in specs), partitions={s.name: s.partitions for s in specs}
        )

    monkeypatch.setattr(clean_topics.kafka, "create_missing_topics", create)
    return specs


@pytest.mark.parametrize(("env", "partitions", "replication"), [({}, 1, -1), (
    {"NEW_TOPIC_REPLICATION": "3", "NEW_TOPIC_PARTITIONS": "12"}, 12, 3)])  # fmt: skip
def test_created_topics_take_the_settings(
    asked: list[kafka.TopicSpec], env: dict[str, str], partitions: int, replication: int
) -> None:
    settings = writer_settings(from_sources({**BASE, **env}), WriterSettings)
    clean_topics.create_dedup_topics(settings, ["clean.orders"])
    clean_topics.create_dedup_topics(settings, ["gaps", "progress"], compact=True)
    assert [(s.name, s.partitions, s.replication) for s in asked] == [
        ("clean.orders", partitions, replication),
        ("gaps", 1, replication),
        ("progress", 1, replication),
    ]
    assert asked[0].config == created_topic_config(settings.max_record_size, any_timestamp=True)
    # the gap and progress topics admit the write producers' batches (dedup/fence.py)
    assert asked[1].config == {
        "cleanup.policy": "compact",
        "max.message.bytes": str(record_limit(settings.max_record_size)),
    }
