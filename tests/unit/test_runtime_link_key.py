"""runtime.link_key: one loader and one watcher for the link key of every command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.errors import ConfigError
from common.wire import Key, KeyRing
from runtime import key_files, link_key


def _ring_file(path: Path) -> KeyRing:
    key = Key.generate()
    ring = KeyRing([key], active=key.key_id)
    key_files.write_keyring(ring, path, overwrite=True)
    return ring


def test_a_key_file_a_password_or_nothing() -> None:
    assert link_key.load(key_file=None, password=None, salt="") is None
    derived = link_key.load(key_file=None, password="correct horse", salt="00" * 16)
    again = link_key.load(key_file=None, password="correct horse", salt="00" * 16)
    assert derived is not None
    assert again is not None
    assert derived.active.material == again.active.material


def test_the_file_loads(tmp_path: Path) -> None:
    written = _ring_file(tmp_path / "link.key")
    ring = link_key.load(key_file=tmp_path / "link.key", password=None, salt="")
    assert ring is not None
    assert ring.active.key_id == written.active.key_id


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"key_file": Path("/nonexistent/link.key"), "password": None, "salt": ""}, "key_file"),
        ({"key_file": None, "password": "pw", "salt": "not hex"}, "salt"),
    ],
)
def test_a_bad_key_names_the_setting(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        link_key.load(**kwargs)  # type: ignore[arg-type]
    assert info.value.key == named


def test_a_malformed_file_names_key_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("{not a key ring")
    with pytest.raises(ConfigError) as info:
        link_key.load(key_file=bad, password=None, salt="")
    assert info.value.key == "key_file"


def test_the_watch_swaps_keys_in_place_and_keeps_the_ring_on_a_broken_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "link.key"
    first = _ring_file(path)
    live = key_files.read_keyring(path)
    watch = link_key.KeyFileWatch(path, live)
    assert not watch.changed()
    second = _ring_file(path)
    os.utime(path, ns=(1, 1))  # a distinct mtime even on a coarse clock
    assert watch.changed()
    assert watch.reload("test")
    assert live.active.key_id == second.active.key_id != first.active.key_id
    assert not watch.changed()
    path.write_text("broken")
    os.utime(path, ns=(2, 2))
    assert watch.changed()
    assert not watch.reload("test")
    assert live.active.key_id == second.active.key_id  # the working ring stays
    assert not watch.changed()  # seen: not retried on every check until it changes again
    assert (watch.reloads, watch.reload_errors) == (1, 1)
