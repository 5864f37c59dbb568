"""What a Python worker keeps of the direct layout's state records is bounded
(``dedup/state_reader.py``)."""

from __future__ import annotations

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
