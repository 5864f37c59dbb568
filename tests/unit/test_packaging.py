"""Packaging checks: systemd units, docker-compose.yml and the Grafana dashboard, against the code.

What these tests guarantee (docs/packaging.md):

- every systemd unit passes ``systemd-analyze verify`` (with its ``ExecStart`` pointed at the real
  installed entry point of this checkout, so the executable check stays meaningful), stays under an
  exposure score of 2.0 in ``systemd-analyze security --offline``, and keeps the hardening baseline;
- the sysusers.d and tmpfiles.d files apply cleanly to an empty root;
- docker-compose.yml validates against the Compose specification's JSON schema;
- every ``kafka-diode`` command line in a unit or a compose service names a real (sub)command and
  only options that command's ``--help`` lists (the CLI is run in-process, so a missing subcommand
  module fails the test instead of skipping it);
- the example and compose configurations pass the commands' own validation;
- every metric the dashboard queries is exported by a component's metrics registry.

``systemd-analyze`` comes from the Debian package ``systemd``; without it those tests skip.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from common import settings
from common.metrics import CollectorRegistry
from dedup.bundle_cli import bundle_env
from dedup.bundle_create import BundleConfig
from dedup.config import DedupConfig, from_sources
from kafka_diode import cli
from receiver.config import ENV_PREFIX as RECEIVER_PREFIX
from receiver.config import ReceiverConfig
from runtime import config_file
from runtime.bundle_files import ENV_PREFIX as BUNDLE_PREFIX
from sender.config import ENV_PREFIX as SENDER_PREFIX
from sender.config import SenderConfig
from sender.resend_job import EXIT_OK, EXIT_UNRECOVERABLE

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_DIR = REPO / "packaging" / "systemd"
UNITS = sorted(p for p in SYSTEMD_DIR.iterdir() if p.suffix in (".service", ".timer", ".path"))
SERVICES = [p for p in UNITS if p.suffix == ".service"]
INSTALLED_BIN = "/opt/kafka-diode/venv/bin/kafka-diode"
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_SCHEMA = REPO / "tests" / "vendor" / "compose-spec" / "compose-spec.json"
DASHBOARD = REPO / "packaging" / "grafana" / "kafka-diode.json"
SYSTEMD_HINT = (
    "systemd-analyze not found: install the Debian package 'systemd' (apt-get install systemd)"
)
EXEC_KEYS = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop", "ExecReload")
SHELL_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")"})
SHELLS = frozenset({"sh", "bash", "dash"})


# --- helpers -----------------------------------------------------------------------------------


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values in order]}}``; repeated keys (Environment=, ...) keep all."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}: keep each setting on one line: {line}"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: setting outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_command_lines(path: Path) -> list[list[str]]:
    """Every Exec*= command of a unit, split like systemd does, with ``%i`` as ``example``."""
    commands = []
    for key, values in read_unit(path).get("Service", {}).items():
        if key not in EXEC_KEYS:
            continue
        for value in values:
            text = value.lstrip("-@:+!").replace("%i", "example").replace("%%", "%")
            commands.append(shlex.split(text))
    return commands


def kafka_diode_invocations(argv: list[str]) -> Iterator[list[str]]:
    """Yield the arguments of every ``kafka-diode`` run in ``argv``, also inside ``sh -c '…'``."""
    i = 0
    while i < len(argv):
        word = argv[i]
        name = Path(word).name
        if name == "kafka-diode":
            args = []
            for arg in argv[i + 1 :]:
                if arg in SHELL_SEPARATORS:
                    break
                args.append(arg)
            yield args
            i += 1 + len(args)
            continue
        if name in SHELLS:
            # sh [-e...] -c SCRIPT: the script is parsed line by line as shell words.
            for j in range(i + 1, len(argv) - 1):
                if argv[j].startswith("-") and "c" in argv[j]:
                    for script_line in argv[j + 1].splitlines():
                        lexer = shlex.shlex(script_line, posix=True, punctuation_chars=True)
                        lexer.whitespace_split = True
                        lexer.commenters = "#"
                        yield from kafka_diode_invocations(list(lexer))
                    return
        i += 1


def split_invocation(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(command path such as ``("bundle", "create")``, the ``--options`` it uses)."""
    path: list[str] = []
    for arg in args:
        if arg.startswith("-"):
            break
        path.append(arg)
    options = [arg.split("=", 1)[0] for arg in args[len(path) :] if arg.startswith("-")]
    return tuple(path), options


