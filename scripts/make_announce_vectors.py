"""Regenerate the golden vectors of the key announcement (tests/vectors/announce_v1.json).

Run on purpose only, when the announcement format changes:

    .venv/bin/python scripts/make_announce_vectors.py

HPKE is randomised (a fresh ephemeral key per seal), so ``cryptography``'s API cannot reproduce a
vector. This script therefore seals with a *fixed* ephemeral key by following RFC 9180 step by
step (DHKEM(X25519, HKDF-SHA256) Encap, KeySchedule in base mode, Seal with sequence 0), written
out below from the RFC; the test then opens the vector with ``cryptography``'s HPKE, which proves
the spelled-out steps and the library agree, and rebuilds the datagram byte for byte (Ed25519 is
deterministic). Another implementation can check itself against every intermediate printed here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.wire.announce import build_announcement, hpke_info  # noqa: E402  after sys.path
from common.wire.keyring import Key  # noqa: E402
from common.wire.pubkey import ReceiverKeyPair, SigningKey  # noqa: E402

OUT = ROOT / "tests" / "vectors" / "announce_v1.json"
RECEIVER_PRIVATE_HEX = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
SIGNING_SEED_HEX = "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
EPHEMERAL_PRIVATE_HEX = "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
SESSION_KEY_HEX = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
SESSION_HEX = "6b6166b12d64696f64652d766563746f"
EPOCH = 2
ISSUED_MS = 1_700_000_000_000
NOT_AFTER_MS = ISSUED_MS + 7_202_000

KEM_ID, KDF_ID, AEAD_ID = 0x0020, 0x0001, 0x0002
KEM_SUITE = b"KEM" + KEM_ID.to_bytes(2, "big")
HPKE_SUITE = b"HPKE" + b"".join(i.to_bytes(2, "big") for i in (KEM_ID, KDF_ID, AEAD_ID))


def extract(salt: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()


def expand(prk: bytes, info: bytes, length: int) -> bytes:
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes((i,)), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def labeled_extract(suite: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return extract(salt, b"HPKE-v1" + suite + label + ikm)


def labeled_expand(suite: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    return expand(prk, length.to_bytes(2, "big") + b"HPKE-v1" + suite + label + info, length)


def raw(key: X25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def seal(pk_r: X25519PublicKey, sk_e: X25519PrivateKey, info: bytes, pt: bytes) -> dict[str, str]:
    """RFC 9180 §4.1 Encap, §5.1 KeySchedule (mode_base), §5.2 Seal (seq 0), aad empty."""
    enc = raw(sk_e.public_key())
    dh = sk_e.exchange(pk_r)
    kem_context = enc + raw(pk_r)
    eae_prk = labeled_extract(KEM_SUITE, b"", b"eae_prk", dh)
    shared_secret = labeled_expand(KEM_SUITE, eae_prk, b"shared_secret", kem_context, 32)
    psk_id_hash = labeled_extract(HPKE_SUITE, b"", b"psk_id_hash", b"")
    info_hash = labeled_extract(HPKE_SUITE, b"", b"info_hash", info)
    context = b"\x00" + psk_id_hash + info_hash
    secret = labeled_extract(HPKE_SUITE, shared_secret, b"secret", b"")
    key = labeled_expand(HPKE_SUITE, secret, b"key", context, 32)
    base_nonce = labeled_expand(HPKE_SUITE, secret, b"base_nonce", context, 12)
    ct = AESGCM(key).encrypt(base_nonce, pt, b"")
    return {
        "enc": enc.hex(),
        "shared_secret": shared_secret.hex(),
        "key_schedule_context": context.hex(),
        "key": key.hex(),
        "base_nonce": base_nonce.hex(),
        "sealed": (enc + ct).hex(),
    }


def main() -> int:
    receiver = ReceiverKeyPair.from_private(
        X25519PrivateKey.from_private_bytes(bytes.fromhex(RECEIVER_PRIVATE_HEX))
    )
    signer = SigningKey.from_private(
        Ed25519PrivateKey.from_private_bytes(bytes.fromhex(SIGNING_SEED_HEX)), name="high-1"
    )
    key = Key.from_material(bytes.fromhex(SESSION_KEY_HEX))
    session = bytes.fromhex(SESSION_HEX)
    info = hpke_info(session, key.key_id, EPOCH, signer.fingerprint, receiver.fingerprint)
    steps = seal(
        X25519PublicKey.from_public_bytes(receiver.public),
        X25519PrivateKey.from_private_bytes(bytes.fromhex(EPHEMERAL_PRIVATE_HEX)),
        info,
        key.material,
    )
    datagram = build_announcement(
        signing_key=signer,
        receiver_fingerprint=receiver.fingerprint,
        session_id=session,
        epoch=EPOCH,
        key_id=key.key_id,
        issued_at_ms=ISSUED_MS,
        not_before_ms=ISSUED_MS,
        not_after_ms=NOT_AFTER_MS,
        sealed=bytes.fromhex(steps["sealed"]),
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    doc = {
        "provenance": (
            "generated by scripts/make_announce_vectors.py (RFC 9180 spelled out, fixed ephemeral "
            f"key) at commit {commit or 'unknown'}; do not edit by hand"
        ),
        "receiver_private_hex": RECEIVER_PRIVATE_HEX,
        "receiver_public_hex": receiver.public.hex(),
        "receiver_fingerprint_hex": receiver.fingerprint.hex(),
        "signing_seed_hex": SIGNING_SEED_HEX,
        "signing_public_hex": signer.public.hex(),
        "signing_fingerprint_hex": signer.fingerprint.hex(),
        "ephemeral_private_hex": EPHEMERAL_PRIVATE_HEX,
        "session_key_hex": SESSION_KEY_HEX,
        "key_id": f"{key.key_id:08x}",
        "session_id_hex": SESSION_HEX,
        "epoch": EPOCH,
        "issued_at_ms": ISSUED_MS,
        "not_before_ms": ISSUED_MS,
        "not_after_ms": NOT_AFTER_MS,
        "hpke_info_hex": info.hex(),
        "hpke": steps,
        "datagram_hex": datagram.hex(),
    }
    OUT.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
