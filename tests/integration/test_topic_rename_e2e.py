"""Topic rename with real processes: the far side sees only far-side names; resend maps back.

- A real sender (``--rename SOURCE=FAR``) and receiver: every raw record and every heartbeat
  control record is keyed with the far-side name, the values are the source records'.
- ``resend`` of a bundle that names the far-side topic reads the source topic upstream and sends
  the records under the far-side name again (decoded from a real UDP socket).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from common.raw_topic import CONTROL_HEADER, parse_raw_key
from common.wire import KeyRing, RecordBatch, ResendMarker
from sender import resend_cli
from tests.integration.receiver_process import ReceiverProcess, start_sender, write_key_file
from tests.integration.test_bundle_resend import _drain, _resend, _signed, ring, udp_sink
from tests.kafka_helpers import (
    Record,
    consume_all,
    create_topic,
    produce_records,
    random_name,
    wait_until,
)

pytestmark = pytest.mark.kafka
__all__ = ["ring", "udp_sink"]  # fixtures shared with test_bundle_resend


def test_a_renamed_topic_reaches_the_raw_topic_under_its_far_name(
    upstream_kafka: Any, downstream_kafka: Any, kafka_topic: Any, group_id: str, tmp_path: Path
) -> None:
    source = kafka_topic(upstream_kafka, partitions=2)
    far = random_name("far")
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    records = [
        Record(key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2) for i in range(300)
    ]
    positions = produce_records(upstream_kafka, source, records)
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    with ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file) as rx:
        sender = start_sender(
            upstream_kafka.bootstrap, rx.port, source, group_id, key_file,
            tmp_path / "sender.log",
            "--rename", f"{source}={far}", "--heartbeat-interval", "0.5",
            "--rate-bytes", "20000000",
        )  # fmt: skip
        try:
            wait_until(lambda: rx.metric("delivered_records_total") >= 300, 120, message="written")
            wait_until(lambda: rx.metric("heartbeats_total") >= 2, 60, message="heartbeats")
        finally:
            sender.send_signal(signal.SIGTERM)
            sender.wait(60)
        assert rx.terminate() == 0
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60, expand_runs=True)
    data = {}
    beats = 0
    for r in consumed:
        parsed = parse_raw_key(r.key)
        assert parsed is not None
        assert parsed[0] == far, r.key  # nothing arrives under the source name
        if r.headers and r.headers[-1][0] == CONTROL_HEADER:
            beats += 1
        else:
            data[parsed[1], parsed[2]] = r.value
    assert beats >= 2
    assert data == {
        (partition, offset): record.value
        for record, (partition, offset) in zip(records, positions, strict=True)
    }


def test_resend_reads_the_source_topic_of_a_far_name_and_sends_it_renamed(
    upstream_kafka: Any, ring: tuple[Path, KeyRing], tmp_path: Path, udp_sink: socket.socket
) -> None:
    key_file, keyring = ring
    source = create_topic(upstream_kafka, partitions=1)
    far = random_name("far")
    produce_records(
        upstream_kafka, source, [Record(key=b"k", value=f"v{i}".encode()) for i in range(50)]
    )
    bundle = _signed(tmp_path, keyring, [(far, 0, 10, 14), (far, 0, 40, 40)])
    code = _resend(
        upstream_kafka.bootstrap, udp_sink, key_file,
        "--bundle", str(bundle), "--rename", f"{source}={far}",
    )  # fmt: skip
    assert code == resend_cli.EXIT_OK
    events = _drain(udp_sink, keyring)
    got = {
        (r.topic, r.offset): r.value
        for e in events
        if isinstance(e, RecordBatch)
        for r in e.records
    }
    assert got == {(far, o): f"v{o}".encode() for o in [10, 11, 12, 13, 14, 40]}
    markers = [e for e in events if isinstance(e, ResendMarker)]
    assert markers
    assert all(t == far for m in markers for t, *_ in m.ranges)
