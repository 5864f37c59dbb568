"""The dedup's log-start probe against a real broker: retention deletes ahead of the dedup."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from prometheus_client import generate_latest

from common.metrics import CollectorRegistry
from dedup.raw_position import RawPositionMetrics, kafka_watermarks
from tests.kafka_helpers import create_topic, produce_records

pytestmark = pytest.mark.kafka


def _progress(topic: str, end: int, latest: int) -> dict[str, Any]:
    return {
        "id": "q",
        "sources": [
            {
                "endOffset": json.dumps({topic: {"0": end}}),
                "latestOffset": json.dumps({topic: {"0": latest}}),
            }
        ],
    }


def test_records_deleted_before_the_dedup_read_them_are_counted_once(
    downstream_kafka: Any,
) -> None:
    topic = create_topic(downstream_kafka, partitions=1)
    produce_records(downstream_kafka, topic, [b"v%d" % i for i in range(100)])
    watermarks, close = kafka_watermarks(
        {"bootstrap.servers": downstream_kafka.bootstrap, "group.id": "probe"}
    )
    registry = CollectorRegistry()
    now = [0.0]
    metrics = RawPositionMetrics(
        registry, [topic], watermarks, clock=lambda: now[0], probe_interval=1.0, close=close
    )
    try:
        metrics.observe_progress(_progress(topic, 40, 100))
        text = generate_latest(registry).decode()
        labels = f'{{partition="0",topic="{topic}"}}'
        assert f"kafka_diode_dedup_raw_log_start_offset{labels} 0.0" in text
        assert f"kafka_diode_dedup_raw_records_expired_unread_total{labels} 0.0" in text

        # retention removes offsets 0..59 while the dedup stands at 40
        admin = AdminClient({"bootstrap.servers": downstream_kafka.bootstrap})
        futures = admin.delete_records([TopicPartition(topic, 0, 60)], request_timeout=30)
        for future in futures.values():
            future.result(timeout=30)
        now[0] = 1.0
        metrics.observe_progress(_progress(topic, 40, 100))
        now[0] = 2.0
        metrics.observe_progress(_progress(topic, 40, 100))  # the same loss, probed again
        text = generate_latest(registry).decode()
        assert f"kafka_diode_dedup_raw_log_start_offset{labels} 60.0" in text
        assert f"kafka_diode_dedup_raw_records_expired_unread_total{labels} 20.0" in text
        assert f"kafka_diode_dedup_raw_offsets_behind{labels} 60.0" in text
    finally:
        metrics.close()
