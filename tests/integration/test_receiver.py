"""``kafka-diode receive`` as a real process against a real downstream broker.

Datagrams are built with ``common.wire.Encoder`` (exactly what the sender puts on the wire) and
sent over real UDP sockets on loopback; the raw topic is read back with a real consumer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time

import pytest

from common.raw_run import SESSION_HEADER, check_run, parse_run_key
from common.wire import Key, KeyRing, RecordBatch, WireConfig
from common.wire.batch_encode import RECORD_BATCH_SCHEMA
from common.wire.compression import compress
from common.wire.control import RESEND_MARKER_SCHEMA, encode_control
from common.wire.crypto import SessionCipher
from common.wire.decoder import Decoder
from common.wire.encoder import Encoder
from common.wire.envelope import (
    CIPHER_AES_256_GCM,
    COMPRESSION_GZIP,
    KIND_RECORD_BATCH,
    KIND_RESEND_MARKER,
    build_header,
    frame,
)
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from receiver.config import ReceiverConfig
from receiver.kafka_sink import RawTopicSink
from receiver.metrics import ReceiverStats
from runtime import key_files
from tests import kafka_helpers
from tests.integration.receiver_process import ReceiverProcess, write_key_file
from tests.kafka_helpers import consume_all, wait_until

pytestmark = pytest.mark.kafka

PROVENANCE = ["diode.key", "diode.timestamp", "diode.timestamp-type", "diode.session"]
# Small limits so hostile claims are cheap to make; the good stream stays far below them.
LIMITS = [
    "--max-record-size", "1048576",
    "--max-message-size", str(1048576 + 4096),
    "--max-decompressed-size", str(2 * 1048576),
    "--max-fragments", "64",
    "--replay-window", "64",
]  # fmt: skip


_OPEN_LINKS: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_links():
    yield
    while _OPEN_LINKS:
        _OPEN_LINKS.pop().close()


class Link:
    """The sending end: an Encoder and a UDP socket aimed at the receiver."""

    def __init__(self, port: int, ring: KeyRing | None, *, cleartext: bool = False) -> None:
        self.config = WireConfig(allow_cleartext=cleartext, linger=0)
        self.session = os.urandom(16)
        self.encoder = Encoder(self.config, ring, session_id=self.session)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _OPEN_LINKS.append(self.sock)
        self.addr = ("127.0.0.1", port)
        self.sent: list[bytes] = []

    def encode(self, records) -> list[bytes]:
        out = []
        for r in records:
            out += [d.data for d in self.encoder.add(*r, now=0.0)]
        out += [d.data for d in self.encoder.flush()]
        return out

    def send(self, datagrams: list[bytes], pace_every: int = 200) -> None:
        for i, data in enumerate(datagrams):
            self.sock.sendto(data, self.addr)
            self.sent.append(data)
            if pace_every and i % pace_every == pace_every - 1:
                time.sleep(0.002)  # pacing (a diode cannot push back), not synchronisation


def make_records(topic: str, count: int, partitions: int = 5, start: int = 0):
    """(topic, partition, offset, timestamp, timestamp_type, key, value, headers) tuples."""
    out = []
    for i in range(start, start + count):
        partition = i % partitions
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else f"k{i}".encode())
        value = None if i % 13 == 0 else os.urandom(8) + b"v" * (i % 300)
        headers = (("h", b"1"), ("diode.key", None)) if i % 3 == 0 else ()
        out.append((topic, partition, i, 1_700_000_000_000 + i, 1 + i % 2, key, value, headers))
    return out


def assert_raw_layout(consumed, sent_records, raw_partitions: int, session: bytes) -> None:
    by_key = {r.key.decode(): r for r in consumed}
    for topic, partition, offset, ts, ts_type, key, value, headers in sent_records:
        raw = by_key[f"{topic}:{partition}:{offset}"]
        assert raw.value == value
        assert raw.partition == partition % raw_partitions
        # the receiver's clock, not the source's (docs/topics.md): within the test's run
        assert abs(raw.timestamp - time.time() * 1000) < 3_600_000
        assert list(raw.headers[: len(headers)]) == list(headers)
        assert [name for name, _ in raw.headers[len(headers) :]] == PROVENANCE
        prov = dict(raw.headers[len(headers) :])
        assert prov["diode.key"] == key
        assert prov["diode.timestamp"] == str(ts).encode()
        assert prov["diode.timestamp-type"] == str(ts_type).encode()
        assert prov["diode.session"] == session.hex().encode()


def test_records_and_heartbeats_reach_the_raw_topic(downstream_kafka, kafka_topic, tmp_path):
    raw_topic = kafka_topic(downstream_kafka, partitions=3)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    with ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file) as rx:
        link = Link(rx.port, ring)
        records = make_records("orders.eu", 600)
        link.send(link.encode(records))
        beat = [
            d.data
            for d in link.encoder.heartbeat(
                sender_id="s1",
                started_at_ms=1,
                sent_at_ms=1_700_000_001_000,
                high_offsets=(("orders.eu", 4, 599), ("orders.eu", 0, 595)),
                low_offsets=(("orders.eu", 0, 0), ("orders.eu", 4, 4)),
                counters=(("sent", 600),),
            )
        ]
        link.send(beat)
        wait_until(lambda: rx.metric("delivered_records_total") >= 602, 60, message="delivered")
        assert rx.terminate() == 0
        summary = json.loads(rx.stdout().strip().splitlines()[-1])["receiver_summary"]
    assert summary["records"] == 600
    assert summary["delivered"] == 602
    assert summary["lost_at_shutdown"] == 0
    consumed = consume_all(
        downstream_kafka, raw_topic, expected_count=602, timeout=60, expand_runs=True
    )
    data = [r for r in consumed if not any(n == "diode.control" for n, _ in r.headers)]
    control = [r for r in consumed if r not in data]
    assert len(data) == 600
    assert_raw_layout(data, records, 3, link.session)
    assert sorted(r.key.decode() for r in control) == ["orders.eu:0:595", "orders.eu:4:599"]
    for r in control:
        assert r.headers == (("diode.control", b"heartbeat"),)
        assert r.partition == int(r.key.decode().split(":")[1]) % 3
        value = json.loads(r.value)
        assert value["type"] == "heartbeat"
        assert value["session"] == link.session.hex()
        assert value["sender_id"] == "s1"
        assert value["low_offset"] == {0: 0, 4: 4}[int(r.key.decode().split(":")[1])]


@pytest.mark.parametrize(("interval", "expected"), [("30", 3), ("0", 10)])
def test_a_heartbeat_that_repeats_the_last_one_is_not_written_again(
    downstream_kafka, kafka_topic, tmp_path, interval, expected
):
    """A live sender on a quiet link heartbeats every 2 s with the same offsets; each raw record
    would make the dedup run a micro-batch for nothing (receiver/heartbeat_repeats.py)."""
    raw_topic = kafka_topic(downstream_kafka, partitions=3)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    extra = ["--heartbeat-repeat-interval", interval]
    with ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=extra
    ) as rx:
        link = Link(rx.port, ring)
        highs = [(9, 7), (9, 7), (9, 7), (12, 7), (12, 7)]  # partition 0 moves once
        for i, (high0, high1) in enumerate(highs, start=1):
            link.send(
                [
                    d.data
                    for d in link.encoder.heartbeat(
                        sender_id="s1",
                        started_at_ms=1,
                        sent_at_ms=1_700_000_000_000 + 2_000 * i,  # changes every time
                        high_offsets=(("orders.eu", 0, high0), ("orders.eu", 1, high1)),
                        low_offsets=(("orders.eu", 0, 0), ("orders.eu", 1, 1)),
                        counters=(("sent", i),),
                    )
                ]
            )
            wait_until(lambda i=i: rx.metric("heartbeats_total") >= i, 30, message="decoded")
        wait_until(
            lambda: rx.metric("delivered_records_total") >= expected, 30, message="delivered"
        )
        skipped = rx.metric("heartbeat_repeats_skipped_total")
        assert rx.terminate() == 0
    assert skipped == 10 - expected
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60)  # to the end: nothing more
    keys = sorted(r.key.decode() for r in consumed)
    if interval == "0":
        assert keys == sorted(
            ["orders.eu:0:9"] * 3 + ["orders.eu:0:12"] * 2 + ["orders.eu:1:7"] * 5
        )
    else:
        assert keys == ["orders.eu:0:12", "orders.eu:0:9", "orders.eu:1:7"]
    assert all(r.headers == (("diode.control", b"heartbeat"),) for r in consumed)


def _bomb(ring: KeyRing) -> bytes:
    """An authentic datagram whose gzip payload inflates to 8 MiB (limit: 2 MiB)."""
    session = os.urandom(16)
    packed = compress(b"\0" * (8 * 1048576), 9)
    assert len(packed) < 60000
    key = ring.active
    header = build_header(
        kind=KIND_RECORD_BATCH,
        compression=COMPRESSION_GZIP,
        cipher=CIPHER_AES_256_GCM,
        session_id=session,
        sequence=0,
        key_id=key.key_id,
        fragment_index=0,
        fragment_count=1,
        message_length=len(packed),
    )
    return frame(header, SessionCipher(key, session).seal(0, packed, header))


def _sealed(ring: KeyRing, payload: bytes, kind: int) -> bytes:
    """An authentic one-datagram message of ``kind`` carrying ``payload`` (a new session)."""
    session = os.urandom(16)
    key = ring.active
    header = build_header(
        kind=kind,
        compression=0,
        cipher=CIPHER_AES_256_GCM,
        session_id=session,
        sequence=0,
        key_id=key.key_id,
        fragment_index=0,
        fragment_count=1,
        message_length=len(payload),
    )
    return frame(header, SessionCipher(key, session).seal(0, payload, header))


def _out_of_range_payloads() -> list[tuple[bytes, int]]:
    """Decodable payloads carrying values no Kafka record or resend marker can have: before
    the out_of_range drop reason, the first one made produce() raise OverflowError."""

    def group(**fields: object) -> dict[str, object]:
        return {
            "topic": "t", "partition": 0, "timestamp_type": 1, "base_offset": 5,
            "base_timestamp": 1_700_000_000_000, "offset_deltas": [0, 1],
            "timestamp_deltas": [0, 1], "keys": [b"k", None], "values": [b"v", b""],
            "headers": [[], []], **fields,
        }  # fmt: skip

    def batch(**fields: object) -> bytes:
        return encode_control(RECORD_BATCH_SCHEMA, {"groups": [group(), group(**fields)]})

    marker = {
        "bundle_id": "b", "phase": "end", "ranges": [{"topic": "t", "partition": 0,
        "first": 0, "last": 9}], "records_sent": -3, "sent_at_ms": 1,
    }  # fmt: skip
    return [
        (batch(base_timestamp=2**63 - 1), KIND_RECORD_BATCH),  # base + delta beyond 64 bits
        (batch(base_timestamp=-5, timestamp_deltas=[0, -(2**63)]), KIND_RECORD_BATCH),
        (batch(base_offset=2**63 - 1), KIND_RECORD_BATCH),
        (batch(topic="a\x00b"), KIND_RECORD_BATCH),
        (encode_control(RESEND_MARKER_SCHEMA, marker), KIND_RESEND_MARKER),
    ]


def _claim(ring: KeyRing, *, count: int, total: int) -> bytes:
    header = build_header(
        kind=KIND_RECORD_BATCH,
        compression=0,
        cipher=CIPHER_AES_256_GCM,
        session_id=os.urandom(16),
        sequence=5,
        key_id=ring.active.key_id,
        fragment_index=1,
        fragment_count=count,
        message_length=total,
    )
    return frame(header, os.urandom(1000))


def test_hostile_traffic_is_dropped_by_reason(downstream_kafka, kafka_topic, tmp_path):
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    rx = ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=LIMITS
    )
    with rx:
        link = Link(rx.port, ring)
        records = make_records("t", 1500, partitions=4)
        good = link.encode(records)
        assert len(good) > 150
        rng = __import__("random").Random(5)
        expected: dict[str, int] = {}
        stream: list[bytes] = []

        def bad(reason: str, data: bytes) -> None:
            expected[reason] = expected.get(reason, 0) + 1
            stream.append(data)

        wrong_key = Link(rx.port, KeyRing([Key.generate()]))
        cleartext = Link(rx.port, None, cleartext=True)
        for i, data in enumerate(good):
            if i % 10 == 1:
                bad("bad_magic", b"X" + rng.randbytes(rng.randrange(0, 1400)))
            if i % 10 == 2:
                bad("malformed", data[: rng.randrange(46, len(data) - 1)])  # truncated
            if i % 10 == 3:
                flipped = bytearray(data)
                flipped[rng.randrange(60, len(data))] ^= 1 << rng.randrange(8)
                bad("auth_failed", bytes(flipped))  # bit flip before the genuine copy
            stream.append(data)
            if i % 10 == 4:
                bad("duplicate", data)  # immediate replay, inside the window
        for data in good[:20]:
            bad("replayed", data)  # far below the 64-datagram window by now
        for data in wrong_key.encode(make_records("t", 30, start=10_000)):
            bad("unknown_key", data)
        for data in cleartext.encode(make_records("t", 30, start=20_000)):
            bad("cleartext_refused", data)
        bad("too_many_fragments", _claim(ring, count=1000, total=5000))
        bad("too_large", _claim(ring, count=2, total=50 * 1048576))
        bad("too_large", _bomb(ring))
        for payload, kind in _out_of_range_payloads():
            bad("out_of_range", _sealed(ring, payload, kind))
        link.send(stream)
        total = len(stream)
        wait_until(lambda: rx.metric("datagrams_total") >= total, 60, message="all read")
        wait_until(lambda: rx.metric("delivered_records_total") >= 1500, 60, message="delivered")
        drops = rx.drops()
        assert rx.alive()
        assert rx.metric("kernel_drops_total") == 0
        assert drops == expected
        assert rx.terminate() == 0
    consumed = consume_all(
        downstream_kafka, raw_topic, expected_count=1500, timeout=60, expand_runs=True
    )
    assert sorted(r.key.decode() for r in consumed) == sorted(
        f"{t}:{p}:{o}" for t, p, o, *_ in records
    )
    assert_raw_layout(consumed, records, 2, link.session)


def test_runs_span_datagrams_and_precede_their_heartbeat(downstream_kafka, kafka_topic, tmp_path):
    """Raw layout v2 as written: consecutive records of a partition coalesce across datagrams
    into runs (one header, values that check_run accepts), cut by a lost offset, and every run of
    a partition is in the raw topic before that partition's heartbeat."""
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    extra = ["--run-linger", "10"]  # only the break and the heartbeat end runs here
    with ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=extra
    ) as rx:
        link = Link(rx.port, ring)
        records = [r for r in make_records("r", 900, partitions=3) if r[2] != 450]
        records = [(t, p, o, ts, 1, k, v, h) for t, p, o, ts, _, k, v, h in records]  # one type
        datagrams = link.encode(records)
        assert len(datagrams) > 20
        link.send(datagrams)
        wait_until(lambda: rx.metric("records_total") >= 899, 60, message="read")
        assert rx.metric("produced_records_total") < 899  # open runs wait (long linger)
        link.send(
            [
                d.data
                for d in link.encoder.heartbeat(
                    sender_id="s1",
                    started_at_ms=1,
                    sent_at_ms=1_700_000_001_000,
                    high_offsets=tuple(("r", p, 897 + p) for p in range(3)),
                    low_offsets=tuple(("r", p, p) for p in range(3)),
                    counters=(),
                )
            ]
        )
        wait_until(lambda: rx.metric("delivered_records_total") >= 902, 60, message="delivered")
        assert rx.terminate() == 0
    raw = consume_all(downstream_kafka, raw_topic, expected_count=None, timeout=60)
    runs = [r for r in raw if parse_run_key(r.key) is not None]
    beats = [r for r in raw if r not in runs]
    assert len(beats) == 3
    for r in runs:
        assert r.headers == ((SESSION_HEADER, link.session.hex().encode()),)
        check_run(r.value, *parse_run_key(r.key))
    # partition 0 (450 lost): runs 0-447/3 and 453-897/3 (cut by the loss), spanning datagrams
    assert sorted(r.key.decode() for r in runs if r.key.startswith(b"r:0:")) == [
        "r:0:0-447/3",
        "r:0:453-897/3",
    ]
    assert sorted(r.key.decode() for r in runs if not r.key.startswith(b"r:0:")) == [
        "r:1:1-898/3",
        "r:2:2-899/3",
    ]
    for beat in beats:
        source = int(beat.key.decode().split(":")[1])
        before = [r for r in raw if r.partition == beat.partition and r.offset < beat.offset]
        ours = [r for r in runs if int(r.key.decode().split(":")[1]) == source]
        assert all(r in before for r in ours), beat.key
    expanded = kafka_helpers.expand_runs(raw)
    assert_raw_layout([r for r in expanded if r not in beats], records, 2, link.session)


