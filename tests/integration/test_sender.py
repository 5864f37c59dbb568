"""kafka-diode send against the real upstream broker and a real UDP socket in the test."""

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from common import settings
from common.wire import Decoder, Heartbeat, Key, KeyRing, RecordBatch, WireConfig
from runtime import key_files
from sender.app import SenderApp
from sender.config import SenderConfig
from tests.kafka_helpers import Record, produce_records, wait_until

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """A UDP socket decoded with common.wire, drained from the test (thread-free)."""

    def __init__(self, keys: KeyRing | None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self.sock.setblocking(False)
        self.decoder = Decoder(WireConfig(allow_cleartext=keys is None), keys)
        self.records: dict[tuple[str, int, int], object] = {}
        self.count = 0
        self.heartbeats: list[Heartbeat] = []
        self.bytes = 0
        self.arrivals: list[tuple[float, int]] = []
        self.key_of_sequence: dict[tuple[bytes, int], int] = {}
        self.record_keys: dict[tuple[str, int, int], int] = {}
        """Key id of the datagram that carried each record (the last copy received)."""

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def drain(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            self.bytes += len(data)
            self.arrivals.append((time.monotonic(), len(data)))
            if len(data) >= 44:  # docs/protocol.md §3: session id at 8, sequence 24, key id 32
                sequence = int.from_bytes(data[24:32], "big")
                self.key_of_sequence[data[8:24], sequence] = int.from_bytes(data[32:36], "big")
            self.decoder.receive_datagram(data, time.monotonic())
            while (event := self.decoder.next_event()) is not None:
                if isinstance(event, RecordBatch):
                    key_id = self.key_of_sequence.get((event.session_id, event.sequence), -1)
                    for r in event.records:
                        self.count += 1
                        self.records[(r.topic, r.partition, r.offset)] = r
                        self.record_keys[(r.topic, r.partition, r.offset)] = key_id
                elif isinstance(event, Heartbeat):
                    self.heartbeats.append(event)

    def close(self) -> None:
        self.sock.close()


def sender_config(broker, topic: str, group: str, port: int, **extra) -> SenderConfig:
    values = {
        "bootstrap_servers": broker.bootstrap,
        "target": f"127.0.0.1:{port}",
        "topics": [topic],
        "group_id": group,
        "insecure_cleartext": True,
        "heartbeat_interval": 0.2,
        "commit_interval": 0.2,
        "loop": "asyncio",
        **extra,
    }
    if "key_file" in values:
        values.pop("insecure_cleartext")
    return settings.build(SenderConfig, file_values=values)


async def run_until(app: SenderApp, rx: Receiver, done, timeout: float = 60.0) -> None:  # noqa: ASYNC109
    """Start ``app``, read ``rx`` on the loop until ``done()``, then stop the app."""
    loop = asyncio.get_running_loop()
    loop.add_reader(rx.sock.fileno(), rx.drain)
    try:
        await app.start()
        deadline = time.monotonic() + timeout
        while not done():
            assert app.failure is None, app.failure
            assert time.monotonic() < deadline, (
                f"timeout: read {app.records_read}, sent "
                f"{app.pipeline.records_sent if app.pipeline else 0}, datagrams "
                f"{app.pipeline.datagrams_sent if app.pipeline else 0}, received {len(rx.records)}"
                f", drops {dict(rx.decoder.drops)}, errors {app.all_errors()}"
            )
            await asyncio.sleep(0.02)
        assert await app.stop()
    finally:
        await app.stop()
        loop.remove_reader(rx.sock.fileno())
        rx.drain()


def committed(broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10.0)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def test_every_record_arrives_with_every_field_and_offsets_are_committed(
    upstream_kafka, kafka_topic, group_id, tmp_path
) -> None:
    topic = kafka_topic(upstream_kafka, partitions=3)
    records = [
        Record(
            key=None if i % 10 == 0 else f"key-{i}".encode(),
            value=None if i % 13 == 0 else (b"" if i % 17 == 0 else os.urandom(200)),
            headers=[("h1", b"a"), ("h2", None), ("h1", b"dup")] if i % 4 == 0 else (),
            partition=i % 3,
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(3000)
    ]
    positions = produce_records(upstream_kafka, topic, records)
    key = Key.generate()
    keys = KeyRing([key], active=key.key_id)
    key_file = tmp_path / "key.json"
    key_files.write_keyring(keys, key_file)
    rx = Receiver(keys)
    cfg = sender_config(
        upstream_kafka, topic, group_id, rx.port, key_file=str(key_file), start_position="earliest"
    )

    async def scenario() -> SenderApp:
        app = SenderApp(cfg)
        await run_until(app, rx, lambda: len(rx.records) >= len(records))
        return app

    with asyncio.Runner() as runner:
        app = runner.run(scenario())
    rx.close()
    for rec, (partition, offset) in zip(records, positions, strict=True):
        got = rx.records[(topic, partition, offset)]
        assert got.key == rec.key
        assert got.value == rec.value
        assert got.headers == tuple(rec.headers)
        assert got.timestamp == rec.timestamp
        assert got.timestamp_type == 1
    ends = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    assert committed(upstream_kafka, group_id, topic, 3) == ends
    # The last heartbeat names the highest offset of every partition.
    last = {(t, p): o for t, p, o in rx.heartbeats[-1].high_offsets}
    assert last == {(topic, p): e - 1 for p, e in ends.items()}
    assert app.records_read == len(records)
    assert app.pipeline.records_sent == len(records)


def test_pacing_holds_the_byte_rate_and_pauses_partitions(
    upstream_kafka, kafka_topic, group_id
) -> None:
    topic = kafka_topic(upstream_kafka, partitions=2)
    produce_records(upstream_kafka, topic, [os.urandom(200) for _ in range(12_000)])
    rate = 300_000.0  # bytes/s: ~2.9 MB of datagrams take ~9.5 s; we measure 3 s
    rx = Receiver(None)
    cfg = sender_config(
        upstream_kafka,
        topic,
        group_id,
        rx.port,
        rate_bytes=rate,
        max_backlog_bytes=512 * 1024,
        batch_size=500,
        max_record_size=1_000_000,  # at 300 kB/s a 16 MiB record could never be reassembled
    )
    paused_seen = []
    backlog_max = []

    async def scenario() -> None:
        app = SenderApp(cfg)

        def enough() -> bool:
            paused_seen.append(app.paused)
            backlog_max.append(app.pipeline.backlog_bytes)
            return bool(rx.arrivals) and rx.arrivals[-1][0] - rx.arrivals[0][0] >= 4.0

        await run_until(app, rx, enough, timeout=30)

    with asyncio.Runner() as runner:
        runner.run(scenario())
    rx.close()
    start = rx.arrivals[0][0]
    window = [n for t, n in rx.arrivals if start + 1.0 <= t < start + 4.0]
    measured = sum(window) / 3.0
    assert abs(measured - rate) <= 0.10 * rate, measured
    assert any(paused_seen)
    # Memory bound: backlog never exceeds its bound plus two consumer batches of datagrams.
    assert (
        max(backlog_max) <= 3 * rate + 2 * 500 * 300
    )  # + the batch in hand and the prefetched one


def _spawn_sender(broker, topic, group, port, log_path, extra=(), *, keyed=False):
    env = {
        **os.environ,
        "DIODE_SENDER_BOOTSTRAP_SERVERS": broker.bootstrap,
        "DIODE_SENDER_TARGET": f"127.0.0.1:{port}",
        "DIODE_SENDER_TOPICS": topic,
        "DIODE_SENDER_GROUP_ID": group,
        "DIODE_SENDER_COMMIT_INTERVAL": "0.2",
    }
    if not keyed:
        env["DIODE_SENDER_INSECURE_CLEARTEXT"] = "true"
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "kafka_diode", "send", *extra],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_sigkill_then_restart_sends_everything_and_sigterm_commits(
    upstream_kafka, kafka_topic, group_id, tmp_path
) -> None:
    topic = kafka_topic(upstream_kafka, partitions=3)
    n = 6000
    # Each partition is given records: the sticky partitioner may leave one empty, and an
    # empty partition has no committed offset to compare.
    positions = produce_records(
        upstream_kafka,
        topic,
        [Record(key=None, value=os.urandom(200), partition=i % 3) for i in range(n)],
    )
    rx = Receiver(None)
    # ~150 kB/s: the whole topic takes ~9 s, so a kill after ~1/3 lands mid-stream.
    log_path = tmp_path / "sender.log"
    first = _spawn_sender(
        upstream_kafka,
        topic,
        group_id,
        rx.port,
        log_path,
        ["--rate-bytes", "150000", "--max-record-size", "500000"],
    )
    try:
        wait_until(lambda: (rx.drain(), len(rx.records) > n // 4)[1], 60, 0.02, "first third")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    rx.drain()
    before = len(rx.records)
    assert before < n  # killed mid-stream
    sent_before = rx.count
    second = _spawn_sender(upstream_kafka, topic, group_id, rx.port, log_path)
    try:
        # A static member (static_membership, the default) takes the dead one's partitions at
        # once; a dynamic one waits ~45 s for the dead member's session to time out.
        wait_until(lambda: (rx.drain(), rx.count > sent_before)[1], 25, 0.02, "a record resent")
        wait_until(lambda: (rx.drain(), len(rx.records) >= n)[1], 90, 0.02, "all records")
        second.send_signal(signal.SIGTERM)
        second.wait(60)
        assert second.returncode == 0, log_path.read_text(errors="replace")[-2000:]
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    rx.drain()
    rx.close()
    assert {(topic, p, o) for p, o in positions} <= set(rx.records)
    ends = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    assert committed(upstream_kafka, group_id, topic, 3) == ends
    assert rx.count >= n  # at least once: re-sent records after the kill are duplicates


def test_a_fenced_static_member_stops_the_sender_naming_the_fix(
    upstream_kafka, kafka_topic, group_id, tmp_path
) -> None:
    # Another consumer joining as this sender's static member fences it for good: it can
    # neither read nor commit. It stops (exit 1) with an ERROR that says why and what to change;
    # its uncommitted records are the new member's to read again (at least once).
    topic = kafka_topic(upstream_kafka, partitions=3)
    produce_records(
        upstream_kafka,
        topic,
        [Record(key=None, value=os.urandom(200), partition=i % 3) for i in range(3000)],
    )
    rx = Receiver(None)
    log_path = tmp_path / "sender.log"
    extra = ["--rate-bytes", "100000", "--max-record-size", "500000", "--sender-id", "fenced"]
    sender = _spawn_sender(upstream_kafka, topic, group_id, rx.port, log_path, extra)
    other = None
    try:
        wait_until(lambda: (rx.drain(), rx.count > 0)[1], 60, 0.02, "the sender sending")
        member = settings.build(
            SenderConfig,
            file_values={
                "bootstrap_servers": upstream_kafka.bootstrap,
                "target": f"127.0.0.1:{rx.port}",
                "topics": [topic],
                "group_id": group_id,
                "sender_id": "fenced",
                "insecure_cleartext": True,
            },
        ).group_instance_id()
        other = Consumer(
            {
                "bootstrap.servers": upstream_kafka.bootstrap,
                "group.id": group_id,
                "group.instance.id": member,
                "enable.auto.commit": False,
            }
        )
        other.subscribe([topic])
        deadline = time.monotonic() + 60
        while sender.poll() is None and time.monotonic() < deadline:
            other.poll(0.2)  # joins, takes the member's place, fetches
            rx.drain()
        assert sender.poll() == 1, log_path.read_text(errors="replace")[-2000:]
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        if other is not None:
            other.close()
        rx.close()
    text = log_path.read_text(errors="replace")
    assert "fenced" in text
    assert f"static member {member!r}" in text
    assert "static_membership = false" in text


def _ends(positions) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def test_heartbeat_low_offsets_are_the_first_offsets_read_also_after_a_restart(
    upstream_kafka, kafka_topic, group_id
) -> None:
    topic = kafka_topic(upstream_kafka, partitions=3)
    first = produce_records(
        upstream_kafka, topic, [Record(None, b"a%d" % i, partition=i % 3) for i in range(300)]
    )
    rx = Receiver(None)

    def beats_of(app: SenderApp) -> list[Heartbeat]:
        return [h for h in rx.heartbeats if h.session_id == app.session_id and h.high_offsets]

    async def session(start_position: str, expected: int) -> SenderApp:
        cfg = sender_config(upstream_kafka, topic, group_id, rx.port, start_position=start_position)
        app = SenderApp(cfg)
        await run_until(app, rx, lambda: len(rx.records) >= expected)
        return app

    with asyncio.Runner() as runner:
        one = runner.run(session("earliest", 300))
    starts = {p: min(o for q, o in first if q == p) for p in range(3)}
    assert set(one.low_offsets.values()) == {0}
    assert one.low_offsets == {(topic, p): o for p, o in starts.items()}
    for beat in beats_of(one):
        lows = {(t, p): o for t, p, o in beat.low_offsets}
        assert lows == {(t, p): one.low_offsets[t, p] for t, p, _ in beat.high_offsets}
    last = beats_of(one)[-1]  # the shutdown heartbeat names every partition
    assert {(t, p): o for t, p, o in last.low_offsets} == one.low_offsets
    assert {(t, p): o for t, p, o in last.high_offsets} == {
        (topic, p): e - 1 for p, e in _ends(first).items()
    }

    # A restart resumes at the committed position: its first record is the new session's low.
    resume = committed(upstream_kafka, group_id, topic, 3)
    assert resume == _ends(first)
    produce_records(
        upstream_kafka, topic, [Record(None, b"b%d" % i, partition=i % 3) for i in range(150)]
    )
    with asyncio.Runner() as runner:
        two = runner.run(session("committed", 450))
    rx.close()
    assert two.session_id != one.session_id
    assert two.low_offsets == {(topic, p): o for p, o in resume.items()}
    last = beats_of(two)[-1]
    assert {(t, p): o for t, p, o in last.low_offsets} == {(topic, p): o for p, o in resume.items()}


def _keygen_add(path: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "keygen", "--out", str(path), "--add"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(out.stdout.strip(), 16)


def test_key_file_change_is_picked_up_while_sending(
    upstream_kafka, kafka_topic, group_id, tmp_path
) -> None:
    topic = kafka_topic(upstream_kafka, partitions=2)
    key_file = tmp_path / "link.key"
    old = Key.generate()
    key_files.write_keyring(KeyRing([old], active=old.key_id), key_file)
    rx_ring = key_files.read_keyring(key_file)
    rx = Receiver(rx_ring)
    cfg = sender_config(
        upstream_kafka,
        topic,
        group_id,
        rx.port,
        key_file=str(key_file),
        key_check_interval=0.1,
        start_position="earliest",
    )
    before = produce_records(upstream_kafka, topic, [b"before-%d" % i for i in range(200)])
    new_id: list[int] = []
    after_holder: list[list[tuple[int, int]]] = []

    async def scenario() -> SenderApp:
        app = SenderApp(cfg)
        loop = asyncio.get_running_loop()
        loop.add_reader(rx.sock.fileno(), rx.drain)
        try:
            await app.start()
            await _until(app, lambda: len(rx.records) >= 200)
            sequence_at_rotation = app.pipeline.next_sequence
            # Receiver first (docs/operations.md): keygen adds the key to a copy, the receiver
            # loads it, and only then does the copy replace the sender's file (atomically, as
            # keygen writes). Adding in place raced: the sender could reload and send a
            # heartbeat under the new key before this receiver had read it.
            staged = key_file.with_name("link.key.new")
            shutil.copy2(key_file, staged)
            new_id.append(await asyncio.to_thread(_keygen_add, staged))
            rx_ring.replace(key_files.read_keyring(staged))  # the receiver holds both keys
            os.replace(staged, key_file)
            await _until(app, lambda: app.keyring_reloads >= 1)
            after = await asyncio.to_thread(
                produce_records, upstream_kafka, topic, [b"after-%d" % i for i in range(200)]
            )
            after_holder.append(after)
            await _until(app, lambda: all((topic, p, o) in rx.records for p, o in after))
            assert app.pipeline.session_id == app.session_id  # same session
            assert app.pipeline.next_sequence > sequence_at_rotation
            assert await app.stop()
            return app
        finally:
            await app.stop()
            loop.remove_reader(rx.sock.fileno())
            rx.drain()

    with asyncio.Runner() as runner:
        app = runner.run(scenario())
    rx.close()
    (new,) = new_id
    assert new != old.key_id
    assert app.keyring is not None
    assert app.keyring.active.key_id == new
    assert not rx.decoder.drops
    by_key = {}
    for (_, p, o), key_id in rx.record_keys.items():
        by_key.setdefault(key_id, set()).add((p, o))
    assert by_key[old.key_id] >= set(before)  # the first records under the old key
    (after,) = after_holder
    assert len(after) == 200
    # every record read after the reload went under the new key, none under the old one
    assert {rx.record_keys[topic, p, o] for p, o in after} == {new}
    # Datagrams are sequential within one session across the rotation.
    assert {sid for sid, _ in rx.key_of_sequence} == {app.session_id}


async def _until(app: SenderApp, done, timeout: float = 60.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not done():
        assert app.failure is None, app.failure
        assert time.monotonic() < deadline, "timeout"
        await asyncio.sleep(0.02)


def test_sighup_reloads_the_key_file_of_a_running_sender(
    upstream_kafka, kafka_topic, group_id, tmp_path
) -> None:
    topic = kafka_topic(upstream_kafka, partitions=1)
    key_file = tmp_path / "link.key"
    old = Key.generate()
    key_files.write_keyring(KeyRing([old], active=old.key_id), key_file)
    rx_ring = key_files.read_keyring(key_file)
    rx = Receiver(rx_ring)
    produce_records(upstream_kafka, topic, [b"before-%d" % i for i in range(50)])
    log_path = tmp_path / "sender.log"
    env_extra = ["--key-file", str(key_file), "--key-check-interval", "0"]
    proc = _spawn_sender(upstream_kafka, topic, group_id, rx.port, log_path, env_extra, keyed=True)
    try:
        wait_until(lambda: (rx.drain(), len(rx.records) >= 50)[1], 60, 0.02, "first records")
        new = _keygen_add(key_file)
        rx_ring.replace(key_files.read_keyring(key_file))
        proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: "key ring reloaded" in log_path.read_text(errors="replace"),
            30,
            0.05,
            "reload logged",
        )
        after = produce_records(upstream_kafka, topic, [b"after-%d" % i for i in range(50)])
        wait_until(
            lambda: (rx.drain(), all((topic, p, o) in rx.records for p, o in after))[1],
            60,
            0.02,
            "records after the reload",
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.returncode == 0, log_path.read_text(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rx.drain()
    rx.close()
    assert not rx.decoder.drops
    assert {rx.record_keys[topic, p, o] for p, o in after} == {new}


def test_a_consumer_that_stops_reading_is_reported_and_recovered(
    upstream_kafka, kafka_topic, group_id
) -> None:
    """Issue #14: the consumer's partitions are paused behind the sender's back (a consumer
    that stops fetching); the stall check reports it (metric, log) and re-creates the consumer,
    and every record still arrives."""
    topic = kafka_topic(upstream_kafka, partitions=2)
    first = [Record(key=None, value=b"a" * 50, headers=(), partition=i % 2) for i in range(200)]
    produce_records(upstream_kafka, topic, first)
    rx = Receiver(None)
    cfg = sender_config(
        upstream_kafka, topic, group_id, rx.port, start_position="earliest", stall_timeout=2.0
    )

    async def scenario() -> SenderApp:
        app = SenderApp(cfg)
        loop = asyncio.get_running_loop()
        loop.add_reader(rx.sock.fileno(), rx.drain)
        try:
            await app.start()
            await wait_async(lambda: len(rx.records) >= 200, 60, "first records")
            source = app.source
            assert source is not None

            def stop_fetching() -> None:  # behind the sender's back: it looks like a dead fetch
                consumer = source._consumer
                consumer.pause(consumer.assignment())

            await source._call(stop_fetching)
            produce_records(upstream_kafka, topic, first)
            await wait_async(lambda: app.stalls >= 1, 60, "stall reported")
            assert app.metrics.stalled._value.get() == 1
            await wait_async(lambda: len(rx.records) >= 400, 60, "records after recovery")
            await wait_async(lambda: not app.stalled, 30, "stall cleared")
            assert await app.stop()
        finally:
            await app.stop()
            loop.remove_reader(rx.sock.fileno())
            rx.drain()
        return app

    with asyncio.Runner() as runner:
        app = runner.run(scenario())
    rx.close()
    assert sorted(o for (_, _, o) in rx.records) == sorted(
        list(range(100)) * 2 + list(range(100, 200)) * 2
    )
    assert app.stalls == 1


async def wait_async(done, timeout: float, what: str) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timeout waiting for {what}"
        await asyncio.sleep(0.05)
