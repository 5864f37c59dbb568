"""Fixtures of the public-key mode tests: fixed key pairs, a sender schedule, a receiver decoder."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from common.wire import WireConfig
from common.wire.announce import (
    AnnounceConfig,
    AnnouncementVerifier,
    KeyAnnouncer,
    build_announcement,
    seal_session_key,
)
from common.wire.keyring import Key
from common.wire.pubkey import (
    RECEIVER,
    PublicKey,
    ReceiverKeyPair,
    ReceiverKeys,
    SigningKey,
    TrustedKeys,
)
from common.wire.pubkey_decoder import PublicKeyDecoder, PublicKeyReceiveConfig

RECEIVER_PAIR = ReceiverKeyPair.from_private(X25519PrivateKey.from_private_bytes(bytes(range(32))))
OTHER_PAIR = ReceiverKeyPair.from_private(X25519PrivateKey.from_private_bytes(bytes([7] * 32)))
SENDER = SigningKey.from_private(
    Ed25519PrivateKey.from_private_bytes(bytes(range(32, 64))), name="high-1"
)
STRANGER = SigningKey.from_private(
    Ed25519PrivateKey.from_private_bytes(bytes([9] * 32)), name="stranger"
)
SESSION = bytes(range(200, 216))
T0_MS = 1_700_000_000_000


def public(pair: ReceiverKeyPair) -> PublicKey:
    return PublicKey(RECEIVER, pair.public, pair.fingerprint, "low")


def verifier(**kw) -> AnnouncementVerifier:
    return AnnouncementVerifier(
        ReceiverKeys([RECEIVER_PAIR]), TrustedKeys([SENDER.public_entry()]), **kw
    )


def decoder(config: WireConfig | None = None, **pk) -> PublicKeyDecoder:
    skew = pk.pop("max_clock_skew", 300.0)
    v = verifier(max_clock_skew=skew)
    dec = PublicKeyDecoder(config or WireConfig(), v, PublicKeyReceiveConfig(**pk))
    dec.sync_clock(T0_MS, 0.0)
    return dec


def announcer(**kw) -> KeyAnnouncer:
    config = AnnounceConfig(**{"session_key_interval": 10.0, "announce_lead": 1.0, **kw})
    return KeyAnnouncer(config, SENDER, public(RECEIVER_PAIR), session_id=SESSION)


def announcement(
    *,
    key: Key | None = None,
    signer: SigningKey = SENDER,
    pair: ReceiverKeyPair = RECEIVER_PAIR,
    epoch: int = 0,
    session: bytes = SESSION,
    not_before_ms: int = T0_MS,
    not_after_ms: int = T0_MS + 60_000,
    sealed: bytes | None = None,
) -> tuple[Key, bytes]:
    key = key or Key.generate()
    if sealed is None:
        sealed = seal_session_key(
            key, public(pair), session_id=session, epoch=epoch, sender_fp=signer.fingerprint
        )
    data = build_announcement(
        signing_key=signer,
        receiver_fingerprint=pair.fingerprint,
        session_id=session,
        epoch=epoch,
        key_id=key.key_id,
        issued_at_ms=not_before_ms,
        not_before_ms=not_before_ms,
        not_after_ms=not_after_ms,
        sealed=sealed,
    )
    return key, data
