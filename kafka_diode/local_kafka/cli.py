"""``kafka-diode local-kafka``: start, stop and list real local Kafka brokers; fetch their jars.

Every failure the user can fix (no Java, no Maven, port taken, download failed) is one line on
stderr and exit status 1. ``start`` prints progress on stderr and the bootstrap address as the last
line of stdout, so ``BOOTSTRAP=$(kafka-diode local-kafka start --name up --port 9092)`` works.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common.errors import ConfigError, JvmBuildError, LocalKafkaError
from dedup import jvm as dedup_jvm
from kafka_diode.local_kafka import broker, cluster, security
from runtime import maven as artifacts

EXIT_FAILURE = 1

_EPILOG = """\
environment:
  KAFKA_DIODE_CACHE    cache root (default ~/.cache/kafka-diode): jars/, data/, run/, maven/
  KAFKA_DIODE_RUN_DIR  where the name index lives (default $KAFKA_DIODE_CACHE/run)
  KAFKA_DIODE_MVN      Maven executable used once to fetch jars (default: mvn on PATH)
  KAFKA_DIODE_JVM_OPTS extra JVM options for the broker, appended after the defaults
  JAVA_HOME            Java 17+ to run the broker, and its javac for 'fetch' (default: on PATH)

Once 'fetch' (or a first 'start') has cached the jars, nothing touches the network or Maven.
See docs/local-kafka.md.
"""


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            f"Run real Apache Kafka {artifacts.KAFKA_VERSION} brokers on this host (KRaft, "
            "combined broker+controller) as background processes, for tests and the demo: a "
            "single-node broker, or a cluster of --brokers nodes replicated as production "
            "clusters are."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")

    start = commands.add_parser(
        "start",
        help="start a broker (formats storage on first start) and print its bootstrap address",
        description=(
            "Start a broker (or with --brokers N a cluster of N nodes named NAME-1..NAME-N) in "
            "the background and wait until it accepts a produce and a fetch. The last line on "
            "stdout is the bootstrap address (host:port[,host:port...]). Starting a name that "
            "already runs on the same port just prints its address; starting a stopped or "
            "killed node of a known cluster by its name (NAME-2) restarts that node alone."
        ),
        allow_abbrev=False,
    )
    start.add_argument(
        "--name",
        required=True,
        help="broker, cluster or cluster node name, used by stop and status",
    )
    start.add_argument(
        "--port",
        type=int,
        default=None,
        help="client (PLAINTEXT) port on 127.0.0.1; a cluster uses PORT..PORT+N-1 (required "
        "unless NAME is a node of a known cluster)",
    )
    start.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="nodes: 1 is a single-node broker (replication 1); 3 (2..9) a cluster with a "
        "3-controller quorum, replication factor min(3, N) for internal topics, transaction "
        "state and default topics, min.insync.replicas 2 (default: %(default)s)",
    )
    start.add_argument(
        "--data-dir",
        default=None,
        help="where the broker keeps its logs and state (default: $KAFKA_DIODE_CACHE/data/NAME)",
    )
    start.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="num.partitions for auto-created topics (default: %(default)s)",
    )
    start.add_argument(
        "--security",
        default="plaintext",
        choices=security.SECURITY_MODES,
        help="plaintext, or sasl_ssl: a TLS listener (certificates made here, CA in "
        "DATA_DIR/security/ca.pem) with SCRAM-SHA-512 users; the components' client properties "
        "are written to DATA_DIR/security/client.properties (librdkafka) and "
        "client-java.properties (Java), never printed (default: %(default)s)",
    )
    start.add_argument(
        "--heap-mb",
        type=int,
        default=broker.DEFAULT_HEAP_MB,
        help="maximum JVM heap in MB (default: %(default)s)",
    )
    start.add_argument(
        "--timeout",
        type=float,
        default=broker.DEFAULT_START_TIMEOUT_S,
        help="seconds to wait until the broker is ready (default: %(default)s)",
    )

    stop = commands.add_parser(
        "stop",
        help="stop a broker, a cluster or one node of a cluster by name (SIGTERM, then SIGKILL)",
        description=(
            "Stop the named broker and only it; a cluster's name stops every node, a node's "
            "name (NAME-2) only that node (start it again by the same name). Data dirs are kept "
            "for the next start."
        ),
        allow_abbrev=False,
    )
    stop.add_argument("--name", required=True, help="the name given to start, or a node's name")
    stop.add_argument(
        "--timeout",
        type=float,
        default=broker.DEFAULT_STOP_TIMEOUT_S,
        help="seconds to wait after SIGTERM before SIGKILL (default: %(default)s)",
    )

    kill = commands.add_parser(
        "kill",
        help="SIGKILL a broker or one node of a cluster by name (a crash, for failover tests)",
        description=(
            "Kill the named broker's JVM with SIGKILL, as a crash would; its data dir and name "
            "stay, so 'start --name NAME' restarts it (a cluster node without --port)."
        ),
        allow_abbrev=False,
    )
    kill.add_argument("--name", required=True, help="a broker's or a cluster node's name")

    commands.add_parser(
        "status",
        help="list known brokers and cluster nodes and whether they run",
        description=(
            "Print a table of the brokers in the index: name, state, pid, bootstrap, cluster "
            "(with its node id), data dir."
        ),
        allow_abbrev=False,
    )
    commands.add_parser(
        "fetch",
        help="download and cache the broker and Spark connector jars; print where",
        description=(
            "Resolve the Kafka broker jars and Spark's Kafka connector (matching pyspark "
            f"{artifacts.SPARK_VERSION}) from Maven Central into the cache, and compile the "
            "dedup's checkpoint file manager there with the JDK's javac (skipped, with a note, "
            "without one). A no-op when cached."
        ),
        allow_abbrev=False,
    )
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode local-kafka") -> int:
    """Run one ``local-kafka`` subcommand; returns the exit status."""
    args = _parser(prog).parse_args(list(argv))
    try:
        if args.command == "start":
            return _start(args)
        if args.command == "stop":
            return _stop(args)
        if args.command == "kill":
            return _kill(args)
        if args.command == "status":
            return _status()
        return _fetch()
    except (LocalKafkaError, ConfigError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _start(args: argparse.Namespace) -> int:
    if args.brokers != 1:
        return _start_cluster(args)
    if args.port is None:
        node = broker.broker_by_name(args.name)
        if node is None or node.membership is None:
            raise ConfigError("--port", "a new broker needs its port", "give --port")
        print(
            f"starting node {args.name!r} of cluster {node.membership.cluster!r} ...",
            file=sys.stderr,
        )
        began = time.monotonic()
        state = node.start(timeout=args.timeout)
        print(
            f"node {args.name!r} ready in {time.monotonic() - began:.1f} s (pid {state.pid})",
            file=sys.stderr,
        )
        print(state.bootstrap)
        return 0
    data_dir = Path(args.data_dir or broker.default_data_dir(args.name)).expanduser().resolve()
    files = security.ensure_security(data_dir / "security") if args.security == "sasl_ssl" else None
    local = broker.LocalBroker(
        args.name,
        args.port,
        data_dir=data_dir,
        partitions=args.partitions,
        heap_mb=args.heap_mb,
        security=files,
    )
    print(f"starting broker {args.name!r} on port {args.port} ...", file=sys.stderr)
    began = time.monotonic()
    state = local.start(timeout=args.timeout)
    print(
        f"broker {state.name!r} ready in {time.monotonic() - began:.1f} s (pid {state.pid}, "
        f"data {state.data_dir})",
        file=sys.stderr,
    )
    _say_security(files)
    print(state.bootstrap)
    return 0


def _say_security(files: security.SecurityFiles | None) -> None:
    if files is not None:
        print(
            f"SASL_SSL (SCRAM-SHA-512, user {files.client.name!r}): client properties in "
            f"{files.directory}/client.properties (librdkafka) and client-java.properties "
            "(Java); docs/security.md",
            file=sys.stderr,
        )


def _start_cluster(args: argparse.Namespace) -> int:
    local = cluster.LocalCluster(
        args.name,
        args.port,
        brokers=args.brokers,
        data_dir=args.data_dir,
        partitions=args.partitions,
        heap_mb=args.heap_mb,
        security=args.security,
    )
    print(
        f"starting cluster {args.name!r} of {args.brokers} nodes on ports "
        f"{', '.join(map(str, local.layout.ports))} ...",
        file=sys.stderr,
    )
    began = time.monotonic()
    local.start(timeout=args.timeout)
    print(
        f"cluster {args.name!r} ready in {time.monotonic() - began:.1f} s (nodes "
        f"{', '.join(n.name for n in local.nodes)}, data {local.data_dir})",
        file=sys.stderr,
    )
    _say_security(local.security)
    print(local.bootstrap)
    return 0


def _stop(args: argparse.Namespace) -> int:
    whole = cluster.cluster_by_name(args.name)
    if whole is not None:
        stopped = whole.stop(timeout=args.timeout)
        print(
            f"cluster {args.name!r} {'stopped' if stopped else 'was not running'}", file=sys.stderr
        )
        return 0
    local = broker.broker_by_name(args.name)
    if local is None:
        print(f"no broker named {args.name!r} is known; nothing to stop", file=sys.stderr)
        return 0
    stopped = local.stop(timeout=args.timeout)
    print(f"broker {args.name!r} {'stopped' if stopped else 'was not running'}", file=sys.stderr)
    return 0


def _kill(args: argparse.Namespace) -> int:
    local = broker.broker_by_name(args.name)
    if local is None:
        print(f"no broker named {args.name!r} is known; nothing to kill", file=sys.stderr)
        return 0
    killed = local.kill()
    print(f"broker {args.name!r} {'killed' if killed else 'was not running'}", file=sys.stderr)
    return 0


def _status() -> int:
    rows = broker.list_brokers()
    if not rows:
        print("no local Kafka brokers known")
        return 0
    table = [("NAME", "STATE", "PID", "BOOTSTRAP", "CLUSTER", "DATA DIR")]
    for row in rows:
        state = row.state
        member = state.membership if state is not None else None
        table.append(
            (
                row.name,
                "running" if row.running else "stopped",
                str(state.pid) if state is not None and row.running else "-",
                state.bootstrap if state is not None else "-",
                f"{member.cluster}#{member.node_id}" if member is not None else "-",
                row.data_dir,
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    return 0


def _fetch() -> int:
    began = time.monotonic()
    kafka_dir = artifacts.ensure_kafka_jars()
    spark_jars = artifacts.spark_connector_jars()
    try:
        manager = str(dedup_jvm.build())
    except JvmBuildError as exc:
        manager = f"not built ({exc}); the dedup then writes its checkpoint logs through Hadoop"
    elapsed = time.monotonic() - began
    print(f"kafka broker jars ({artifacts.KAFKA_VERSION}): {kafka_dir}")
    print(f"spark kafka connector ({artifacts.SPARK_VERSION}): {spark_jars[0].parent}")
    print(f"dedup checkpoint file manager: {manager}")
    print(f"ready in {elapsed:.1f} s", file=sys.stderr)
    return 0
