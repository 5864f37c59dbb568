"""The raw topic's layout (common/raw_topic.py): the receiver writes it, the dedup reads it.

The pins: the runs the receiver's sink hands the producer (layout v2) expand
(``common.raw_run.expand_run``) into exactly the v1 records ``raw_headers`` describes, and those
parse back, through the v1 reader, into exactly the source record (key, value, headers including
source ``diode.*`` names, timestamp).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.raw_topic import (
    PROVENANCE_HEADERS,
    heartbeat_records,
    parse_raw_key,
    raw_headers,
    raw_key,
    reset_record,
    restore,
)
from common.wire import Heartbeat, Record

PROVENANCE = PROVENANCE_HEADERS
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


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        (b"orders:3:1048576", ("orders", 3, 1048576)),
        (b"a.b-c_d:0:0", ("a.b-c_d", 0, 0)),
        (b"weird:name:1:2", ("weird:name", 1, 2)),  # split on the LAST two ':'
        (b"t:0:-1", ("t", 0, -1)),
        (b"t:0", None),
        (b":0:1", None),
        (b"t:x:1", None),
        (b"t:1:", None),
        (b"t:99999999999:1", None),
        (b"t:0:1 ", None),
        (None, None),
        (b"\xff:0:1", None),
    ],
)
def test_parse_raw_key(key: bytes | None, parsed: tuple[str, int, int] | None) -> None:
    assert parse_raw_key(key) == parsed


def test_restore_strips_exactly_the_trailing_provenance() -> None:
    source = [("h", None), ("diode.key", b"user header")]
    prov = [("diode.key", None), ("diode.timestamp", b"1700"), ("diode.timestamp-type", b"1"),
            ("diode.session", b"ab" * 16)]  # fmt: skip
    assert restore(source + prov) == (None, 1700, source)
    assert restore(prov) == (None, 1700, [])
    assert restore(prov[:3]) is None
    assert restore([*source, prov[1], prov[0], *prov[2:]]) is None
    assert restore([*prov[:1], ("diode.timestamp", b"soon"), *prov[2:]]) is None
    # the SQL classifier's rule exactly: whole value decimal, signed 64-bit
    for stamp in (b"12\n", b" 12", b"+12", b"1_2", b"9223372036854775808", b""):
        assert restore([*prov[:1], ("diode.timestamp", stamp), *prov[2:]]) is None, stamp
    assert restore([*prov[:1], ("diode.timestamp", b"-5"), *prov[2:]]) == (None, -5, [])
    assert tuple(n for n, _ in prov) == PROVENANCE


def test_a_reset_record_is_a_control_record_of_its_partition() -> None:
    key, value = reset_record("orders:eu", 4, "alice", 1700)
    assert parse_raw_key(key) == ("orders:eu", 4, 0)
    assert json.loads(value) == {"type": "reset", "requested_by": "alice", "at_ms": 1700}


_HEADER_NAMES = st.sampled_from(["h", "diode.key", "diode.session", "diode.control", "x-y"])
_BYTES = st.none() | st.binary(max_size=8)


@st.composite
def _groups(draw: Any) -> Any:
    from common.wire.events import RecordGroup  # noqa: PLC0415

    n = draw(st.integers(1, 6))
    first = draw(st.integers(0, 2**62))
    return RecordGroup(
        topic=draw(st.from_regex(r"[a-z][a-z0-9._:-]{0,12}", fullmatch=True)),
        partition=draw(st.integers(0, 2**31 - 1)),
        timestamp_type=draw(st.integers(0, 2)),
        offsets=tuple(range(first, first + n)),
        timestamps=tuple(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))),
        keys=tuple(draw(st.lists(_BYTES, min_size=n, max_size=n))),
        values=tuple(draw(st.lists(_BYTES, min_size=n, max_size=n))),
        headers=tuple(
            tuple(draw(st.lists(st.tuples(_HEADER_NAMES, _BYTES), max_size=3))) for _ in range(n)
        ),
    )


@settings(deadline=None)  # the first example imports the sink and its tests' fakes
@given(st.lists(_groups(), min_size=1, max_size=3))
def test_the_sinks_runs_expand_to_the_v1_layout(groups: list[Any]) -> None:
    """The receiver writes runs (v2); expanded (common.raw_run.expand_run) they are exactly the
    v1 records raw_headers describes, and the v1 reader gives back the source record."""
    from common.raw_run import expand_run  # noqa: PLC0415
    from tests.unit.test_receiver_sink import SESSION as SINK_SESSION  # noqa: PLC0415
    from tests.unit.test_receiver_sink import FakeProducer, _batch, _sink  # noqa: PLC0415

    fake = FakeProducer({"raw": 3})
    sink, _ = _sink(fake)
    batch = _batch(*groups)
    sink.write_batch(batch)
    expanded = []
    for _topic, value, key, _partition, _cb, _ts_cb, ts, headers in fake.calls:
        assert ts == 0
        records = expand_run(key, value, headers)
        assert records is not None
        expanded.extend(records)
    assert len(expanded) == batch.count
    # in order within each partition (runs of different partitions may finish in any order)
    expanded.sort(key=lambda item: parse_raw_key(item[0])[:2])  # type: ignore[index]
    records = sorted(batch.records, key=lambda record: (record.topic, record.partition))
    for (key, value, headers), record in zip(expanded, records, strict=True):
        assert headers == raw_headers(record, SINK_SESSION.hex().encode())
        # what the dedup's reader makes of it is the source record, byte for byte
        assert parse_raw_key(key) == (record.topic, record.partition, record.offset)
        assert value == record.value
        assert restore(headers) == (record.key, record.timestamp, list(record.headers))
