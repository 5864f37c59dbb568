"""The raw topic layout (docs/topics.md) and the loss report's ranges."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from common.wire import Heartbeat, Record
from receiver.loss_report import LossReport, format_ranges
from receiver.raw_format import (
    PROVENANCE_HEADERS,
    heartbeat_records,
    parse_raw_key,
    raw_headers,
    raw_key,
)

SESSION = bytes(range(16))


def _record(**kw) -> Record:
    base = {
        "topic": "orders.eu",
        "partition": 3,
        "offset": 1048576,
        "timestamp": 1700000000123,
        "timestamp_type": 1,
        "key": b"k",
        "value": b"v",
        "headers": (("h1", b"x"), ("diode.key", None), ("h1", b"y")),
    }
    base.update(kw)
    return Record(**base)


def test_key_format_and_parse() -> None:
    assert raw_key("orders.eu", 3, 1048576) == "orders.eu:3:1048576"
    assert parse_raw_key(b"orders.eu:3:1048576") == ("orders.eu", 3, 1048576)


def test_headers_are_source_then_exactly_four_provenance() -> None:
    record = _record()
    headers = raw_headers(record, SESSION.hex().encode())
    assert headers[:3] == list(record.headers)  # order and duplicates kept, diode.* untouched
    assert tuple(name for name, _ in headers[3:]) == PROVENANCE_HEADERS
    assert headers[3:] == [
        ("diode.key", b"k"),
        ("diode.timestamp", b"1700000000123"),
        ("diode.timestamp-type", b"1"),
        ("diode.session", b"000102030405060708090a0b0c0d0e0f"),
    ]


def test_null_and_empty_keys_stay_distinct() -> None:
    assert raw_headers(_record(key=None), b"s")[-4] == ("diode.key", None)
    assert raw_headers(_record(key=b""), b"s")[-4] == ("diode.key", b"")


def test_heartbeat_records() -> None:
    beat = Heartbeat(
        session_id=SESSION,
        sequence=9,
        sender_id="s1",
        started_at_ms=1,
        sent_at_ms=2,
        high_offsets=(("a", 0, 10), ("b:x", 5, 7)),
        low_offsets=(("b:x", 5, 0), ("a", 0, 3)),
        counters=(),
    )
    rows = list(heartbeat_records(beat))
    assert [(t, p, k) for t, p, k, _ in rows] == [("a", 0, "a:0:10"), ("b:x", 5, "b:x:5:7")]
    assert json.loads(rows[0][3]) == {
        "type": "heartbeat",
        "sender_id": "s1",
        "session": SESSION.hex(),
        "started_at_ms": 1,
        "sent_at_ms": 2,
        "high_offset": 10,
        "low_offset": 3,
    }
    assert json.loads(rows[1][3])["low_offset"] == 0


def test_loss_report_merges_ranges() -> None:
    report = LossReport()
    for offset in [5, 6, 7, 10, 9, 1, 8, 7]:
        report.add("t", 0, offset)
    report.add("u", 2, 100)
    records, unlisted, ranges = report.take()
    assert records == 9
    assert unlisted == 0
    assert ranges == [("t", 0, 1, 1), ("t", 0, 5, 10), ("u", 2, 100, 100)]
    assert format_ranges(ranges) == "t:0:1, t:0:5-10, u:2:100"
    assert not report


@given(st.lists(st.integers(0, 300), max_size=200))
def test_loss_report_never_under_reports(offsets) -> None:
    report = LossReport(max_ranges_per_partition=8)
    for offset in offsets:
        report.add("t", 1, offset)
    _, _, ranges = report.take()
    covered = {o for _, _, first, last in ranges for o in range(first, last + 1)}
    assert set(offsets) <= covered
    assert len(ranges) <= 8


def test_loss_report_bounds_partitions() -> None:
    report = LossReport(max_partitions=2)
    for p in range(5):
        report.add("t", p, 0)
    records, unlisted, ranges = report.take()
    assert (records, unlisted, len(ranges)) == (5, 3, 2)
