"""The ``kafka-diode`` command: one entry point, one subcommand per job.

Each subcommand is a ``main(argv) -> int`` function in its component's ``cli`` module, imported
only when chosen, so ``kafka-diode --help`` does not load Spark or Kafka clients.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from kafka_diode import __version__

#: subcommand -> (module, summary). The module's ``main(argv)`` receives the remaining arguments.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "send": ("sender.cli", "read Kafka and send encrypted, paced UDP datagrams (high side)"),
    "receive": ("receiver.cli", "receive datagrams and write records to the raw topic (low side)"),
    "dedup": ("dedup.cli", "Spark job: raw topic -> clean topic(s) + gap topic (low side)"),
    "gaps": ("dedup.gaps_cli", "list open gaps from the gap topic (low side)"),
    "raw": ("dedup.raw_cli", "print a raw topic's records decoded, whatever the layout (low side)"),
    "status": (
        "kafka_diode.status",
        "the low side at a glance; exit 1 when a person is needed (low side)",
    ),
    "bundle": ("dedup.bundle_cli", "create or show a resend bundle from the gap topic (low side)"),
    "resend": ("sender.resend_cli", "resend records listed in a bundle or a range (high side)"),
    "keygen": ("kafka_diode.keygen", "write a new 256-bit key file and print its key id"),
    "netem": ("netem.cli", "network impairment: userspace relay, tc netem apply/clear"),
    "local-kafka": ("kafka_diode.local_kafka.cli", "start/stop/status of embedded Kafka brokers"),
    "demo": ("kafka_diode.demo", "the whole pipeline on one machine over a lossy link"),
    "bench": ("kafka_diode.bench_cli", "benchmarks: codec, sender, receiver, dedup, e2e"),
}

#: ``(command, first argument)`` -> module: a subcommand that belongs to the other side of the
#: link (``bundle join`` runs on the high side, the rest of ``bundle`` on the low side).
ROUTES: dict[tuple[str, str], str] = {("bundle", "join"): "sender.bundle_join"}

NOT_AVAILABLE = 2


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [
        "usage: kafka-diode [--version] [--help] <command> [options]",
        "",
        "Carry Kafka topics across a one-way link over UDP; prove exactly-once or report gaps.",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "Run 'kafka-diode <command> --help' for the options of a command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else NOT_AVAILABLE
    if args[0] in ("-V", "--version"):
        print(f"kafka-diode {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"kafka-diode: unknown command {name!r}; run 'kafka-diode --help'", file=sys.stderr)
        return NOT_AVAILABLE
    module_name, _ = SUBCOMMANDS[name]
    if rest and (name, rest[0]) in ROUTES:
        module_name, name, rest = ROUTES[name, rest[0]], f"{name} {rest[0]}", rest[1:]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"kafka-diode {name}: not available yet in this version", file=sys.stderr)
        return NOT_AVAILABLE
    entry = module.main
    return int(entry(rest, prog=f"kafka-diode {name}"))
