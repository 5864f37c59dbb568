"""docs/deployment.md, followed on local SASL_SSL brokers (issue 47).

Everything the guide's steps give is read from its code blocks, never copied here, so the test
fails when the guide drifts from the code: the SCRAM users it names, the topics with their
partitions, replication and retention (§3), the link key (§4), the sender's and receiver's TOML
and environment files and the dedup's environment file (§6-8), the ``--check-config`` commands the
units' steps run, and ``kafka-diode status`` (§10). Host names, ``/etc/kafka-diode`` and the
passwords are the only things replaced: the brokers are local (127.0.0.1), the files live in a
temporary directory, and each ``<secret>`` is the user's generated password.

What does not run here: the ACLs (the local brokers have no authorizer), systemd (the units are
verified by tests/unit/test_packaging.py), the Spark standalone cluster
(tests/integration/test_dedup_cluster.py), the kernel and NIC settings, and the offline install.

The default suite follows the guide on one SASL_SSL broker (replication and ``min.insync.replicas``
capped at 1); the ``slow`` test follows it on a three-broker SASL_SSL cluster with the guide's
replication unchanged.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.local_kafka.cluster import LocalCluster
from kafka_diode.local_kafka.security import ensure_security

pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "deployment.md"
ETC = "/etc/kafka-diode/"
SECRET = "<secret>"


# --- reading the guide -------------------------------------------------------------------------


def code_blocks(text: str) -> list[str]:
    """The guide's indented code blocks (four spaces, after a blank line), dedented."""
    blocks: list[str] = []
    current: list[str] = []
    previous_blank = True
    for line in text.splitlines():
        if line.startswith("    ") and (current or previous_blank):
            current.append(line[4:])
        elif not line.strip() and current:
            current.append("")
        else:
            if current:
                blocks.append("\n".join(current).strip("\n"))
                current = []
        previous_blank = not line.strip()
    if current:
        blocks.append("\n".join(current).strip("\n"))
    return blocks


