"""The receiver process against the downstream topic's size limit (real broker, real UDP).

1. Records of 3 MB (over librdkafka's and Kafka's 1 MB defaults) reach the raw topic with the
   documented set-up only (a topic admitting ``max_record_size`` plus the raw overhead; the
   embedded broker's default does): nothing refused, nothing lost.
2. A raw topic whose ``max.message.bytes`` is below what ``max_record_size`` needs stops the
   receiver at start-up (exit code 2) with a message naming the setting and the value to set;
   so does such a topic that a ``{topic}`` template names and that exists at start-up.
"""

from __future__ import annotations

import os
import socket

import pytest

from common.topic_limits import record_limit
from common.wire import WireConfig
from common.wire.encoder import Encoder
from tests.integration.receiver_process import ReceiverProcess, write_key_file
from tests.kafka_helpers import consume_all, create_topic, random_name, wait_until

pytestmark = pytest.mark.kafka


def test_records_of_3_mb_reach_the_raw_topic(downstream_kafka, kafka_topic, tmp_path) -> None:
    raw_topic = kafka_topic(downstream_kafka, partitions=1)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    values = [os.urandom(3 * 1024 * 1024 + i) for i in range(3)]
    encoder = Encoder(WireConfig(linger=0), ring, session_id=os.urandom(16))
    datagrams = []
    for offset, value in enumerate(values):
        datagrams += encoder.add("big", 0, offset, 1_700_000_000_000, 1, b"k", value, (), 0.0)
    datagrams += encoder.flush()
    assert len(datagrams) > 6000  # fragmented into MTU-sized datagrams
    with ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file) as rx:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for d in datagrams:
                sock.sendto(d.data, ("127.0.0.1", rx.port))
        wait_until(lambda: rx.metric("delivered_records_total") >= 3, 60, message="delivered")
        assert rx.metric("delivery_errors_total") == 0
        assert rx.drops() == {}
        assert rx.terminate() == 0
    consumed = consume_all(
        downstream_kafka, raw_topic, expected_count=3, timeout=60, expand_runs=True
    )
    assert sorted(r.value for r in consumed) == sorted(values)


def test_a_raw_topic_too_small_stops_the_receiver_naming_the_setting(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    raw_topic = kafka_topic(downstream_kafka, partitions=1, config={"max.message.bytes": "1048588"})
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    rx = ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file)
    with pytest.raises(RuntimeError, match="receiver exited 2"):
        rx.start()
    log = rx.log()
    assert "configuration error" in log
    assert f"max.message.bytes={record_limit(16 * 1024 * 1024)}" in log
    assert "max_record_size" in log
    # the documented alternative: a smaller max_record_size that the topic admits starts fine
    smaller = ReceiverProcess(
        downstream_kafka.bootstrap,
        raw_topic,
        tmp_path,
        key_file=key_file,
        extra=["--max-record-size", str(1048588 - 4096), "--max-message-size", str(1048588)],
    )
    with smaller:
        assert smaller.alive()
    # runs are capped by run_max_bytes: one larger than the topic admits stops the start-up too
    larger_runs = ReceiverProcess(
        downstream_kafka.bootstrap,
        raw_topic,
        tmp_path,
        key_file=key_file,
        extra=[
            "--max-record-size", str(1048588 - 4096), "--max-message-size", str(1048588),
            "--run-max-bytes", str(1 << 20),
        ],
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="receiver exited 2"):
        larger_runs.start()
    assert "run_max_bytes" in larger_runs.log()
    assert "max.message.bytes=1052672" in larger_runs.log()


def test_an_existing_topic_of_the_raw_template_too_small_stops_the_receiver(
    downstream_kafka, tmp_path
) -> None:
    # a {topic} template names topics that exist before the first record: one of them too narrow
    prefix = random_name("tmpl")  # no other test's topic matches the template
    template = f"{prefix}.{{topic}}.raw"
    narrow = create_topic(downstream_kafka, f"{prefix}.orders.raw",
                          config={"max.message.bytes": "1048588"})  # fmt: skip
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    rx = ReceiverProcess(downstream_kafka.bootstrap, template, tmp_path, key_file=key_file,
                         extra=["--raw-topic-replication", "1",
                                "--raw-topic-min-insync-replicas", "1"])  # fmt: skip
    with pytest.raises(RuntimeError, match="receiver exited 2"):
        rx.start()
    log = rx.log()
    assert "configuration error" in log
    assert f"raw topic template {template}" in log
    assert f"--entity-name {narrow} --add-config max.message.bytes=" in log
    # with a max_record_size the topic admits, the same template starts
    fits = ReceiverProcess(
        downstream_kafka.bootstrap,
        template,
        tmp_path,
        key_file=key_file,
        extra=["--raw-topic-replication", "1", "--raw-topic-min-insync-replicas", "1",
               "--max-record-size", str(1048588 - 4096), "--max-message-size", str(1048588)],
    )  # fmt: skip
    with fits:
        assert fits.alive()
