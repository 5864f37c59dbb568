"""Resend bundles in the public-key mode: signed by the low side's Ed25519 key, verified on the
high side with its public half; HMAC bundles are unchanged."""

from __future__ import annotations

import json

import pytest

from common import bundle as bundle_format
from common.errors import BundleError, ConfigError
from common.wire.pubkey import SigningKey, TrustedKeys
from runtime.bundle_files import BundleKeyConfig, read_bundle
from tests.pubkey_support import SENDER, STRANGER

BUNDLE = bundle_format.build(
    [("orders", 0, 5, 9), ("orders", 0, 20, 20), ("audit", 3, 1, 1)],
    bundle_id="abc123",
    created_at_ms=1_700_000_000_000,
)
LOW = SigningKey.generate(name="low-side")


def test_a_signed_bundle_verifies_with_the_low_side_public_key() -> None:
    data = bundle_format.sign_ed25519(BUNDLE, LOW)
    assert json.loads(data)["auth"]["alg"] == "Ed25519"
    assert bundle_format.verify(data, {}, trusted=TrustedKeys([LOW.public_entry()])) == BUNDLE


def test_a_signed_bundle_is_refused_when_altered_untrusted_or_without_trust() -> None:
    data = bundle_format.sign_ed25519(BUNDLE, LOW)
    trusted = TrustedKeys([LOW.public_entry()])
    altered = data.replace(b'"abc123"', b'"abc124"')
    with pytest.raises(BundleError, match="altered"):
        bundle_format.verify(altered, {}, trusted=trusted)
    with pytest.raises(BundleError, match="not a trusted"):
        bundle_format.verify(data, {}, trusted=TrustedKeys([STRANGER.public_entry()]))
    with pytest.raises(BundleError, match="bundle_trusted_keys_file"):
        bundle_format.verify(data, {1: bytes(32)})
    forged = bundle_format.sign_ed25519(BUNDLE, STRANGER)  # signed by someone else entirely
    doc = json.loads(forged)
    doc["auth"]["key"] = json.loads(data)["auth"]["key"]  # claiming to be the low side
    with pytest.raises(BundleError, match="altered"):
        bundle_format.verify(json.dumps(doc).encode(), {}, trusted=trusted)


def test_resend_reads_signed_bundles_with_its_trusted_keys(tmp_path) -> None:
    path = tmp_path / "gaps.bundle"
    path.write_bytes(bundle_format.sign_ed25519(BUNDLE, LOW))
    assert read_bundle(path, None, TrustedKeys([LOW.public_entry()])) == BUNDLE
    with pytest.raises(BundleError, match="bundle_trusted_keys_file"):
        read_bundle(path, None, None)
    with pytest.raises(BundleError, match="not a trusted"):
        read_bundle(path, None, TrustedKeys([SENDER.public_entry()]))


def test_bundle_key_config_takes_exactly_one_kind_of_key(tmp_path) -> None:
    with pytest.raises(ConfigError, match="exclude each other"):
        BundleKeyConfig(key_file=tmp_path / "a", signing_key_file=tmp_path / "b")
    config = BundleKeyConfig(signing_key_file=tmp_path / "missing")
    with pytest.raises(ConfigError, match="signing_key_file"):
        config.signing_key()
