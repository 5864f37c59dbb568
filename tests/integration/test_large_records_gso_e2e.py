"""Large records through UDP GSO and GRO with real brokers, under sustained load.

The sender's default (``udp_gso`` on) with 10 KB and 100 KB records, into a receiver with its
default (``udp_gro`` on) and with GRO off (one datagram per read), at 1452-byte datagrams and at a
jumbo-frame link's 8952 (payload lengths of three bytes): a backlog of ~50 MB waits
upstream before the sender starts (deeper than four replay windows in datagrams), the sender
empties it paced (``--rate-bytes``), one GSO ``sendmsg`` per run of fragments; the receiver reads
the runs coalesced (its ``socket_coalesced_reads`` counter says the runs were GSO runs read whole,
``coalesced_messages`` that their records were decoded in one call each, and both stay 0 with GRO
off) and writes the raw topic. Every record must be there exactly
once, byte for byte, with no datagram dropped anywhere: not by the kernel, not by the decoder.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.receiver_process import ReceiverProcess, start_sender, write_key_file
from tests.kafka_helpers import Record, consume_all, produce_records, wait_until

pytestmark = pytest.mark.kafka

REPLAY_WINDOW = 8192  # the receiver's default
SMALL, LARGE = 10_000, 100_000
#: 3,000 x 10 KB and 200 x 100 KB (every 16th record): ~50 MB, ~36,000 datagrams of 1452 bytes
RECORDS = 3200
RATE = 25_000_000  # bytes/s: the backlog leaves in ~2 s, paced


@pytest.mark.parametrize(
    ("gro", "datagram_size"),
    [(False, 1452), (True, 1452), (True, 8952)],
    ids=["gro-off", "gro-on", "gro-on-jumbo"],
)
def test_large_records_through_gso_and_gro_arrive_exactly_once(
    gro, datagram_size, upstream_kafka, downstream_kafka, kafka_topic, group_id, tmp_path
):
    source = kafka_topic(upstream_kafka, partitions=3)
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    pool = [os.urandom(LARGE) for _ in range(4)]
    records = [
        Record(
            key=b"k-%d" % i,
            value=pool[i % 4][: LARGE if i % 16 == 0 else SMALL - (i % 7)],
            partition=i % 3,
        )
        for i in range(RECORDS)
    ]
    positions = produce_records(upstream_kafka, source, records, timeout=120)
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    with ReceiverProcess(
        downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file,
        extra=["--udp-gro", str(gro).lower()],
    ) as rx:  # fmt: skip
        sender = start_sender(
            upstream_kafka.bootstrap, rx.port, source, group_id, key_file,
            tmp_path / "sender.log", "--rate-bytes", str(RATE), "--heartbeat-interval", "1",
            "--max-datagram-size", str(datagram_size),
        )  # fmt: skip
        try:
            wait_until(lambda: rx.metric("records_total") >= RECORDS, 120, message="records read")
            wait_until(
                lambda: rx.metric("delivered_records_total") >= RECORDS, 60, message="written"
            )
        finally:
            sender.send_signal(signal.SIGTERM)
            assert sender.wait(60) == 0
        metrics = rx.metrics()
        assert rx.drops() == {}
        assert rx.metric("kernel_drops_total") == 0
        assert rx.metric("delivery_errors_total") == 0
        # the backlog was deep: four replay windows of datagrams (one at jumbo datagrams)
        assert rx.metric("datagrams_total") >= 4 * REPLAY_WINDOW * 1452 // datagram_size
        coalesced = sum(
            value
            for (name, _), value in metrics.items()
            if name == "kafka_diode_receiver_socket_coalesced_reads_total"
        )
        whole = rx.metric("coalesced_messages_total")
        if gro:
            assert coalesced > 0, "no GSO run was read coalesced: GSO or GRO is not in use"
            assert whole > 0, "no large record was decoded whole from its coalesced read"
        else:
            assert coalesced == 0
            assert whole == 0
        assert rx.terminate() == 0
    consumed = consume_all(downstream_kafka, raw_topic, timeout=60, expand_runs=True)
    data: dict[tuple[int, int], list[bytes | None]] = {}
    for r in consumed:
        if r.headers and r.headers[-1][0] == "diode.control":
            continue
        _, partition, offset = r.key.decode().rsplit(":", 2)
        data.setdefault((int(partition), int(offset)), []).append(r.value)
    assert len(data) == RECORDS
    for record, (partition, offset) in zip(records, positions, strict=True):
        assert data[partition, offset] == [record.value], (partition, offset)
