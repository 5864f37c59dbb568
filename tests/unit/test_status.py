"""kafka_diode.status.assess: which observations need a person (pure)."""

from __future__ import annotations

from kafka_diode.status import Observation, SourceStatus, StatusConfig, assess, receiver_rates

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
