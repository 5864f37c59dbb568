"""``kafka-diode raw dump``'s decoding: every layout of docs/topics.md, and what is malformed."""

from __future__ import annotations

from common.raw_run import RunBuilder, parse_run_key
from common.raw_topic import parse_raw_key
from dedup.raw_cli import describe, render


def run_of(first: int, last: int, stride: int = 1) -> tuple[bytes, bytes]:
    run = RunBuilder("orders", 2, 1, first, 1_000)
    for o in range(first, last + 1, stride):
        run.append(o, 1_000 + o, None if o % 2 else b"k%d" % o, b"v%d" % o, (("h", None),))
    return run.key().encode(), run.encode()


def test_a_v2_run_is_shown_with_every_record() -> None:
    key, value = run_of(10, 14, 2)
    d = describe(key, value, [("diode.session", b"ab")])
    assert (d["layout"], d["topic"], d["partition"], d["first"], d["last"], d["stride"]) == (
        "v2", "orders", 2, 10, 14, 2,
    )  # fmt: skip
    assert [(r["offset"], r["key"], r["value"]) for r in d["records"]] == [
        (10, b"k10", b"v10"), (12, b"k12", b"v12"), (14, b"k14", b"v14"),
    ]  # fmt: skip
    lines = render("raw:0@7", d, records=True, width=20)
    assert lines[0] == "raw:0@7  v2 orders:2 offsets 10-14/2 (3 records)"
    assert lines[1] == "    10  ts 1010  key b'k10'  value b'v10'  headers h=null"


def test_a_v1_record_and_a_control_record() -> None:
    headers = [("x", b"1"), ("diode.key", None), ("diode.timestamp", b"-3"),
               ("diode.timestamp-type", b"0"), ("diode.session", b"ab")]  # fmt: skip
    d = describe(b"orders:0:5", b"val", headers)
    assert d["layout"] == "v1"
    assert d["records"] == [
        {"offset": 5, "timestamp": -3, "key": None, "value": b"val", "headers": [("x", b"1")]}
    ]
    c = describe(b"orders:0:9", b'{"type":"heartbeat"}', [("diode.control", b"heartbeat")])
    assert (c["layout"], c["control"], c["first"]) == ("control", "heartbeat", 9)


def test_malformed_runs_and_keys_are_named() -> None:
    key, value = run_of(0, 3)
    assert "does not match its key" in describe(b"orders:2:0-4", value, [])["reason"]
    assert describe(key, value[:-2], [])["layout"] == "malformed"
    assert describe(b"orders:0:007", b"", [])["reason"] == "key does not parse"
    assert describe(b"orders:0:5", b"", [])["reason"] == "provenance headers"


def test_run_and_record_keys_parse_only_in_canonical_form() -> None:
    assert parse_run_key("a:b:c:1:2-9/1") is None  # stride 1 is never written out
    assert parse_run_key("a:b:c:1:2-8/2") == ("a:b:c", 1, 2, 8, 2)
    assert parse_run_key("t:1:2-9/2") is None  # 9 - 2 is not a multiple of 2
    assert parse_run_key("t:1:9-2") is None
    assert parse_run_key("t:01:2-9") is None
    assert parse_run_key("t:1:2-9/65") is None  # beyond MAX_STRIDE
    assert parse_run_key("t:1:5") is None
    assert parse_raw_key("t:1:5") == ("t", 1, 5)
    assert parse_raw_key("t:1:-5") == ("t", 1, -5)
    assert parse_raw_key("t:1:+5") is None
    assert parse_raw_key("t:1: 5") is None
    assert parse_raw_key("t:1:2-9") is None


def test_the_direct_layouts_tick_is_shown_as_a_tick() -> None:
    """docs/dedup.md "The direct layout": the dedup's idle ticks go into the raw partitions."""
    d = describe(b"tick", b"", [("diode.control", b"tick")])
    assert d == {"layout": "tick"}
    assert render("raw:1@7", d, records=True, width=40) == ["raw:1@7  tick (the dedup's, no input)"]
