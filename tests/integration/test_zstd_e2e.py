"""zstd end to end: a real sender with --compression zstd, a receiver with no setting for it."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.integration.receiver_process import ReceiverProcess, start_sender, write_key_file
from tests.kafka_helpers import Record, consume_all, produce_records, wait_until

pytestmark = pytest.mark.kafka


def test_zstd_sender_to_raw_topic(
    upstream_kafka: Any, downstream_kafka: Any, kafka_topic: Any, group_id: str, tmp_path: Any
) -> None:
    source = kafka_topic(upstream_kafka, partitions=2)
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    # log-like values: compressible, and each different
    records = [
        Record(
            key=f"host-{i % 7}".encode(),
            value=(
                f'{{"ts": {1_700_000_000 + i}, "level": "INFO", "host": "host-{i % 7}", '
                f'"msg": "request {i} served in {i % 97} ms", "path": "/api/v1/items/{i}"}}'
            ).encode()
            * 4,
            partition=i % 2,
        )
        for i in range(600)
    ]
    positions = produce_records(upstream_kafka, source, records)
    value_bytes = sum(len(r.value or b"") for r in records)
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    with ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file) as rx:
        sender = start_sender(
            upstream_kafka.bootstrap, rx.port, source, group_id, key_file,
            tmp_path / "sender.log",
            "--compression", "zstd", "--compression-level", "3", "--rate-bytes", "20000000",
        )  # fmt: skip
        try:
            wait_until(lambda: rx.metric("records_total") >= 600, 120, message="records read")
            wait_until(lambda: rx.metric("delivered_records_total") >= 600, 60, message="written")
        finally:
            sender.send_signal(signal.SIGTERM)
            sender.wait(60)
        assert rx.drops() == {}
        # the link carried compressed payloads: far fewer bytes than the values alone
        assert rx.metric("bytes_total") < value_bytes / 3
        assert rx.terminate() == 0
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60, expand_runs=True)
    data = {
        r.key.decode(): r for r in consumed if not r.headers or r.headers[-1][0] != "diode.control"
    }
    assert len(data) == 600
    for record, (partition, offset) in zip(records, positions, strict=True):
        assert data[f"{source}:{partition}:{offset}"].value == record.value
