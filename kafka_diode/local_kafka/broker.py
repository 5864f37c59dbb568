"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) as a background JVM.

Theory of operation
-------------------
``LocalBroker.start()`` resolves Java (17+) and the cached broker jars, writes ``server.properties``
and a log4j2 configuration into the data directory, formats the storage once (a fresh cluster id on
first start; later starts reuse it), and launches ``java ... kafka.Kafka server.properties`` in its
own session, so the broker outlives the command that started it. It returns only once the broker
has accepted a produce *and* served the same record back to a fetch, or raises
:class:`LocalKafkaError` with the tail of the broker's log.

State lives in two places::

    <data-dir>/broker.json        pid, ports, bootstrap, java command of the running broker
    <data-dir>/server.properties  the broker configuration (rewritten on every start)
    <data-dir>/logs/server.log    the broker's own log (log4j2, rolled at 20 MB x 3)
    <data-dir>/logs/stdout.log    the JVM's stdout/stderr (crashes, OOM)
    <data-dir>/kraft-logs/        Kafka's log.dirs
    <run-dir>/<name>.json         index: name -> data dir, so ``stop --name`` and ``status`` find it

``<run-dir>`` is ``$KAFKA_DIODE_RUN_DIR`` or ``<cache>/run``; the default data dir is
``<cache>/data/<name>``.

Guarantees: ``stop()`` signals only the process whose ``/proc/<pid>/cmdline`` carries this broker's
name *and* data directory (never a recycled pid), sends SIGTERM, and sends SIGKILL only after a
deadline. ``start()`` of a name that is already running on the same port returns the running
broker; starting on a port that something else holds fails before Java is launched.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError, LocalKafkaError
from kafka_diode.local_kafka.security import SecurityFiles, ensure_security
from runtime import maven as artifacts

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Measured: a broker under the test suite's load peaks well below this (docs/benchmarks.md).
DEFAULT_HEAP_MB = 512
DEFAULT_START_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 30.0
PROBE_TOPIC = "__kafka_diode_probe"
#: Marks our JVMs on their command line, so stop/status recognise them and nothing else.
CMDLINE_NAME_PROP = "-Dkafka_diode.broker="
CMDLINE_DIR_PROP = "-Dkafka_diode.data_dir="
STATE_FILE = "broker.json"
#: Extra JVM options for the broker, appended after ours (so they win), split like a shell would.
JVM_OPTS_ENV = "KAFKA_DIODE_JVM_OPTS"
_POLL_S = 0.2

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by kafka-diode: the broker logs to files in its data dir, never to our terminal. -->
<Configuration status="WARN" shutdownHook="disable">
  <Appenders>
    <RollingFile name="server" fileName="{logs}/server.log" filePattern="{logs}/server.log.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="20 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.network.RequestChannel$" level="WARN"/>
    <Logger name="org.apache.kafka.common.utils.AppInfoParser" level="WARN"/>
    <Logger name="org.apache.kafka.storage.internals.log" level="WARN"/>
    <Logger name="kafka.log.LogCleaner" level="WARN"/>
  </Loggers>
</Configuration>
"""


@dataclass(frozen=True, slots=True)
class ClusterMembership:
    """A broker's place in a local cluster (kafka_diode.local_kafka.cluster): every node is a
    combined broker and controller, and the controllers form a static quorum."""

    cluster: str
    """The cluster's name (its nodes are ``<cluster>-1``, ``<cluster>-2``, ...)."""
    node_id: int
    """This node's ``node.id`` (1-based)."""
    voters: str
    """``controller.quorum.voters``: ``1@127.0.0.1:PORT,2@...`` (fixed for the cluster's life)."""
    controller_port: int
    """This node's controller port (one of the voters')."""
    size: int
    """Nodes in the cluster: internal topics get min(3, size) replicas, 2 in sync."""
    cluster_id: str
    """The KRaft cluster id every node's storage is formatted with."""

    @property
    def replication(self) -> int:
        """Replication factor of internal and default topics."""
        return min(3, self.size)

    @property
    def min_insync(self) -> int:
        """``min.insync.replicas``: 2 (one broker may be down without refusing writes)."""
        return min(2, self.replication)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClusterMembership:
        """Parse the ``membership`` object of a ``broker.json``."""
        return cls(
            cluster=str(data["cluster"]),
            node_id=int(data["node_id"]),
            voters=str(data["voters"]),
            controller_port=int(data["controller_port"]),
            size=int(data["size"]),
            cluster_id=str(data["cluster_id"]),
        )


