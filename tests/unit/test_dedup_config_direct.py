"""The dedup's ``STATE_LAYOUT`` and ``STATE_TOPIC`` settings (``dedup/config.py``), without Spark
or Kafka: what the direct layout accepts and what it refuses, naming the variable."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from dedup.config import DedupConfig, from_sources

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/var/lib/d"}
DIRECT = {**BASE, "STATE_LAYOUT": "direct"}


def test_the_defaults_are_auto_and_the_state_topic() -> None:
    cfg = from_sources(BASE)
    assert cfg.state_layout == "auto"
    assert cfg.state_topic == "kafka-diode.dedup.state"
    assert DedupConfig.state_layout == "auto"


@pytest.mark.parametrize(
    ("env", "new_layout"),
    [
        ({}, "direct"),  # one raw topic
        ({"RAW_TOPICS": "chain-1,chain-2"}, "buckets"),  # chains merge several
        ({"KAFKA_SOURCE_MINPARTITIONS": "4"}, "buckets"),  # one raw partition over many tasks
        ({"KAFKA_SOURCE_maxRecordsPerPartition": "9"}, "buckets"),
        ({"STATE_LAYOUT": "buckets"}, "buckets"),  # an explicit choice wins
        ({"STATE_LAYOUT": "direct"}, "direct"),
    ],
)
def test_auto_picks_direct_where_direct_is_possible(env: dict[str, str], new_layout: str) -> None:
    assert from_sources({**BASE, **env}).new_state_layout == new_layout


def test_direct_with_one_raw_topic_is_accepted() -> None:
    cfg = from_sources(DIRECT)
    assert cfg.state_layout == "direct"
    assert cfg.raw_topics == ("raw",)
    assert cfg.state_topic == "kafka-diode.dedup.state"


def test_direct_and_its_state_topic_may_come_from_flags() -> None:
    cfg = from_sources(BASE, {"state_layout": "direct", "state_topic": "dedup.state.b"})
    assert (cfg.state_layout, cfg.state_topic) == ("direct", "dedup.state.b")


def test_direct_accepts_kafka_source_options_that_keep_one_task_per_partition() -> None:
    cfg = from_sources({**DIRECT, "KAFKA_SOURCE_KAFKA_SECURITY_PROTOCOL": "SSL"})
    assert cfg.kafka_source == {"kafka.security.protocol": "SSL"}


@pytest.mark.parametrize("value", ["bogus", "Direct", "partitions", ""])
def test_an_unknown_layout_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({**BASE, "STATE_LAYOUT": value})
    assert info.value.key == "STATE_LAYOUT"
    assert "STATE_LAYOUT" in str(info.value)
    assert info.value.fix is not None
    assert "direct" in info.value.fix


@pytest.mark.parametrize("raw_topics", ["a,b", "a, b, c"])
def test_direct_refuses_several_raw_topics(raw_topics: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({**DIRECT, "RAW_TOPICS": raw_topics})
    assert info.value.key == "STATE_LAYOUT"
    assert "RAW_TOPICS" in info.value.problem
    # the same topics are fine for the buckets layout (chains)
    assert len(from_sources({**BASE, "RAW_TOPICS": raw_topics}).raw_topics) >= 2


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KAFKA_SOURCE_MINPARTITIONS", "4"),
        ("KAFKA_SOURCE_minPartitions", "4"),
        ("KAFKA_SOURCE_maxRecordsPerPartition", "10"),
        ("KAFKA_SOURCE_MAXRECORDSPERPARTITION", "10"),
    ],
)
def test_direct_refuses_source_options_that_split_raw_partitions(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({**DIRECT, variable: value})
    assert info.value.key.upper() == variable.upper()  # all-caps names reach us lower-cased
    assert "direct" in info.value.problem
    # auto leaves Spark to split partitions as it likes: the buckets layout
    assert from_sources({**BASE, variable: value}).new_state_layout == "buckets"


def test_direct_names_one_of_two_splitting_options() -> None:
    with pytest.raises(ConfigError) as info:
        from_sources(
            {
                **DIRECT,
                "KAFKA_SOURCE_MINPARTITIONS": "4",
                "KAFKA_SOURCE_maxRecordsPerPartition": "10",
            }
        )
    assert info.value.key in ("KAFKA_SOURCE_MINPARTITIONS", "KAFKA_SOURCE_maxRecordsPerPartition")


@pytest.mark.parametrize("layout", ["buckets", "direct"])
@pytest.mark.parametrize(
    ("env", "state_topic"),
    [
        ({}, "kafka-diode.dedup.progress"),
        ({}, "raw"),
        ({"RAW_TOPICS": "raw.a"}, "raw.a"),
        ({}, "kafka-diode.gaps"),
        ({}, "kafka-diode.dedup.control"),
        ({"CLEAN_TOPIC": "clean"}, "clean"),
        ({"PROGRESS_TOPIC": "p"}, "p"),
    ],
)
def test_a_state_topic_that_is_another_topic_is_refused(
    layout: str, env: dict[str, str], state_topic: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({**BASE, **env, "STATE_LAYOUT": layout, "STATE_TOPIC": state_topic})
    assert info.value.key == "STATE_TOPIC"


@pytest.mark.parametrize("state_topic", ["", "with space", "a/b", "x" * 250, "state{topic}"])
def test_an_invalid_state_topic_name_is_refused(state_topic: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({**DIRECT, "STATE_TOPIC": state_topic})
    assert info.value.key == "STATE_TOPIC"
    assert "not a valid Kafka topic name" in info.value.problem


def test_a_state_topic_of_the_longest_valid_name_is_accepted() -> None:
    assert from_sources({**DIRECT, "STATE_TOPIC": "s" * 249}).state_topic == "s" * 249


def test_the_dataclass_refuses_like_the_environment() -> None:
    with pytest.raises(ConfigError) as info:
        DedupConfig(
            raw_topics=("a", "b"),
            bootstrap_servers="k:9092",
            state_dir_config="/d",
            state_layout="direct",
        )
    assert info.value.key == "STATE_LAYOUT"
    with pytest.raises(ConfigError) as info:
        DedupConfig(
            raw_topics=("raw",),
            bootstrap_servers="k:9092",
            state_dir_config="/d",
            state_layout="direct",
            kafka_source={"minPartitions": "4"},
        )
    assert info.value.key == "KAFKA_SOURCE_minPartitions"  # as the operator wrote it


def test_direct_transactions_default_to_spark_s_parallelism_and_refuse_a_negative() -> None:
    assert from_sources(DIRECT).direct_transactions == 0
    assert from_sources({**DIRECT, "DIRECT_TRANSACTIONS": "4"}).direct_transactions == 4
    with pytest.raises(ConfigError) as info:
        from_sources({**DIRECT, "DIRECT_TRANSACTIONS": "-1"})
    assert info.value.key == "DIRECT_TRANSACTIONS"
