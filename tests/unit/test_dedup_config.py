"""Dedup configuration (operator names, pass-through, errors), without Spark or Kafka."""

import os

import pytest

from common.errors import ConfigError
from dedup.config import DedupConfig, environment_help, from_sources

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/var/lib/d"}


def test_operator_names_and_pass_through() -> None:
    cfg = from_sources(
        {
            **BASE,
            "RAW_TOPICS": "raw.a, raw.b",
            "WINDOW_SIZE": "1000",
            "MAX_WINDOWS": "20",
            "CLEAN_TOPIC": "{topic}",
            "GAP_EMIT_INTERVAL_SEC": "2.5",
            "PERSIST_INTERVAL_MS": "250",
            "SPARK_CONF_SPARK_EXECUTOR_MEMORY": "4g",
            "SPARK_CONF_spark_executor_memoryOverhead": "1g",
            "KAFKA_CONF_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SOURCE_KAFKA_SECURITY_PROTOCOL": "SSL",
            "UNRELATED": "x",
        }
    )
    assert cfg.raw_topics == ("raw.a", "raw.b")
    assert (cfg.window_size, cfg.max_windows, cfg.persist_interval_ms) == (1000, 20, 250)
    assert cfg.gap_emit_interval_sec == 2.5
    assert cfg.clean_topic_for("orders") == "orders"
    assert cfg.spark_conf == {
        "spark.executor.memory": "4g",
        "spark.executor.memoryOverhead": "1g",
    }
    assert cfg.kafka_conf == {"security.protocol": "SASL_SSL"}
    assert cfg.kafka_source == {"kafka.security.protocol": "SSL"}


def test_flags_override_environment() -> None:
    cfg = from_sources({**BASE, "WINDOW_SIZE": "1000"}, {"window_size": "50"})
    assert cfg.window_size == 50


@pytest.mark.parametrize(("cores", "expected"), [(0, 1), (1, 1), (2, 1), (3, 1), (8, 4)])
def test_state_partitions_default_to_half_the_cores(cores: int, expected: int) -> None:
    """A state partition's task keeps two Python workers busy: one per two cores, at least one."""
    assert from_sources(BASE).effective_shuffle_partitions(cores) == expected
    host = from_sources(BASE).effective_shuffle_partitions()
    assert host == from_sources(BASE).effective_shuffle_partitions(os.cpu_count() or 1)
    assert from_sources({**BASE, "SHUFFLE_PARTITIONS": "3"}).effective_shuffle_partitions(8) == 3


def test_transactional_id_is_stable_per_checkpoint() -> None:
    a = from_sources(BASE)
    b = from_sources(BASE)
    c = from_sources({**BASE, "STATE_DIR_CONFIG": "/elsewhere"})
    assert a.writer_transactional_id == b.writer_transactional_id != c.writer_transactional_id
    assert from_sources({**BASE, "TRANSACTIONAL_ID": "t1"}).writer_transactional_id == "t1"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RAW_TOPICS": ""}, "RAW_TOPICS"),
        ({"WINDOW_SIZE": "0"}, "WINDOW_SIZE"),
        ({"WINDOW_SIZE": "many"}, "WINDOW_SIZE"),
        ({"MAX_WINDOWS": "-1"}, "MAX_WINDOWS"),
        ({"GAP_EMIT_INTERVAL_SEC": "0"}, "GAP_EMIT_INTERVAL_SEC"),
        ({"PERSIST_INTERVAL_MS": "x"}, "PERSIST_INTERVAL_MS"),
        ({"CLEAN_TOPIC": "clean.{source}"}, "CLEAN_TOPIC"),
        ({"CLEAN_TOPIC": "raw"}, "CLEAN_TOPIC"),
        ({"BOOTSTRAP_SERVERS": " "}, "BOOTSTRAP_SERVERS"),
        ({"FAIL_ON_DATA_LOSS": "perhaps"}, "FAIL_ON_DATA_LOSS"),
        ({"KAFKA_CONF_TRANSACTIONAL_ID": "x"}, "KAFKA_CONF_TRANSACTIONAL_ID"),
        ({"MAX_RECORD_SIZE": "0"}, "MAX_RECORD_SIZE"),
        ({"KAFKA_CONF_MESSAGE_MAX_BYTES": "1000000"}, "KAFKA_CONF_MESSAGE_MAX_BYTES"),
        (
            {"MAX_RECORD_SIZE": "200000000", "KAFKA_CONF_RECEIVE_MESSAGE_MAX_BYTES": "100000000"},
            "KAFKA_CONF_RECEIVE_MESSAGE_MAX_BYTES",
        ),
    ],
)
def test_errors_name_the_variable_and_the_fix(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({**BASE, **env})
    assert named in info.value.key


def test_missing_required_names_env_and_flag() -> None:
    with pytest.raises(ConfigError) as info:
        from_sources({"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:1"})
    assert info.value.key == "STATE_DIR_CONFIG"
    assert "--state-dir-config" in str(info.value)


def test_help_lists_every_variable() -> None:
    text = environment_help()
    for name in DedupConfig.__dataclass_fields__:
        if name not in ("spark_conf", "kafka_conf", "kafka_source"):
            assert name.upper() in text
    assert "SPARK_CONF_<NAME>" in text
    assert "KAFKA_CONF_<NAME>" in text


def test_the_batch_default_fits_the_receivers_default_runs() -> None:
    """``MAX_OFFSETS_PER_TRIGGER`` against what the receiver's run defaults write (docs/
    operations.md "Many source partitions"): a trigger's worth of runs from 128 busy source
    partitions fits one batch (with 2,000, 128 partitions at 5,000 records/s fell behind), and a
    batch of full runs stays within the 640 MB that tests/integration/test_dedup_heap.py carries
    through the default heap."""
    from receiver.config import DEFAULT_RUN_LINGER, DEFAULT_RUN_MAX_BYTES  # noqa: PLC0415

    cfg = from_sources(BASE)
    runs_per_trigger = 128 / DEFAULT_RUN_LINGER * cfg.persist_interval_ms / 1000
    assert cfg.max_offsets_per_trigger >= runs_per_trigger
    assert cfg.max_offsets_per_trigger * DEFAULT_RUN_MAX_BYTES <= 640 * 2**20
