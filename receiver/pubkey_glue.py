"""The receiver's public-key mode glue: key files in, reloads, events logged (docs/receiver.md).

The decoding is ``common.wire.pubkey_decoder`` (pure). This module loads the receiver's key pairs
and the trusted-sender list, reloads either when its modification time changes (or on SIGHUP)
without a restart (``runtime.file_watch``: a file that fails to load leaves the previous keys in
use), ties the decoder's monotonic clock to the wall clock each second, and logs learned and
retired keys.
"""

from __future__ import annotations

import logging
import time

from common.errors import ConfigError, KeyRingError
from common.wire.announce import AnnouncementVerifier
from common.wire.config import WireConfig
from common.wire.pubkey import format_fingerprint
from common.wire.pubkey_decoder import KeyLearned, KeyRetired, PublicKeyDecoder
from receiver.config import ReceiverConfig
from runtime.file_watch import FileReloader
from runtime.key_files import load_receiver_keys, load_trusted

log = logging.getLogger(__name__)


def load_verifier(config: ReceiverConfig) -> AnnouncementVerifier:
    """The verifier for the configured key files.

    Raises:
        ConfigError: a file is missing, unreadable or malformed (names its key).
    """
    assert config.receiver_key_file is not None
    assert config.trusted_senders_file is not None
    try:
        keys = load_receiver_keys(config.receiver_key_file)
    except KeyRingError as exc:
        raise ConfigError(
            "receiver_key_file", str(exc), "run 'kafka-diode keygen --receiver'"
        ) from exc
    try:
        trusted = load_trusted(config.trusted_senders_file)
    except KeyRingError as exc:
        raise ConfigError(
            "trusted_senders_file", str(exc), "copy the senders' .pub files ('keygen --merge')"
        ) from exc
    return AnnouncementVerifier(
        keys, trusted, max_clock_skew=config.max_clock_skew, max_sessions=config.max_sessions
    )


class PublicKeyGlue:
    """Owns the decoder's verifier files: loading, reloading, clock sync, event logging."""

    def __init__(self, config: ReceiverConfig, wire: WireConfig) -> None:
        assert config.receiver_key_file is not None
        assert config.trusted_senders_file is not None
        self._config = config
        self._files = FileReloader(
            (config.receiver_key_file, config.trusted_senders_file),
            lambda: load_verifier(config),
            self._swap,
            what="public-key files",
            kept="the previous keys stay",
            errors=(ConfigError,),
        )
        self.verifier = load_verifier(config)
        self.decoder = PublicKeyDecoder(wire, self.verifier, config.pubkey_config())
        self.decoder.sync_clock(time.time() * 1000.0, time.monotonic())
        self.keys_learned = 0
        self.keys_retired = 0
        log.info(
            "public-key mode: %d receiver key(s) %s, %d trusted sender(s) %s",
            len(self.verifier.receiver_keys),
            ", ".join(format_fingerprint(p.fingerprint) for p in self.verifier.receiver_keys),
            len(self.verifier.trusted),
            ", ".join(
                f"{k.name}={format_fingerprint(k.fingerprint)}" for k in self.verifier.trusted
            ),
        )

    def tick(self, wall_ms: float, now: float, *, check_files: bool = True) -> None:
        """Once a second: clock sync; with ``check_files``, reload a key file whose modification
        time changed."""
        self.decoder.sync_clock(wall_ms, now)
        if not check_files:
            return
        self._files.check("key file changed")

    @property
    def reloads(self) -> int:
        """Reloads of the key files that took effect."""
        return self._files.reloads

    @property
    def reload_errors(self) -> int:
        """Reloads that failed (the previous keys stayed)."""
        return self._files.reload_errors

    def reload(self, why: str) -> bool:
        """Re-read both files; keep the keys in use when either fails to load."""
        return self._files.reload(why)

    def _swap(self, fresh: AnnouncementVerifier) -> str:
        self.verifier.receiver_keys = fresh.receiver_keys
        self.verifier.trusted = fresh.trusted
        return (
            f": {len(fresh.receiver_keys)} receiver key(s), {len(fresh.trusted)} trusted sender(s)"
        )

    def on_event(self, event: KeyLearned | KeyRetired) -> None:
        """Count and log a learned or retired session key."""
        if isinstance(event, KeyLearned):
            self.keys_learned += 1
            log.info(
                "session key %08x learned: session %s epoch %d, signed by %s (%s), for receiver "
                "key %s, valid until %d ms; %d held datagram(s) released",
                event.key_id,
                event.session_id.hex(),
                event.epoch,
                event.signer or "?",
                format_fingerprint(event.signer_fingerprint),
                format_fingerprint(event.receiver_fingerprint),
                event.not_after_ms,
                event.released,
            )
        else:
            self.keys_retired += 1
            log.info("session key %08x retired (%s)", event.key_id, event.why)
