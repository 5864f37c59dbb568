"""Bundles and resend against real brokers and real UDP sockets.

- ``bundle create`` reads a real gap topic (latest state per key, open gaps only, topic filter).
- ``resend`` reads exactly the listed offsets upstream, reports offsets deleted by
  ``DeleteRecords`` as unrecoverable and sends the rest: a UDP socket + ``common.wire.Decoder``
  checks that exactly the rest arrived, between a start and an end resend marker.
- ``resend`` never moves a consumer group's committed offsets.
- The full loop (both brokers, sender, lossy relay, receiver, dedup; bundle -> resend -> dedup)
  ends with every record in the clean topic exactly once and an empty second bundle.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from common import bundle as b
from common.gap_record import GapReport, GapState, gap_key, gap_value
from common.wire import Decoder, Key, KeyRing, RecordBatch, ResendMarker, WireConfig
from dedup import bundle_cli
from runtime import key_files
from sender import resend_cli
from tests.kafka_helpers import Record, create_topic, produce_records

pytestmark = pytest.mark.kafka


@pytest.fixture
def ring(tmp_path: Path) -> tuple[Path, KeyRing]:
    keyring = KeyRing([Key.generate()])
    path = tmp_path / "link.key"
    key_files.write_keyring(keyring, path)
    return path, keyring


@pytest.fixture
def udp_sink() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def _drain(sock: socket.socket, keyring: KeyRing) -> list[Any]:
    """Every event of the datagrams waiting in ``sock`` (the resend has finished sending)."""
    decoder = Decoder(WireConfig(), keyring)
    events: list[Any] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            break
        decoder.receive_datagram(data, time.monotonic())
        while (event := decoder.next_event()) is not None:
            events.append(event)
    return events


def _signed(tmp_path: Path, keyring: KeyRing, gaps: list[tuple[str, int, int, int]]) -> Path:
    bundle = b.build(gaps, bundle_id="it-bundle", created_at_ms=int(time.time() * 1000))
    path = tmp_path / "gaps.bundle"
    key = keyring.active
    path.write_bytes(b.sign(bundle, key_id=key.key_id, link_key=key.material))
    return path


def _resend(upstream: str, sock: socket.socket, key_file: Path, *extra: str) -> int:
    port = sock.getsockname()[1]
    return resend_cli.main(
        ["--bootstrap-servers", upstream, "--target", f"127.0.0.1:{port}",
         "--key-file", str(key_file), "--no-progress", "--loop", "asyncio", *extra],
    )  # fmt: skip


def _records(events: list[Any]) -> dict[tuple[str, int, int], Any]:
    out: dict[tuple[str, int, int], Any] = {}
    for event in events:
        if isinstance(event, RecordBatch):
            for rec in event.records:
                out[(rec.topic, rec.partition, rec.offset)] = rec
    return out


def test_bundle_create_reads_the_gap_topic(
    downstream_kafka: Any,
    ring: tuple[Path, KeyRing],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key_file, keyring = ring
    gap_topic = create_topic(downstream_kafka, partitions=1, config={"cleanup.policy": "compact"})

    def gap(topic: str, part: int, first: int, last: int, state: GapState) -> Record:
        report = GapReport(
            topic=topic, partition=part, first=first, last=last, state=state,
            detected_at=1, reported_at=2,
        )  # fmt: skip
        return Record(key=gap_key(report), value=gap_value(report))

    produce_records(
        downstream_kafka,
        gap_topic,
        [
            gap("orders", 0, 10, 19, GapState.OPEN),
            gap("orders", 0, 20, 20, GapState.OPEN),  # adjacent: merged with 10..19
            gap("orders", 1, 5, 9, GapState.OPEN),
            gap("orders", 1, 5, 9, GapState.FILLED),  # closed by a resend
            gap("audit", 2, 100, 199, GapState.OPEN),
            gap("audit", 2, 500, 510, GapState.EXPIRED),
        ],
    )
    out = tmp_path / "latest.bundle"
    base = ["--bootstrap-servers", downstream_kafka.bootstrap, "--gap-topic", gap_topic,
            "--key-file", str(key_file)]  # fmt: skip
    assert bundle_cli.main(["create", *base, "--out", str(out)]) == 0
    bundle = b.verify(out.read_bytes(), {keyring.active.key_id: keyring.active.material})
    assert [(p.topic, p.partition, p.ranges) for p in bundle.partitions] == [
        ("audit", 2, ((100, 199),)),
        ("orders", 0, ((10, 20),)),
    ]
    assert bundle.gap_count == 3
    assert "111 records in 2 partitions" in capsys.readouterr().out

    # --topic filter, --max-records and --dry-run (no file written)
    dry = tmp_path / "dry.bundle"
    argv = [
        "create",
        *base,
        "--topic",
        "audit",
        "--max-records",
        "7",
        "--dry-run",
        "--out",
        str(dry),
    ]
    assert bundle_cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "7 records in 1 partitions" in printed
    assert "93 more offsets are open" in printed
    assert not dry.exists()

    assert bundle_cli.main(["show", str(out), "--key-file", str(key_file)]) == 0
    assert "100-199" in capsys.readouterr().out


def test_resend_reports_deleted_offsets_and_sends_the_rest(
    upstream_kafka: Any,
    ring: tuple[Path, KeyRing],
    tmp_path: Path,
    udp_sink: socket.socket,
    capsys: pytest.CaptureFixture[str],
    group_id: str,
) -> None:
    key_file, keyring = ring
    topic = create_topic(upstream_kafka, partitions=2)
    produce_records(
        upstream_kafka,
        topic,
        [
            Record(key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2,
                   headers=(("h", b"x"),) if i % 3 == 0 else ())
            for i in range(200)
        ],
    )  # fmt: skip
    # Partition 0 holds 100 records (offsets 0..99); DeleteRecords moves its log start to 30.
    admin = AdminClient({"bootstrap.servers": upstream_kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 30)]).values():
        future.result(30)
    # A live sender's committed offsets, which the resend must not move.
    live = Consumer({"bootstrap.servers": upstream_kafka.bootstrap, "group.id": group_id})
    live.commit(
        offsets=[TopicPartition(topic, 0, 42), TopicPartition(topic, 1, 7)], asynchronous=False
    )

    bundle = _signed(
        tmp_path, keyring,
        [(topic, 0, 10, 19), (topic, 0, 25, 40), (topic, 0, 90, 99), (topic, 0, 120, 121),
         (topic, 1, 0, 4), (topic, 1, 60, 60)],
    )  # fmt: skip
    code = _resend(upstream_kafka.bootstrap, udp_sink, key_file, "--bundle", str(bundle))
    out = capsys.readouterr().out
    assert code == resend_cli.EXIT_UNRECOVERABLE, out
    assert "deleted upstream (below log start 30): 10-19, 25-29" in out
    assert "beyond the log end (100): 120-121" in out
    assert "UNRECOVERABLE: 17 offsets" in out  # 10 + 5 + 2 offsets

    events = _drain(udp_sink, keyring)
    got = _records(events)
    expected = {(topic, 0, o) for o in [*range(30, 41), *range(90, 100)]}
    expected |= {(topic, 1, o) for o in [0, 1, 2, 3, 4, 60]}
    assert set(got) == expected
    rec = got[(topic, 1, 60)]
    assert (rec.key, rec.value) == (b"k121", b"v121")
    assert got[(topic, 0, 30)].value == b"v60"
    assert got[(topic, 0, 30)].headers == (("h", b"x"),)
    markers = [e for e in events if isinstance(e, ResendMarker)]
    assert [m.phase for m in markers] == ["start", "end"]
    assert {m.bundle_id for m in markers} == {"it-bundle"}
    assert markers[-1].records_sent == len(expected)

    committed = live.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    assert [tp.offset for tp in committed] == [42, 7]
    live.close()


def test_resend_by_offset_and_time_range(
    upstream_kafka: Any,
    ring: tuple[Path, KeyRing],
    udp_sink: socket.socket,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key_file, keyring = ring
    topic = create_topic(upstream_kafka, partitions=1)
    base_ts = 1_700_000_000_000
    produce_records(
        upstream_kafka,
        topic,
        [Record(key=None, value=f"v{i}".encode(), timestamp=base_ts + i * 1000) for i in range(50)],
    )
    args = ["--topic", topic, "--partition", "0", "--from-offset", "5", "--to-offset", "9"]
    assert _resend(upstream_kafka.bootstrap, udp_sink, key_file, *args) == 0
    assert sorted(o for _, _, o in _records(_drain(udp_sink, keyring))) == [5, 6, 7, 8, 9]
    assert "all requested records were sent" in capsys.readouterr().out

    # records 10..14 have timestamps base+10 s .. base+14 s (inclusive bounds)
    args = ["--topic", topic, "--from-time", str(base_ts + 10_000), "--to-time",
            str(base_ts + 14_000)]  # fmt: skip
    assert _resend(upstream_kafka.bootstrap, udp_sink, key_file, *args) == 0
    assert sorted(o for _, _, o in _records(_drain(udp_sink, keyring))) == [10, 11, 12, 13, 14]


def test_empty_bundle_sends_nothing_and_succeeds(
    upstream_kafka: Any, ring: tuple[Path, KeyRing], tmp_path: Path, udp_sink: socket.socket
) -> None:
    key_file, keyring = ring
    bundle = _signed(tmp_path, keyring, [])
    assert _resend(upstream_kafka.bootstrap, udp_sink, key_file, "--bundle", str(bundle)) == 0
    assert _drain(udp_sink, keyring) == []


# -- the whole loop --------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.chaos
def test_full_loop_gaps_bundle_resend_exactly_once(
    upstream_kafka: Any, downstream_kafka: Any, tmp_path: Path
) -> None:
    from kafka_diode.pipeline import Pipeline, PipelineSpec  # noqa: PLC0415  heavy imports

    spec = PipelineSpec(
        records=6000,
        topics=("orders", "audit_log"),
        partitions=2,
        profile="lossy-5",
        seed=7,
        heartbeat_interval=0.5,
        window_size=1000,
        gap_emit_interval=1.0,
    )
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as pipe:
        pipe.setup()
        pipe.start_components()
        assert pipe.produce() == spec.records
        verdict = pipe.wait_settled(timeout=300)
        assert verdict.promise_kept, verdict.line()
        assert verdict.open_gaps > 0, "5 % loss must leave gaps for the resend to fill"
        # a resend over the same lossy link can lose records again, so it goes with copies, as an
        # operator's would (4 copies at 5 % loss: 6e-6 of its datagrams lost, ~3 % that one of
        # ~5,300 records needs another pass); once the verdict has stood still for three gap
        # scans (and then some), the next pass carries what is still open
        settled_for = 3 * spec.gap_emit_interval + 10
        for _ in range(4):
            pipe.resend_pass(copies=4)
            verdict = pipe.wait_settled(timeout=180, want_ok=True, stable_for=settled_for)
            if verdict.ok:
                break
        assert verdict.ok, verdict.line()
        assert verdict.exactly_once == spec.records

        # a second bundle is empty
        again = tmp_path / "second.bundle"
        code = bundle_cli.main(
            ["create", "--bootstrap-servers", pipe.ep.downstream, "--gap-topic", pipe.ep.gap_topic,
             "--key-file", str(pipe.ep.key_file), "--out", str(again)],
        )  # fmt: skip
        assert code == 0
        assert json.loads(again.read_text())["record_count"] == 0
