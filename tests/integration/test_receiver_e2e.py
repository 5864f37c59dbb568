"""End to end with the real sender: upstream broker -> sender -> UDP -> receiver -> raw topic."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from common.topic_limits import ANY_TIMESTAMP
from tests.integration.receiver_process import ROOT, ReceiverProcess, write_key_file
from tests.kafka_helpers import Record, consume_all, produce_records, wait_until

pytestmark = pytest.mark.kafka

PROVENANCE = ["diode.key", "diode.timestamp", "diode.timestamp-type", "diode.session"]


def test_sender_to_raw_topic(upstream_kafka, downstream_kafka, kafka_topic, group_id, tmp_path):
    # Source timestamps from a clock far off the downstream broker's: 2 h ahead (Kafka 4 refuses
    # CreateTime over an hour ahead by default, and the raw topic has the defaults), 30 days and
    # ~3 years behind. The upstream topic takes any timestamp; the raw topic must not care.
    source = kafka_topic(upstream_kafka, partitions=3, config=ANY_TIMESTAMP)
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    now = int(time.time() * 1000)
    skewed = (now + 2 * 3_600_000, now - 30 * 86_400_000, 1_700_000_000_000)
    records = [
        Record(
            key=None if i % 9 == 0 else f"key-{i}".encode(),
            value=None if i % 17 == 0 else os.urandom(5) + b"x" * (i % 250),
            headers=(("trace", f"{i}".encode()), ("diode.key", b"spoof")) if i % 4 == 0 else (),
            partition=i % 3,
            timestamp=skewed[i % 3] + i,
        )
        for i in range(900)
    ]
    positions = produce_records(upstream_kafka, source, records)
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    with ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file) as rx:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIODE_SENDER_")}
        env["PYTHONPATH"] = str(ROOT)
        sender_log = (tmp_path / "sender.log").open("wb")
        sender = subprocess.Popen(
            [
                sys.executable, "-m", "sender",
                "--bootstrap-servers", upstream_kafka.bootstrap,
                "--target", f"127.0.0.1:{rx.port}",
                "--topics", source,
                "--group-id", group_id,
                "--start-position", "earliest",
                "--key-file", str(key_file),
                "--heartbeat-interval", "1",
            ],
            stdout=subprocess.DEVNULL, stderr=sender_log, env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            wait_until(lambda: rx.metric("records_total") >= 900, 120, message="records read")
            wait_until(lambda: rx.metric("heartbeats_total") >= 2, 60, message="heartbeats")
            wait_until(lambda: rx.metric("delivered_records_total") >= 903, 60, message="written")
        finally:
            sender.send_signal(signal.SIGTERM)
            sender.wait(60)
            sender_log.close()
        assert rx.drops() == {}
        assert rx.metric("delivery_errors_total") == 0
        assert rx.terminate() == 0
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60, expand_runs=True)
    data = {}
    highs: dict[int, int] = {}
    for r in consumed:
        if r.headers and r.headers[-1][0] == "diode.control":
            assert r.headers == (("diode.control", b"heartbeat"),)
            topic, partition, high = r.key.decode().rsplit(":", 2)
            assert topic == source
            assert r.partition == int(partition) % 2
            highs[int(partition)] = max(highs.get(int(partition), -1), int(high))
        else:
            data[r.key.decode()] = r
    assert len(data) == 900
    for record, (partition, offset) in zip(records, positions, strict=True):
        raw = data[f"{source}:{partition}:{offset}"]
        assert raw.value == record.value
        assert raw.partition == partition % 2
        assert now - 60_000 <= raw.timestamp <= time.time() * 1000  # the receiver's clock
        n = len(record.headers)
        assert raw.headers[:n] == tuple(record.headers)
        assert [name for name, _ in raw.headers[n:]] == PROVENANCE
        prov = dict(raw.headers[n:])
        assert prov["diode.key"] == record.key
        assert prov["diode.timestamp"] == str(record.timestamp).encode()
        assert prov["diode.timestamp-type"] == b"1"
        assert len(prov["diode.session"]) == 32
    assert highs == {p: max(o for q, o in positions if q == p) for p in range(3)}
