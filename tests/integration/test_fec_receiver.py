"""The real receiver process with FEC: lost sources rebuilt, hostile repairs dropped by reason.

Sources and repairs are built in-process (wire ``Encoder`` + ``FecEncoder`` with the receiver's
key) and sent over UDP to ``kafka-diode receive``; every tenth source is "lost" (never sent).
Before each genuine repair go its forged, truncated and bit-flipped versions; after all of them,
authentic repairs with absurd block fields (a keyholder's forgery) and a copy of every repair.
The receiver must count each hostile datagram under its reason, stay up, rebuild every lost
source, and write every record to the raw topic exactly once.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from common.wire import Encoder, KeyRing, WireConfig
from common.wire.envelope import HEADER_SIZE
from common.wire.fec import FEC_HEADER, SCHEME_ZFEC_RS, FecConfig, FecEncoder, is_repair
from tests.integration.receiver_process import ReceiverProcess, write_key_file
from tests.kafka_helpers import consume_all, wait_until

pytestmark = pytest.mark.kafka

RECORDS = 1500
FEC = FecConfig(overhead=30, block_size=16, interleave=1)  # the losses below are per block


def _build(ring: KeyRing, session: bytes) -> tuple[list[bytes], list[bytes], FecEncoder]:
    size = 1452 - FEC.overhead_bytes
    enc = Encoder(WireConfig(max_datagram_size=size), ring, session_id=session)
    fec = FecEncoder(FEC, ring, session_id=session, max_source_size=size)
    wire: list[bytes] = []
    sources: list[bytes] = []
    value = os.urandom(300)
    for i in range(RECORDS):
        for d in enc.add("t", i % 4, i, 1_700_000_000_000 + i, 1, b"k%d" % i, value, (), 0.0):
            sources.append(d.data)
            wire += [d.data, *fec.add(d.data, 0, 0.0)]
    for d in enc.flush():
        sources.append(d.data)
        wire += [d.data, *fec.add(d.data, 0, 0.0)]
    wire += [r for _, r in fec.flush()]
    return sources, wire, fec


def test_receiver_rebuilds_lost_datagrams_and_drops_hostile_repairs(
    downstream_kafka, kafka_topic, tmp_path: Path
) -> None:
    raw_topic = kafka_topic(downstream_kafka, partitions=2)
    key_file = tmp_path / "keys.json"
    ring = write_key_file(key_file)
    session = os.urandom(16)
    sources, wire, fec = _build(ring, session)
    lost = set(sources[3::10])
    expected: dict[str, int] = {}
    stream: list[bytes] = []

    def bad(reason: str, data: bytes) -> None:
        expected[reason] = expected.get(reason, 0) + 1
        stream.append(data)

    repairs = [d for d in wire if is_repair(d)]
    for n, d in enumerate(wire):
        if d in lost:
            continue
        if is_repair(d) and n % 3 == 0:
            flipped = bytearray(d)
            flipped[HEADER_SIZE + 5 + n % 50] ^= 0x10
            bad("fec_auth_failed", bytes(flipped))
            bad("fec_malformed", d[:-7])  # truncated: the payload length no longer fits
            bad("fec_auth_failed", d[: HEADER_SIZE + 3] + os.urandom(len(d) - HEADER_SIZE - 3))
        stream.append(d)
    for d in repairs:
        bad("fec_duplicate", d)  # the copies of --copies 2
    # authentic repairs (sealed with the key) with absurd fields, repair sequences after the rest
    absurd = [
        FEC_HEADER.pack(10, SCHEME_ZFEC_RS, 0, 1, 0, 100, 1) + b"\x01",  # k = 0
        FEC_HEADER.pack(10, SCHEME_ZFEC_RS, 200, 100, 0, 100, 200) + bytes(25),  # k + m > 256
        FEC_HEADER.pack(10, SCHEME_ZFEC_RS, 2, 1, 0, 100, 2) + b"\x01",  # bitmap lacks a member
        FEC_HEADER.pack(10, 9, 1, 1, 0, 100, 1) + b"\x01",  # unknown scheme
    ]
    for head in absurd:
        bad(
            "fec_malformed", fec._seal(memoryview(head + bytes(100)))
        )  # hostile input needs the sealer
    with ReceiverProcess(downstream_kafka.bootstrap, raw_topic, tmp_path, key_file=key_file) as rx:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for d in stream:
                sock.sendto(d, ("127.0.0.1", rx.port))
        finally:
            sock.close()
        wait_until(lambda: rx.metric("datagrams_total") >= len(stream), 60, message="all read")
        wait_until(lambda: rx.metric("delivered_records_total") >= RECORDS, 60, message="written")
        assert rx.alive()
        assert rx.metric("kernel_drops_total") == 0
        assert rx.drops() == expected
        assert rx.metric("fec_datagrams_reconstructed_total") == len(lost)
        assert rx.metric("fec_blocks_unrecoverable_total") == 0
        assert rx.metric("fec_blocks_recovered_total") > 0
        assert rx.terminate() == 0
    consumed = consume_all(
        downstream_kafka, raw_topic, expected_count=RECORDS, timeout=60, expand_runs=True
    )
    assert sorted(r.key.decode() for r in consumed) == sorted(
        f"t:{i % 4}:{i}" for i in range(RECORDS)
    )