@functools.cache
def cli_help(path: tuple[str, ...]) -> tuple[int, str]:
    """Run ``kafka-diode PATH --help`` in-process; (exit code, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([*path, "--help"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue() + err.getvalue()


def assert_cli_accepts(args: list[str], where: str) -> None:
    """Fail unless ``kafka-diode ARGS`` names a real command and only options its help lists."""
    path, options = split_invocation(args)
    assert path, f"{where}: 'kafka-diode' without a command"
    code, text = cli_help(path)
    usage = " ".join(text.split())
    assert code == 0, f"{where}: 'kafka-diode {' '.join(path)} --help' exited {code}:\n{text}"
    assert f"usage: kafka-diode {' '.join(path)}" in usage, (
        f"{where}: 'kafka-diode {' '.join(path)}' is not a command; its --help shows:\n{text}"
    )
    unknown = [
        opt for opt in options if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)
    ]
    assert not unknown, (
        f"{where}: 'kafka-diode {' '.join(path)}' has no option(s) {unknown}; --help:\n{text}"
    )


def unit_invocations() -> list[tuple[str, list[str]]]:
    found = []
    for unit in SERVICES:
        for command in unit_command_lines(unit):
            for args in kafka_diode_invocations(command):
                found.append((unit.name, args))
    return found


def compose_doc() -> dict[str, object]:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def compose_services() -> dict[str, dict[str, object]]:
    services = compose_doc()["services"]
    assert isinstance(services, dict)
    return services


def compose_command(service: dict[str, object]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]  # type: ignore[union-attr]


def compose_invocations() -> list[tuple[str, list[str]]]:
    found = []
    for name, service in compose_services().items():
        for args in kafka_diode_invocations(compose_command(service)):
            found.append((name, args))
    return found


def entry_point() -> Path:
    """The ``kafka-diode`` console script of the environment running the tests."""
    found = shutil.which("kafka-diode", path=str(Path(sys.executable).parent))
    assert found, f"no kafka-diode entry point next to {sys.executable}: pip install -e ."
    return Path(found)


@pytest.fixture(scope="module")
def staged_units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The units, with the installed entry point replaced by this checkout's real one."""
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze is None:
        pytest.skip(SYSTEMD_HINT)
    staged = tmp_path_factory.mktemp("units")
    real = str(entry_point())
    for unit in UNITS:
        (staged / unit.name).write_text(unit.read_text().replace(INSTALLED_BIN, real))
    return staged


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    assert exe
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


# --- systemd -------------------------------------------------------------------------------------


def test_expected_units_exist() -> None:
    names = {p.name for p in UNITS}
    for name in (
        "kafka-diode-sender@.service",
        "kafka-diode-receiver@.service",
        "kafka-diode-dedup@.service",
        "kafka-diode-dedup-cluster@.service",
        "kafka-diode-resend@.service",
        "kafka-diode-resend@.path",
        "kafka-diode-bundle@.service",
        "kafka-diode-bundle@.timer",
    ):
        assert name in names


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify(unit: Path, staged_units: Path) -> None:
    # verify fails on a missing ExecStart binary, and prints unknown keys and bad values as
    # warnings: both must be absent.
    result = systemd_analyze("verify", "--man=no", "--generators=no", str(staged_units / unit.name))
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stderr.strip() == "", result.stderr
    assert result.stdout.strip() == "", result.stdout


@pytest.mark.parametrize("unit", SERVICES, ids=lambda p: p.name)
def test_systemd_security_exposure_stays_low(unit: Path, staged_units: Path) -> None:
    # 20 = an exposure level of 2.0 of 10 ("OK"); ours are 1.4-1.5 today.
    result = systemd_analyze(
        "security", "--offline=yes", "--threshold=20", "--no-pager", str(staged_units / unit.name)
    )
    assert result.returncode == 0, result.stdout + result.stderr


