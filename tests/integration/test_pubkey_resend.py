"""Resend in the public-key mode against real brokers and a real UDP socket: the low side signs
the bundle with its Ed25519 key, the high side verifies it with the public half, and the resend
session announces its own session key, which a receiver learns before decoding the records."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from common.gap_record import GapReport, GapState, gap_key, gap_value
from common.wire import RecordBatch, ResendMarker, WireConfig
from common.wire.announce import AnnouncementVerifier
from common.wire.pubkey import (
    RECEIVER,
    SIGNING,
    PublicKey,
    ReceiverKeyPair,
    ReceiverKeys,
    SigningKey,
    TrustedKeys,
    public_keys_document,
    signing_key_document,
)
from common.wire.pubkey_decoder import KeyLearned, PublicKeyDecoder
from dedup import bundle_cli
from runtime.key_files import write_key_file
from sender import resend_cli
from tests.kafka_helpers import Record, create_topic, produce_records

pytestmark = pytest.mark.kafka


def _write_signing(tmp_path: Path, name: str) -> tuple[SigningKey, Path, Path]:
    key = SigningKey.generate(name=name)
    private, public = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
    write_key_file(private, signing_key_document(key), private=True)
    write_key_file(public, public_keys_document(SIGNING, [key.public_entry()]), private=False)
    return key, private, public


def test_signed_bundle_to_resend_to_a_public_key_receiver(
    upstream_kafka: Any, downstream_kafka: Any, tmp_path: Path
) -> None:
    pair = ReceiverKeyPair.generate()
    receiver_pub = tmp_path / "receiver.pub"
    write_key_file(
        receiver_pub,
        public_keys_document(RECEIVER, [PublicKey(RECEIVER, pair.public, pair.fingerprint)]),
        private=False,
    )
    sender, sender_key, _ = _write_signing(tmp_path, "high-1")
    _, bundle_key, bundle_pub = _write_signing(tmp_path, "low-bundles")
    _, _, stranger_pub = _write_signing(tmp_path, "stranger")
    source = create_topic(upstream_kafka, partitions=1)
    produce_records(upstream_kafka, source, [b"v-%d" % i for i in range(50)])
    gap_topic = create_topic(downstream_kafka, partitions=1, config={"cleanup.policy": "compact"})
    report = GapReport(
        topic=source, partition=0, first=10, last=29, state=GapState.OPEN,
        detected_at=1, reported_at=2,
    )  # fmt: skip
    gap = Record(key=gap_key(report), value=gap_value(report))
    produce_records(downstream_kafka, gap_topic, [gap])
    bundle_path = tmp_path / "gaps.bundle"
    assert bundle_cli.main([
        "create", "--bootstrap-servers", downstream_kafka.bootstrap, "--gap-topic", gap_topic,
        "--signing-key-file", str(bundle_key), "--out", str(bundle_path),
    ]) == 0  # fmt: skip
    assert b'"Ed25519"' in bundle_path.read_bytes()

    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sink.bind(("127.0.0.1", 0))
    sink.setblocking(False)
    base = [
        "--bootstrap-servers", upstream_kafka.bootstrap,
        "--target", f"127.0.0.1:{sink.getsockname()[1]}",
        "--signing-key-file", str(sender_key), "--receiver-public-key-file", str(receiver_pub),
        "--no-progress", "--loop", "asyncio", "--bundle", str(bundle_path),
    ]  # fmt: skip
    try:
        untrusted = resend_cli.main([*base, "--bundle-trusted-keys-file", str(stranger_pub)])
        assert untrusted == resend_cli.EXIT_BAD_BUNDLE
        assert resend_cli.main([*base, "--bundle-trusted-keys-file", str(bundle_pub)]) == 0
        decoder = PublicKeyDecoder(
            WireConfig(),
            AnnouncementVerifier(ReceiverKeys([pair]), TrustedKeys([sender.public_entry()])),
        )
        decoder.sync_clock(time.time() * 1000, time.monotonic())
        events: list[Any] = []
        while True:
            try:
                data = sink.recv(65536)
            except BlockingIOError:
                break
            decoder.receive_datagram(data, time.monotonic())
            while (event := decoder.next_event()) is not None:
                events.append(event)
    finally:
        sink.close()
    assert isinstance(events[0], KeyLearned)  # the announcement went out first
    offsets = sorted(r.offset for e in events if isinstance(e, RecordBatch) for r in e.records)
    assert offsets == list(range(10, 30))
    assert [e.phase for e in events if isinstance(e, ResendMarker)] == ["start", "end"]
    assert not decoder.drops, decoder.drops