def shell_lines(block: str) -> list[str]:
    """A block's commands: continuations joined, comments dropped, ``for`` loops unrolled."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    out: list[str] = []
    i = 0
    while i < len(lines):
        loop = re.fullmatch(r"for (\w+) in (.+); do", lines[i])
        if loop is None:
            out.append(lines[i])
            i += 1
            continue
        end = lines.index("done", i)
        for value in loop.group(2).split():
            out += [line.replace(f"${loop.group(1)}", value) for line in lines[i + 1 : end]]
        i = end + 1
    return out


def block_with(blocks: list[str], first_line: str) -> str:
    """The one block whose first line starts with ``first_line``."""
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/deployment.md: {len(found)} blocks start with {first_line!r}"
    return found[0]


@dataclass(frozen=True, slots=True)
class GuideTopic:
    """A ``kafka-topics.sh --create`` of the guide."""

    name: str
    """--topic"""
    partitions: int
    """--partitions"""
    replication: int
    """--replication-factor"""
    config: dict[str, str]
    """every --config"""


def guide_topics(blocks: list[str]) -> list[GuideTopic]:
    topics = []
    for block in blocks:
        for line in shell_lines(block):
            args = shlex.split(line)
            if args[:1] != ["kafka-topics.sh"] or "--create" not in args:
                continue
            values: dict[str, list[str]] = {}
            for flag, value in itertools.pairwise(args):
                values.setdefault(flag, []).append(value)
            topics.append(
                GuideTopic(
                    name=values["--topic"][0],
                    partitions=int(values["--partitions"][0]),
                    replication=int(values["--replication-factor"][0]),
                    config=dict(c.split("=", 1) for c in values.get("--config", [])),
                )
            )
    return topics


def guide_users(text: str) -> set[str]:
    """Every SCRAM user the guide names (ACL principals and ``sasl.username`` values)."""
    return set(re.findall(r"User:([\w-]+)", text)) | set(
        re.findall(r'"sasl\.username" = "([\w-]+)"', text)
    )


def kafka_diode_commands(blocks: list[str]) -> list[list[str]]:
    return [
        shlex.split(line)[1:]
        for block in blocks
        for line in shell_lines(block)
        if line.startswith("kafka-diode ")
    ]


# --- following it ------------------------------------------------------------------------------


class Site:
    """The guide's low and high sites on one set of local brokers, with files under ``root``."""

    def __init__(self, root: Path, bootstrap: str, ca: Path, brokers: int) -> None:
        self.text = GUIDE.read_text()
        self.blocks = code_blocks(self.text)
        self.root = root
        self.etc = root / "etc" / "kafka-diode"
        self.bootstrap = bootstrap
        self.brokers = brokers
        self.passwords: dict[str, str] = {}
        self.etc.mkdir(parents=True)
        shutil.copy(ca, self.etc / "ca.pem")  # §2: "install -m 0644 ca.pem /etc/kafka-diode/ca.pem"

    def local(self, text: str) -> str:
        """The guide's text with its hosts, paths and secrets made local."""
        text = re.sub(r"kafka-(up|down)-1\.\w+\.example:9093(,kafka-\1-\d\.\w+\.example:9093)*",
                      self.bootstrap, text)  # fmt: skip
        text = text.replace(ETC, f"{self.etc}/").replace("192.0.2.10", "127.0.0.1")
        for user, password in self.passwords.items():
            text = re.sub(rf'(username="{user}" password=")<secret>', rf"\g<1>{password}", text)
        return text

    def run(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        args = [self.local(a) for a in args]
        return subprocess.run(
            [sys.executable, "-m", "kafka_diode", *args],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    def install(self, source: str, target: str, extra: dict[str, str] | None = None) -> Path:
        """``install packaging/... /etc/kafka-diode/...``, plus ``extra`` lines appended."""
        path = Path(self.local(target))
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / source, path)
        if extra:
            path.write_text(path.read_text() + "".join(f"{k}={v}\n" for k, v in extra.items()))
        return path

    def installs(self) -> list[tuple[str, str]]:
        """Every ``install ... packaging/X /etc/kafka-diode/Y`` of the guide."""
        found = []
        for block in self.blocks:
            for line in shell_lines(block):
                args = shlex.split(line)
                if args[:1] == ["install"] and args[-1].startswith(ETC):
                    found.append((args[-2], args[-1]))
        return found


def env_file(path: Path) -> dict[str, str]:
    """An environment file as systemd's ``EnvironmentFile=`` reads the guide's ones."""
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def follow_the_guide(root: Path, broker: LocalBroker | LocalCluster, brokers: int) -> None:
    files = broker.security
    assert files is not None
    site = Site(root, broker.bootstrap, files.ca, brokers)
    admin_conf = {"bootstrap.servers": broker.bootstrap, **files.librdkafka(files.admin)}
    admin = AdminClient(admin_conf)

    # §3 users: one SCRAM-SHA-512 user per component
    users = guide_users(site.text)
    assert {"diode-sender", "diode-receiver", "diode-dedup"} <= users
    site.passwords = {user: secrets.token_hex(12) for user in sorted(users)}
    upserts = [
        UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
        )
        for user, password in site.passwords.items()
    ]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=60)

    # §3 topics, as the guide creates them (one broker: replication and min ISR capped at 1)
    topics = guide_topics(site.blocks)
    names = {t.name for t in topics}
    assert {"diode.raw", "kafka-diode.gaps", "kafka-diode.dedup.state"} <= names
    raw = next(t for t in topics if t.name == "diode.raw")
    state = next(t for t in topics if t.name == "kafka-diode.dedup.state")
    assert state.partitions >= raw.partitions, "the state topic needs a partition per raw one"
    new = []
    for t in topics:
        replication = min(t.replication, brokers)
        config = dict(t.config)
        if "min.insync.replicas" in config:
            isr = min(int(config["min.insync.replicas"]), replication)
            config["min.insync.replicas"] = str(isr)
        new.append(NewTopic(t.name, t.partitions, replication, config=config))
    for future in admin.create_topics(new, operation_timeout=60).values():
        future.result(timeout=120)
    # a created topic reaches the metadata a moment after create_topics returns: wait for all
    deadline = time.monotonic() + 60
    while not names <= set(metadata := admin.list_topics(timeout=30).topics):
        assert time.monotonic() < deadline, f"topics not in the metadata: {names - set(metadata)}"
        time.sleep(0.2)  # polling a condition with a deadline
    described = admin.describe_configs([ConfigResource("topic", t.name) for t in topics])
    for t in topics:
        partitions = metadata[t.name].partitions
        assert len(partitions) == t.partitions, t.name
        assert {len(p.replicas) for p in partitions.values()} == {min(t.replication, brokers)}
        [future] = [f for r, f in described.items() if r.name == t.name]
        actual = future.result(timeout=60)
        for key, value in t.config.items():
            if key != "min.insync.replicas" or brokers >= t.replication:
                assert actual[key].value == value, f"{t.name}: {key}"

    # §4 the link key, with the guide's command
    commands = kafka_diode_commands(site.blocks)
    [keygen] = [c for c in commands if c[0] == "keygen"]
    (site.etc / "keys").mkdir()
    done = site.run(keygen, {})
    assert done.returncode == 0, done.stderr

    # §6-8 the files each unit reads, installed as the guide says
    installs = site.installs()
    installed = {Path(target).parts[3] for _source, target in installs}
    assert {"sender", "receiver", "bundle", "resend"} <= installed
    sender_toml, receiver_toml = (
        b for b in site.blocks if b.startswith("bootstrap_servers = ")
    )  # the order of §6 and §7
    assert 'topics = ["orders", "audit"]' in sender_toml
    assert 'raw_topic = "diode.raw"' in receiver_toml
    runs: dict[str, list[str]] = {}
    for component, command, block, user in (
        ("sender", "send", sender_toml, "diode-sender"),
        ("receiver", "receive", receiver_toml, "diode-receiver"),
    ):
        for source, target in installs:
            if target.startswith(f"{ETC}{component}/"):
                site.install(source, target)
        toml = Path(site.local(f"{ETC}{component}/main.toml"))
        toml.write_text(site.local(block))  # "/etc/kafka-diode/<component>/main.toml": the block
        password = {f"DIODE_{component.upper()}_KAFKA__SASL_PASSWORD": site.passwords[user]}
        env = site.install(f"packaging/env/{component}.env.example",
                           f"{ETC}{component}/main.env", password)  # fmt: skip
        [check] = [c for c in commands if c[0] == command and "--check-config" in c]
        runs[command] = check
        result = site.run(check, env_file(env))
        assert result.returncode == 0, f"kafka-diode {' '.join(check)}:\n{result.stderr}"
        shown = result.stdout + result.stderr
        assert "SASL_SSL" in shown
        assert site.passwords[user] not in shown

    # §8 the dedup's environment file: the guide's block, then --check-config with it exported
    dedup_block = block_with(site.blocks, "BOOTSTRAP_SERVERS=")
    dedup_text = site.local(dedup_block).replace(SECRET, site.passwords["diode-dedup"])
    dedup_env_path = site.etc / "dedup" / "main.env"
    dedup_env_path.parent.mkdir(parents=True, exist_ok=True)
    dedup_env_path.write_text(dedup_text + "\n")
    dedup_env = env_file(dedup_env_path)
    assert dedup_env["KAFKA_CONF_SASL_USERNAME"] == "diode-dedup"
    # the checkpoint and master are the cluster's; here a local directory and local[2]
    dedup_env["STATE_DIR_CONFIG"] = str(root / "checkpoint")
    [dedup_check] = [c for c in commands if c[:1] == ["dedup"] and "--check-config" in c]
    result = site.run(dedup_check, dedup_env)
    assert result.returncode == 0, f"kafka-diode {' '.join(dedup_check)}:\n{result.stderr}"
    assert site.passwords["diode-dedup"] not in result.stdout + result.stderr

    # §8 bundle.env: the guide says the bundle unit exits 2 without a key file
    bundle = [(s, t) for s, t in installs if t.startswith(f"{ETC}bundle/")]
    assert bundle == [("packaging/env/bundle.env.example", f"{ETC}bundle/main.env")]

    # §10 the whole-path check, with the dedup's environment file
    [status] = [c for c in commands if c[:1] == ["status"]]
    silent = f"127.0.0.1:{free_port()}"  # nothing runs yet: the metrics endpoints do not answer
    status = [a if not re.fullmatch(r"[\d.]+:946\d", a) else silent for a in status]
    result = site.run(status, dedup_env)
    shown = result.stdout + result.stderr
    assert result.returncode == 1, shown  # Kafka readable; a person needed (endpoints silent)
    assert "NEEDS A PERSON" in shown
    assert site.passwords["diode-dedup"] not in shown
    wrong = {**dedup_env, "KAFKA_CONF_SASL_PASSWORD": "not-the-password"}
    result = site.run(status, wrong)
    assert result.returncode == 3, result.stdout + result.stderr  # "Kafka cannot be read"