@pytest.fixture
def own_broker(tmp_path):
    """A downstream broker this test may stop and start (the session brokers are shared)."""
    kafka_helpers.reap_orphan_test_brokers()
    broker = LocalBroker(
        f"pytest-{os.getpid()}-rxrestart", free_port(), data_dir=tmp_path / "kafka", partitions=2
    )
    kafka_helpers._started.append(broker)  # stopped at exit even if the test dies
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.slow
def test_downstream_broker_restart_loses_nothing_that_was_not_reported(own_broker, tmp_path):
    raw_topic = kafka_helpers.create_topic(own_broker, partitions=2)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    rx = ReceiverProcess(own_broker.bootstrap, raw_topic, tmp_path, key_file=key_file)
    with rx:
        link = Link(rx.port, ring)
        first = make_records("s", 3000, partitions=4)
        link.send(link.encode(first))
        wait_until(lambda: rx.metric("delivered_records_total") >= 3000, 60, message="phase 1")
        own_broker.stop()
        second = make_records("s", 5000, partitions=4, start=3000)
        link.send(link.encode(second))  # arrives while the broker is down
        wait_until(lambda: rx.metric("records_total") >= 8000, 60, message="read while down")
        stopped_for = time.monotonic()
        assert rx.alive()
        assert rx.metric("delivered_records_total") < 8000
        wait_until(lambda: time.monotonic() - stopped_for > 4, 10, message="broker away 4 s")
        own_broker.start()
        wait_until(lambda: rx.metric("delivered_records_total") >= 8000, 120, message="recovered")
        assert rx.drops().get("downstream_overflow", 0) == 0
        assert rx.metric("delivery_errors_total") == 0
        assert rx.terminate() == 0
    consumed = consume_all(own_broker, raw_topic, expected_count=8000, timeout=60, expand_runs=True)
    keys = [r.key.decode() for r in consumed]
    assert sorted(set(keys)) == sorted(f"s:{p}:{o}" for _, p, o, *_ in first + second)
    assert len(keys) == len(set(keys))  # idempotent producer: no duplicates from retries