@dataclass(frozen=True, slots=True)
class BrokerState:
    """What ``broker.json`` records about a started broker."""

    name: str
    """The broker's name (``--name``)."""
    pid: int
    """The JVM's process id."""
    port: int
    """The client (PLAINTEXT) port."""
    controller_port: int
    """The KRaft controller port, chosen automatically."""
    bootstrap: str
    """``host:port`` for ``bootstrap.servers``."""
    data_dir: str
    """Absolute data directory."""
    cluster_id: str
    """The KRaft cluster id the storage was formatted with."""
    kafka_version: str
    """The Apache Kafka release running."""
    started_at: float
    """Unix time the JVM was launched."""
    membership: ClusterMembership | None = None
    """Its place in a local cluster; None for a single-node broker."""
    security_dir: str | None = None
    """``--security sasl_ssl``: the directory of its certificates and users; None: PLAINTEXT."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BrokerState:
        """Parse a ``broker.json`` document (unknown keys are ignored)."""
        member = data.get("membership")
        return cls(
            security_dir=data.get("security_dir"),
            membership=ClusterMembership.from_json(member) if member else None,
            name=str(data["name"]),
            pid=int(data["pid"]),
            port=int(data["port"]),
            controller_port=int(data["controller_port"]),
            bootstrap=str(data["bootstrap"]),
            data_dir=str(data["data_dir"]),
            cluster_id=str(data["cluster_id"]),
            kafka_version=str(data["kafka_version"]),
            started_at=float(data["started_at"]),
        )


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """One row of ``status``: a known broker and whether its JVM is alive."""

    name: str
    """The broker's name."""
    running: bool
    """Whether the recorded pid is alive and is this broker's JVM."""
    data_dir: str
    """The broker's data directory."""
    state: BrokerState | None
    """The last recorded state, if the state file is readable."""


