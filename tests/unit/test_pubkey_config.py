"""Configuration of the public-key mode on both sides: keys named, modes exclusive."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from receiver.config import ReceiverConfig
from sender.config import SenderConfig

SENDER = {"bootstrap_servers": "k:9092", "target": "127.0.0.1:9470", "topics": ("t",)}


def test_sender_public_key_mode_needs_both_files_and_excludes_key_file() -> None:
    cfg = SenderConfig(
        **SENDER, signing_key_file=Path("s.key"), receiver_public_key_file=Path("r.pub")
    )
    assert cfg.announce_config().session_key_interval == 3600
    with pytest.raises(ConfigError, match="receiver_public_key_file"):
        SenderConfig(**SENDER, signing_key_file=Path("s.key"))
    with pytest.raises(ConfigError, match="exclude each other"):
        SenderConfig(
            **SENDER,
            key_file=Path("k"),
            signing_key_file=Path("s.key"),
            receiver_public_key_file=Path("r.pub"),
        )
    with pytest.raises(ConfigError, match="announce_lead"):
        SenderConfig(
            **SENDER,
            signing_key_file=Path("s.key"),
            receiver_public_key_file=Path("r.pub"),
            session_key_interval=2,
            announce_lead=2,
        )


def test_receiver_public_key_mode_needs_both_files_and_excludes_key_file() -> None:
    cfg = ReceiverConfig(receiver_key_file=Path("r.key"), trusted_senders_file=Path("t.pub"))
    assert cfg.pubkey_config().hold_datagrams == 4096
    with pytest.raises(ConfigError, match="trusted_senders_file"):
        ReceiverConfig(receiver_key_file=Path("r.key"))
    with pytest.raises(ConfigError, match="receiver_key_file"):
        ReceiverConfig(
            key_file=Path("k"), receiver_key_file=Path("r.key"), trusted_senders_file=Path("t")
        )
    with pytest.raises(ConfigError, match="hold_timeout"):
        ReceiverConfig(
            receiver_key_file=Path("r.key"), trusted_senders_file=Path("t"), hold_timeout=-1
        )
