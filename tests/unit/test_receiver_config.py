"""ReceiverConfig: layering, validation naming the key, and the CLI's --check-config / exit 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from common import settings
from common.errors import ConfigError
from common.wire import Key, KeyRing
from receiver import cli
from receiver.config import (
    DEFAULT_RUN_MAX_BYTES,
    ENV_PREFIX,
    IDEMPOTENT_INFLIGHT_RECORDS,
    ReceiverConfig,
)
from runtime import key_files


def _build(file_values=None, env=None, flags=None) -> ReceiverConfig:
    return settings.build(
        ReceiverConfig, file_values=file_values, env=env, env_prefix=ENV_PREFIX, flags=flags
    )


def test_layers_file_then_env_then_flags() -> None:
    cfg = _build(
        file_values={"allow_cleartext": True, "listen_port": 1000, "raw_topic": "a"},
        env={"DIODE_RECEIVER_LISTEN_PORT": "2000", "DIODE_RECEIVER_KAFKA__LINGER_MS": "7"},
        flags={"listen_port": "3000"},
    )
    assert cfg.listen_port == 3000
    assert cfg.raw_topic == "a"
    assert cfg.producer_config()["linger.ms"] == "7"


def test_producer_config_pins_idempotence_and_bounds_the_queue() -> None:
    cfg = _build(
        file_values={
            "allow_cleartext": True,
            "buffer_max_records": 5000,
            "buffer_max_bytes": 4 * 1024 * 1024,
        }
    )
    props = cfg.producer_config()
    assert props["enable.idempotence"] == "true"
    assert props["acks"] == "all"
    assert props["queue.buffering.max.messages"] == "5000"
    assert props["queue.buffering.max.kbytes"] == "4096"


def test_a_default_batch_leaves_room_for_a_second_request_in_flight() -> None:
    # librdkafka's idempotent producer counts records in flight against its 5 requests: a batch of
    # 5 runs or more would keep one request per partition in flight and its broker thread spinning.
    props = _build(file_values={"allow_cleartext": True}).producer_config()
    assert int(props["batch.num.messages"]) < IDEMPOTENT_INFLIGHT_RECORDS
    # ... and the batches still fill: 4 runs of the default size fit one batch.size
    assert int(props["batch.num.messages"]) * DEFAULT_RUN_MAX_BYTES <= int(props["batch.size"])


def test_the_largest_raw_record_is_a_run_or_one_record_whichever_is_larger() -> None:
    small = _build(file_values={"allow_cleartext": True, "max_record_size": 10_000})
    assert small.raw_size_setting() == ("run_max_bytes", 65_536)
    assert small.producer_config()["message.max.bytes"] == str(65_536 + 4096)
    large = _build(file_values={"allow_cleartext": True})
    assert large.raw_size_setting() == ("max_record_size", 16 * 1024 * 1024)


def test_a_raw_topic_smaller_than_a_run_is_a_problem_naming_run_max_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from receiver import topic_check  # noqa: PLC0415

    cfg = _build(
        file_values={"allow_cleartext": True, "max_record_size": 10_000, "run_max_bytes": 1 << 20}
    )
    monkeypatch.setattr(topic_check, "describe_topic", lambda *_: {"max.message.bytes": "1048588"})
    problem = topic_check.raw_topic_problem(cfg, "raw")
    assert problem is not None
    assert "run_max_bytes" in problem
    assert "1052672" in problem
    assert "or lower run_max_bytes to at most 1044492" in problem  # receiver-only: one side
    fits = _build(
        file_values={"allow_cleartext": True, "max_record_size": 10_000, "run_max_bytes": 900_000}
    )
    assert topic_check.raw_topic_problem(fits, "raw") is None


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"allow_cleartext": True, "raw_topic": "bad topic"}, "raw_topic"),
        ({"allow_cleartext": True, "sockets": 0}, "sockets"),
        ({}, "key_file"),
        ({"allow_cleartext": True, "kafka": {"acks": "1"}}, "kafka.acks"),
        (
            {"allow_cleartext": True, "kafka": {"queue.buffering.max.messages": "9"}},
            "kafka.queue.buffering.max.messages",
        ),
        ({"allow_cleartext": True, "replay_window": 3}, "replay_window"),
        ({"allow_cleartext": True, "rcvbuf_bytes": 10}, "rcvbuf_bytes"),
        ({"allow_cleartext": True, "listen_portt": 1}, "listen_portt"),
        ({"allow_cleartext": True, "listen_ports": [0]}, "listen_ports"),
        ({"allow_cleartext": True, "listen_ports": [70000]}, "listen_ports"),
        ({"allow_cleartext": True, "listen_ports": [9471, 9471]}, "listen_ports"),
        ({"allow_cleartext": True, "listen_port": 9471, "listen_ports": [9471]}, "listen_ports"),
        (
            {"allow_cleartext": True, "listen_ports": list(range(9471, 9480)), "sockets": 8},
            "listen_ports",
        ),
        ({"allow_cleartext": True, "run_max_bytes": 100}, "run_max_bytes"),
        ({"allow_cleartext": True, "raw_topic_partitions": 0}, "raw_topic_partitions"),
        ({"allow_cleartext": True, "raw_topic_replication": 0}, "raw_topic_replication"),
        (
            {"allow_cleartext": True, "raw_topic_min_insync_replicas": -3},
            "raw_topic_min_insync_replicas",
        ),
        (
            {
                "allow_cleartext": True,
                "raw_topic_replication": 1,
                "raw_topic_min_insync_replicas": 2,
            },
            "raw_topic_min_insync_replicas",
        ),
        ({"allow_cleartext": True, "run_max_bytes": 2_000_000_000}, "run_max_bytes"),
        ({"allow_cleartext": True, "run_linger": -0.1}, "run_linger"),
        ({"allow_cleartext": True, "run_linger": 60}, "run_linger"),
        ({"allow_cleartext": True, "read_pause": -0.001}, "read_pause"),
        ({"allow_cleartext": True, "read_pause": 0.051}, "read_pause"),
        (
            {"allow_cleartext": True, "kafka": {"delivery.report.only.error": "true"}},
            "kafka.delivery.report.only.error",
        ),
        (
            {
                "allow_cleartext": True,
                "max_record_size": 10_000,
                "run_max_bytes": 2_000_000,
                "kafka": {"message.max.bytes": "1000000"},
            },
            "kafka.message.max.bytes",
        ),
    ],
)
def test_bad_values_name_the_key(values, key) -> None:
    with pytest.raises(ConfigError) as info:
        _build(file_values=values)
    assert info.value.key == key


def test_raw_topic_template() -> None:
    cfg = _build(file_values={"allow_cleartext": True, "raw_topic": "raw.{topic}"})
    assert cfg.raw_topic_for("orders") == "raw.orders"


def test_every_field_is_documented() -> None:
    docs = settings.field_docs(ReceiverConfig)

    missing = [f.name for f in dataclasses.fields(ReceiverConfig) if not docs.get(f.name)]
    assert missing == []


def test_check_config_prints_json(tmp_path: Path, capsys, monkeypatch) -> None:
    key_file = tmp_path / "keys.json"
    key_files.write_keyring(KeyRing([Key.generate()]), key_file)
    toml = tmp_path / "r.toml"
    toml.write_text(
        f'key_file = "{key_file}"\nraw_topic = "raw"\n[kafka]\n"sasl.password" = "x"\n'
        '"sasl.jaas.config" = "ScramLoginModule required password=\\"y\\";"\n'
    )
    monkeypatch.delenv("DIODE_RECEIVER_LISTEN_PORT", raising=False)
    code = cli.main(["--config", str(toml), "--check-config", "--listen-port", "5555"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["listen_port"] == 5555
    assert out["kafka"]["sasl.password"] == "***"
    assert out["kafka"]["sasl.jaas.config"] == "***"  # Java's login line carries the password


def test_bad_config_exits_2_naming_the_key(tmp_path: Path, capsys) -> None:
    code = cli.main(["--allow-cleartext", "true", "--sockets", "0", "--check-config"])
    assert code == 2
    assert "sockets" in capsys.readouterr().err


def test_unreadable_key_file_exits_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "k.json"
    bad.write_text("not json")
    assert cli.main(["--key-file", str(bad), "--check-config"]) == 2
    assert "k.json" in capsys.readouterr().err


def test_workers_are_laid_out_port_by_port() -> None:
    cfg = _build(
        file_values={
            "allow_cleartext": True,
            "listen_port": 9470,
            "listen_ports": [9480, 9490],
            "sockets": 2,
            "worker_processes": True,
            "metrics_port": 9600,
        }
    )
    assert cfg.ports() == (9470, 9480, 9490)
    assert cfg.socket_count() == 6
    workers = [cfg.for_worker(i) for i in range(cfg.socket_count())]
    assert [w.listen_port for w in workers] == [9470, 9470, 9480, 9480, 9490, 9490]
    assert {(w.listen_ports, w.sockets, w.worker_processes) for w in workers} == {((), 1, False)}
    assert [w.metrics_port for w in workers] == list(range(9600, 9606))


def test_the_raw_topic_is_created_with_the_settings_and_the_size_its_records_need() -> None:
    from receiver import topic_check  # noqa: PLC0415

    cfg = _build(
        file_values={
            "allow_cleartext": True,
            "raw_topic_partitions": 12,
            "raw_topic_replication": 3,
            "raw_topic_min_insync_replicas": 2,
            "max_record_size": 10_000,
            "run_max_bytes": 900_000,
        }
    )
    spec = topic_check.raw_topic_spec(cfg, "raw")
    assert (spec.name, spec.partitions, spec.replication) == ("raw", 12, 3)
    assert dict(spec.config) == {"max.message.bytes": "904096", "min.insync.replicas": "2"}
    broker_default = _build(
        file_values={"allow_cleartext": True, "raw_topic_min_insync_replicas": -1}
    )
    assert "min.insync.replicas" not in topic_check.raw_topic_spec(broker_default, "raw").config


def test_a_raw_topic_the_cluster_cannot_create_while_failing_over_is_created_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError  # noqa: PLC0415

    from receiver import topic_check  # noqa: PLC0415
    from runtime import kafka  # noqa: PLC0415

    cfg = _build(file_values={"allow_cleartext": True})

    def creating(error_code: int) -> object:
        def create(*_args: object, **_kwargs: object) -> object:
            raise kafka.error(KafkaError(error_code), "cannot create topic 'raw'", topic="raw")

        return create

    # a controller failing over: a warning, and the sink creates the topic when it needs it
    monkeypatch.setattr(topic_check.kafka, "create_missing_topics", creating(KafkaError._TIMED_OUT))
    assert topic_check.ensure_raw_topic(cfg, "raw") is False
    # a refusal stops the start-up, naming the setting
    monkeypatch.setattr(
        topic_check.kafka, "create_missing_topics", creating(KafkaError.INVALID_REPLICATION_FACTOR)
    )
    with pytest.raises(ConfigError, match="raw_topic_replication"):
        topic_check.ensure_raw_topic(cfg, "raw")
