"""kafka_diode.status.assess: which observations need a person (pure)."""

from __future__ import annotations

from kafka_diode.status import (
    Observation,
    SourceStatus,
    StatusConfig,
    assess,
    dedup_next_offsets,
    receiver_rates,
)

CONFIG = StatusConfig(bootstrap_servers="h:1", silent_after=30, max_backlog=1000)


def _obs(**source: object) -> Observation:
    s = SourceStatus("t", 0, vouched=99, heartbeat_age=1.0, received=99)
    for k, v in source.items():
        setattr(s, k, v)
    return Observation(sources={("t", 0): s})


def test_a_healthy_low_side_needs_nobody() -> None:
    assert assess(_obs(), CONFIG).problems == []


def test_each_condition_is_one_reason() -> None:
    assert "open gap" in assess(_obs(open_gaps=1, gap_records=5, received=99), CONFIG).problems[0]
    assert "silent" in assess(_obs(heartbeat_age=31.0), CONFIG).problems[0]
    assert "in flight or lost" in assess(_obs(received=90), CONFIG).problems[0]
    obs = _obs()
    obs.dedup_backlog = 5000
    assert "behind" in assess(obs, CONFIG).problems[0]
    obs = _obs()
    obs.receiver = {"drops_auth_failed": 3, "drops_duplicate": 100}
    problems = assess(obs, CONFIG).problems
    assert problems == [
        "receiver dropped datagrams in the last window: auth_failed 3 (docs/operations.md)"
    ]


def test_records_missing_inside_a_gap_are_not_counted_twice() -> None:
    # offsets 95..99 are in an open gap: only the gap is reported, not "in flight"
    problems = assess(_obs(received=94, open_gaps=1, gap_records=5), CONFIG).problems
    assert len(problems) == 1
    assert "open gap" in problems[0]


def test_rates_come_from_two_scrapes() -> None:
    rates = receiver_rates(
        {"datagrams": 100, "drops_duplicate": 1}, {"datagrams": 300, "drops_duplicate": 4}, 2.0
    )
    assert rates == {"datagrams_per_s": 100.0, "drops_duplicate": 3.0}


def test_the_clean_topic_behind_what_the_sender_vouched_for_needs_a_person() -> None:
    config = StatusConfig(bootstrap_servers="h:1", max_clean_lag=50)
    assert _obs(clean=None).sources[("t", 0)].clean_behind is None
    assert _obs(vouched=None, clean=10).sources[("t", 0)].clean_behind is None
    assert assess(_obs(clean=49), config).problems == []  # 50 behind: at the limit
    problems = assess(_obs(clean=48), config).problems
    assert problems == [
        "t[0]: the clean topic is 51 record(s) behind what the sender vouched for (offset 99, "
        "clean up to 48; more than 50): the dedup falls behind"
    ]
    # records of an open gap are behind too, but the gap has its own line
    problems = assess(_obs(clean=40, open_gaps=1, gap_records=20), config).problems
    assert len(problems) == 1
    assert "open gap" in problems[0]


def test_the_dedups_next_raw_offsets_come_from_its_metrics() -> None:
    scraped = {
        "kafka_diode_dedup_raw_next_offset{partition=0,topic=diode.raw}": 120.0,
        "kafka_diode_dedup_raw_next_offset{partition=11,topic=raw.a-b_c}": 7.0,
        "kafka_diode_dedup_raw_latest_offset{partition=0,topic=diode.raw}": 130.0,
        "kafka_diode_dedup_gaps_open": 2.0,
    }
    assert dedup_next_offsets(scraped) == {("diode.raw", 0): 120, ("raw.a-b_c", 11): 7}