def test_overflow_is_counted_and_reported_as_ranges(tmp_path):
    """Downstream unreachable from the start: bounded buffers overflow, ranges are logged."""
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    dead = f"127.0.0.1:{free_port()}"
    extra = [
        "--buffer-max-records", "200", "--backlog-max-records", "100",
        "--metadata-timeout", "0.5", "--shutdown-timeout", "1",
    ]  # fmt: skip
    rx = ReceiverProcess(dead, "raw", tmp_path, key_file=key_file, extra=extra)
    with rx:
        link = Link(rx.port, ring)
        link.send(link.encode(make_records("o", 1000, partitions=1)))
        wait_until(lambda: rx.metric("records_total") >= 1000, 30, message="read")
        # partition count never known: the backlog (100 records, whole runs) holds, the rest
        # overflows; a run that would take the backlog past 100 records overflows whole
        wait_until(lambda: rx.drops().get("downstream_overflow", 0) >= 900, 10, message="overflow")
        overflow = rx.drops()["downstream_overflow"]
        wait_until(lambda: len(_reported(rx.log(), "downstream_overflow")) == overflow, 10)
        assert rx.terminate() == 0
    overflowed = _reported(rx.log(), "downstream_overflow")
    at_shutdown = _reported(rx.log(), "could not be delivered")
    # the backlog, not written at shutdown, is reported too: every record exactly once
    assert len(at_shutdown) == 1000 - overflow <= 100
    assert overflowed | at_shutdown == {("o", 0, o) for o in range(1000)}
    summary = json.loads(rx.stdout().strip().splitlines()[-1])["receiver_summary"]
    assert summary["lost_at_shutdown"] >= 1  # raw records (runs) in the backlog


