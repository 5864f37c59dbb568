"""One sender spread over two receiver ports (``target_ports`` -> ``listen_ports``), for real.

The sending end is the sender's own ``SendPipeline`` and ``UdpSender`` (encoder, copies, the
per-message choice of port) on real UDP sockets; the receiving end is ``kafka-diode receive`` as a
real process listening on two ports, in one process or with one worker process per port, writing
to a real downstream broker. Every record must reach the raw topic exactly once, every large
(fragmented) record must be reassembled where its fragments landed, and the redundant copies must
be dropped as duplicates by the socket they reached. The last test runs the whole real sender
(``python -m sender --target-ports``, copies 2) from an upstream broker into two worker processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.wire import Encoder, WireConfig
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.verify import read_topic
from sender.heartbeat import Beat
from sender.pacing import Pacer, PacingConfig
from sender.send_pipeline import SendPipeline
from sender.transport import UdpSender
from tests.integration.receiver_process import (
    ROOT,
    ReceiverProcess,
    free_udp_port,
    write_key_file,
)
from tests.kafka_helpers import Record, consume_all, produce_records, wait_until

pytestmark = pytest.mark.kafka

COUNT = 3000
COPIES = 2


def value_of(offset: int) -> bytes:
    """Every 50th record is large: a message of ~4 fragments at the default datagram size."""
    return offset.to_bytes(4, "big") * (1500 if offset % 50 == 0 else 30)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: list[dict], name: str, **labels: str) -> float:
    key = (f"kafka_diode_receiver_{name}", tuple(sorted(labels.items())))
    return sum(m.get(key, 0.0) for m in samples)


async def send_all(ports: tuple[int, int], ring) -> bytes:
    """Send COUNT records over both ports with COPIES copies, then a heartbeat; the session."""
    loop = asyncio.get_running_loop()
    session = os.urandom(16)
    udp = UdpSender([("127.0.0.1", p) for p in ports], send_buffer=4 << 20)
    pipeline = SendPipeline(
        encoder=Encoder(WireConfig(linger=0.002), ring, session_id=session),
        # paced: loopback into a Python receiver must not overflow its socket buffer
        pacer=Pacer(PacingConfig(datagrams_per_s=20_000, burst_seconds=0.01), loop.time()),
        udp=udp,
        loop=loop,
        copies=COPIES,
        max_backlog_bytes=64 << 20,
    )
    try:
        for offset in range(COUNT):
            pipeline.record(
                "orders", offset % 4, offset, 1_700_000_000_000, 1, None, value_of(offset), None
            )
        assert await pipeline.drain(60)
        high = tuple(sorted((t, p, o) for (t, p), o in pipeline.sent_high.items()))
        pipeline.heartbeat(
            Beat(
                sender_id="ports",
                started_at_ms=1,
                sent_at_ms=2,
                high_offsets=high,
                low_offsets=tuple((t, p, p) for t, p, _ in high),
                counters=(),
            )
        )
        assert await pipeline.drain(10)
        assert udp.errors == {}
    finally:
        pipeline.close()
        udp.close()
    return session


@pytest.mark.parametrize("workers", [False, True], ids=["one-process", "worker-per-port"])
def test_one_sender_over_two_ports_delivers_each_record_once(
    downstream_kafka, kafka_topic, tmp_path, workers: bool
):
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    second = free_udp_port()
    extra = ["--listen-ports", str(second), "--rcvbuf-bytes", str(16 << 20)]
    if workers:
        extra += ["--worker-processes", "true"]
    rx = ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=extra
    )
    with rx:
        # every worker says where it listens
        wait_until(lambda: rx.log().count("receiving on") >= (2 if workers else 1), 60)
        metrics_ports = [rx.metrics_port, rx.metrics_port + 1] if workers else [rx.metrics_port]
        session = asyncio.run(send_all((rx.port, second), ring))
        # Control messages go to every port: each worker takes the heartbeat once; one process
        # (one replay window) drops the second arrival as a duplicate.
        heartbeats = 2 if workers else 1

        def delivered() -> bool:
            m = [scrape(p) for p in metrics_ports]
            return total(m, "delivered_records_total") >= COUNT + heartbeats * 4

        wait_until(delivered, 60, message="delivered")
        samples = [scrape(p) for p in metrics_ports]
        assert total(samples, "records_total") == COUNT  # no copy decoded twice
        assert total(samples, "heartbeats_total") == heartbeats
        assert total(samples, "drops_total", reason="reassembly_timeout") == 0
        assert total(samples, "reassemblies_in_flight") == 0
        drops = {
            dict(labels)["reason"]
            for m in samples
            for (name, labels), value in m.items()
            if name == "kafka_diode_receiver_drops_total" and value
        }
        assert drops == {"duplicate"}  # the copies, each dropped where it landed
        datagrams = total(samples, "datagrams_total")
        expected_duplicates = datagrams / COPIES + (2 - heartbeats)
        assert total(samples, "drops_total", reason="duplicate") == expected_duplicates
        # each port carried a share, and each socket's metrics name its port
        for port in (rx.port, second):
            per_port = sum(
                value
                for m in samples
                for (name, labels), value in m.items()
                if name == "kafka_diode_receiver_socket_datagrams_total"
                and dict(labels)["port"] == str(port)
            )
            assert 0.3 * datagrams < per_port < 0.7 * datagrams
        assert rx.terminate() == 0
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60, expand_runs=True)
    data = [r for r in consumed if not any(n == "diode.control" for n, _ in r.headers)]
    keys = [r.key.decode() for r in data]
    assert sorted(keys) == sorted(f"orders:{o % 4}:{o}" for o in range(COUNT))  # exactly once
    for r in data:
        assert r.value == value_of(int(r.key.decode().rsplit(":", 1)[1]))
        assert dict(r.headers)["diode.session"] == session.hex().encode()


def test_real_sender_over_two_ports_into_two_workers(
    upstream_kafka, downstream_kafka, kafka_topic, group_id, tmp_path
):
    """``kafka-diode send --target-ports`` -> ``receive --listen-ports --worker-processes``."""
    source = kafka_topic(upstream_kafka, partitions=3)
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    records = [
        Record(
            key=f"key-{i}".encode(),
            value=value_of(i),
            headers=(),
            partition=i % 3,
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(1200)
    ]
    positions = produce_records(upstream_kafka, source, records)
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    second = free_udp_port()
    extra = ["--listen-ports", str(second), "--worker-processes", "true"]
    rx = ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file, extra=extra
    )
    with rx:
        wait_until(lambda: rx.log().count("receiving on") >= 2, 60)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIODE_SENDER_")}
        env["PYTHONPATH"] = str(ROOT)
        with (tmp_path / "sender.log").open("wb") as sender_log:
            sender = subprocess.Popen(
                [
                    sys.executable, "-m", "sender",
                    "--bootstrap-servers", upstream_kafka.bootstrap,
                    "--target", f"127.0.0.1:{rx.port}",
                    "--target-ports", str(second),
                    "--topics", source,
                    "--group-id", group_id,
                    "--start-position", "earliest",
                    "--key-file", str(key_file),
                    "--heartbeat-interval", "1",
                    "--copies", "2",
                    "--rate-datagrams", "5000",
                ],
                stdout=subprocess.DEVNULL, stderr=sender_log, env=env, cwd=ROOT,
            )  # fmt: skip
            try:
                ports = [rx.metrics_port, rx.metrics_port + 1]

                def each(name: str) -> list[float]:
                    return [total([scrape(p)], name) for p in ports]

                wait_until(lambda: sum(each("records_total")) >= 1200, 120, message="records")
                wait_until(lambda: min(each("heartbeats_total")) >= 2, 60, message="heartbeats")
                samples = [scrape(p) for p in ports]
            finally:
                sender.send_signal(signal.SIGTERM)
                sender.wait(60)
        assert total(samples, "records_total") == 1200  # each record decoded once overall
        assert min(total([m], "records_total") for m in samples) > 0  # both workers got a share
        reasons = {
            dict(labels)["reason"]
            for m in samples
            for (name, labels), value in m.items()
            if name == "kafka_diode_receiver_drops_total" and value
        }
        assert reasons <= {"duplicate"}  # no reassembly timeouts, no replays
        assert rx.terminate() == 0
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60, expand_runs=True)
    data = [r.key.decode() for r in consumed if not any(n == "diode.control" for n, _ in r.headers)]
    assert sorted(data) == sorted(f"{source}:{p}:{o}" for p, o in positions)


@pytest.mark.slow
@pytest.mark.spark
def test_a_fast_link_over_two_worker_processes_is_deduped_exactly_once_without_gaps(
    upstream_kafka, downstream_kafka, tmp_path
):
    """docs/operations.md's fast-link setting under load, through the dedup: ``target_ports`` =
    ``listen_ports`` with a worker process per port, ~200 MB at 20 MB/s. Each worker writes its
    own share and its own heartbeats into the raw topic; the dedup must still see each record
    once and no gap at any scan (a worker's heartbeat vouching for what the other carries would
    report false gaps)."""
    spec = PipelineSpec(
        records=60_000,
        value_size=200,
        value_size_max=20_000,
        profile=None,
        rate_bytes=20_000_000,
        receiver_ports=2,
        worker_processes=True,
        gap_emit_interval=2.0,
    )
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.start_with_backlog()
        verdict = p.wait_settled(timeout=600, want_ok=True)
        ports = [p.ep.metrics["receiver"], p.ep.metrics["receiver"] + 1]
        shares = [total([scrape(port)], "records_total") for port in ports]
        gaps = read_topic(p.ep.downstream, p.ep.gap_topic, committed_only=False)
    assert verdict.ok, verdict.line()
    assert verdict.exactly_once == spec.records
    assert min(shares) > 0, shares  # both workers carried a share
    assert gaps == [], f"{len(gaps)} gap records"
