"""Gap detector: the worked example of docs/gaps.md "Semantics", one test per known-wrong
behaviour, budget, state."""

from __future__ import annotations

import array
import logging
import struct
import zlib

import pytest

from common.errors import ConfigError, DiodeError, LocalProtocolError
from common.gap_record import GapRecordError, gap_key, gap_value, parse_gap
from dedup.detector import (
    DetectorConfig,
    GapReport,
    GapState,
    GapStateError,
    PartitionDetector,
    WindowSizeMismatchError,
)


def detector(ws: int = 1000, mw: int = 4, mxe: int = 100, **kw: int) -> PartitionDetector:
    return PartitionDetector(
        "orders", 3, DetectorConfig(window_size=ws, max_windows=mw, max_expired_gaps=mxe, **kw)
    )


def states(reports: list[GapReport]) -> list[tuple[int, int, str]]:
    return [(r.first, r.last, r.state.value) for r in reports]


def test_design_worked_example_offset_5499_lands_in_window_5000_to_5999() -> None:
    det = detector(ws=1000)
    assert det.observe(5499, 1) is True
    assert det.low_watermark == 5000
    assert det.next_expected == 5500
    assert det.observe(5500, 2) is True  # o == nextExpected
    assert det.observe(5503, 3) is True  # o > nextExpected: gap [5501, 5502]
    assert det.open_gaps() == [(5501, 5502)]
    assert det.observe(5502, 4) is True  # late, inside the gap: shrink
    assert det.open_gaps() == [(5501, 5501)]
    assert det.observe(5502, 5) is False  # duplicate
    assert det.observe(5400, 6) is True  # before the first offset but in its window: once,
    assert det.observe(5400, 7) is False  # and never a gap
    assert det.open_gaps() == [(5501, 5501)]
    assert (det.delivered, det.duplicates) == (5, 2)


def test_a_gap_is_reported_only_when_two_consecutive_scans_see_it() -> None:
    det = detector()
    for o in (0, 1, 5, 3):
        det.observe(o, 1)
    assert det.scan(10) == []  # first sighting of [2,2] and [4,4]
    det.observe(4, 11)  # ordinary reordering fills one before the second scan
    (report,) = det.scan(20)
    assert report == GapReport("orders", 3, 2, 2, GapState.OPEN, detected_at=10, reported_at=20)
    assert det.scan(30) == []  # once per change, not every scan


def test_missing_offsets_after_the_last_received_one_in_a_window_are_gaps() -> None:
    det = detector(ws=1000)
    det.observe(0, 1)
    det.observe(10, 1)  # 11..999 missing in window 0; something later arrives in window 1
    det.observe(1500, 1)
    assert det.open_gaps() == [(1, 9), (11, 1499)]
    det.scan(1)
    assert states(det.scan(2)) == [(1, 9, "open"), (11, 1499, "open")]


def test_a_whole_window_with_nothing_received_is_a_gap() -> None:
    det = detector(ws=100, mw=10)
    det.observe(50, 1)
    det.observe(99, 1)
    det.observe(350, 1)  # windows 100..199 and 200..299 received nothing
    assert det.open_gaps() == [(51, 98), (100, 349)]


def test_whole_empty_windows_evicted_are_reported_too() -> None:
    det = detector(ws=100, mw=2)
    det.observe(0, 1)
    det.observe(99, 1)
    det.observe(550, 2)  # evicts windows 0..3: [1,98] and [100,399] are their last window report
    assert states(det.drain_reports()) == [(1, 98, "open"), (100, 399, "open")]
    assert det.low_watermark == 400
    assert det.open_gaps() == [(1, 98), (100, 399), (400, 549)]


def test_heartbeat_makes_missing_tail_a_gap_when_nothing_follows() -> None:
    det = detector()
    for o in range(10):
        det.observe(o, 1)
    det.heartbeat(14, 2)  # the sender sent 10..14 too; none arrived and nothing will follow
    assert det.open_gaps() == [(10, 14)]
    det.scan(3)
    assert states(det.scan(4)) == [(10, 14, "open")]
    det.heartbeat(12, 5)  # an older heartbeat never shrinks the known tail
    assert det.open_gaps() == [(10, 14)]
    assert det.observe(20, 6) is True  # the tail gap keeps its key and grows
    assert states(det.scan(7)) == [(10, 19, "open")]


