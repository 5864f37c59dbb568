"""``kafka-diode keygen`` in the public-key modes (in process, through ``main``)."""

from __future__ import annotations

import os
import stat

from common.wire.pubkey import format_fingerprint
from kafka_diode.keygen import main
from runtime.key_files import (
    load_receiver_keys,
    load_receiver_public,
    load_signing_key,
    load_trusted,
)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_receiver_pair_then_rotation_with_add(tmp_path, capsys) -> None:
    out = tmp_path / "receiver.key"
    assert main(["--receiver", "--out", str(out)]) == 0
    first = capsys.readouterr().out.split()[-1]
    assert _mode(out) == 0o600
    assert _mode(tmp_path / "receiver.pub") == 0o644
    assert format_fingerprint(load_receiver_public(tmp_path / "receiver.pub").fingerprint) == first
    assert main(["--receiver", "--out", str(out)]) == 1  # exists: refused without --add/--force
    assert main(["--receiver", "--add", "--out", str(out)]) == 0
    second = capsys.readouterr().out.split()[-1]
    assert {format_fingerprint(p.fingerprint) for p in load_receiver_keys(out)} == {first, second}
    assert format_fingerprint(load_receiver_public(tmp_path / "receiver.pub").fingerprint) == second


def test_signing_keys_merge_into_a_trusted_list_and_show_prints_fingerprints(
    tmp_path, capsys
) -> None:
    for name in ("a", "b"):
        assert main(["--signing", "--name", name, "--out", str(tmp_path / f"{name}.key")]) == 0
    capsys.readouterr()
    trusted = tmp_path / "trusted.pub"
    args = ["--merge", str(tmp_path / "a.pub"), str(tmp_path / "b.pub"), "--out", str(trusted)]
    assert main(args) == 0
    assert sorted(k.name for k in load_trusted(trusted)) == ["a", "b"]
    capsys.readouterr()
    assert main(["--show", str(tmp_path / "a.key")]) == 0
    shown = capsys.readouterr().out
    assert format_fingerprint(load_signing_key(tmp_path / "a.key").fingerprint) in shown
    assert main(["--show", str(tmp_path / "missing")]) == 1
    assert main(["--signing", "--receiver", "--out", str(tmp_path / "x")]) == 1


def test_the_shared_key_mode_is_unchanged(tmp_path, capsys) -> None:
    assert main(["--out", str(tmp_path / "link.key")]) == 0
    assert len(capsys.readouterr().out.strip()) == 8  # the key id, as before
