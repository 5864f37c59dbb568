"""Key ring, key file, password derivation, keygen CLI and WireConfig validation."""

from __future__ import annotations

import io
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from common.errors import ConfigError, KeyRingError
from common.wire import Key, KeyRing, WireConfig, derive_key, format_key_id, fragment_capacity
from kafka_diode import keygen
from runtime import key_files


def test_key_id_is_derived_and_material_never_printed() -> None:
    key = Key.from_material(b"\x01" * 32)
    assert key.key_id == Key.from_material(b"\x01" * 32).key_id != 0
    assert "01" * 4 not in repr(key)
    ring = KeyRing([key])
    assert (b"\x01" * 32).hex() not in repr(ring)
    assert ring.active is key
    with pytest.raises(KeyRingError):
        Key.from_material(b"short")


def test_ring_add_activate_remove_replace() -> None:
    a, b = Key.generate(), Key.generate()
    ring = KeyRing([a])
    ring.add(b)
    assert ring.active is a
    ring.activate(b.key_id)
    assert ring.active is b
    ring.remove(b.key_id)
    with pytest.raises(KeyRingError, match="no active key"):
        _ = ring.active
    assert ring.get(b.key_id) is None
    with pytest.raises(KeyRingError):
        ring.activate(b.key_id)
    other = KeyRing([b])
    ring.replace(other)
    assert ring.ids == (b.key_id,)
    assert ring.active is b


def test_key_file_round_trip_mode_and_no_overwrite(tmp_path) -> None:
    path = tmp_path / "keys.json"
    ring = KeyRing([Key.generate(), Key.generate()])
    key_files.write_keyring(ring, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = key_files.read_keyring(path)
    assert loaded.ids == ring.ids
    assert loaded.active.material == ring.active.material
    with pytest.raises(KeyRingError, match="refusing"):
        key_files.write_keyring(ring, path)


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"kafka_diode_keyring": 2, "keys": []},
        {"kafka_diode_keyring": 1, "keys": []},
        {"kafka_diode_keyring": 1, "keys": [{"key": "zz"}]},
        {"kafka_diode_keyring": 1, "keys": [{"key": "00" * 31}]},
        {"kafka_diode_keyring": 1, "keys": [{"key": "01" * 32, "id": "00000001"}]},
        {"kafka_diode_keyring": 1, "keys": [{"key": "01" * 32}], "active": "00000001"},
    ],
)
def test_bad_key_files(tmp_path, doc) -> None:
    path = tmp_path / "k.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyRingError):
        key_files.read_keyring(path)
    path.write_text("{not json")
    with pytest.raises(KeyRingError):
        key_files.read_keyring(path)
    with pytest.raises(KeyRingError):
        key_files.read_keyring(tmp_path / "missing.json")


def test_password_derivation_is_deterministic() -> None:
    salt = b"s" * 16
    k1 = derive_key("correct horse", salt, n=1 << 10)
    assert k1 == derive_key(b"correct horse", salt, n=1 << 10)
    assert k1 != derive_key("correct horse", b"t" * 16, n=1 << 10)
    assert len(k1) == 32
    with pytest.raises(KeyRingError):
        derive_key("", salt)
    with pytest.raises(KeyRingError):
        derive_key("pw", b"short")
    with pytest.raises(KeyRingError):
        derive_key("pw", salt, n=1000)  # not a power of two


def test_keygen_writes_0600_refuses_overwrite_and_adds(tmp_path, capsys) -> None:
    path = tmp_path / "ring.json"
    assert keygen.main(["--out", str(path)]) == 0
    first = capsys.readouterr().out.strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key_files.read_keyring(path).ids == (int(first, 16),)
    assert keygen.main(["--out", str(path)]) == 1
    assert "exists" in capsys.readouterr().err
    assert keygen.main(["--out", str(path), "--add"]) == 0
    second = capsys.readouterr().out.strip()
    ring = key_files.read_keyring(path)
    assert [format_key_id(i) for i in ring.ids] == [first, second]
    assert format_key_id(ring.active.key_id) == second
    assert keygen.main(["--out", str(path), "--force"]) == 0
    assert len(key_files.read_keyring(path)) == 1


def test_keygen_password_same_salt_same_key(tmp_path, capsys, monkeypatch) -> None:
    ids = []
    for name in ("a.json", "b.json"):
        monkeypatch.setattr("sys.stdin", io.StringIO("secret words\n"))
        args = ["--out", str(tmp_path / name), "--password", "--salt", "ab" * 16]
        assert keygen.main([*args, "--scrypt-n", "1024"]) == 0
        ids.append(capsys.readouterr().out.strip())
    assert ids[0] == ids[1]
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["keys"][0]["kdf"] == {"name": "scrypt", "salt": "ab" * 16, "n": 1024, "r": 8, "p": 1}
    assert "secret" not in (tmp_path / "a.json").read_text()