def test_a_gap_filled_later_is_reported_closed() -> None:
    det = detector()
    det.observe(0, 1)
    det.observe(10, 1)
    det.scan(2)
    assert states(det.scan(3)) == [(1, 9, "open")]
    det.observe(1, 4)  # the gap's first offset: key 1 closes, remainder gets its own key
    det.observe(5, 4)  # a split
    assert states(det.scan(5)) == [(2, 4, "open"), (6, 9, "open"), (1, 1, "filled")]
    det.observe_many([2, 3, 4, 6, 7, 8, 9], 6)
    assert states(det.scan(7)) == [(2, 4, "filled"), (6, 9, "filled")]
    assert det.reported_open() == []
    assert det.scan(8) == []


def test_evicted_gaps_are_remembered_a_late_record_is_delivered_once_and_closes_it() -> None:
    det = detector(ws=10, mw=2, mxe=10)
    det.observe(0, 1)
    det.observe(5, 1)  # gap [1,4]
    det.observe(30, 2)  # evicts windows 0..1: [1,4] and [6,19] move below the floor
    assert states(det.drain_reports()) == [(1, 4, "open"), (6, 19, "open")]
    assert det.low_watermark == 20
    assert det.observe(3, 3) is True  # late resend into an expired gap: delivered once
    assert det.observe(3, 3) is False  # and never again
    assert det.observe(5, 3) is False  # below the floor, not in a gap: a duplicate
    assert (det.duplicates, det.below_window) == (2, 0)
    assert states(det.scan(4)) == [(1, 2, "open"), (4, 4, "open")]  # key 1 shrank, 4 split off


def test_expired_gap_overflow_is_reported_expired_and_later_records_are_counted() -> None:
    det = detector(ws=10, mw=1, mxe=1)
    det.observe(0, 1)
    det.observe(5, 1)  # gap [1,4]
    det.observe(12, 2)  # evict window 0: [1,4] and [6,9] expire to the list of 1
    assert states(det.drain_reports()) == [
        (1, 4, "open"),
        (6, 9, "open"),
        (1, 4, "expired"),
    ]
    assert det.observe(2, 3) is False  # forgotten: a counted, reported loss, never silent
    assert det.below_window == 1
    assert det.observe(7, 3) is True  # still remembered
    assert det.observe(0, 3) is False
    assert det.below_window == 2  # below anything forgotten: cannot tell a duplicate from a loss


def test_offsets_before_the_first_one_seen_are_not_a_gap_but_are_delivered_once() -> None:
    det = detector(ws=10, mw=2)
    det.observe(25, 1)
    assert det.observe(12, 1) is True  # window 10..19 opened downward: nothing was evicted yet
    assert det.observe(12, 1) is False
    assert det.open_gaps() == []
    assert det.observe(2, 1) is False  # would need a 3rd window: older than the state can hold
    assert det.below_window == 1


def test_memory_budget_evicts_oldest_window_and_tells_the_operator(
    caplog: pytest.LogCaptureFixture,
) -> None:
    det = detector(ws=65536, mw=64, max_state_bytes=20_000)
    with caplog.at_level(logging.WARNING, logger="dedup.detector"):
        for w in range(6):
            base = w * 65536
            det.observe_many(array.array("Q", range(base, base + 65536, 2)), 1)  # bitset windows
    assert det.budget_evictions > 0
    assert det.low_watermark is not None
    assert det.low_watermark > 0
    (warning, *_) = det.drain_warnings()
    assert "MAX_STATE_BYTES" in warning
    assert "MAX_STATE_BYTES" in caplog.text
    assert any(r.state is GapState.OPEN for r in det.drain_reports())
    assert det.state_bytes_estimate() <= 20_000 + 9000  # one bitset container may overshoot


