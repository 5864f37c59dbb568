"""The receiver's public-key glue: key files loaded, the trusted list reloaded without restart,
a broken file leaving the previous keys in use."""

from __future__ import annotations

import os

import pytest

from common.errors import ConfigError
from common.wire import DropReason
from common.wire.pubkey import (
    RECEIVER,
    SIGNING,
    ReceiverKeys,
    public_keys_document,
    receiver_keys_document,
)
from common.wire.pubkey_decoder import KeyLearned
from receiver.config import ReceiverConfig
from receiver.pubkey_glue import PublicKeyGlue
from runtime.key_files import write_key_file
from tests.pubkey_support import RECEIVER_PAIR, SENDER, STRANGER, T0_MS, announcement, public
from tests.wire_support import drain


def _config(tmp_path) -> ReceiverConfig:
    keys, trusted = tmp_path / "receiver.key", tmp_path / "trusted.pub"
    write_key_file(keys, receiver_keys_document(ReceiverKeys([RECEIVER_PAIR])), private=True)
    write_key_file(trusted, public_keys_document(SIGNING, [SENDER.public_entry()]), private=False)
    return ReceiverConfig(receiver_key_file=keys, trusted_senders_file=trusted)


def _touch_later(path) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_new_trusted_sender_is_accepted_after_the_file_changes(tmp_path) -> None:
    config = _config(tmp_path)
    glue = PublicKeyGlue(config, config.wire_config())
    glue.tick(T0_MS, 0.0)
    dec = glue.decoder
    _, by_stranger = announcement(signer=STRANGER)
    dec.receive_datagram(by_stranger, 0.0)
    assert [e.reason for e in drain(dec)] == [DropReason.UNTRUSTED_SIGNER]
    assert config.trusted_senders_file is not None
    write_key_file(
        config.trusted_senders_file,
        public_keys_document(SIGNING, [SENDER.public_entry(), STRANGER.public_entry()]),
        private=False,
        overwrite=True,
    )
    _touch_later(config.trusted_senders_file)
    glue.tick(T0_MS, 0.0, check_files=False)  # SIGHUP-only mode: not yet
    dec.receive_datagram(by_stranger, 0.0)
    assert [e.reason for e in drain(dec)] == [DropReason.UNTRUSTED_SIGNER]
    glue.tick(T0_MS, 0.0)
    assert glue.reloads == 1
    dec.receive_datagram(by_stranger, 0.0)
    assert [type(e) for e in drain(dec)] == [KeyLearned]


def test_a_broken_file_keeps_the_previous_keys(tmp_path) -> None:
    config = _config(tmp_path)
    glue = PublicKeyGlue(config, config.wire_config())
    assert config.receiver_key_file is not None
    config.receiver_key_file.write_text("{not json")
    _touch_later(config.receiver_key_file)
    glue.tick(T0_MS, 0.0)
    assert glue.reload_errors == 1
    glue.decoder.receive_datagram(announcement()[1], 0.0)
    assert [type(e) for e in drain(glue.decoder)] == [KeyLearned]


def test_a_receiver_public_file_is_not_a_trusted_list(tmp_path) -> None:
    config = _config(tmp_path)
    assert config.trusted_senders_file is not None
    write_key_file(
        config.trusted_senders_file,
        public_keys_document(RECEIVER, [public(RECEIVER_PAIR)]),
        private=False,
        overwrite=True,
    )
    with pytest.raises(ConfigError, match="trusted_senders_file"):
        PublicKeyGlue(config, config.wire_config())
