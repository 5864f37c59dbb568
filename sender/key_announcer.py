"""The sender's public-key mode glue: key files in, announcements out (docs/sender.md).

The schedule is ``common.wire.announce.KeyAnnouncer`` (pure). Here: load the signing key and the
receiver's public key (``ConfigError`` naming the key when unusable), and a task that asks the
announcer what is due and queues it as a control datagram (``SendPipeline.announcements``, to every
target port), which the send scheduler sends ahead of the data within the replay window's margin.
Used by the live sender and by resend: each session announces its own keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.errors import ConfigError, KeyRingError
from common.wire.announce import KeyAnnouncer
from common.wire.pubkey import TrustedKeys, format_fingerprint
from runtime.key_files import load_receiver_public, load_signing_key, load_trusted

if TYPE_CHECKING:
    from sender.config import SenderConfig
    from sender.send_pipeline import SendPipeline

log = logging.getLogger(__name__)

#: Longest sleep of the announce task: it also notices a byte-count rotation this often.
_MAX_SLEEP = 0.5


def load_announcer(config: SenderConfig, session_id: bytes) -> KeyAnnouncer | None:
    """The session-key schedule of the public-key mode, or None in shared-key mode.

    Raises:
        ConfigError: the signing key or the receiver public key file is unusable.
    """
    if config.signing_key_file is None:
        return None
    assert config.receiver_public_key_file is not None
    try:
        signing = load_signing_key(config.signing_key_file)
    except KeyRingError as exc:
        raise ConfigError(
            "signing_key_file", str(exc), "run 'kafka-diode keygen --signing'"
        ) from exc
    try:
        receiver = load_receiver_public(config.receiver_public_key_file)
    except KeyRingError as exc:
        raise ConfigError(
            "receiver_public_key_file", str(exc), "copy the receiver's .pub file here"
        ) from exc
    log.info(
        "public-key mode: signing as %s, sealing to receiver key %s",
        format_fingerprint(signing.fingerprint),
        format_fingerprint(receiver.fingerprint),
    )
    return KeyAnnouncer(config.announce_config(), signing, receiver, session_id=session_id)


def load_bundle_trust(config: SenderConfig) -> TrustedKeys | None:
    """The low side's bundle signing keys (public-key mode), or None.

    Raises:
        ConfigError: the file is unusable.
    """
    if config.bundle_trusted_keys_file is None:
        return None
    try:
        return load_trusted(config.bundle_trusted_keys_file)
    except KeyRingError as exc:
        raise ConfigError("bundle_trusted_keys_file", str(exc)) from exc


def wall_ms() -> int:
    """Unix time in milliseconds (validity windows are in wall time)."""
    return int(time.time() * 1000)


async def announce_loop(
    announcer: KeyAnnouncer, pipeline: SendPipeline, clock: Callable[[], float]
) -> None:
    """Forever: queue what the announcer has due (repeats, new keys) ahead of the data."""
    epoch = announcer.epoch
    while True:
        await asyncio.sleep(max(0.001, min(_MAX_SLEEP, announcer.next_deadline() - clock())))
        out = announcer.poll(clock(), wall_ms(), pipeline.bytes_sent)
        if out:
            pipeline.announcements(out)
        if announcer.epoch != epoch:
            epoch = announcer.epoch
            log.info(
                "session key epoch %d in use (key %08x)", epoch, announcer.keyring.active.key_id
            )
