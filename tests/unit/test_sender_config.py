"""SenderConfig: layering, validation naming the key, secrets masked, key loading."""

import argparse
import json
import string

import pytest

from common import settings
from common.errors import ConfigError
from common.wire import Key, KeyRing
from runtime import key_files
from sender import cli
from sender.config import (
    ENV_PREFIX,
    FETCH_QUEUE_BACKOFF_MS,
    FETCH_QUEUE_KBYTES,
    SenderConfig,
    load_keyring,
)

BASE = {
    "bootstrap_servers": "127.0.0.1:9092",
    "target": "127.0.0.1:9000",
    "topics": ["a"],
    "insecure_cleartext": True,
}


def make(**overrides):
    values = {**BASE, **overrides}
    return settings.build(SenderConfig, file_values=values)


def test_layers_file_env_flags() -> None:
    cfg = settings.build(
        SenderConfig,
        file_values={**BASE, "copies": 2, "linger": 0.01},
        env={
            "DIODE_SENDER_COPIES": "3",
            "DIODE_SENDER_KAFKA__SECURITY_PROTOCOL": "SSL",
            "OTHER": "x",
        },
        env_prefix=ENV_PREFIX,
        flags={"copies": "4"},
    )
    assert cfg.copies == 4
    assert cfg.linger == 0.01
    assert cfg.kafka == {"security.protocol": "SSL"}
    assert cfg.consumer_properties()["security.protocol"] == "SSL"
    assert cfg.consumer_properties()["enable.auto.commit"] is False


def test_the_live_consumer_is_a_static_member_under_a_stable_derived_id() -> None:
    # A restarted sender rejoins as the member it was, so it need not wait out the dead one's
    # session (docs/sender.md, "Restarts"); another group, topic selection or sender_id is
    # another member, so two senders of one group on one host do not fence each other.
    props = make(sender_id="high-1").group_consumer_properties()
    member = props["group.instance.id"]
    assert member == make(sender_id="high-1").group_instance_id()
    assert isinstance(member, str)
    assert member.startswith("kafka-diode-sender-high-1-")
    others = {
        make(sender_id="high-2").group_instance_id(),
        make(sender_id="high-1", group_id="other").group_instance_id(),
        make(sender_id="high-1", topics=["b"]).group_instance_id(),
        make(sender_id="high-1", exclude_topics="^x").group_instance_id(),
    }
    assert member not in others
    assert len(others) == 4
    # the order topics are listed in names the same selection
    assert (
        make(topics=["a", "b"]).group_instance_id() == make(topics=["b", "a"]).group_instance_id()
    )
    # Kafka takes [a-zA-Z0-9._-], at most 249 characters
    odd = make(sender_id="höst name/" + "x" * 240).group_instance_id()
    assert len(odd) <= 249
    assert set(odd) <= set(string.ascii_letters + string.digits + "._-")
    # the resend's consumer (a throwaway group) and an operator's choice are left alone
    assert "group.instance.id" not in make().consumer_properties()
    named = make(kafka={"group.instance.id": "mine"}).group_consumer_properties()
    assert named["group.instance.id"] == "mine"
    off = make(static_membership=False).group_consumer_properties()
    assert "group.instance.id" not in off


def test_a_full_prefetch_queue_is_fetched_again_soon() -> None:
    # librdkafka's default backoff (1 s) outlasts the bounded queue drained unpaced: a backlog
    # idled half of each second (bench/sender_fetch.py). The operator's ``kafka`` table wins.
    props = make().consumer_properties()
    assert props["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS <= 50
    assert props["queued.max.messages.kbytes"] == FETCH_QUEUE_KBYTES
    mine = make(kafka={"fetch.queue.backoff.ms": "200", "queued.max.messages.kbytes": "4096"})
    assert mine.consumer_properties()["fetch.queue.backoff.ms"] == "200"
    assert mine.consumer_properties()["queued.max.messages.kbytes"] == "4096"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"topcs": ["a"]}, "topcs"),
        ({"target": "nohost"}, "target"),
        ({"target": "h:70000"}, "target"),
        ({"bind": "[::1"}, "bind"),
        ({"topics": []}, "topics"),
        ({"topics": ["^(("]}, "topics"),
        ({"exclude_topics": "(("}, "exclude_topics"),
        ({"copies": 0}, "copies"),
        ({"rate_bytes": -5}, "rate_bytes"),
        ({"start_position": "middle"}, "start_position"),
        ({"start_position": "timestamp"}, "start_timestamp"),
        ({"start_position": "timestamp", "start_timestamp": "yesterday"}, "start_timestamp"),
        ({"insecure_cleartext": False}, "key_file"),
        ({"kafka": {"enable.auto.commit": "true"}}, "kafka.enable.auto.commit"),
        ({"max_datagram_size": 100}, "max_datagram_size"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"target_ports": [9001, 9001]}, "target_ports"),
        ({"target_ports": [0]}, "target_ports"),
        ({"password": "pw", "insecure_cleartext": False}, "salt"),
    ],
)
def test_bad_values_name_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    assert info.value.key == key


