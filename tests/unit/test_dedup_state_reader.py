"""What a Python worker keeps of the direct layout's state records is bounded, and what the
workers of one executor share through files is checked before it is used
(``dedup/state_reader.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup import state_reader
from dedup.writer_settings import WriterSettings

SETTINGS = WriterSettings(
    bootstrap_servers="127.0.0.1:9",
    clean_topic="clean.{topic}",
    gap_topic="gaps",
    progress_topic="progress",
    state_topic="state",
    transactional_id="txn",
)


@pytest.fixture(autouse=True)
def _empty(monkeypatch):
    monkeypatch.setattr(state_reader, "_kept", type(state_reader._kept)())
    monkeypatch.setattr(state_reader, "MAX_KEPT_BYTES", 1000)
    monkeypatch.setattr(state_reader, "shared_dir", None)


def kept() -> dict[bytes, int]:
    return {place[3]: k.end for place, k in state_reader._kept.items()}


def test_the_least_recent_records_go_first_when_the_bytes_are_spent() -> None:
    for i in range(4):
        state_reader.remember(SETTINGS, b"k%d" % i, 0, 10 + i, b"x" * 300)
    assert kept() == {b"k1": 11, b"k2": 12, b"k3": 13}
    state_reader.remember(SETTINGS, b"k1", 0, 20, b"y" * 10)  # replaced, newest now
    state_reader.remember(SETTINGS, b"k4", 0, 14, b"x" * 600)
    assert kept() == {b"k3": 13, b"k1": 20, b"k4": 14}


def test_a_record_over_the_bound_is_not_kept_and_drops_the_older_one() -> None:
    state_reader.remember(SETTINGS, b"k", 0, 5, b"x" * 10)
    state_reader.remember(SETTINGS, b"k", 0, 7, b"x" * 1001)
    assert kept() == {}


def test_forget_and_places_are_per_partition() -> None:
    state_reader.remember(SETTINGS, b"k", 0, 5, b"a")
    state_reader.remember(SETTINGS, b"k", 1, 6, b"b")
    state_reader.forget(SETTINGS, b"k", 0)
    assert list(state_reader._kept) == [("127.0.0.1:9", "state", 1, b"k")]


def another_worker() -> None:
    """What a worker forked from the same daemon keeps of its own: nothing yet."""
    state_reader._kept.clear()


def test_a_record_one_worker_committed_is_found_by_another_while_the_end_holds(
    tmp_path: Path,
) -> None:
    state_reader.share(tmp_path)
    state_reader.remember(SETTINGS, b"k", 3, 10, b"state")
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 3, 12) is None  # the partition moved on
    assert state_reader.kept_value(SETTINGS, b"k", 3, 10) == b"state"
    assert state_reader.kept_value(SETTINGS, b"k", 4, 10) is None  # another partition's
    # a newer commit by the second worker replaces the file for the first
    state_reader.remember(SETTINGS, b"k", 3, 12, b"newer")
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 3, 12) == b"newer"
    assert len(list(tmp_path.iterdir())) == 1  # one file per place, replaced whole


def test_without_a_shared_directory_a_worker_keeps_its_own_only() -> None:
    state_reader.remember(SETTINGS, b"k", 0, 10, b"state")
    assert state_reader.kept_value(SETTINGS, b"k", 0, 10) == b"state"
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 0, 10) is None


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_shared_file_is_dropped_and_the_partition_read(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    state_reader.share(tmp_path)
    state_reader.remember(SETTINGS, b"k", 0, 10, b"state record")
    (path,) = tmp_path.iterdir()
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-1] ^= 1
    elif damage == "truncate":
        del data[-3:]
    else:
        data.clear()
    path.write_bytes(bytes(data))
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 0, 10) is None
    assert not path.exists()
    assert "unreadable shared state file" in caplog.text


def test_forget_drops_the_shared_record_too(tmp_path: Path) -> None:
    state_reader.share(tmp_path)
    state_reader.remember(SETTINGS, b"k", 0, 10, b"state")
    state_reader.forget(SETTINGS, b"k", 0)
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 0, 10) is None
    assert list(tmp_path.iterdir()) == []


def test_a_record_over_the_shared_bound_stays_in_its_worker_and_drops_the_older_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_reader, "MAX_SHARED_BYTES", 100)
    state_reader.share(tmp_path)
    state_reader.remember(SETTINGS, b"k", 0, 10, b"x" * 100)
    assert len(list(tmp_path.iterdir())) == 1
    state_reader.remember(SETTINGS, b"k", 0, 12, b"x" * 101)
    assert list(tmp_path.iterdir()) == []
    assert state_reader.kept_value(SETTINGS, b"k", 0, 12) == b"x" * 101  # its own worker's
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 0, 12) is None


def test_a_shared_directory_that_is_gone_costs_a_read_never_a_task(tmp_path: Path) -> None:
    state_reader.share(tmp_path / "gone")
    state_reader.remember(SETTINGS, b"k", 0, 10, b"state")  # no error
    assert state_reader.kept_value(SETTINGS, b"k", 0, 10) == b"state"
    another_worker()
    assert state_reader.kept_value(SETTINGS, b"k", 0, 10) is None
