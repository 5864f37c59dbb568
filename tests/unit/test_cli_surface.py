"""The command line as an operator meets it, through each command's real ``main(argv)`` and loader:
repeated list options reach the configuration, dedup variable typos are refused with the likely
name, ``--check-config`` opens every file it is given, netem takes its own words as flags
(docs/configuration.md, "Lists, tables and typos")."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from common import settings
from common.errors import ConfigError
from dedup import bundle_cli
from dedup import cli as dedup_cli
from dedup.config import from_sources, tool_config
from kafka_diode import cli, cli_reference, docs_gen, status
from netem import cli as netem_cli
from runtime.named_files import check_files, table_variable
from sender import resend_cli

ROOT = Path(__file__).resolve().parents[2]
DEDUP_ENV = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/tmp/ck"}


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "link.key"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["keygen", "--out", str(path)]) == 0
    return path


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def _send(key_file: Path, *extra: str) -> list[str]:
    return [
        "send",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--target",
        "127.0.0.1:9470",
        "--key-file",
        str(key_file),
        "--rate-bytes",
        "100000000",
        *extra,
        "--check-config",
    ]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DIODE_* or dedup variable of the machine running the tests leaks in."""
    import os  # noqa: PLC0415  only to empty it

    for var in list(os.environ):
        if var.startswith("DIODE_") or var in DEDUP_ENV:
            monkeypatch.delenv(var)
    return monkeypatch


# -- list options reach the configuration -----------------------------------------------------


def test_send_keeps_every_topic_and_rename(key_file: Path, clean_env: pytest.MonkeyPatch) -> None:
    code, out, err = _run(
        _send(key_file, "--topics", "a", "--topics", "c", "--rename", "a=b", "--rename", "c=d")
    )
    assert code == 0, err
    shown = json.loads(out)
    assert shown["topics"] == ["a", "c"]
    assert shown["rename"] == ["a=b", "c=d"]


