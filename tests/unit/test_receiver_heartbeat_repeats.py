"""Which heartbeat partitions the receiver writes (``receiver/heartbeat_repeats.py``).

The property that makes dropping repeats safe: a gap detector (the dedup's real one) fed only the
heartbeat partitions the receiver writes reaches the same gaps, tail and floor as one fed every
heartbeat, whatever records and scans come between.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from common.raw_topic import CHAIN_COUNT, CHAIN_INDEX, CHAIN_SHARE
from common.wire.events import Heartbeat
from dedup.detector import DetectorConfig, PartitionDetector
from receiver.heartbeat_repeats import HeartbeatRepeats

A = bytes(range(16))
B = bytes(range(1, 17))


def beat(
    highs: dict[int, int],
    lows: dict[int, int] | None = None,
    *,
    session: bytes = A,
    started: int = 1_000,
    sent: int = 0,
    chain: tuple[int, int] | None = None,
) -> Heartbeat:
    lows = lows if lows is not None else dict.fromkeys(highs, 0)
    counters: tuple[tuple[str, int], ...] = ()
    if chain is not None:
        counters = ((CHAIN_INDEX, chain[0]), (CHAIN_COUNT, chain[1]), (CHAIN_SHARE, 1))
    return Heartbeat(
        session_id=session,
        sequence=0,
        sender_id="high-1",
        started_at_ms=started,
        sent_at_ms=sent,
        high_offsets=tuple(("t", p, h) for p, h in highs.items()),
        low_offsets=tuple(("t", p, lows[p]) for p in highs),
        counters=counters,
    )


def partitions(selected: Heartbeat | None) -> list[tuple[int, int, int]]:
    if selected is None:
        return []
    lows = {p: low for _, p, low in selected.low_offsets}
    return [(p, high, lows[p]) for _, p, high in selected.high_offsets]


def test_a_repeat_is_dropped_until_the_interval_passes() -> None:
    repeats = HeartbeatRepeats(30.0)
    assert partitions(repeats.select(beat({0: 5, 1: 7}, sent=1), 100.0)) == [(0, 5, 0), (1, 7, 0)]
    # sent_at_ms changes every time and is not what the dedup needs
    assert repeats.select(beat({0: 5, 1: 7}, sent=2), 102.0) is None
    assert repeats.select(beat({0: 5, 1: 7}, sent=3), 129.9) is None
    assert partitions(repeats.select(beat({0: 5, 1: 7}), 130.0)) == [(0, 5, 0), (1, 7, 0)]
    assert repeats.dropped == 4


def test_a_changed_partition_is_written_at_once_and_alone() -> None:
    repeats = HeartbeatRepeats(30.0)
    repeats.select(beat({0: 5, 1: 7, 2: 9}), 0.0)
    selected = repeats.select(beat({0: 6, 1: 7, 2: 9}, {0: 0, 1: 0, 2: 0}), 2.0)
    assert partitions(selected) == [(0, 6, 0)]
    assert partitions(repeats.select(beat({0: 6, 1: 7, 2: 9}, {0: 0, 1: 3, 2: 0}), 4.0)) == [
        (1, 7, 3)
    ]


def test_a_new_session_or_start_time_is_news() -> None:
    repeats = HeartbeatRepeats(30.0)
    repeats.select(beat({0: 5}), 0.0)
    assert partitions(repeats.select(beat({0: 5}, session=B), 1.0)) == [(0, 5, 0)]
    assert partitions(repeats.select(beat({0: 5}, session=B, started=2_000), 2.0)) == [(0, 5, 0)]


def test_share_chains_are_remembered_apart() -> None:
    repeats = HeartbeatRepeats(30.0)
    assert repeats.select(beat({0: 5}, chain=(1, 2)), 0.0) is not None
    assert repeats.select(beat({0: 5}, chain=(2, 2)), 0.5) is not None  # another chain's news
    assert repeats.select(beat({0: 5}, chain=(1, 2)), 2.0) is None
    assert repeats.select(beat({0: 5}, chain=(2, 2)), 2.5) is None


def test_interval_zero_writes_every_heartbeat() -> None:
    repeats = HeartbeatRepeats(0.0)
    one = beat({0: 5})
    assert repeats.select(one, 0.0) is one
    assert repeats.select(one, 0.1) is one
    assert repeats.dropped == 0


def test_memory_is_bounded_and_forgetting_only_writes_more() -> None:
    repeats = HeartbeatRepeats(30.0, max_entries=4)
    repeats.select(beat(dict.fromkeys(range(4), 5)), 0.0)
    assert repeats.select(beat(dict.fromkeys(range(4), 5)), 1.0) is None
    repeats.select(beat({9: 1}), 2.0)  # a fifth partition: the memory starts over
    assert len(repeats._written) == 1
    assert partitions(repeats.select(beat({0: 5}), 3.0)) == [(0, 5, 0)]


# -- the property --------------------------------------------------------------------------------

CONFIG = DetectorConfig(window_size=16, max_windows=4, max_expired_gaps=8)

step = st.one_of(
    # a heartbeat: session, its start time, high, low (clipped to high), chain (None or index
    # of 2); small ranges, so that a heartbeat often repeats or differs in one field only
    st.tuples(
        st.just("beat"),
        st.sampled_from([A, B]),
        st.sampled_from([1_000, 2_000]),
        st.sampled_from([5, 20, 40]),
        st.integers(0, 40),
        st.sampled_from([None, 1, 2]),
        st.floats(0, 10),
    ),
    # records arrive: a run of offsets
    st.tuples(st.just("data"), st.integers(0, 60), st.integers(0, 12), st.floats(0, 5)),
    st.tuples(st.just("scan"), st.floats(0, 20)),
)


def apply(detector: PartitionDetector, hb: Heartbeat, now_ms: int) -> None:
    """As the dedup's ``apply_heartbeats`` applies one heartbeat record."""
    started = hb.started_at_ms
    counters = dict(hb.counters)
    for (_, _, high), (_, _, low) in zip(hb.high_offsets, hb.low_offsets, strict=True):
        if CHAIN_INDEX in counters:
            detector.chain_heartbeat(counters[CHAIN_INDEX], counters[CHAIN_COUNT], high, now_ms)
            detector.session_low(low, now_ms, session_started_ms=started)
        else:
            detector.heartbeat(high, now_ms, low, session_started_ms=started)