def test_large_offsets_never_wrap() -> None:
    det = detector(ws=2**32, mw=8)
    top = 2**63 - 10
    assert det.observe_many([top, top + 3, top + 1], 1) == [True, True, True]
    assert det.open_gaps() == [(top + 2, top + 2)]
    restored = PartitionDetector.from_bytes(det.to_bytes(), det.config)
    assert restored.open_gaps() == [(top + 2, top + 2)]
    with pytest.raises(LocalProtocolError):
        det.observe(-1, 1)
    with pytest.raises(LocalProtocolError):
        det.observe_many([2**63], 1)


def test_observe_many_answers_duplicates_inside_one_batch() -> None:
    det = detector()
    assert det.observe_many([5, 6, 5, 7, 6, 9], 1) == [True, True, False, True, False, True]
    assert det.observe_many(array.array("Q", [8, 9, 8, 10]), 1) == [True, False, False, True]
    assert (det.delivered, det.duplicates, det.next_expected) == (6, 4, 11)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"window_size": 0}, "WINDOW_SIZE"),
        ({"window_size": 2**33}, "WINDOW_SIZE"),
        ({"max_windows": 0}, "MAX_WINDOWS"),
        ({"window_size": 2**32, "max_windows": 2**10}, "MAX_WINDOWS"),
        ({"max_expired_gaps": -1}, "MAX_EXPIRED_GAPS"),
        ({"max_state_bytes": 10}, "MAX_STATE_BYTES"),
    ],
)
def test_config_errors_name_the_key(kwargs: dict[str, int], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        DetectorConfig(**kwargs)
    assert info.value.key == key


def test_state_round_trips_and_garbage_is_a_diode_error() -> None:
    det = detector()
    assert PartitionDetector.from_bytes(det.to_bytes(), det.config).to_bytes() == det.to_bytes()
    det.observe_many([0, 3, 9, 2000], 1)
    det.heartbeat(2100, 1)
    det.scan(2)
    blob = det.to_bytes()
    again = PartitionDetector.from_bytes(blob, det.config)
    assert (again.topic, again.partition, again.open_gaps()) == ("orders", 3, det.open_gaps())
    assert again.scan(3) == det.scan(3)
    for bad in (b"", b"junk", blob[:-1], blob + b"\0", blob[:5] + b"\xff" * 40, b"KDGD\x02"):
        with pytest.raises(GapStateError):
            PartitionDetector.from_bytes(bad, det.config)
    assert issubclass(GapStateError, DiodeError)
    with pytest.raises(GapStateError, match="WINDOW_SIZE"):
        PartitionDetector.from_bytes(blob, DetectorConfig(window_size=500))


def test_gap_record_round_trip_and_schema() -> None:
    report = GapReport("orders.eu", 3, 100, 149, GapState.OPEN, 1_000, 2_000)
    assert gap_key(report) == b"orders.eu:3:100"
    value = gap_value(report)
    assert value == (
        b'{"topic":"orders.eu","partition":3,"first":100,"last":149,"count":50,'
        b'"state":"open","detected_at":1000,"reported_at":2000,"version":1}'
    )
    assert parse_gap(gap_key(report), value) == report
    assert parse_gap(b"orders.eu:3:100", None) is None
    for key, bad in [
        (b"orders.eu:3:100", b"not json"),
        (b"orders.eu:3:100", value.replace(b'"version":1', b'"version":2')),
        (b"orders.eu:3:100", value.replace(b'"open"', b'"closed"')),
        (b"orders.eu:3:101", value),
        (b"orders.eu:3:100", value.replace(b'"count":50', b'"count":5')),
        (b"no-colons", value),
        (b"orders.eu:3:100", b"[1]"),
        (b"orders.eu:3:100", b" " * 70_000),
    ]:
        with pytest.raises(GapRecordError):
            parse_gap(key, bad)


# -- heartbeat low offsets (docs/gaps.md "Heartbeat low offsets") -------------------------------


def test_lost_head_becomes_a_gap_when_the_heartbeat_names_the_session_low() -> None:
    det = detector(ws=10, mw=4)
    for o in range(7, 12):  # offsets 0..6 (the first datagram) were lost on the link
        det.observe(o, 1)
    assert det.open_gaps() == []  # without the low offset nothing below 7 is known
    det.heartbeat(11, 2, low_offset=0)
    assert det.first_offset == 0
    assert det.low_watermark == 0
    assert det.open_gaps() == [(0, 6)]
    assert det.scan(3) == []  # the two-scan rule holds for head gaps too
    assert states(det.scan(4)) == [(0, 6, "open")]
    assert det.observe(3, 5) is True  # a resend fills it exactly once
    assert det.observe(3, 5) is False
    assert states(det.scan(6)) == [(0, 2, "open"), (4, 6, "open")]


def test_whole_partition_lost_is_reported_from_heartbeats_alone() -> None:
    det = detector(ws=10, mw=4)
    det.heartbeat(332, 1, low_offset=0)  # not one record of the partition arrived
    assert det.open_gaps() == [(0, 332)]
    det.scan(2)
    assert states(det.scan(3)) == [(0, 332, "open")]
    assert det.observe(0, 4) is True  # the resend arrives
    assert det.observe(1, 4) is True
    assert states(det.scan(5)) == [(2, 332, "open"), (0, 1, "filled")]
    restored = PartitionDetector.from_bytes(det.to_bytes(), det.config)
    assert restored.open_gaps() == [(2, 332)]


def test_a_restart_with_a_higher_low_neither_raises_the_floor_nor_forgets() -> None:
    det = detector(ws=10, mw=8)
    det.heartbeat(4, 1, low_offset=0)
    for o in (2, 3, 4):
        det.observe(o, 1)
    det.scan(2)
    assert states(det.scan(3)) == [(0, 1, "open")]
    det.heartbeat(30, 4, low_offset=20)  # a new session resumed from its commit at 20
    assert det.first_offset == 0
    assert det.open_gaps() == [(0, 1), (5, 30)]
    assert det.observe(3, 5) is False  # still a duplicate
    det.scan(6)
    assert states(det.scan(7)) == [(5, 30, "open")]
    assert det.reported_open() == [(0, 1), (5, 30)]


def test_a_low_below_what_the_windows_can_reach_is_evicted_at_once() -> None:
    det = detector(ws=10, mw=2, mxe=10)
    det.observe(45, 1)  # window 40..49; MAX_WINDOWS=2 reaches down to 30 at most
    det.heartbeat(45, 2, low_offset=5)
    assert states(det.drain_reports()) == [(5, 29, "open")]  # last report from the windows
    assert det.low_watermark == 30
    assert det.open_gaps() == [(5, 29), (30, 44)]
    assert det.observe(7, 3) is True  # a resend below the floor is delivered once
    assert det.observe(7, 3) is False
    assert det.observe(2, 3) is False  # below the session's low: nothing vouches for it
    assert det.below_window == 1


def test_a_low_arriving_after_an_eviction_lowers_the_floor_only_to_the_oldest_window() -> None:
    det = detector(ws=10, mw=2, mxe=10)
    det.observe(25, 1)
    det.observe(12, 1)  # grew down to window 10..19: delivered
    det.observe(35, 2)  # evicts window 10..19 (whose gaps are below the first offset: none)
    assert det.drain_reports() == []
    det.heartbeat(35, 3, low_offset=0)  # records below 20 may have been delivered: not a gap
    assert det.first_offset == 20
    assert det.open_gaps() == [(20, 24), (26, 34)]


def test_after_a_reset_lows_of_sessions_started_before_it_are_ignored() -> None:
    config = DetectorConfig(window_size=10, max_windows=8)
    det = PartitionDetector("orders", 3, config, reset_at_ms=1_000)
    det.observe(50, 2_000)  # records delivered before the reset are 0..49
    det.heartbeat(50, 2_001, low_offset=0, session_started_ms=500)
    det.heartbeat(50, 2_002, low_offset=0)  # no start time (older receivers): as before
    assert det.open_gaps() == []
    assert det.lows_ignored == 2
    again = PartitionDetector.from_bytes(det.to_bytes(), config)
    again.heartbeat(60, 2_003, low_offset=40, session_started_ms=1_500)  # a new session
    assert again.open_gaps() == [(40, 49), (51, 60)]


def test_heartbeat_low_offset_is_validated() -> None:
    det = detector()
    with pytest.raises(LocalProtocolError):
        det.heartbeat(10, 1, low_offset=11)
    with pytest.raises(LocalProtocolError):
        det.heartbeat(10, 1, low_offset=-1)


def test_version_1_states_still_load() -> None:
    det = detector()
    det.observe_many([0, 3, 9], 1)
    det.scan(2)
    # v3 appends a chain table (empty here: a section header and an empty zlib stream)
    blob = det.to_bytes()[: -(16 + len(zlib.compress(b"", 1)))]
    v2 = b"KDGD\x02" + blob[5:]
    assert PartitionDetector.from_bytes(v2, det.config).open_gaps() == det.open_gaps()
    # v2 inserts reset_at (q) and lows_ignored (Q) before the topic length: strip them.
    head = 5 + struct.calcsize("<QqqqqqBQQQQq")
    v1 = b"KDGD\x01" + blob[5:head] + blob[head + 16 :]
    old = PartitionDetector.from_bytes(v1, det.config)
    assert (old.open_gaps(), old.reported_open(), old.delivered) == (
        det.open_gaps(),
        det.reported_open(),
        det.delivered,
    )
    old.heartbeat(20, 3, low_offset=0)  # v1 states were never reset: lows apply
    assert old.open_gaps() == [(1, 2), (4, 8), (10, 20)]


def test_share_chains_vouch_only_up_to_what_every_chain_sent() -> None:
    det = detector(ws=100, mw=10)
    det.observe_many([0, 2, 4, 1, 3], 1)  # chain 1 (even) sent 0..4, chain 2 (odd) 1..3
    det.chain_heartbeat(1, 2, 8, 1)  # chain 1 sent up to 8 (6 and 8 lost on its link)
    assert det.chains_missing == 1
    assert det.heartbeat_high is None  # chain 2 silent: nothing vouched beyond what arrived
    det.chain_heartbeat(2, 2, 3, 2)
    assert det.chains_missing == 0
    assert det.heartbeat_high == 4  # min(8 + 1, 3 + 1): offset 5 may still come from chain 2
    assert det.open_gaps() == []
    det.chain_heartbeat(2, 2, 11, 3)
    assert det.heartbeat_high == 9
    assert det.open_gaps() == [(5, 9)]  # 5, 7, 9 (chain 2) and 6, 8 (chain 1) missing
    copy = PartitionDetector.from_bytes(det.to_bytes(), det.config)
    copy.chain_heartbeat(1, 2, 12, 4)
    assert (copy.heartbeat_high, copy.chains_missing) == (12, 0)  # min(13, 12)


def test_a_new_chain_count_starts_the_chain_table_afresh() -> None:
    det = detector(ws=100, mw=10)
    det.chain_heartbeat(1, 2, 10, 1)
    det.chain_heartbeat(1, 3, 12, 2)
    assert det.chains_missing == 2
    assert "re-planned" in det.drain_warnings()[0]
    with pytest.raises(LocalProtocolError):
        det.chain_heartbeat(3, 2, 1, 3)
    with pytest.raises(LocalProtocolError):
        det.chain_heartbeat(1, 65, 1, 3)


def test_window_size_mismatch_error_names_both_sizes() -> None:
    det = detector(ws=1000)
    det.observe(1, 1)
    with pytest.raises(WindowSizeMismatchError) as info:
        PartitionDetector.from_bytes(det.to_bytes(), DetectorConfig(window_size=500))
    assert (info.value.saved, info.value.configured) == (1000, 500)
