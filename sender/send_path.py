"""The send path, built once for ``send`` and ``resend`` alike: socket, encoder, pipeline, keys.

``resend`` promises the same wire path and pacing as ``send`` (docs/resend.md); building both
here keeps that promise by construction instead of by two copies kept alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from common.wire import Encoder, KeyRing
from common.wire.announce import KeyAnnouncer
from common.wire.reed_solomon import ACCELERATION
from sender.config import SenderConfig
from sender.key_announcer import load_announcer, wall_ms
from sender.pacing import Pacer
from sender.send_pipeline import SendPipeline
from sender.transport import UdpSender

logger = logging.getLogger(__name__)

#: Resuming paused partitions takes librdkafka 0.5-1 s here (the fetch restarts), so the
#: backlog's low-water mark (half the bound) must hold more than that at the paced rate, or the
#: link idles while Kafka wakes up (measured: docs/sender.md, "Backpressure").
RESUME_SLACK_SECONDS = 3.0


def backlog_bound(cfg: SenderConfig) -> int:
    """The backlog bound in force: ``max_backlog_bytes``, raised to 3 s of the byte rate."""
    by_rate = max(cfg.rate_bytes, cfg.rate_datagrams * cfg.max_datagram_size)
    return max(cfg.max_backlog_bytes, int(RESUME_SLACK_SECONDS * by_rate))


@dataclass(frozen=True, slots=True)
class SendPath:
    """What a sending session holds; close ``udp`` when done."""

    udp: UdpSender
    pipeline: SendPipeline
    """The one entrance for records, withheld offsets and control messages (it owns the
    session's encoder)."""
    keyring: KeyRing | None
    """The ring the encoder seals with (``None`` in cleartext; the announcer's in public-key
    mode)."""
    announcer: KeyAnnouncer | None
    """Public-key mode: the session-key schedule; None otherwise."""


def open_send_path(
    cfg: SenderConfig,
    session_id: bytes,
    keyring: KeyRing | None,
    *,
    loop: asyncio.AbstractEventLoop,
    clock: Callable[[], float],
    on_pressure: Callable[[bool], None],
) -> SendPath:
    """Open the UDP socket and build the session's pipeline (and the encoder it owns).

    ``keyring``: the shared-key ring (ignored in public-key mode, where the announcer makes the
    session keys; its first announcements are queued before anything else).

    Raises:
        ConfigError: signing or receiver key file, target or bind address unusable.
    """
    announcer = load_announcer(cfg, session_id)  # public-key mode (sender/key_announcer.py)
    first = announcer.start(clock(), wall_ms()) if announcer is not None else []
    if announcer is not None:
        keyring = announcer.keyring
    udp = UdpSender(
        cfg.targets(), bind=cfg.bind_address(), send_buffer=cfg.send_buffer, gso=cfg.udp_gso
    )
    encoder = Encoder(cfg.wire_config(), keyring, session_id=session_id, topic_map=cfg.topic_map())
    fec = cfg.fec_encoder(keyring, session_id)
    if fec is not None:
        # ten times the CPU per repair without ISA-L: worth one line when FEC is on
        logger.info("FEC repair arithmetic: %s", ACCELERATION)
    pipeline = SendPipeline(
        encoder=encoder,
        pacer=Pacer(cfg.pacing_config(), clock()),
        udp=udp,
        loop=loop,
        copies=cfg.copies,
        copy_spacing=cfg.copy_spacing,
        replay_window=cfg.replay_window,
        max_backlog_bytes=backlog_bound(cfg),
        on_pressure=on_pressure,
        clock=clock,
        fec=fec,
    )
    pipeline.announcements(first)
    return SendPath(udp=udp, pipeline=pipeline, keyring=keyring, announcer=announcer)