def run_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the name index lives: ``$KAFKA_DIODE_RUN_DIR`` or ``<cache>/run``."""
    environ = os.environ if env is None else env
    configured = environ.get("KAFKA_DIODE_RUN_DIR", "").strip()
    return Path(configured).expanduser() if configured else artifacts.cache_root(env) / "run"


def default_data_dir(name: str, env: Mapping[str, str] | None = None) -> Path:
    """``<cache>/data/<name>``: the broker's data unless ``--data-dir`` says otherwise."""
    return artifacts.cache_root(env) / "data" / name


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe broker name, else raise ConfigError."""
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            "--name",
            f"{name!r} is not a valid broker name",
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def validate_port(port: int, key: str = "--port") -> int:
    """Return ``port`` if it is a usable TCP port, else raise ConfigError."""
    if not 1 <= port <= 65535:
        raise ConfigError(key, f"{port} is not a TCP port", "use 1-65535")
    return port


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether a listening socket already holds ``host:port`` (as the JVM would bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # The JVM binds with SO_REUSEADDR, so a TIME_WAIT leftover does not block it; mirror that.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def free_port(host: str = HOST) -> int:
    """A TCP port the kernel considers free right now (for tests and the controller listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid form)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def pid_cmdline(pid: int) -> list[str] | None:
    """The argv of ``pid`` from /proc, or None when it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not raw:  # zombies and kernel threads have an empty cmdline
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def is_our_broker(pid: int, name: str, data_dir: str | Path) -> bool:
    """Whether ``pid`` is alive and is the JVM of broker ``name`` on ``data_dir``."""
    argv = pid_cmdline(pid)
    if argv is None:
        return False
    return f"{CMDLINE_NAME_PROP}{name}" in argv and f"{CMDLINE_DIR_PROP}{data_dir}" in argv


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our exited child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def _name_lock(name: str, env: Mapping[str, str] | None) -> Iterator[None]:
    """Serialise start/stop of one name across processes (two concurrent ``start --name x``)."""
    directory = run_dir(env)
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class LocalBroker:
    """One named local broker. Cheap to construct; nothing runs until :meth:`start`.

    Usable as a context manager: ``with LocalBroker("up", 9092) as broker: broker.bootstrap``.
    """

    def __init__(
        self,
        name: str,
        port: int,
        *,
        data_dir: str | Path | None = None,
        partitions: int = 1,
        heap_mb: int = DEFAULT_HEAP_MB,
        env: Mapping[str, str] | None = None,
        membership: ClusterMembership | None = None,
        security: SecurityFiles | None = None,
    ) -> None:
        self.name = validate_name(name)
        self.membership = membership
        self.security = security
        self.port = validate_port(port)
        if partitions < 1:
            raise ConfigError("--partitions", f"{partitions} is not a partition count", "use >= 1")
        if heap_mb < 128:
            raise ConfigError("heap_mb", f"{heap_mb} MB is too small for a broker", "use >= 128")
        self.partitions = partitions
        self.heap_mb = heap_mb
        self._env = env
        chosen = Path(data_dir) if data_dir is not None else default_data_dir(name, env)
        self.data_dir = chosen.expanduser().resolve()
        self._process: subprocess.Popen[bytes] | None = None
        self._state: BrokerState | None = None

    # -- public surface -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"{HOST}:{self.port}"

    def client_conf(self) -> dict[str, str]:
        """librdkafka properties (besides ``bootstrap.servers``) a client needs here: the
        components' SCRAM user over TLS on a secured broker, nothing on a PLAINTEXT one."""
        return self.security.librdkafka() if self.security is not None else {}

    @property
    def state(self) -> BrokerState | None:
        """The state recorded by the last start of this broker, if any."""
        return self._state or read_state(self.data_dir)

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def is_running(self) -> bool:
        """Whether this broker's JVM is alive (by pid and command line)."""
        state = self.state
        if state is None:
            return False
        if self._process is not None and self._process.pid == state.pid:
            # Our own child cannot be recycled before we reap it: no need to trust /proc, which
            # briefly shows an empty cmdline while the JVM launcher execs.
            return self._process.poll() is None
        return is_our_broker(state.pid, self.name, self.data_dir)

    def start(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> BrokerState:
        """Start the broker (or return it if already running here) and wait until it is usable.

        Raises:
            LocalKafkaError: Java/jars unusable, port taken, or the broker did not become ready.
        """
        self.launch(timeout)
        return self.wait_ready(timeout)

    def launch(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> BrokerState:
        """Launch the JVM (or find it running here) without waiting for it to be usable: the
        nodes of a cluster are all launched before any can be ready (a quorum needs a majority).

        Raises:
            LocalKafkaError: Java/jars unusable, port taken, or the name runs elsewhere.
        """
        with _name_lock(self.name, self._env):
            existing = self.state
            if existing is not None and is_our_broker(existing.pid, self.name, self.data_dir):
                if existing.port != self.port:
                    raise LocalKafkaError(
                        f"broker {self.name!r} already runs on port {existing.port}: "
                        f"stop it first (kafka-diode local-kafka stop --name {self.name})"
                    )
                self._state = existing
                return existing
            other = _index_entry(self.name, self._env)
            if other is not None and Path(other) != self.data_dir:
                other_state = read_state(Path(other))
                if other_state is not None and is_our_broker(other_state.pid, self.name, other):
                    raise LocalKafkaError(
                        f"a broker named {self.name!r} already runs from {other}: stop it first "
                        f"(kafka-diode local-kafka stop --name {self.name}) or pick another name"
                    )
            if port_in_use(self.port):
                raise LocalKafkaError(
                    f"port {self.port} on {HOST} is already in use: pick another --port "
                    "or stop what listens there (see 'ss -ltnp')"
                )
            java = artifacts.java_executable(self._env)
            jars = artifacts.ensure_kafka_jars(self._env)
            state = self._launch(java, jars, previous=existing)
            self._state = state
            _write_index(self.name, self.data_dir, self._env)
            return state

    def wait_ready(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> BrokerState:
        """Wait until the launched broker accepts a produce and serves it back to a fetch;
        stop it and raise with its log's last words if it does not in ``timeout`` seconds.

        Raises:
            LocalKafkaError: not launched, exited, or not ready in time.
        """
        state = self.state
        if state is None:
            raise LocalKafkaError(f"broker {self.name!r} was never started")
        try:
            admin = self.security.librdkafka(self.security.admin) if self.security else {}
            _wait_ready(
                state.bootstrap, time.monotonic() + timeout, alive=self.is_running, conf=admin
            )
        except LocalKafkaError as exc:
            self.stop()
            raise LocalKafkaError(f"{exc}{self._log_tail()}") from exc
        log.info("broker %s ready at %s (pid %d)", self.name, state.bootstrap, state.pid)
        return state

    def kill(self) -> bool:
        """SIGKILL this broker's JVM (a crash, for failover tests); its index entry and data stay
        for a restart. Returns False if it was not running."""
        with _name_lock(self.name, self._env):
            state = self.state
            if state is None or not self.is_running():
                return False
            _signal(state.pid, signal.SIGKILL, self.name, self.data_dir, self._process)
            if not _wait_gone(state.pid, self.name, self.data_dir, 10.0, self._process):
                raise LocalKafkaError(f"broker {self.name!r} (pid {state.pid}) survived SIGKILL")
            self._process = None
            return True

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
        """Stop this broker: SIGTERM, wait, SIGKILL after ``timeout``. Idempotent.

        Returns:
            True if a running broker was stopped, False if none was running.
        """
        with _name_lock(self.name, self._env):
            state = self.state
            stopped = False
            if state is not None:
                stopped = _terminate(state, self.data_dir, timeout, self._process)
            self._process = None
            if self.membership is None:  # a cluster's nodes stay known until the cluster stops
                _remove_index(self.name, self.data_dir, self._env)
            return stopped

    def forget(self) -> None:
        """Drop this broker from the name index (a stopped cluster's nodes)."""
        _remove_index(self.name, self.data_dir, self._env)

    # -- internals ------------------------------------------------------------------------------

    def _launch(self, java: str, jars: Path, previous: BrokerState | None) -> BrokerState:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_dirs = self.data_dir / "kraft-logs"
        member = self.membership
        controller_port = (
            member.controller_port if member is not None else _controller_port(previous, self.port)
        )
        cluster_id = _formatted_cluster_id(log_dirs) or (
            member.cluster_id if member is not None else new_cluster_id()
        )
        properties = self.data_dir / "server.properties"
        properties.write_text(
            _server_properties(
                self.port,
                controller_port,
                log_dirs,
                self.partitions,
                member=member,
                security=self.security,
            ),
            encoding="utf-8",
        )
        properties.chmod(0o600)  # a secured broker's holds its SCRAM password
        log4j = self.data_dir / "log4j2.xml"
        log4j.write_text(_LOG4J2_XML.format(logs=logs), encoding="utf-8")
        base = [
            java,
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={logs}",
            "-Djava.awt.headless=true",
            "-cp",
            f"{jars}/*",
        ]
        if _formatted_cluster_id(log_dirs) is None:
            self._format(base, properties, cluster_id)
        command = [
            *base[:1],
            f"-Xmx{self.heap_mb}m",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            # Few cores, several JVMs: keep the broker's own thread pools small.
            "-XX:ParallelGCThreads=2",
            "-XX:CICompilerCount=2",
            *shlex.split((os.environ if self._env is None else self._env).get(JVM_OPTS_ENV, "")),
            f"{CMDLINE_NAME_PROP}{self.name}",
            f"{CMDLINE_DIR_PROP}{self.data_dir}",
            *base[1:],
            "kafka.Kafka",
            str(properties),
        ]
        with (logs / "stdout.log").open("ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survive the CLI's exit and its terminal's Ctrl+C
                cwd=self.data_dir,
            )
        self._process = process
        state = BrokerState(
            name=self.name,
            pid=process.pid,
            port=self.port,
            controller_port=controller_port,
            bootstrap=self.bootstrap,
            data_dir=str(self.data_dir),
            cluster_id=cluster_id,
            kafka_version=artifacts.KAFKA_VERSION,
            started_at=time.time(),
            membership=member,
            security_dir=str(self.security.directory) if self.security is not None else None,
        )
        _write_json_atomic(self.data_dir / STATE_FILE, asdict(state))
        return state

    def _format(self, base: list[str], properties: Path, cluster_id: str) -> None:
        # "--cluster-id=" form: a base64 id may start with "-", which argparse would read as a flag
        command = [*base, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c"]
        command.append(str(properties))
        if self.security is not None:  # SCRAM users exist before the first connection
            command += self.security.format_args()
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=DEFAULT_START_TIMEOUT_S,
                check=False,
                cwd=self.data_dir,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LocalKafkaError(f"formatting the storage of {self.name!r} failed: {exc}") from exc
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise LocalKafkaError(
                f"formatting the storage in {self.data_dir} failed ({detail[0][:300]}): "
                "remove the data dir or pick another --data-dir"
            )

    def _log_tail(self) -> str:
        """The JVM's own last words (stdout.log) and the broker log's last errors, one line."""
        logs = self.data_dir / "logs"
        lines: list[str] = []
        with contextlib.suppress(OSError):
            text = (logs / "stdout.log").read_text(encoding="utf-8", errors="replace")
            lines += [line for line in text.splitlines() if line.strip()][-3:]
        with contextlib.suppress(OSError):
            text = (logs / "server.log").read_text(encoding="utf-8", errors="replace")
            lines += [line for line in text.splitlines() if "] ERROR " in line][-3:]
        if not lines:
            return f"; broker log: {logs}"
        return f"; broker log {logs} says: " + " | ".join(line.strip()[:200] for line in lines)


def _controller_port(previous: BrokerState | None, client_port: int) -> int:
    # Reuse the last controller port when free: the next start then looks like the last one.
    if (
        previous is not None
        and previous.controller_port != client_port
        and not port_in_use(previous.controller_port)
    ):
        return previous.controller_port
    while True:
        candidate = free_port()
        if candidate != client_port:
            return candidate


def _formatted_cluster_id(log_dirs: Path) -> str | None:
    try:
        text = (log_dirs / "meta.properties").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cluster\.id=(\S+)$", text, re.MULTILINE)
    return match.group(1) if match else None


#: The embedded broker's ``message.max.bytes``: the default ``max_record_size`` plus the raw
#: layout's overhead, rounded up (16 MiB + 64 KiB).
EMBEDDED_MESSAGE_MAX_BYTES = 16 * 1024 * 1024 + 64 * 1024


def _server_properties(
    port: int,
    controller_port: int,
    log_dirs: Path,
    partitions: int,
    *,
    member: ClusterMembership | None = None,
    security: SecurityFiles | None = None,
) -> str:
    listener = "PLAINTEXT" if security is None else "SASL_SSL"
    replicas, in_sync = ("1", "1")
    if member is not None:
        replicas, in_sync = str(member.replication), str(member.min_insync)
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1" if member is None else str(member.node_id),
        "controller.quorum.voters": (
            f"1@{HOST}:{controller_port}" if member is None else member.voters
        ),
        "listeners": f"{listener}://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"{listener}://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": listener,
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dirs),
        "num.partitions": str(partitions),
        # A cluster: 3 replicas, 2 in sync, everywhere (internal topics, transaction state,
        # topics created with the default), as production clusters run.
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": replicas,
        # Fewer internal partitions: the first consumer group and first transaction come up fast.
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": "168",
        "log.segment.bytes": str(256 * 1024 * 1024),
        # Topics admit a record of the default max_record_size (16 MiB) with the raw layout's
        # overhead (common/topic_limits.py), as docs/operations.md tells operators to set up.
        "message.max.bytes": str(EMBEDDED_MESSAGE_MAX_BYTES),
    }
    if security is not None:
        settings.update(security.broker_settings(listener))
    lines = ["# Written by kafka-diode on every start; edit the code, not this file."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _wait_ready(
    bootstrap: str,
    deadline: float,
    alive: Callable[[], bool],
    conf: Mapping[str, str] | None = None,
) -> None:
    """Wait until ``bootstrap`` accepts a produce and serves it back to a fetch, or raise."""
    host, _, port_text = bootstrap.rpartition(":")
    last_error = "no answer yet"
    while True:
        if not alive():
            raise LocalKafkaError(f"the broker at {bootstrap} exited during start-up")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LocalKafkaError(f"the broker at {bootstrap} was not ready in time ({last_error})")
        try:
            with socket.create_connection((host, int(port_text)), timeout=min(1.0, remaining)):
                pass
        except OSError as exc:
            last_error = f"connect: {exc}"
            time.sleep(_POLL_S)  # polling a condition under a deadline, not synchronising on time
            continue
        try:
            _probe(bootstrap, min(remaining, 15.0), conf or {})
            return
        except LocalKafkaError as exc:
            last_error = str(exc)


def _probe(bootstrap: str, timeout: float, conf: Mapping[str, str]) -> None:
    """Produce one record to the probe topic and fetch it back; raise LocalKafkaError if not."""
    # Imported here: status/stop and `--help` must not pay for loading librdkafka.
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    from common.errors import KafkaClientError  # noqa: PLC0415
    from runtime import kafka  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    # Warnings while a fresh broker settles (coordinator load in progress, …) are expected here and
    # the probe's outcome says whether it settled; they must not reach a demo's terminal.
    quiet = logging.getLogger(f"{__name__}.probe")
    quiet.setLevel(logging.ERROR)
    common: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "logger": quiet,
        "log_level": 4,  # no informational lines (%6|…|BGQUEUE|… when a client is destroyed)
        "socket.timeout.ms": 5000,
        **conf,
    }
    try:  # the broker's (cluster's) default replication factor
        kafka.create_missing_topics(
            common, [kafka.TopicSpec(name=PROBE_TOPIC, partitions=1)], timeout=timeout
        )
    except KafkaClientError as exc:
        raise LocalKafkaError(f"create probe topic: {exc}") from exc
    delivered: list[tuple[int, str | None]] = []
    token = uuid.uuid4().bytes

    def on_delivery(err: Any, msg: Any) -> None:
        delivered.append((-1, err.str()) if err is not None else (int(msg.offset()), None))

    # Idempotent like every real producer of ours: ready means producer ids are handed out too
    # (a client starting right after would otherwise log "Failed to acquire idempotence PID").
    producer = kafka.producer(
        {
            **common,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": int(timeout * 1000),
        }
    )
    producer.produce(PROBE_TOPIC, value=token, partition=0, on_delivery=on_delivery)
    producer.flush(timeout)
    if not delivered or delivered[0][1] is not None:
        raise LocalKafkaError(f"probe produce: {delivered[0][1] if delivered else 'timed out'}")
    consumer = kafka.consumer(
        {**common, "group.id": "kafka-diode-probe", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(PROBE_TOPIC, 0, delivered[0][0])])
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            if msg.value() == token:
                return
        raise LocalKafkaError("probe fetch: the produced record did not come back in time")
    finally:
        consumer.close()


def _terminate(
    state: BrokerState,
    data_dir: Path,
    timeout: float,
    process: subprocess.Popen[bytes] | None,
) -> bool:
    pid = state.pid
    if process is not None and process.pid != pid:
        process = None
    if process is not None:
        if process.poll() is not None:
            return False
    elif not is_our_broker(pid, state.name, data_dir):
        _reap(pid)
        return False
    _signal(pid, signal.SIGTERM, state.name, data_dir, process)
    if _wait_gone(pid, state.name, data_dir, timeout, process):
        return True
    log.warning("broker %s (pid %d) ignored SIGTERM for %.0f s; killing", state.name, pid, timeout)
    _signal(pid, signal.SIGKILL, state.name, data_dir, process)
    if not _wait_gone(pid, state.name, data_dir, 10.0, process):
        raise LocalKafkaError(f"broker {state.name!r} (pid {pid}) survived SIGKILL")
    return True


def _signal(
    pid: int,
    signum: signal.Signals,
    name: str,
    data_dir: Path,
    process: subprocess.Popen[bytes] | None,
) -> None:
    """Send ``signum`` to our child, or to ``pid`` only while its cmdline proves it is ours."""
    if process is not None:
        if process.poll() is None:
            process.send_signal(signum)
    elif is_our_broker(pid, name, data_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _wait_gone(
    pid: int, name: str, data_dir: Path, timeout: float, process: subprocess.Popen[bytes] | None
) -> bool:
    if process is not None:
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_our_broker(pid, name, data_dir):
            return True
        time.sleep(_POLL_S)  # the pid is not our child: /proc is all we can watch
    return not is_our_broker(pid, name, data_dir)


def read_state(data_dir: Path) -> BrokerState | None:
    """The ``broker.json`` of ``data_dir``, or None when absent or unreadable."""
    try:
        return BrokerState.from_json(json.loads((data_dir / STATE_FILE).read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    temp.replace(path)


def _index_entry(name: str, env: Mapping[str, str] | None) -> str | None:
    try:
        data = json.loads((run_dir(env) / f"{name}.json").read_text("utf-8"))
        return str(data["data_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_index(name: str, data_dir: Path, env: Mapping[str, str] | None) -> None:
    _write_json_atomic(run_dir(env) / f"{name}.json", {"name": name, "data_dir": str(data_dir)})


def _remove_index(name: str, data_dir: Path, env: Mapping[str, str] | None) -> None:
    if _index_entry(name, env) == str(data_dir):
        with contextlib.suppress(FileNotFoundError):
            (run_dir(env) / f"{name}.json").unlink()


def broker_by_name(name: str, env: Mapping[str, str] | None = None) -> LocalBroker | None:
    """The indexed broker called ``name`` (running or not), or None if the index lacks it."""
    validate_name(name)
    data_dir = _index_entry(name, env)
    if data_dir is None:
        return None
    state = read_state(Path(data_dir))
    port = state.port if state is not None else 1
    membership = state.membership if state is not None else None
    security = (
        ensure_security(Path(state.security_dir))
        if state is not None and state.security_dir
        else None
    )
    return LocalBroker(
        name, port, data_dir=data_dir, env=env, membership=membership, security=security
    )


def list_brokers(env: Mapping[str, str] | None = None) -> list[BrokerStatus]:
    """Every indexed broker and whether it runs; entries whose data dir vanished are dropped."""
    directory = run_dir(env)
    rows: list[BrokerStatus] = []
    if not directory.is_dir():
        return rows
    for entry in sorted(directory.glob("*.json")):
        name = entry.stem
        data_dir = _index_entry(name, env)
        if data_dir is None or not Path(data_dir).is_dir():
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
            continue
        state = read_state(Path(data_dir))
        running = state is not None and is_our_broker(state.pid, name, data_dir)
        rows.append(BrokerStatus(name=name, running=running, data_dir=data_dir, state=state))
    return rows