def outcome(detector: PartitionDetector) -> tuple[object, ...]:
    return (
        detector.heartbeat_high,
        detector.first_offset,
        detector.next_expected,
        detector.open_gaps(),
        detector.reported_open(),
        detector.delivered,
        detector.duplicates,
    )


@settings(max_examples=400, deadline=None)
# a session that started after the reset, same offsets: its low now counts (the start time matters)
@example([("beat", A, 1_000, 5, 0, None, 0.0), ("beat", A, 2_000, 5, 0, None, 1.0)], 30.0, 1_500)
@given(st.lists(step, max_size=40), st.sampled_from([5.0, 30.0]), st.sampled_from([None, 1_500]))
def test_the_dedup_reaches_the_same_gaps_from_the_written_heartbeats(
    steps: list[tuple[object, ...]], interval: float, reset_at: int | None
) -> None:
    # reset_at: the detectors replace state a reset cleared at 1.5 s (sender clock), so the lows
    # of sessions started before it are ignored (the start time matters)
    every = PartitionDetector("t", 0, CONFIG, reset_at_ms=reset_at)
    written = PartitionDetector("t", 0, CONFIG, reset_at_ms=reset_at)
    repeats = HeartbeatRepeats(interval)
    now = 0.0
    for item in steps:
        now += float(item[-1])  # type: ignore[arg-type]
        now_ms = int(now * 1000)
        if item[0] == "beat":
            _, session, started, high, low, chain = item[:6]
            assert isinstance(high, int)
            assert isinstance(low, int)
            assert isinstance(started, int)
            hb = beat(
                {0: high},
                {0: min(low, high)},
                session=session,  # type: ignore[arg-type]
                started=started,
                sent=now_ms,
                chain=None if chain is None else (chain, 2),  # type: ignore[arg-type]
            )
            apply(every, hb, now_ms)
            selected = repeats.select(hb, now)
            if selected is not None:
                apply(written, selected, now_ms)
        elif item[0] == "data":
            _, first, length = item[:3]
            assert isinstance(first, int)
            assert isinstance(length, int)
            every.observe_run(first, first + length, now_ms)
            written.observe_run(first, first + length, now_ms)
        else:
            assert every.scan(now_ms) == written.scan(now_ms)
        assert outcome(every) == outcome(written)
    assert every.drain_reports() == written.drain_reports()