def test_send_flags_replace_the_environment_list(
    key_file: Path, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("DIODE_SENDER_TOPICS", "x,y")
    code, out, err = _run(_send(key_file))
    assert code == 0, err
    assert json.loads(out)["topics"] == ["x", "y"]
    code, out, err = _run(_send(key_file, "--topics", "a", "--topics", "b,c"))
    assert code == 0, err
    assert json.loads(out)["topics"] == ["a", "b", "c"]


def test_send_property_tables_merge_by_key(key_file: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DIODE_SENDER_KAFKA__CLIENT_RACK", "r1")
    code, out, err = _run(
        _send(key_file, "--topics", "a", "--kafka", "socket.timeout.ms=1", "--kafka", "acks=1")
    )
    assert code == 0, err
    assert json.loads(out)["kafka"] == {"client.rack": "r1", "socket.timeout.ms": "1", "acks": "1"}


def test_receive_keeps_every_listen_port(clean_env: pytest.MonkeyPatch) -> None:
    code, out, err = _run(
        [
            "receive",
            "--allow-cleartext",
            "true",
            "--listen-ports",
            "9471",
            "--listen-ports",
            "9472,9473",
            "--check-config",
        ]
    )
    assert code == 0, err
    assert json.loads(out)["listen_ports"] == [9471, 9472, 9473]


def test_dedup_keeps_every_raw_topic(clean_env: pytest.MonkeyPatch) -> None:
    for var, value in DEDUP_ENV.items():
        clean_env.setenv(var, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = dedup_cli.main(["--raw-topics", "a", "--raw-topics", "b", "--check-config"])
    assert code == 0, err.getvalue()
    assert json.loads(out.getvalue())["raw_topics"] == ["a", "b"]


def test_resend_keeps_every_partition() -> None:
    args = resend_cli.build_parser("resend").parse_args(
        ["--topic", "t", "--partition", "0", "--partition", "2,3", "--from-time", "0"]
    )
    assert resend_cli.request_from_args(args).partitions == (0, 2, 3)


def test_bundle_create_keeps_every_topic(key_file: Path, clean_env: pytest.MonkeyPatch) -> None:
    parser = bundle_cli.build_parser("bundle")
    args = parser.parse_args(
        [
            "create",
            "--bootstrap-servers",
            "k:1",
            "--gap-topic",
            "g",
            "--key-file",
            str(key_file),
            "--topic",
            "a",
            "--topic",
            "b",
            "--dry-run",
        ]
    )
    assert bundle_cli.load_config(args, {}).topics == ("a", "b")


def test_status_keeps_every_raw_topic_and_receiver() -> None:
    args = status._parser("status").parse_args(
        [
            "--raw-topics",
            "r1",
            "--raw-topics",
            "r2",
            "--receiver-metrics",
            "h:1",
            "--receiver-metrics",
            "h:2",
            "--bootstrap-servers",
            "k:1",
        ]
    )
    config = status.config_from(args, {"RAW_TOPICS": "ignored"})
    assert config.raw_topics == ("r1", "r2")
    assert config.receiver_metrics == ("h:1", "h:2")
    assert status.config_from(status._parser("s").parse_args([]), DEDUP_ENV).raw_topics == ("raw",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Lists:
    items: tuple[str, ...] = ()
    """Items."""
    ports: tuple[int, ...] = ()
    """Ports."""


_ITEM = st.text("abcdefghij0123456789._-", min_size=1, max_size=6)


@given(
    file_items=st.lists(_ITEM, max_size=3),
    env_items=st.lists(_ITEM, max_size=3),
    first=st.lists(_ITEM, min_size=1, max_size=3),
    second=st.lists(_ITEM, min_size=1, max_size=3),
    ports=st.lists(st.integers(1, 65535), min_size=1, max_size=4),
)
def test_the_loader_keeps_repeats_and_flags_replace_lower_layers(
    file_items: list[str],
    env_items: list[str],
    first: list[str],
    second: list[str],
    ports: list[int],
) -> None:
    import argparse  # noqa: PLC0415

    # a flag value of exactly "--" is refused (the next test)
    assume("--" not in (",".join(first), ",".join(second)))
    parser = argparse.ArgumentParser(allow_abbrev=False)
    settings.add_flags(parser, _Lists)
    env = {"X_ITEMS": ",".join(env_items)} if env_items else {}
    argv = [f"--items={','.join(first)}", f"--items={','.join(second)}"]
    argv += [arg for p in ports for arg in ("--ports", str(p))]
    built = settings.build(
        _Lists,
        file_values={"items": file_items},
        env=env,
        env_prefix="X_",
        flags=parser.parse_args(argv),
    )
    assert built.items == tuple(first + second)
    assert built.ports == tuple(ports)
    unflagged = settings.build(
        _Lists, file_values={"items": file_items}, env=env, env_prefix="X_", flags={}
    )
    assert unflagged.items == tuple(env_items or file_items)


def test_a_list_flag_of_exactly_two_dashes_is_refused_not_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """argparse reads ``--items=--`` as the end of the options and hands over no value: the
    item would vanish, so the command line stops with a message instead."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(allow_abbrev=False)
    settings.add_flags(parser, _Lists)
    try:
        parsed = parser.parse_args(["--items=a", "--items=--"])
    except SystemExit:
        assert 'exactly "--"' in capsys.readouterr().err
    else:  # an argparse that hands the value over keeps it
        assert parsed.items == ["a", "--"]


# -- dedup environment typos ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "meant"),
    [
        ("WINDOW_SIZ", "WINDOW_SIZE"),
        ("window_size", "WINDOW_SIZE"),
        ("MAX_WINDOW", "MAX_WINDOWS"),
        ("RAW_TOPIC", "RAW_TOPICS"),
        ("GAP_TOPCI", "GAP_TOPIC"),
        ("KAFKA_CNF_SECURITY_PROTOCOL", "KAFKA_CONF_SECURITY_PROTOCOL"),
        ("SPARK_CONFIG_SPARK_EXECUTOR_MEMORY", "SPARK_CONF_SPARK_EXECUTOR_MEMORY"),
    ],
)
def test_a_dedup_variable_typo_names_the_likely_key(var: str, meant: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_sources({**DEDUP_ENV, var: "10"})
    assert caught.value.key == var
    assert caught.value.fix == f"did you mean {meant!r}?"
    with pytest.raises(ConfigError, match=re.escape(meant)):
        tool_config({**DEDUP_ENV, var: "10"})  # gaps, raw and dedup reset read the same file


@pytest.mark.parametrize(
    "var",
    [
        "PATH",
        "HOME",
        "JAVA_HOME",
        "SPARK_HOME",
        "SPARK_CONF_DIR",
        "SPARK_LOG_LEVEL",
        "SPARK_MASTER_HOST",
        "PYSPARK_PYTHON",
        "KAFKA_HEAP_OPTS",
        "KAFKA_OPTS",
        "HOSTNAME",
        "USER",
        "LANG",
        "INVOCATION_ID",
        "KAFKA_DIODE_DEDUP_FAULT",
    ],
)
def test_variables_that_are_not_the_dedup_s_are_left_alone(var: str) -> None:
    config = from_sources({**DEDUP_ENV, var: "/somewhere"})
    assert config.spark_conf == {}  # SPARK_CONF_DIR is Spark's own, not a setting


def test_a_spark_conf_variable_must_name_a_spark_setting() -> None:
    with pytest.raises(ConfigError, match="SPARK_CONF_SPARK_EXECUTOR_MEMORY"):
        from_sources({**DEDUP_ENV, "SPARK_CONF_EXECUTOR_MEMORY": "4g"})
    ok = from_sources({**DEDUP_ENV, "SPARK_CONF_SPARK_EXECUTOR_MEMORY": "4g"})
    assert ok.spark_conf == {"spark.executor.memory": "4g"}


def test_dedup_check_config_stops_on_a_typo(clean_env: pytest.MonkeyPatch) -> None:
    for var, value in {**DEDUP_ENV, "WINDOW_SIZ": "10"}.items():
        clean_env.setenv(var, value)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert dedup_cli.main(["--check-config"]) == dedup_cli.EXIT_CONFIG
    assert "WINDOW_SIZ: unknown environment variable (did you mean 'WINDOW_SIZE'?)" in (
        err.getvalue()
    )


def test_status_stops_on_a_dedup_variable_typo() -> None:
    with pytest.raises(ConfigError, match="did you mean 'GAP_TOPIC'"):
        status.config_from(status._parser("s").parse_args([]), {"GAP_TOPC": "g"})


@given(st.text(max_size=8), st.text(max_size=8))
def test_edit_distance_is_a_distance(a: str, b: str) -> None:
    assert settings.edit_distance(a, b) == settings.edit_distance(b, a)
    assert (settings.edit_distance(a, b) == 0) == (a == b)
    assert settings.edit_distance(a, b) <= max(len(a), len(b))
    if len(a) >= 2:
        swapped = a[1] + a[0] + a[2:]
        assert settings.edit_distance(a, swapped) <= 1


# -- --check-config opens every file it names ---------------------------------------------------


@pytest.mark.parametrize(
    "prop", ["ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.crl.location"]
)
def test_send_check_config_refuses_a_missing_kafka_file(
    key_file: Path, prop: str, clean_env: pytest.MonkeyPatch
) -> None:
    code, _, err = _run(_send(key_file, "--topics", "a", "--kafka", f"{prop}=/nonexistent/x.pem"))
    assert code == 2
    assert f"kafka.{prop}: /nonexistent/x.pem does not exist" in err


def test_a_ca_location_may_be_a_directory_or_probe_and_a_key_may_not(
    key_file: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    for value in ("probe", str(tmp_path)):
        code, _, err = _run(_send(key_file, "--topics", "a", "--kafka", f"ssl.ca.location={value}"))
        assert code == 0, err
    code, _, err = _run(_send(key_file, "--topics", "a", "--kafka", f"ssl.key.location={tmp_path}"))
    assert code == 2
    assert "kafka.ssl.key.location" in err
    assert "is a directory" in err


def test_receive_check_config_refuses_a_missing_certificate(clean_env: pytest.MonkeyPatch) -> None:
    code, _, err = _run(
        [
            "receive",
            "--allow-cleartext",
            "true",
            "--kafka",
            "ssl.certificate.location=/nope",
            "--check-config",
        ]
    )
    assert code == 2
    assert "kafka.ssl.certificate.location: /nope does not exist" in err


@pytest.mark.parametrize(
    "var",
    ["KAFKA_CONF_SSL_CA_LOCATION", "KAFKA_SOURCE_KAFKA_SSL_TRUSTSTORE_LOCATION"],
)
def test_dedup_check_config_refuses_a_missing_client_file(
    var: str, clean_env: pytest.MonkeyPatch
) -> None:
    for name, value in {**DEDUP_ENV, var: "/nonexistent.jks"}.items():
        clean_env.setenv(name, value)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert dedup_cli.main(["--check-config"]) == dedup_cli.EXIT_CONFIG
    assert f"{var}: /nonexistent.jks does not exist" in err.getvalue()


def test_resend_check_config_refuses_a_missing_bundle(
    key_file: Path, clean_env: pytest.MonkeyPatch
) -> None:
    code, out, err = _run(
        [
            "resend",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--target",
            "127.0.0.1:9470",
            "--key-file",
            str(key_file),
            "--bundle",
            "/nonexistent",
            "--check-config",
        ]
    )
    assert code == resend_cli.EXIT_BAD_BUNDLE
    assert out == ""
    assert "--bundle" in err
    assert "/nonexistent" in err


def test_resend_check_config_refuses_a_bundle_that_is_not_one(
    key_file: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"not a bundle")
    code, _, err = _run(
        [
            "resend",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--target",
            "127.0.0.1:9470",
            "--key-file",
            str(key_file),
            "--bundle",
            str(junk),
            "--check-config",
        ]
    )
    assert code == resend_cli.EXIT_BAD_BUNDLE, err


def test_bundle_create_refuses_a_missing_ca(key_file: Path, clean_env: pytest.MonkeyPatch) -> None:
    code, _, err = _run(
        [
            "bundle",
            "create",
            "--bootstrap-servers",
            "k:1",
            "--gap-topic",
            "g",
            "--key-file",
            str(key_file),
            "--dry-run",
            "--kafka",
            "ssl.ca.location=/nonexistent",
        ]
    )
    assert code == bundle_cli.EXIT_CONFIG
    assert "kafka.ssl.ca.location: /nonexistent does not exist" in err


def test_check_files_finds_path_fields_and_names_table_keys(tmp_path: Path) -> None:
    @dataclasses.dataclass(frozen=True)
    class Named:
        rules_file: Path | None = None
        kafka_conf: dict[str, str] = dataclasses.field(default_factory=dict)

    check_files(Named())  # nothing named: nothing to check
    readable = tmp_path / "rules"
    readable.write_text("")
    check_files(Named(rules_file=readable, kafka_conf={"ssl.ca.location": str(tmp_path)}))
    with pytest.raises(ConfigError, match=r"rules_file: .* does not exist"):
        check_files(Named(rules_file=tmp_path / "gone"))
    with pytest.raises(ConfigError) as caught:
        check_files(
            Named(kafka_conf={"sasl.kerberos.keytab": "/gone"}),
            key=table_variable({"kafka_conf": "KAFKA_CONF_"}),
        )
    assert caught.value.key == "KAFKA_CONF_SASL_KERBEROS_KEYTAB"


# -- netem takes its own words as flags ------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--loss", "5"], "loss random 5%"),
        (["--loss", "5%", "--loss-correlation", "25"], "loss random 5% 25%"),
        (["--ge-p", "1", "--ge-r", "20"], "loss gemodel 1% 20% 100% 0%"),
        (["--delay", "10ms", "--jitter", "2"], "delay 10ms 2ms"),
        (["--delay", "5", "--reorder", "25%", "--gap", "3"], "reorder 25% gap 3"),
        (["--rate", "10mbit"], "rate 10000000bit"),
        (["--limit", "50"], "limit 50"),
    ],
)
def test_netem_apply_takes_profile_keys_as_flags(flags: list[str], words: str) -> None:
    code, out, err = _run(
        ["netem", "apply", "--dev", "eth0", "--profile", "clean", *flags, "--dry-run"]
    )
    assert code == 0, err
    assert words in out


def test_a_netem_flag_of_one_loss_model_replaces_the_profile_s_other() -> None:
    code, out, err = _run(
        ["netem", "apply", "--dev", "eth0", "--profile", "lossy-5", "--ge-p", "2", "--dry-run"]
    )
    assert code == 0, err
    assert "loss gemodel 2%" in out
    assert "random" not in out


def test_a_bad_netem_flag_is_named() -> None:
    code, _, err = _run(
        ["netem", "apply", "--dev", "eth0", "--profile", "clean", "--loss", "5x", "--dry-run"]
    )
    assert code == netem_cli.EXIT_USAGE
    assert "--loss: cannot read percentage '5x'" in err


def test_netem_relay_builds_its_profile_from_the_flags() -> None:
    parser = netem_cli._parser("netem")
    args = parser.parse_args(["relay", "--forward", "127.0.0.1:9", "--loss", "3", "--delay", "4"])
    profile = netem_cli.profile_from(args, "clean", 7)
    assert (profile.loss, profile.delay, profile.seed) == (3.0, 4.0, 7)


# -- the reference lists only what exists -------------------------------------------------------


def test_every_flag_in_the_key_tables_is_taken_by_its_commands() -> None:
    """docs/configuration.md's key tables name a flag only where a command takes it, and a
    variable only where one is read (no `MAX_DATAGRAM_SIZE`, no `--loss` nothing accepts)."""
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    parsers = dict(cli_reference.command_parsers())
    for section in docs_gen.SECTIONS:
        body = committed.partition(f"\n## {section.title}\n")[2].partition("\n## ")[0]
        rows = [line.split(" | ") for line in body.splitlines() if line.startswith("| `")]
        assert rows, section.title
        for row in rows:
            env_cell, flag_cell = row[1].strip(), row[2].strip()
            if section.env_prefix is None:
                assert env_cell == "—", (section.title, row[0])
            if not section.commands:
                assert flag_cell == "—", (section.title, row[0])
                continue
            flag = flag_cell.strip("`")
            for command in section.commands:
                options = {s for a in parsers[command]._actions for s in a.option_strings}
                assert flag in options, f"{command} does not take {flag}"


#: Keys an example env file sets to a value of its site, not the default.
SITE_KEYS = frozenset(
    {"bootstrap_servers", "raw_topics", "state_dir_config", "spark_master", "metrics_port"}
    | {"metrics_addr", "clean_topic", "gap_topic", "gap_emit_interval_sec", "persist_interval_ms"}
    | {"new_topic_partitions", "new_topic_replication"}
)


@pytest.mark.parametrize(
    "env_file", ["packaging/env/dedup.env.example", "packaging/compose/dedup.env"]
)
def test_dedup_example_env_files_keep_the_defaults(env_file: str) -> None:
    """An example sets a detector key only to its default (WINDOW_SIZE can never change later)."""
    from dedup.config import DedupConfig  # noqa: PLC0415

    env = dict(
        line.split("=", 1)
        for line in (ROOT / env_file).read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    )
    config = from_sources({"STATE_DIR_CONFIG": "/tmp/x", **env})
    for field in dataclasses.fields(DedupConfig):
        if field.name in SITE_KEYS or field.default is dataclasses.MISSING:
            continue
        assert getattr(config, field.name) == field.default, (env_file, field.name)
