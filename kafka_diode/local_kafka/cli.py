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

from common.errors import ConfigError, LocalKafkaError
from kafka_diode.local_kafka import broker
from runtime import maven as artifacts

EXIT_FAILURE = 1

_EPILOG = """\
environment:
  KAFKA_DIODE_CACHE    cache root (default ~/.cache/kafka-diode): jars/, data/, run/, maven/
  KAFKA_DIODE_RUN_DIR  where the name index lives (default $KAFKA_DIODE_CACHE/run)
  KAFKA_DIODE_MVN      Maven executable used once to fetch jars (default: mvn on PATH)
  KAFKA_DIODE_JVM_OPTS extra JVM options for the broker, appended after the defaults
  JAVA_HOME            Java 17+ to run the broker (default: java on PATH)

Once 'fetch' (or a first 'start') has cached the jars, nothing touches the network or Maven.
See docs/local-kafka.md.
"""


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            f"Run real Apache Kafka {artifacts.KAFKA_VERSION} brokers on this host (KRaft, single "
            "node, combined broker+controller) as background processes, for tests and the demo."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")

    start = commands.add_parser(
        "start",
        help="start a broker (formats storage on first start) and print its bootstrap address",
        description=(
            "Start a broker in the background and wait until it accepts a produce and a fetch. "
            "The last line on stdout is the bootstrap address (host:port). Starting a name that "
            "already runs on the same port just prints its address."
        ),
    )
    start.add_argument("--name", required=True, help="broker name, used by stop and status")
    start.add_argument(
        "--port", required=True, type=int, help="client (PLAINTEXT) port on 127.0.0.1"
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
        help="stop a broker by name (SIGTERM, then SIGKILL after --timeout)",
        description="Stop the named broker and only it; its data dir is kept for the next start.",
    )
    stop.add_argument("--name", required=True, help="the name given to start")
    stop.add_argument(
        "--timeout",
        type=float,
        default=broker.DEFAULT_STOP_TIMEOUT_S,
        help="seconds to wait after SIGTERM before SIGKILL (default: %(default)s)",
    )

    commands.add_parser(
        "status",
        help="list known brokers and whether they run",
        description="Print a table of the brokers in the index: name, state, pid, bootstrap, dir.",
    )
    commands.add_parser(
        "fetch",
        help="download and cache the broker and Spark connector jars; print where",
        description=(
            "Resolve the Kafka broker jars and Spark's Kafka connector (matching pyspark "
            f"{artifacts.SPARK_VERSION}) from Maven Central into the cache. A no-op when cached."
        ),
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
        if args.command == "status":
            return _status()
        return _fetch()
    except (LocalKafkaError, ConfigError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _start(args: argparse.Namespace) -> int:
    local = broker.LocalBroker(
        args.name,
        args.port,
        data_dir=args.data_dir,
        partitions=args.partitions,
        heap_mb=args.heap_mb,
    )
    print(f"starting broker {args.name!r} on port {args.port} ...", file=sys.stderr)
    began = time.monotonic()
    state = local.start(timeout=args.timeout)
    print(
        f"broker {state.name!r} ready in {time.monotonic() - began:.1f} s (pid {state.pid}, "
        f"data {state.data_dir})",
        file=sys.stderr,
    )
    print(state.bootstrap)
    return 0


def _stop(args: argparse.Namespace) -> int:
    local = broker.broker_by_name(args.name)
    if local is None:
        print(f"no broker named {args.name!r} is known; nothing to stop", file=sys.stderr)
        return 0
    stopped = local.stop(timeout=args.timeout)
    print(f"broker {args.name!r} {'stopped' if stopped else 'was not running'}", file=sys.stderr)
    return 0


def _status() -> int:
    rows = broker.list_brokers()
    if not rows:
        print("no local Kafka brokers known")
        return 0
    table = [("NAME", "STATE", "PID", "BOOTSTRAP", "DATA DIR")]
    for row in rows:
        state = row.state
        table.append(
            (
                row.name,
                "running" if row.running else "stopped",
                str(state.pid) if state is not None and row.running else "-",
                state.bootstrap if state is not None else "-",
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
    elapsed = time.monotonic() - began
    print(f"kafka broker jars ({artifacts.KAFKA_VERSION}): {kafka_dir}")
    print(f"spark kafka connector ({artifacts.SPARK_VERSION}): {spark_jars[0].parent}")
    print(f"ready in {elapsed:.1f} s", file=sys.stderr)
    return 0