def test_default_config_fits_ipv4_and_ipv6_mtu() -> None:
    config = WireConfig()
    assert config.max_datagram_size == 1500 - 40 - 8
    assert fragment_capacity(config.max_datagram_size) == 1452 - 44 - 2 - 16
    assert config.max_record_size >= 16 * 1024 * 1024


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"max_datagram_size": 65508}, "max_datagram_size"),
        ({"max_datagram_size": 100}, "max_datagram_size"),
        ({"compression": "lz4"}, "compression"),
        ({"compression_level": 0}, "compression_level"),
        ({"max_message_size": 16 * 1024 * 1024}, "max_message_size"),
        ({"max_decompressed_size": 1}, "max_decompressed_size"),
        ({"max_fragments": 100}, "max_fragments"),
        ({"max_fragments": 70000}, "max_fragments"),
        ({"max_reassemblies": 0}, "max_reassemblies"),
        ({"max_reassembly_bytes": 10}, "max_reassembly_bytes"),
        ({"reassembly_timeout": 0}, "reassembly_timeout"),
        ({"linger": -1}, "linger"),
        ({"replay_window": 10}, "replay_window"),
        ({"max_sessions": 0}, "max_sessions"),
        ({"max_record_size": "big"}, "max_record_size"),
    ],
)
def test_config_validation_names_the_key(kwargs, key) -> None:
    with pytest.raises(ConfigError) as info:
        WireConfig(**kwargs)
    assert info.value.key == key
    assert info.value.fix


def test_keygen_add_keeps_the_owner_group_and_mode_of_the_key_file(tmp_path, capsys) -> None:
    path = tmp_path / "ring.json"
    assert keygen.main(["--out", str(path)]) == 0
    os.chmod(path, 0o640)  # read by the service user's group
    owner = (os.getuid(), os.getgid())
    if os.geteuid() == 0:
        owner = (54321, 54322)  # a service user other than the one running keygen
        os.chown(path, *owner)
    assert keygen.main(["--out", str(path), "--add"]) == 0
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert (st.st_uid, st.st_gid) == owner
    assert len(key_files.read_keyring(path)) == 2
    assert not [p for p in tmp_path.iterdir() if p.name != "ring.json"]  # no temporary left


def test_keygen_add_refuses_a_key_file_others_can_read_and_changes_nothing(
    tmp_path, capsys
) -> None:
    path = tmp_path / "ring.json"
    assert keygen.main(["--out", str(path)]) == 0
    capsys.readouterr()
    os.chmod(path, 0o644)
    before = path.read_bytes()
    assert keygen.main(["--out", str(path), "--add"]) == 1
    assert "chmod o-rwx" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_key_ring_write_refuses_modes_for_others_and_unpermitted_owners(tmp_path) -> None:
    ring = KeyRing([Key.generate()])
    with pytest.raises(KeyRingError, match="other users"):
        key_files.write_keyring(ring, tmp_path / "a.json", mode=0o644)
    assert not (tmp_path / "a.json").exists()
    if os.geteuid() != 0:
        with pytest.raises(KeyRingError, match="nothing was changed"):
            key_files.write_keyring(ring, tmp_path / "b.json", owner=(0, 0))
        assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_keygen_add_by_a_user_who_cannot_keep_the_owner_changes_nothing(capsys) -> None:
    # The file belongs to a service user; "nobody" may read it through the group and write the
    # directory, but cannot give a new file that owner: keygen must fail, not lock the owner out.
    with tempfile.TemporaryDirectory() as tmp:  # pytest's tmp_path is not traversable by others
        _keygen_as_nobody(Path(tmp), capsys)


def _keygen_as_nobody(workdir: Path, capsys) -> None:
    os.chmod(workdir, 0o777)
    path = workdir / "ring.json"
    key_files.write_keyring(KeyRing([Key.generate()]), path, mode=0o640, owner=(54321, 65534))
    before = path.read_bytes()
    groups = os.getgroups()
    os.setgroups([])
    os.setegid(65534)
    os.seteuid(65534)  # effective ids only: root gets them back below
    try:
        code = keygen.main(["--out", str(path), "--add"])
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)
    assert code == 1
    assert "nothing was changed" in capsys.readouterr().err
    assert path.read_bytes() == before
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (54321, 65534, 0o640)
    assert [p.name for p in workdir.iterdir()] == ["ring.json"]
