"""A real local Kafka cluster: N KRaft nodes (each a combined broker and controller) as background
JVMs, replicated as production clusters are.

Theory of operation
-------------------
A cluster called ``down`` of three nodes is three :class:`~.broker.LocalBroker`\\ s named
``down-1``, ``down-2`` and ``down-3`` on consecutive client ports, each with its own data directory
(``<data-dir>/node-<i>``), sharing one KRaft cluster id and a static controller quorum
(``controller.quorum.voters`` lists the three controller ports, fixed when the cluster is first
made and kept in ``cluster.json``). Internal topics (consumer offsets, transaction state, share
state) and topics created with the broker's defaults get ``min(3, N)`` replicas and
``min.insync.replicas`` 2: with ``acks=all`` one node may be down without a refused write.

``start()`` launches every node first and only then waits for each to be ready (a quorum needs a
majority: a node alone never is); ready is the single broker's test (a produce accepted and
fetched back) on every node, with a probe topic replicated to all of them. Nodes are ordinary
named brokers for ``stop``/``kill``/``start`` by name (one node down for a failover test, a rolling
restart); :meth:`LocalCluster.stop` stops every node and forgets them.

State::

    <data-dir>/cluster.json   name, size, ports, controller ports, cluster id
    <data-dir>/node-<i>/      each node's broker.json, server.properties, logs, kraft-logs
    <run-dir>/clusters/<name>.json  index: cluster name -> its layout
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError, LocalKafkaError
from kafka_diode.local_kafka.broker import (
    DEFAULT_HEAP_MB,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    HOST,
    ClusterMembership,
    LocalBroker,
    default_data_dir,
    free_port,
    new_cluster_id,
    port_in_use,
    run_dir,
    validate_name,
    validate_port,
)
from kafka_diode.local_kafka.security import ensure_security, validate_security

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"
#: Nodes a local cluster may have (3 is what production runs; more costs a JVM each).
MAX_NODES = 9


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """What ``cluster.json`` records: fixed when the cluster is first made."""

    name: str
    """The cluster's name."""
    ports: tuple[int, ...]
    """Client (PLAINTEXT) port of node 1, 2, ..."""
    controller_ports: tuple[int, ...]
    """Controller port of node 1, 2, ... (the static quorum)."""
    cluster_id: str
    """The KRaft cluster id."""
    data_dir: str
    """Absolute data directory of the cluster."""
    security: str = "plaintext"
    """``--security``: plaintext, or sasl_ssl (certificates and users in
    ``<data-dir>/security``)."""

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma-separated, for ``bootstrap.servers``."""
        return ",".join(f"{HOST}:{port}" for port in self.ports)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClusterLayout:
        """Parse a ``cluster.json`` document."""
        return cls(
            name=str(data["name"]),
            ports=tuple(int(p) for p in data["ports"]),
            controller_ports=tuple(int(p) for p in data["controller_ports"]),
            cluster_id=str(data["cluster_id"]),
            data_dir=str(data["data_dir"]),
            security=str(data.get("security", "plaintext")),
        )


def node_name(cluster: str, node_id: int) -> str:
    """The broker name of node ``node_id`` (1-based) of ``cluster``."""
    return f"{cluster}-{node_id}"


class LocalCluster:
    """A named local cluster of ``brokers`` nodes; nothing runs until :meth:`start`.

    ``ports`` defaults to ``port, port + 1, ...``; an existing cluster of the same name and data
    directory is started again with its recorded ports (its quorum is fixed).
    """

    def __init__(
        self,
        name: str,
        port: int | None = None,
        *,
        brokers: int = 3,
        ports: tuple[int, ...] | None = None,
        data_dir: str | Path | None = None,
        partitions: int = 1,
        heap_mb: int = DEFAULT_HEAP_MB,
        env: Mapping[str, str] | None = None,
        security: str = "plaintext",
    ) -> None:
        self.name = validate_name(name)
        validate_security(security)
        if not 2 <= brokers <= MAX_NODES:
            raise ConfigError(
                "--brokers", f"{brokers} is not a cluster size", f"use 2..{MAX_NODES} (or 1)"
            )
        self._env = env
        chosen = Path(data_dir) if data_dir is not None else default_data_dir(name, env)
        self.data_dir = chosen.expanduser().resolve()
        layout = read_layout(self.data_dir)
        if layout is not None and len(layout.ports) != brokers:
            raise ConfigError(
                "--brokers",
                f"cluster {name!r} in {self.data_dir} has {len(layout.ports)} nodes, not {brokers}",
                f"use --brokers {len(layout.ports)}, or another --data-dir",
            )
        if layout is None:
            if ports is None:
                if port is None:
                    raise ConfigError("--port", "a new cluster needs its first port", "give --port")
                ports = tuple(port + i for i in range(brokers))
            if len(ports) != brokers or len(set(ports)) != brokers:
                raise ConfigError("--port", f"{brokers} distinct ports needed, not {ports}")
            for p in ports:
                validate_port(p)
            controller_ports: list[int] = []
            while len(controller_ports) < brokers:
                candidate = free_port()
                if candidate not in ports and candidate not in controller_ports:
                    controller_ports.append(candidate)
            layout = ClusterLayout(
                name=name,
                ports=tuple(ports),
                controller_ports=tuple(controller_ports),
                cluster_id=new_cluster_id(),
                data_dir=str(self.data_dir),
                security=security,
            )
        elif (ports is not None and tuple(ports) != layout.ports) or (
            ports is None and port is not None and port != layout.ports[0]
        ):
            raise ConfigError(
                "--port",
                f"cluster {name!r} in {self.data_dir} uses ports {layout.ports}",
                f"use --port {layout.ports[0]}, or another --data-dir",
            )
        if layout.security != security:
            raise ConfigError(
                "--security",
                f"cluster {name!r} in {self.data_dir} was made with --security {layout.security}",
                f"use --security {layout.security}, or another --data-dir",
            )
        self.layout = layout
        self.security = (
            ensure_security(self.data_dir / "security") if security == "sasl_ssl" else None
        )
        voters = ",".join(
            f"{i}@{HOST}:{cp}" for i, cp in enumerate(layout.controller_ports, start=1)
        )
        self.nodes = [
            LocalBroker(
                node_name(name, i),
                p,
                data_dir=self.data_dir / f"node-{i}",
                partitions=partitions,
                heap_mb=heap_mb,
                env=env,
                membership=ClusterMembership(
                    cluster=name,
                    node_id=i,
                    voters=voters,
                    controller_port=layout.controller_ports[i - 1],
                    size=brokers,
                    cluster_id=layout.cluster_id,
                ),
                security=self.security,
            )
            for i, p in enumerate(layout.ports, start=1)
        ]

    # -- public surface -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated."""
        return self.layout.bootstrap

    def client_conf(self) -> dict[str, str]:
        """librdkafka properties (besides ``bootstrap.servers``) for the components' user."""
        return self.security.librdkafka() if self.security is not None else {}

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def node(self, name_or_id: str | int) -> LocalBroker:
        """A node by its broker name (``down-2``) or node id (2)."""
        for i, node in enumerate(self.nodes, start=1):
            if name_or_id in (i, node.name):
                return node
        raise ConfigError("--name", f"cluster {self.name!r} has no node {name_or_id!r}")

    def start(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> ClusterLayout:
        """Launch every node that is not running, then wait until each is ready.

        Raises:
            LocalKafkaError: a port is taken, a node exits or is not ready in time (every node
                this call launched is stopped again).
        """
        for node in self.nodes:
            if not node.is_running() and port_in_use(node.port):
                raise LocalKafkaError(
                    f"port {node.port} on {HOST} (node {node.name}) is already in use: pick "
                    "another --port or stop what listens there (see 'ss -ltnp')"
                )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.data_dir / CLUSTER_FILE, asdict(self.layout))
        _write_json(_index_path(self.name, self._env), asdict(self.layout))
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.launch(timeout)
            for node in self.nodes:
                node.wait_ready(max(1.0, deadline - time.monotonic()))
        except LocalKafkaError:
            self.stop()
            raise
        log.info("cluster %s ready at %s", self.name, self.bootstrap)
        return self.layout

    def running(self) -> list[str]:
        """Names of the nodes whose JVM is alive."""
        return [node.name for node in self.nodes if node.is_running()]

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout``) and forget the cluster's
        names; the data stays for the next start. Returns whether any node was running."""
        # All at once: a node stopped after a majority of the quorum is gone cannot finish its
        # controlled shutdown and would wait for SIGKILL.
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            results = list(pool.map(lambda node: node.stop(timeout), self.nodes))
        for node in self.nodes:
            node.forget()
        stopped = any(results)
        with contextlib.suppress(FileNotFoundError):
            (_index_path(self.name, self._env)).unlink()
        return stopped


def read_layout(data_dir: Path) -> ClusterLayout | None:
    """The ``cluster.json`` of ``data_dir``, or None when absent or unreadable."""
    try:
        return ClusterLayout.from_json(json.loads((data_dir / CLUSTER_FILE).read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cluster_by_name(name: str, env: Mapping[str, str] | None = None) -> LocalCluster | None:
    """The indexed cluster called ``name``, or None."""
    validate_name(name)
    try:
        data = json.loads((_index_path(name, env)).read_text("utf-8"))
        layout = ClusterLayout.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return LocalCluster(
        name,
        brokers=len(layout.ports),
        ports=layout.ports,
        data_dir=layout.data_dir,
        env=env,
        security=layout.security,
    )


def _index_path(name: str, env: Mapping[str, str] | None) -> Path:
    return run_dir(env) / "clusters" / f"{name}.json"


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    temp.replace(path)