def test_timestamp_start_accepts_iso_and_millis() -> None:
    iso = make(start_position="timestamp", start_timestamp="2024-05-01T00:00:00Z")
    assert iso.start_timestamp_ms() == 1714521600000
    assert make(start_position="timestamp", start_timestamp="123").start_timestamp_ms() == 123


def test_targets_include_extra_ports() -> None:
    cfg = make(target_ports=[9001, 9002])
    assert cfg.targets() == [("127.0.0.1", 9000), ("127.0.0.1", 9001), ("127.0.0.1", 9002)]


def test_key_file_missing_unreadable_or_malformed_names_key_file(tmp_path) -> None:
    missing = make(insecure_cleartext=False, key_file=str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError) as info:
        load_keyring(missing)
    assert info.value.key == "key_file"
    assert "does not exist" in str(info.value)

    unreadable = tmp_path / "dir.json"
    unreadable.mkdir()  # a directory cannot be read as a file, even by root
    with pytest.raises(ConfigError) as info:
        load_keyring(make(insecure_cleartext=False, key_file=str(unreadable)))
    assert info.value.key == "key_file"

    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    with pytest.raises(ConfigError) as info:
        load_keyring(make(insecure_cleartext=False, key_file=str(junk)))
    assert info.value.key == "key_file"


def test_key_file_and_password_load(tmp_path) -> None:
    key = Key.generate()
    path = tmp_path / "k.json"
    key_files.write_keyring(KeyRing([key], active=key.key_id), path)
    ring = load_keyring(make(insecure_cleartext=False, key_file=str(path)))
    assert ring is not None
    assert ring.active.key_id == key.key_id


def test_check_config_masks_secrets_and_exits_0(tmp_path, capsys, monkeypatch) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text(
        'bootstrap_servers = "127.0.0.1:9092"\ntarget = "127.0.0.1:9000"\ntopics = ["a", "^b.*"]\n'
        '[kafka]\n"sasl.password" = "hunter2"\n'
    )
    monkeypatch.setenv("DIODE_SENDER_PASSWORD", "s3cret")
    monkeypatch.setenv("DIODE_SENDER_SALT", "00" * 16)
    assert cli.main(["--config", str(toml), "--check-config"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    assert "hunter2" not in out
    shown = json.loads(out)
    assert shown["password"] == "***"
    assert shown["topics"] == ["a", "^b.*"]


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--topics", "a", "--copies", "x"], {}, "--copies"),
        (["--topics", "a", "--key-file", "/nonexistent/key.json"], {}, "key_file"),
        (
            ["--topics", "a", "--insecure-cleartext", "true"],
            {"DIODE_SENDER_COPYS": "2"},
            "DIODE_SENDER_COPYS",
        ),
        (
            ["--topics", "a", "--insecure-cleartext", "true", "--target", "no-such.invalid:1"],
            {},
            "target",
        ),
    ],
)
def test_cli_config_errors_exit_2_naming_the_key(argv, env, needle, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DIODE_SENDER_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("DIODE_SENDER_TARGET", "127.0.0.1:9000")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_help_documents_every_field() -> None:
    text = cli.build_parser("kafka-diode send").format_help()
    for name in settings.field_docs(SenderConfig):
        assert settings.flag_name(name) in text
    assert isinstance(cli.build_parser("x"), argparse.ArgumentParser)


def test_pacing_that_cannot_carry_the_largest_record_stops_start_up() -> None:
    """Issue #14: at 300 kB/s a 16 MiB record takes ~56 s, longer than the receiver's
    reassembly_timeout: refused at start-up, naming max_record_size and the fix."""
    with pytest.raises(ConfigError) as err:
        make(rate_bytes=300_000)
    assert err.value.key == "max_record_size"
    assert "reassembly_timeout" in str(err.value)
    make(rate_bytes=300_000, max_record_size=1_000_000)  # 3.4 s: fine
    make(rate_bytes=300_000, reassembly_timeout=120)  # the receiver waits longer: fine
    with pytest.raises(ConfigError) as err:
        make(rate_datagrams=100, max_record_size=1_000_000, copies=2)
    assert err.value.key == "max_record_size"
    assert make().largest_message_seconds() == 0.0  # unpaced: no bound


@pytest.mark.parametrize("window", [0, 63, (1 << 20) + 1])
def test_replay_window_out_of_range_names_the_key(window: int) -> None:
    with pytest.raises(ConfigError) as err:
        make(replay_window=window)
    assert err.value.key == "replay_window"
