"""Public-key mode end to end, real processes: upstream Kafka -> sender -> netem relay (losing key
announcements) -> receiver -> raw topic.

Two promises are checked from the raw topic, not from counters: data flows as soon as one
announcement gets through, and a record sent before that is either delivered or lies inside the
[low, high] range the sender's heartbeats report (the dedup's detector turns it into a gap);
and five session-key changes in one run, under 20 % loss of control datagrams, lose nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from common.raw_topic import CONTROL_HEADER, parse_raw_key
from common.wire.pubkey import (
    RECEIVER,
    SIGNING,
    PublicKey,
    ReceiverKeyPair,
    ReceiverKeys,
    SigningKey,
    public_keys_document,
    receiver_keys_document,
    signing_key_document,
)
from runtime.key_files import write_key_file
from tests.integration.receiver_process import ROOT, ReceiverProcess, free_udp_port
from tests.kafka_helpers import Record, consume_all, produce_records, wait_until

pytestmark = pytest.mark.kafka


def _keys(tmp_path: Path) -> dict[str, Path]:
    pair = ReceiverKeyPair.generate()
    sender = SigningKey.generate(name="high-1")
    paths = {n: tmp_path / n for n in ("receiver.key", "receiver.pub", "sender.key", "sender.pub")}
    write_key_file(
        paths["receiver.key"], receiver_keys_document(ReceiverKeys([pair])), private=True
    )
    write_key_file(
        paths["receiver.pub"],
        public_keys_document(RECEIVER, [PublicKey(RECEIVER, pair.public, pair.fingerprint)]),
        private=False,
    )
    write_key_file(paths["sender.key"], signing_key_document(sender), private=True)
    write_key_file(
        paths["sender.pub"], public_keys_document(SIGNING, [sender.public_entry()]), private=False
    )
    return paths


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIODE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


class _Relay:
    """``kafka-diode netem relay`` losing key announcements (``--kind-loss``)."""

    def __init__(self, forward_port: int, kind_loss: str, log: Path) -> None:
        self.port = free_udp_port()
        self._log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "kafka_diode", "netem", "relay",
                    "--listen", f"127.0.0.1:{self.port}",
                    "--forward", f"127.0.0.1:{forward_port}",
                    "--profile", "clean", "--seed", "7", "--kind-loss", kind_loss,
                    "--event-loop", "asyncio",
                ],
                stdout=subprocess.PIPE, stderr=err, env=_env(), cwd=ROOT,
            )  # fmt: skip
        wait_until(lambda: "netem relay" in log.read_text(errors="replace"), 30, message="relay")

    def stop(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}


def _sender(
    upstream: str, topic: str, group: str, port: int, keys: dict[str, Path], log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            [
                sys.executable, "-m", "sender",
                "--bootstrap-servers", upstream, "--target", f"127.0.0.1:{port}",
                "--topics", topic, "--group-id", group, "--start-position", "earliest",
                "--signing-key-file", str(keys["sender.key"]),
                "--receiver-public-key-file", str(keys["receiver.pub"]),
                "--heartbeat-interval", "0.5",
                *extra,
            ],
            stdout=subprocess.DEVNULL, stderr=err, env=_env(), cwd=ROOT,
        )  # fmt: skip


def _raw(downstream: str, raw_topic: str) -> tuple[dict[int, set[int]], dict[int, tuple[int, int]]]:
    """Data offsets per source partition, and the last heartbeat's (low, high) per partition."""
    data: dict[int, set[int]] = defaultdict(set)
    beats: dict[int, tuple[int, int]] = {}
    for rec in consume_all(downstream, raw_topic, timeout=10, expand_runs=True):
        assert rec.key is not None
        _, partition, offset = parse_raw_key(rec.key)
        if any(name == CONTROL_HEADER for name, _ in rec.headers):
            assert rec.value is not None
            beat = json.loads(rec.value)
            beats[partition] = (beat["low_offset"], beat["high_offset"])
        else:
            data[partition].add(offset)
    return data, beats


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_lost_announcements_delay_data_and_every_earlier_record_is_delivered_or_in_range(
    upstream_kafka, downstream_kafka, kafka_topic, group_id, tmp_path
):
    source = kafka_topic(upstream_kafka, partitions=2)
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    keys = _keys(tmp_path)
    # both partitions get records (keyless records would go where the sticky partitioner puts
    # them, all in one partition at times, and the per-partition checks below need both)
    early = produce_records(
        upstream_kafka,
        source,
        [Record(None, b"early-%d" % i, partition=i % 2) for i in range(3000)],
    )
    rx = ReceiverProcess(
        downstream_kafka.bootstrap,
        raw_topic,
        tmp_path,
        extra=[
            "--receiver-key-file", str(keys["receiver.key"]),
            "--trusted-senders-file", str(keys["sender.pub"]),
            "--hold-datagrams", "20", "--hold-timeout", "1",
        ],
    )  # fmt: skip
    with rx:
        # The first 16 announcements (8 s at 0.5 s) are lost, then 20 % of the rest (loss of
        # control only): longer than the consumer takes to join and send the early records, and
        # than the 1 s hold, so some of them are certainly lost before the key is known.
        relay = _Relay(rx.port, "3:20:16", tmp_path / "relay.log")
        sender = _sender(
            upstream_kafka.bootstrap, source, group_id, relay.port, keys, tmp_path / "sender.log",
            "--announce-interval", "0.5", "--rate-datagrams", "400",
            # at 400 datagrams/s only ~2 MB records reassemble in time (start-up check)
            "--max-record-size", "1000000",
        )  # fmt: skip
        try:
            wait_until(lambda: rx.metric("session_keys_learned_total") >= 1, 60, message="key")
            late = produce_records(
                upstream_kafka,
                source,
                [Record(None, b"late-%d" % i, partition=i % 2) for i in range(1000)],
            )
            ends = {p: max(o for q, o in early + late if q == p) for p in (0, 1)}

            def tail_arrived() -> bool:
                data, beats = _raw(downstream_kafka.bootstrap, raw_topic)
                return all(o in data[p] for p, o in late) and all(
                    beats.get(p, (0, -1))[1] == end for p, end in ends.items()
                )

            wait_until(tail_arrived, 120, interval=1.0, message="late records and heartbeats")
        finally:
            _stop(sender)
            relay_summary = relay.stop()
        drops = rx.drops()
    data, beats = _raw(downstream_kafka.bootstrap, raw_topic)
    assert drops.get("unknown_key", 0) > 0, drops  # data before any announcement was lost...
    missing = {(p, o) for p, o in early + late if o not in data[p]}
    assert missing  # ...so some early records are not in the raw topic
    assert all((p, o) in early for p, o in missing)  # only records sent before the key was known
    for p, (low, high) in beats.items():  # ...and each lies inside the heartbeats' range: a gap
        assert low == min(o for q, o in early if q == p)
        assert high == ends[p]
        assert all(low <= o <= high for q, o in missing if q == p)
    assert relay_summary.get("dropped_kind", 0) >= 16, relay_summary
    assert set(drops) <= {"unknown_key", "duplicate"}, drops


