"""Golden vector of the key announcement (tests/vectors/announce_v1.json, made by
scripts/make_announce_vectors.py, printed in docs/protocol.md §7.5)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fastavro import schemaless_reader

from common.wire.announce import (
    ANNOUNCEMENT_SCHEMA,
    SUITE,
    AnnouncementVerifier,
    build_announcement,
    hpke_info,
)
from common.wire.envelope import ENVELOPE_SCHEMA
from common.wire.pubkey import ReceiverKeyPair, ReceiverKeys, SigningKey, TrustedKeys

V = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "announce_v1.json").read_text("utf-8")
)
RECEIVER = ReceiverKeyPair.from_private(
    X25519PrivateKey.from_private_bytes(bytes.fromhex(V["receiver_private_hex"]))
)
SIGNER = SigningKey.from_private(
    Ed25519PrivateKey.from_private_bytes(bytes.fromhex(V["signing_seed_hex"])), name="high-1"
)
DATAGRAM = bytes.fromhex(V["datagram_hex"])
SESSION = bytes.fromhex(V["session_id_hex"])


def test_keys_and_fingerprints_match_the_vector() -> None:
    assert RECEIVER.public.hex() == V["receiver_public_hex"]
    assert RECEIVER.fingerprint.hex() == V["receiver_fingerprint_hex"]
    assert SIGNER.public.hex() == V["signing_public_hex"]
    assert SIGNER.fingerprint.hex() == V["signing_fingerprint_hex"]


def test_the_library_opens_the_spelled_out_rfc_9180_seal() -> None:
    info = hpke_info(
        SESSION, int(V["key_id"], 16), V["epoch"], SIGNER.fingerprint, RECEIVER.fingerprint
    )
    assert info.hex() == V["hpke_info_hex"]
    opened = SUITE.decrypt(bytes.fromhex(V["hpke"]["sealed"]), RECEIVER.private, info=info)
    assert opened.hex() == V["session_key_hex"]


def test_the_encoder_reproduces_the_datagram() -> None:
    built = build_announcement(
        signing_key=SIGNER,
        receiver_fingerprint=RECEIVER.fingerprint,
        session_id=SESSION,
        epoch=V["epoch"],
        key_id=int(V["key_id"], 16),
        issued_at_ms=V["issued_at_ms"],
        not_before_ms=V["not_before_ms"],
        not_after_ms=V["not_after_ms"],
        sealed=bytes.fromhex(V["hpke"]["sealed"]),
    )
    assert built == DATAGRAM


def test_the_verifier_learns_the_session_key_and_fastavro_reads_the_datagram() -> None:
    verifier = AnnouncementVerifier(ReceiverKeys([RECEIVER]), TrustedKeys([SIGNER.public_entry()]))
    learned = verifier.verify(DATAGRAM, V["issued_at_ms"] + 1000)
    assert learned.key.material.hex() == V["session_key_hex"]
    assert f"{learned.key.key_id:08x}" == V["key_id"]
    envelope = schemaless_reader(io.BytesIO(DATAGRAM), ENVELOPE_SCHEMA, None)
    body = schemaless_reader(io.BytesIO(envelope["payload"]), ANNOUNCEMENT_SCHEMA, None)
    assert body["not_after_ms"] == V["not_after_ms"]
    assert body["sealed_key"].hex() == V["hpke"]["sealed"]


def test_protocol_md_prints_the_vector() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text("utf-8")
    assert V["datagram_hex"] in "".join(text.split())
