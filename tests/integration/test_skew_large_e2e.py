"""Skewed clocks and large records from the wire to the clean topic: real receiver process, real
brokers, real Spark (``kafka-diode dedup`` as a subprocess), nothing mocked.

Source records timestamped 2 h ahead of the downstream broker's clock (Kafka 4 refuses CreateTime
more than an hour ahead by default), 30 days and ~3 years behind, plus records of 3 MB (over
Kafka's and librdkafka's 1 MB defaults): every one reaches the clean topic the dedup creates, once,
with its original timestamp, key, value and headers; no gap is reported, nothing is refused.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from common.wire import WireConfig
from common.wire.encoder import Encoder
from tests.integration.receiver_process import ReceiverProcess, write_key_file
from tests.integration.test_dedup import finish, job_env, run_dedup
from tests.kafka_helpers import consume_all, wait_until

# Slow (one Spark start, 1-2 min here): the CI set covers the same rules without Spark in
# test_dedup_limits.py (clean topic) and test_receiver_e2e.py (raw topic, real sender).
pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

HOUR = 3_600_000
SOURCE = "orders.eu"


def test_skewed_timestamps_and_3_mb_records_reach_the_clean_topic(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=2)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    now = int(time.time() * 1000)
    skew = (now + 2 * HOUR, now - 30 * 24 * HOUR, 1_700_000_000_000)
    records = []  # (partition, offset, timestamp, key, value, headers)
    for partition in range(2):
        for offset in range(60):
            big = partition == 0 and offset in {20, 41}
            value = os.urandom(3 * 1024 * 1024 + offset) if big else b"v%d" % offset
            headers = (("trace", b"%d" % offset),) if offset % 3 == 0 else ()
            ts = skew[offset % 3] + offset
            records.append((partition, offset, ts, b"k%d" % offset, value, headers))
    encoder = Encoder(WireConfig(linger=0), ring, session_id=os.urandom(16))
    datagrams = []
    for partition, offset, ts, key, value, headers in records:
        datagrams += encoder.add(SOURCE, partition, offset, ts, 1, key, value, headers, 0.0)
    datagrams += encoder.flush()
    datagrams += encoder.heartbeat(
        sender_id="s",
        started_at_ms=now,
        sent_at_ms=now,
        high_offsets=[(SOURCE, 0, 59), (SOURCE, 1, 59)],
        low_offsets=[(SOURCE, 0, 0), (SOURCE, 1, 0)],
        counters=[],
    )
    with ReceiverProcess(downstream_kafka.bootstrap, raw, tmp_path, key_file=key_file) as rx:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for d in datagrams:
                sock.sendto(d.data, ("127.0.0.1", rx.port))
        want = len(records) + 2  # and the heartbeat's two control records
        wait_until(lambda: rx.metric("delivered_records_total") >= want, 60, message="raw")
        assert rx.metric("delivery_errors_total") == 0
        assert rx.drops() == {}
        assert rx.terminate() == 0

    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw)  # clean topic: the job's own
    finish(run_dedup(env, "--until-settled"))

    clean = consume_all(downstream_kafka, f"clean.{raw}.{SOURCE}", expected_count=len(records))
    got = {(r.partition % 2, r.key): r for r in clean}
    assert len(clean) == len(got) == len(records)
    for partition, _offset, ts, key, value, headers in records:
        r = got[(partition, key)]
        assert (r.timestamp, r.value, tuple(r.headers)) == (ts, value, headers)
    gaps = consume_all(downstream_kafka, f"gaps.{raw}", timeout=10)
    assert [json.loads(g.value) for g in gaps if g.value is not None] == []