def test_five_session_key_changes_under_control_loss_lose_nothing(
    upstream_kafka, downstream_kafka, kafka_topic, group_id, tmp_path
):
    source = kafka_topic(upstream_kafka, partitions=2)
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    keys = _keys(tmp_path)
    rx = ReceiverProcess(
        downstream_kafka.bootstrap,
        raw_topic,
        tmp_path,
        extra=[
            "--receiver-key-file", str(keys["receiver.key"]),
            "--trusted-senders-file", str(keys["sender.pub"]),
            "--retire-grace", "3",
        ],
    )  # fmt: skip
    produced: list[tuple[int, int]] = []
    stop_producing = threading.Event()

    def produce() -> None:
        i = 0
        while not stop_producing.is_set():
            produced.extend(
                produce_records(upstream_kafka, source, [b"r-%d" % (i + j) for j in range(50)])
            )
            i += 50
            stop_producing.wait(0.1)  # ~500 records/s, spread over the whole run

    with rx:
        relay = _Relay(rx.port, "3:20", tmp_path / "relay.log")
        sender = _sender(
            upstream_kafka.bootstrap, source, group_id, relay.port, keys, tmp_path / "sender.log",
            "--session-key-interval", "1.5", "--announce-lead", "0.3",
            "--announce-interval", "0.3",
        )  # fmt: skip
        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        try:
            wait_until(
                lambda: rx.metric("session_keys_learned_total") >= 6, 90, message="6 session keys"
            )
            stop_producing.set()
            producer.join(60)

            def all_arrived() -> bool:
                data, _ = _raw(downstream_kafka.bootstrap, raw_topic)
                return all(o in data[p] for p, o in produced)

            wait_until(all_arrived, 120, interval=1.0, message="every record in the raw topic")
        finally:
            stop_producing.set()
            producer.join(60)
            _stop(sender)
            relay_summary = relay.stop()
        drops = rx.drops()
        learned = rx.metric("session_keys_learned_total")
    assert learned >= 6  # the first key and five changes, one sender process
    assert "unknown_key" not in drops, drops  # held until its announcement, never lost
    assert relay_summary.get("dropped_kind", 0) >= 1, relay_summary
    assert "key file changed" not in (tmp_path / "sender.log").read_text()
    assert rx.log().count("session key") >= 6