HARDENING = {
    "User": "kafka-diode",
    "Group": "kafka-diode",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX AF_NETLINK",
}


@pytest.mark.parametrize("unit", SERVICES, ids=lambda p: p.name)
def test_service_hardening_baseline(unit: Path) -> None:
    service = read_unit(unit)["Service"]
    for key, want in HARDENING.items():
        assert service.get(key) == [want], f"{unit.name}: {key}= must be {want!r}"
    assert "@system-service" in service["SystemCallFilter"]
    for key in ("StateDirectory", "LogsDirectory", "ConfigurationDirectory", "MemoryMax", "UMask"):
        assert key in service, f"{unit.name}: {key}= missing"
    # The JVM's JIT needs W+X memory; everything else runs without it.
    jvm = unit.name.startswith(("kafka-diode-dedup@", "kafka-diode-dedup-cluster@"))
    assert service.get("MemoryDenyWriteExecute") == (None if jvm else ["yes"])
    if service["Type"] != ["oneshot"]:
        assert service["Restart"] == ["on-failure"]
        unit_section = read_unit(unit)["Unit"]
        assert "StartLimitIntervalSec" in unit_section
        assert "StartLimitBurst" in unit_section


def test_dedup_gets_more_memory_than_the_others() -> None:
    def memory_max(name: str) -> int:
        value = read_unit(SYSTEMD_DIR / name)["Service"]["MemoryMax"][0]
        return int(value[:-1]) * {"M": 1, "G": 1024}[value[-1]]

    assert memory_max("kafka-diode-dedup@.service") > memory_max("kafka-diode-sender@.service")
    assert memory_max("kafka-diode-dedup@.service") > memory_max("kafka-diode-receiver@.service")


def test_the_receiver_gets_a_larger_cpu_share_than_every_other_unit() -> None:
    # a starved receiver drops datagrams at its socket; every other component waits instead
    def weight(unit: Path) -> int:
        return int(read_unit(unit)["Service"].get("CPUWeight", ["100"])[0])

    units = sorted(SYSTEMD_DIR.glob("*.service"))
    receiver = SYSTEMD_DIR / "kafka-diode-receiver@.service"
    assert receiver in units
    assert all(weight(receiver) > weight(u) for u in units if u != receiver)


def test_units_run_the_installed_entry_point() -> None:
    for unit in SERVICES:
        runs = [c for c in unit_command_lines(unit) if Path(c[0]).name == "kafka-diode"]
        assert runs, f"{unit.name}: no kafka-diode command"
        for command in runs:
            assert command[0] == INSTALLED_BIN, f"{unit.name}: use {INSTALLED_BIN}"


@pytest.mark.parametrize(
    ("unit", "args"), unit_invocations(), ids=lambda v: v if isinstance(v, str) else " ".join(v)
)
def test_unit_command_lines_use_real_cli_options(unit: str, args: list[str]) -> None:
    assert_cli_accepts(args, unit)


def test_sysusers_and_tmpfiles_apply_to_an_empty_root(tmp_path: Path) -> None:
    sysusers, tmpfiles = shutil.which("systemd-sysusers"), shutil.which("systemd-tmpfiles")
    if sysusers is None or tmpfiles is None:
        pytest.skip(SYSTEMD_HINT)
    (tmp_path / "etc").mkdir()
    conf = REPO / "packaging" / "sysusers" / "kafka-diode.conf"
    subprocess.run([sysusers, f"--root={tmp_path}", str(conf)], check=True, capture_output=True)
    passwd = (tmp_path / "etc" / "passwd").read_text()
    assert re.search(
        r"^kafka-diode:x:\d+:\d+:.*:/var/lib/kafka-diode:/usr/sbin/nologin$", passwd, re.M
    )
    conf = REPO / "packaging" / "tmpfiles" / "kafka-diode.conf"
    subprocess.run(
        [tmpfiles, f"--root={tmp_path}", "--create", str(conf)], check=True, capture_output=True
    )
    keys = tmp_path / "etc" / "kafka-diode" / "keys"
    assert keys.is_dir()
    assert keys.stat().st_mode & 0o777 == 0o750