def _reported(log: str, what: str) -> set[tuple[str, int, int]]:
    """Offsets listed in the receiver's "resend these source ranges" lines about ``what``."""
    out = set()
    for line in log.splitlines():
        if what not in line or "resend these source ranges: " not in line:
            continue
        for item in line.split("resend these source ranges: ", 1)[1].split(", "):
            topic, partition, span = item.strip().rsplit(":", 2)
            first, _, last = span.partition("-")
            out |= {(topic, int(partition), o) for o in range(int(first), int(last or first) + 1)}
    return out


def test_sigterm_flushes_what_the_socket_path_took(downstream_kafka, kafka_topic, tmp_path):
    """Records still in the producer (long linger) when SIGTERM arrives are written, then exit 0."""
    raw_topic = kafka_topic(downstream_kafka, partitions=3)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    extra = ["--kafka", "linger.ms=3000"]
    rx = ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=extra
    )
    with rx:
        link = Link(rx.port, ring)
        link.send(link.encode(make_records("f", 400)))
        wait_until(lambda: rx.metric("records_total") >= 400, 30, message="read")
        assert rx.metric("delivered_records_total") < 400  # still lingering in the producer
        assert rx.terminate() == 0
    summary = json.loads(rx.stdout().strip().splitlines()[-1])["receiver_summary"]
    assert summary["delivered"] == 400
    assert summary["lost_at_shutdown"] == 0
    assert (
        len(
            consume_all(
                downstream_kafka, raw_topic, expected_count=400, timeout=60, expand_runs=True
            )
        )
        == 400
    )


