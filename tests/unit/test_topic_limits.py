"""The downstream-topic rules (pure) and the producer/consumer settings derived from them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import ConfigError
from common.topic_limits import (
    ANY_TIMESTAMP,
    CLOCK_MARGIN_MS,
    LONG_MAX,
    RECORD_OVERHEAD,
    TimestampWindow,
    created_topic_config,
    record_limit,
    size_problem,
    timestamp_window,
)
from dedup.raw_position import consumer_conf
from receiver.config import ReceiverConfig

MIB = 1024 * 1024
KAFKA4_DEFAULTS = {
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": str(LONG_MAX),
}


def test_size_problem_names_the_topic_setting_the_value_and_the_alternative() -> None:
    problem = size_problem("diode.raw", KAFKA4_DEFAULTS, 16 * MIB, "max_record_size")
    assert problem is not None
    assert "diode.raw" in problem
    assert f"max.message.bytes={16 * MIB + RECORD_OVERHEAD}" in problem
    assert "kafka-configs" in problem
    assert f"max_record_size on both sides to at most {1048588 - RECORD_OVERHEAD}" in problem
    fits = {"max.message.bytes": str(record_limit(16 * MIB))}
    assert size_problem("diode.raw", fits, 16 * MIB, "max_record_size") is None
    assert size_problem("diode.raw", KAFKA4_DEFAULTS, 1048588 - RECORD_OVERHEAD, "x") is None
    assert size_problem("diode.raw", {}, 16 * MIB, "x") is None  # unreadable: nothing to say


def test_created_topics_admit_the_maximum_and_clean_ones_any_timestamp() -> None:
    raw = created_topic_config(16 * MIB, any_timestamp=False)
    clean = created_topic_config(16 * MIB, any_timestamp=True)
    assert raw == {"max.message.bytes": str(record_limit(16 * MIB))}
    assert clean == {**raw, **ANY_TIMESTAMP}
    assert size_problem("t", clean, 16 * MIB, "x") is None
    assert timestamp_window(clean).unlimited


def test_kafka4_default_window_refuses_two_hours_ahead_and_keeps_thirty_days_behind() -> None:
    window = timestamp_window(KAFKA4_DEFAULTS)
    assert not window.unlimited
    assert window.describe() == "message.timestamp.after.max.ms=3600000"
    now = 1_800_000_000_000
    low, high = window.bounds(now)
    assert not low <= now + 2 * 3_600_000 <= high
    assert low <= now - 30 * 86_400_000 <= high
    assert high == now + 3_600_000 - CLOCK_MARGIN_MS
    log_append = timestamp_window({**KAFKA4_DEFAULTS, "message.timestamp.type": "LogAppendTime"})
    assert log_append.bounds(now) == (-LONG_MAX - 1, LONG_MAX)
    assert log_append.describe() == "message.timestamp.type=LogAppendTime"


def test_the_legacy_difference_setting_bounds_both_sides() -> None:
    window = timestamp_window({"message.timestamp.difference.max.ms": "600000"})
    assert (window.before_ms, window.after_ms) == (600_000, 600_000)


@given(
    before=st.one_of(st.just(LONG_MAX), st.integers(0, 10**12)),
    after=st.one_of(st.just(LONG_MAX), st.integers(0, 10**12)),
    now=st.integers(0, 4 * 10**12),
    ts=st.integers(-(2**63), 2**63 - 1),
)
def test_bounds_never_admit_a_timestamp_the_broker_would_refuse(before, after, now, ts) -> None:
    # the broker (same clock, for this property) refuses ts > now + after or ts < now - before;
    # Long.MAX_VALUE is "no limit"
    low, high = TimestampWindow(before_ms=before, after_ms=after).bounds(now)
    if low <= ts <= high:
        assert after == LONG_MAX or ts <= now + after - CLOCK_MARGIN_MS
        assert before == LONG_MAX or ts >= now - before + CLOCK_MARGIN_MS


def test_the_receivers_producer_admits_max_record_size() -> None:
    config = ReceiverConfig(allow_cleartext=True)
    assert int(config.producer_config()["message.max.bytes"]) == record_limit(16 * MIB)
    small = ReceiverConfig(
        allow_cleartext=True, max_record_size=1000, max_message_size=5096, run_max_bytes=1024
    )
    assert int(small.producer_config()["message.max.bytes"]) == record_limit(1024)  # a run
    # records smaller than the run cap: the run cap decides what the raw topic must admit
    default_runs = ReceiverConfig(allow_cleartext=True, max_record_size=1000, max_message_size=5096)
    assert int(default_runs.producer_config()["message.max.bytes"]) == record_limit(65_536)
    bigger = ReceiverConfig(allow_cleartext=True, kafka={"message.max.bytes": "50000000"})
    assert bigger.producer_config()["message.max.bytes"] == "50000000"  # a larger one is kept


def test_a_producer_limit_below_max_record_size_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError) as info:
        ReceiverConfig(allow_cleartext=True, kafka={"message.max.bytes": "1000000"})
    assert info.value.key == "kafka.message.max.bytes"
    assert str(record_limit(16 * MIB)) in str(info.value)


def test_the_rereader_admits_records_over_its_fetch_defaults() -> None:
    default = consumer_conf({"bootstrap.servers": "b"}, {}, group_id="g", max_record_size=16 * MIB)
    assert "fetch.max.bytes" not in default  # librdkafka's defaults hold 16 MiB
    huge = consumer_conf({"bootstrap.servers": "b"}, {}, group_id="g", max_record_size=200 * MIB)
    assert huge["fetch.max.bytes"] >= record_limit(200 * MIB)
    assert huge["receive.message.max.bytes"] >= huge["fetch.max.bytes"] + 512