# --- docker-compose ------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_schema() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    # The spec names draft-07 without the trailing '#', which jsonschema does not recognise.
    assert "draft-07" in schema["$schema"]
    validator_cls = jsonschema.Draft7Validator
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose_doc()), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_compose_has_the_whole_pipeline() -> None:
    services = compose_services()
    for name in ("kafka-up", "kafka-down", "producer", "sender", "netem", "receiver", "dedup"):
        assert name in services
    for name in ("kafka-up", "kafka-down"):
        assert str(services[name]["image"]).startswith("apache/kafka:")
    used = {tuple(split_invocation(args)[0][:1]) for _, args in compose_invocations()}
    for command in ("send", "receive", "dedup", "netem"):
        assert (command,) in used


@pytest.mark.parametrize(
    ("service", "args"),
    compose_invocations(),
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_compose_commands_use_real_cli_options(service: str, args: list[str]) -> None:
    assert_cli_accepts(args, f"docker-compose.yml service {service}")


def test_compose_bind_mounts_exist() -> None:
    for name, service in compose_services().items():
        sources = [str(v).split(":", 1)[0] for v in service.get("volumes", [])]  # type: ignore[union-attr]
        sources += [str(v) for v in service.get("env_file", [])]  # type: ignore[union-attr]
        for source in sources:
            if source.startswith("./"):
                assert (REPO / source).exists(), f"service {name}: {source} does not exist"


def test_compose_and_units_run_the_same_commands() -> None:
    """The compose services run what the units run (config path aside): one way to start each."""
    units = {}
    for _unit, args in unit_invocations():
        path, _ = split_invocation(args)
        units[path] = [a.replace("example", "demo") for a in args]
    for service, args in compose_invocations():
        path, _ = split_invocation(args)
        if path in (("send",), ("receive",), ("dedup",)):
            assert args == units[path], f"service {service} differs from its systemd unit"


# --- configuration examples ---------------------------------------------------------------------


def _check_config(command: str, config: Path, env: dict[str, str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([command, "--config", str(config), "--check-config"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(old)
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "link.key"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["keygen", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    ("command", "config", "prefix"),
    [
        ("send", "packaging/config/sender/example.toml", "DIODE_SENDER_"),
        ("send", "packaging/compose/sender.toml", "DIODE_SENDER_"),
        ("receive", "packaging/config/receiver/example.toml", "DIODE_RECEIVER_"),
        ("receive", "packaging/compose/receiver.toml", "DIODE_RECEIVER_"),
    ],
)
def test_example_configs_pass_check_config(
    command: str, config: str, prefix: str, key_file: Path
) -> None:
    # The key path in the examples is the installed one; point it at a real key for the check.
    env = {f"{prefix}KEY_FILE": str(key_file)}
    if config.startswith("packaging/compose/") and command == "send":
        env[f"{prefix}TARGET"] = "127.0.0.1:9470"  # 'netem' resolves only inside compose
    code, text = _check_config(command, REPO / config, env)
    assert code == 0, f"kafka-diode {command} --config {config} --check-config:\n{text}"


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


@pytest.mark.parametrize(
    "env_file", ["packaging/env/dedup.env.example", "packaging/compose/dedup.env"]
)
def test_dedup_env_files_are_valid_dedup_settings(env_file: str) -> None:
    dedup_config = importlib.import_module("dedup.config")
    env = {"STATE_DIR_CONFIG": "/var/lib/kafka-diode/dedup-example/checkpoint"}
    env.update(_env_file(REPO / env_file))
    cfg = dedup_config.from_sources(env=env)
    assert cfg.raw_topics


# --- Grafana -------------------------------------------------------------------------------------


def dashboard_metric_names() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    exprs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    names = set()
    for expr in exprs:
        names.update(re.findall(r"\bkafka_diode_[a-z0-9_]+", expr))
    return names


# Imported when called, so that a component which does not import yet fails only the metrics
# test (with the reason), not the collection of this whole module.
def _sender_registry() -> object:
    registry = CollectorRegistry()
    importlib.import_module("sender.metrics").SenderMetrics(registry=registry)
    return registry


def _receiver_registry() -> object:
    metrics = importlib.import_module("receiver.metrics")
    return metrics.make_registry(metrics.ReceiverStats(), metrics.Gauges())


def _dedup_registry() -> object:
    registry = CollectorRegistry()
    importlib.import_module("dedup.metrics").DedupMetrics(registry=registry)
    return registry


#: How each component builds its metrics registry; the dashboard is checked against these.
REGISTRIES = {"sender": _sender_registry, "receiver": _receiver_registry, "dedup": _dedup_registry}


def exported_metric_names() -> tuple[set[str], dict[str, str]]:
    """(family and sample names the registries export, {component: why its registry failed})."""
    names: set[str] = set()
    failures: dict[str, str] = {}
    for component, build in REGISTRIES.items():
        try:
            registry = build()
        except Exception as exc:  # reported with the metrics that it leaves unexplained
            failures[component] = f"{type(exc).__name__}: {exc}"
            continue
        for family in registry.collect():  # type: ignore[attr-defined]
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    return names, failures


def literal_metric_names() -> set[str]:
    """Metric names written out whole in the sources (the netem relay's collector)."""
    names: set[str] = set()
    for package in ("sender", "receiver", "dedup", "netem"):
        for path in (REPO / package).rglob("*.py"):
            names.update(re.findall(r"[\"'](kafka_diode_[a-z0-9_]+)[\"']", path.read_text()))
    return names


def test_dashboard_queries_only_metrics_the_code_exports() -> None:
    used = dashboard_metric_names()
    assert used, "the dashboard queries no kafka_diode_* metric"
    exported, failures = exported_metric_names()
    known = exported | literal_metric_names()
    # A counter family "x" is exported as "x_total"; a histogram as x_bucket, x_sum, x_count.
    suffixes = ("_total", "_bucket", "_sum", "_count", "_created")
    missing = sorted(
        name
        for name in used
        if name not in known
        and not any(name.endswith(s) and name[: -len(s)] in known for s in suffixes)
    )
    assert not missing, f"dashboard metrics not exported by the code: {missing}; {failures=}"


def test_dashboard_is_importable_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["title"]
    assert doc["uid"]
    assert doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))


# --- example environment files, through the components' own loaders (issue 47) ------------------


def _assignments(path: Path, *, commented: bool) -> dict[str, str]:
    """``KEY=value`` lines of an env file; with ``commented``, the ``#KEY=value`` examples too."""
    values = {}
    for line in path.read_text().splitlines():
        text = line.strip()
        if commented and re.match(r"^#[A-Z][A-Z0-9_]*=", text):
            text = text[1:]
        if text and not text.startswith("#") and "=" in text:
            key, _, value = text.partition("=")
            values[key.strip()] = value.strip()
    return values


ENV_EXAMPLES = REPO / "packaging" / "env"


def test_every_example_env_file_is_tested() -> None:
    assert {p.name for p in ENV_EXAMPLES.iterdir()} == {
        "sender.env.example",
        "receiver.env.example",
        "dedup.env.example",
        "bundle.env.example",
        "resend.env.example",
    }


@pytest.mark.parametrize("commented", [False, True], ids=["as shipped", "examples uncommented"])
def test_sender_env_example_loads_through_the_sender_s_loader(commented: bool) -> None:

    env = _assignments(ENV_EXAMPLES / "sender.env.example", commented=commented)
    assert all(k.startswith(SENDER_PREFIX) for k in env), env
    toml = config_file.read_toml_section(REPO / "packaging/config/sender/example.toml", "sender")
    config = settings.build(SenderConfig, file_values=toml, env=env, env_prefix=SENDER_PREFIX)
    if commented:
        assert config.rate_bytes == float(env["DIODE_SENDER_RATE_BYTES"])


@pytest.mark.parametrize("commented", [False, True], ids=["as shipped", "examples uncommented"])
def test_receiver_env_example_loads_through_the_receiver_s_loader(commented: bool) -> None:

    env = _assignments(ENV_EXAMPLES / "receiver.env.example", commented=commented)
    assert all(k.startswith(RECEIVER_PREFIX) for k in env), env
    toml = config_file.read_toml_section(
        REPO / "packaging/config/receiver/example.toml", "receiver"
    )
    settings.build(ReceiverConfig, file_values=toml, env=env, env_prefix=RECEIVER_PREFIX)


@pytest.mark.parametrize("commented", [False, True], ids=["as shipped", "examples uncommented"])
def test_dedup_env_example_loads_and_keeps_the_defaults(commented: bool) -> None:

    env = {"STATE_DIR_CONFIG": "/var/lib/kafka-diode/dedup-example/checkpoint"}
    env.update(_assignments(ENV_EXAMPLES / "dedup.env.example", commented=commented))
    config = from_sources(env=env)
    # WINDOW_SIZE can never change under a checkpoint: the example must not suggest another value
    assert config.window_size == DedupConfig.window_size
    assert config.max_windows == DedupConfig.max_windows
    assert config.new_topic_replication >= 1, "topics the dedup creates must be replicated"


def test_bundle_env_example_loads_through_bundle_create_s_loader(key_file: Path) -> None:

    env = _assignments(ENV_EXAMPLES / "dedup.env.example", commented=False)
    env.update(_assignments(ENV_EXAMPLES / "bundle.env.example", commented=True))
    env[f"{BUNDLE_PREFIX}KEY_FILE"] = str(key_file)  # the example names the installed path
    config = settings.build(BundleConfig, env=bundle_env(env), env_prefix=BUNDLE_PREFIX)
    assert config.gap_topic == env["GAP_TOPIC"]
    assert config.max_records == int(env[f"{BUNDLE_PREFIX}MAX_RECORDS"])


def test_resend_env_example_sets_only_what_the_resend_unit_reads() -> None:
    env = _assignments(ENV_EXAMPLES / "resend.env.example", commented=True)
    unit = (SYSTEMD_DIR / "kafka-diode-resend@.service").read_text()
    assert set(env) == {"BUNDLE"}
    assert "${BUNDLE}" in unit


def test_optional_env_files_are_optional_in_their_units() -> None:
    """An env file the docs call optional is read with ``EnvironmentFile=-``; the dedup's is
    required (every setting of the job lives there)."""
    for unit, path in (
        ("kafka-diode-sender@.service", "/etc/kafka-diode/sender/%i.env"),
        ("kafka-diode-receiver@.service", "/etc/kafka-diode/receiver/%i.env"),
        ("kafka-diode-resend@.service", "/etc/kafka-diode/resend/%i.env"),
        ("kafka-diode-bundle@.service", "/etc/kafka-diode/bundle/%i.env"),
    ):
        files = read_unit(SYSTEMD_DIR / unit)["Service"]["EnvironmentFile"]
        assert f"-{path}" in files, f"{unit}: EnvironmentFile=-{path}"
    for unit in ("kafka-diode-dedup@.service", "kafka-diode-dedup-cluster@.service"):
        files = read_unit(SYSTEMD_DIR / unit)["Service"]["EnvironmentFile"]
        assert files == ["/etc/kafka-diode/dedup/%i.env"]


def test_resend_unit_moves_the_bundle_after_an_unrecoverable_run() -> None:
    """Exit 3 (some offsets unrecoverable upstream) fails the unit but must not leave the bundle in
    the inbox, or the path unit runs it again and again."""

    service = read_unit(SYSTEMD_DIR / "kafka-diode-resend@.service")["Service"]
    assert "ExecStartPost" not in service  # it would not run after a non-zero exit
    (post,) = service["ExecStopPost"]
    assert f"{EXIT_OK}|{EXIT_UNRECOVERABLE})" in post
    assert "done/last.bundle" in post
    assert "SuccessExitStatus" not in service  # exit 3 stays visible as a failure


def test_cluster_dedup_unit_needs_a_spark_master_and_sets_no_local_checkpoint() -> None:
    service = read_unit(SYSTEMD_DIR / "kafka-diode-dedup-cluster@.service")["Service"]
    assert not any(v.startswith("STATE_DIR_CONFIG=") for v in service.get("Environment", []))
    (pre,) = service["ExecStartPre"]
    assert "SPARK_MASTER" in pre
    assert "spark://" in pre