def test_sighup_reloads_the_key_ring(downstream_kafka, kafka_topic, tmp_path):
    raw_topic = kafka_topic(downstream_kafka, partitions=1)
    key_file = tmp_path / "keys.json"
    old = write_key_file(key_file)
    new_key = Key.generate()
    extra = ["--key-check-interval", "0"]  # only SIGHUP reloads here
    rx = ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=extra
    )
    with rx:
        link = Link(rx.port, KeyRing([new_key]))
        link.send(link.encode(make_records("k", 50)))
        wait_until(lambda: rx.drops().get("unknown_key", 0) > 0, 30, message="unknown key")
        key_files.write_keyring(
            KeyRing([*old, new_key], active=new_key.key_id), key_file, overwrite=True
        )
        rx.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: rx.metric("keyring_reloads_total") >= 1, 30, message="reloaded")
        link.send(link.encode(make_records("k", 50, start=50)))
        wait_until(lambda: rx.metric("delivered_records_total") >= 50, 30, message="delivered")
        assert rx.alive()
        assert rx.terminate() == 0
    keys = sorted(
        r.key.decode()
        for r in consume_all(downstream_kafka, raw_topic, timeout=30, expand_runs=True)
    )
    assert keys == sorted(f"k:{i % 5}:{i}" for i in range(50, 100))