# --- the tests ---------------------------------------------------------------------------------


def test_the_guide_s_code_blocks_parse() -> None:
    text = GUIDE.read_text()
    blocks = code_blocks(text)
    topics = {t.name: t for t in guide_topics(blocks)}
    assert topics["diode.raw"].partitions == topics["kafka-diode.dedup.state"].partitions
    assert all(t.replication == 3 for t in topics.values())
    commands = {c[0] for c in kafka_diode_commands(blocks)}
    assert {"keygen", "send", "receive", "dedup", "status"} <= commands


@pytest.fixture
def sasl_ssl_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    data_dir = tmp_path / "kafka"
    files = ensure_security(data_dir.resolve() / "security")
    broker = LocalBroker("guide-low", free_port(), data_dir=data_dir, security=files)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


def test_following_the_guide_on_one_sasl_ssl_broker(
    tmp_path: Path, sasl_ssl_broker: LocalBroker
) -> None:
    follow_the_guide(tmp_path / "site", sasl_ssl_broker, brokers=1)


@pytest.mark.slow
def test_following_the_guide_on_a_three_broker_sasl_ssl_cluster(tmp_path: Path) -> None:
    cluster = LocalCluster(
        "guide-low", brokers=3, ports=tuple(free_port() for _ in range(3)),
        data_dir=tmp_path / "kafka", security="sasl_ssl",
    )  # fmt: skip
    try:
        cluster.start()
        follow_the_guide(tmp_path / "site", cluster, brokers=3)
    finally:
        cluster.stop()
