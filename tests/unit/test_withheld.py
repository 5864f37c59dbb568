"""Withheld offsets from the wire to the dedup (no Kafka, no Spark): the decoder's checks, the
raw topic's control record, the gap detector's ``withhold`` and the dedup's per-group step."""

from __future__ import annotations

import json

import pytest

from common.raw_topic import CONTROL_HEADER, WITHHELD, parse_raw_key, withheld_records
from common.wire import DropReason, Withheld
from common.wire.control import WITHHELD_SCHEMA, encode_control
from common.wire.envelope import KIND_WITHHELD
from dedup.detector import DetectorConfig, PartitionDetector
from dedup.rows import KIND_WITHHELD as ROW_WITHHELD
from tests.dedup_support import FakeState, delivered
from tests.unit.test_dedup_job import DATA, HB, open_gaps, run, settle
from tests.wire_support import SESSION, craft, drops_of, endpoints, feed


def _ranges(*items: tuple[str, int, int, int]) -> bytes:
    return encode_control(
        WITHHELD_SCHEMA,
        {"ranges": [{"topic": t, "partition": p, "first": f, "last": la} for t, p, f, la in items]},
    )


def test_a_withheld_message_decodes_to_its_ranges() -> None:
    encoder, decoder = endpoints()
    out = encoder.withhold("t", 1, 5, 0.0) + encoder.withhold("t", 1, 6, 0.0)
    out += encoder.withhold("t", 1, 9, 0.0) + encoder.withhold("u", 0, 0, 0.0)
    assert out == []  # held until a seal, the linger or a flush
    assert encoder.pending_withheld == 3
    out = encoder.flush()
    assert [d.completes for d in out] == [(("t", 1, 9), ("u", 0, 0))]
    events = feed(decoder, out)
    assert events == [Withheld(SESSION, 0, (("t", 1, 5, 6), ("t", 1, 9, 9), ("u", 0, 0, 0)))]


def test_withheld_ranges_follow_the_batch_and_take_over_its_completes() -> None:
    encoder, _ = endpoints()
    assert encoder.add("t", 0, 10, 0, 0, b"k", b"v", (), 0.0) == []
    assert encoder.withhold("t", 0, 11, 0.0) == []
    assert encoder.add("t", 0, 12, 0, 0, b"k", b"v", (), 0.0) == []
    batch, held = encoder.flush()
    assert batch.completes == ()  # vouched for only once the withheld message left too
    assert held.completes == (("t", 0, 12),)
    assert held.sequence == batch.sequence + 1


def test_the_linger_deadline_sends_withheld_offsets_alone() -> None:
    encoder, _ = endpoints()
    encoder.withhold("t", 0, 3, 1.0)
    deadline = encoder.next_deadline()
    assert deadline is not None
    assert encoder.poll(deadline - 0.0001) == []
    assert len(encoder.poll(deadline)) == 1


@pytest.mark.parametrize(
    "ranges",
    [
        (),
        (("t", 0, 5, 4),),
        (("t", -1, 0, 0),),
        (("t", 0, -3, 2),),
        (("", 0, 1, 2),),
    ],
)
def test_an_impossible_withheld_message_is_dropped_by_reason(
    ranges: tuple[tuple[str, int, int, int], ...],
) -> None:
    _, decoder = endpoints()
    events = feed(decoder, [craft(_ranges(*ranges), kind=KIND_WITHHELD)])
    [drop] = drops_of(events)
    assert drop.reason is DropReason.OUT_OF_RANGE
    assert decoder.drops[DropReason.OUT_OF_RANGE] == 1


def test_a_truncated_withheld_message_is_dropped_as_malformed() -> None:
    _, decoder = endpoints()
    events = feed(decoder, [craft(_ranges(("t", 0, 1, 2))[:-3], kind=KIND_WITHHELD)])
    [drop] = drops_of(events)
    assert drop.reason is DropReason.MALFORMED


def test_each_range_becomes_one_control_record_keyed_by_its_first_offset() -> None:
    event = Withheld(SESSION, 7, (("t", 2, 5, 9), ("u", 0, 3, 3)))
    records = list(withheld_records(event))
    assert [(t, p, parse_raw_key(k)) for t, p, k, _ in records] == [
        ("t", 2, ("t", 2, 5)),
        ("u", 0, ("u", 0, 3)),
    ]
    value = json.loads(records[0][3])
    assert value == {"type": "withheld", "session": SESSION.hex(), "first": 5, "last": 9}
    assert WITHHELD == b"withheld"
    assert CONTROL_HEADER == "diode.control"


def _detector(ws: int = 10, windows: int = 4) -> PartitionDetector:
    return PartitionDetector("t", 0, DetectorConfig(window_size=ws, max_windows=windows))


def test_withheld_offsets_are_seen_never_gaps_never_delivered() -> None:
    d = _detector()
    assert d.observe_many([0, 1, 2], 0) == [True] * 3
    assert d.withhold(3, 25, 0) == 23
    assert d.observe_many([26, 4, 3], 0) == [True, False, False]  # a later copy is a duplicate
    d.heartbeat(30, 0)
    d.scan(1)
    assert [(r.first, r.last) for r in d.scan(2)] == [(27, 30)]
    assert (d.delivered, d.duplicates) == (4, 2)  # withholding counts neither
    assert d.withhold(20, 26, 3) == 0  # seen already: nothing new


def test_a_withheld_range_longer_than_the_windows_evicts_nothing_as_a_gap() -> None:
    d = _detector(ws=10, windows=3)
    d.observe(0, 0)
    assert d.withhold(1, 999, 0) == 999
    d.heartbeat(999, 0)
    d.scan(1)
    assert d.scan(2) == []
    assert d.drain_reports() == []
    assert d.next_expected == 1000


def test_a_withheld_range_below_the_floor_closes_expired_gaps_only() -> None:
    d = _detector(ws=10, windows=2)
    d.observe(0, 0)
    d.observe(35, 0)  # evicts windows 0 and 1: 1..19 become expired gaps
    assert d.withhold(5, 12, 0) == 8
    assert d.open_gaps() == [(1, 4), (13, 19), (20, 34)]


def test_the_dedup_step_records_withheld_rows_and_counts_them() -> None:
    state = FakeState()
    withheld = ROW_WITHHELD
    out = run(state, (DATA, 0, -1, -1), (withheld, 1, 4, -1), (DATA, 5, -1, -1), (HB, 6, 0, -1))
    stats = out[out["kind"] == "stat"]
    assert int(stats["withheld"].sum()) == 4
    assert int(stats["delivered"].sum()) == 2
    assert [o for o, _ in delivered(out)] == [0, 5]  # only the records are forwarded
    assert open_gaps(settle(state)) == [(6, 6)]