def test_new_raw_topic_leaves_the_backlog_without_waiting_for_the_tick(
    downstream_kafka, kafka_topic, tmp_path
):
    # The partition count of a raw topic seen for the first time is looked up on a thread; its
    # records wait in the backlog. The answer must be applied by service() (after every socket
    # burst), not only by the once-a-second tick(): at 100k records/s a second of waiting
    # overflowed the 100k-record backlog (downstream_overflow drops at a rate the receiver
    # otherwise keeps up with).
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    config = ReceiverConfig(
        bootstrap_servers=downstream_kafka.bootstrap,
        raw_topic=raw_topic,
        allow_cleartext=True,
        run_linger=0,  # runs end with each datagram: they reach the backlog at once
    )
    stats = ReceiverStats()
    sink = RawTopicSink(config, stats)
    decoder = Decoder(config.wire_config(), None)
    link = Link(0, None, cleartext=True)
    for data in link.encode(make_records("m", 300)):
        decoder.receive_datagram(data, 0.0)
        while (event := decoder.next_event()) is not None:
            assert isinstance(event, RecordBatch)
            sink.write_batch(event)
    assert sink.backlog_records == 300  # partition count not known yet

    def served() -> bool:
        sink.service()  # never tick(): that is the point
        return sink.backlog_records == 0 and stats.delivered == 300

    try:
        wait_until(served, 30, interval=0.01, message="backlog moved to the producer")
        assert stats.produced == 300
    finally:
        asyncio.run(sink.close(10))
    assert (
        len(
            consume_all(
                downstream_kafka, raw_topic, expected_count=300, timeout=60, expand_runs=True
            )
        )
        == 300
    )
