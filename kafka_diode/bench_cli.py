"""``kafka-diode bench <name> [options]``: run one of the benchmark scripts in ``bench/``.

Each benchmark is a script in the source tree's ``bench/`` directory (``bench/e2e.py``,
``bench/codec.py``, ...) that prints its progress, then ONE JSON object as its last line. This
command finds the script, runs it with this interpreter and passes every remaining option through,
so ``kafka-diode bench e2e --help`` shows the script's own options. The exit code is the script's.

The scripts live in the source checkout, not in the installed package: from an installed wheel
this command says where to get them instead of failing obscurely.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: name -> (script in bench/, what it measures)
BENCHES: dict[str, tuple[str, str]] = {
    "e2e": ("e2e.py", "whole pipeline, real brokers: rates, CPU, memory, loss, latency, baselines"),
    "codec": ("codec.py", "wire encode/decode (batching, framing, AES-GCM) on one core"),
    "sender": ("sender.py", "the sender process: Kafka read -> datagrams"),
    "receiver": ("receiver.py", "the receiver process: datagrams -> raw topic"),
    "dedup": ("dedup.py", "the Spark dedup job: raw -> clean + gaps"),
    "gaps": ("gaps_memory.py", "gap detector state size and throughput"),
    "relay": ("netem_relay.py", "the netem userspace relay"),
    "peer": ("peer.py", "side by side with air-gap built from its source (its directory first)"),
}

NOT_AVAILABLE = 2


def bench_dir() -> Path:
    """``bench/`` next to the package in a source checkout."""
    return Path(__file__).resolve().parents[1] / "bench"


def main(argv: Sequence[str], prog: str = "kafka-diode bench") -> int:
    """Run ``bench/<script>`` for the chosen benchmark; returns its exit code."""
    listing = "\n".join(f"  {name:<9} {what}" for name, (_, what) in BENCHES.items())
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="benchmarks:\n" + listing + "\n\nOptions after NAME go to the script "
        "('kafka-diode bench e2e --help'). docs/benchmarks.md has results and exact commands.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", choices=sorted(BENCHES), metavar="NAME", help="which benchmark")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="passed to the script")
    args = parser.parse_args(list(argv))
    script = bench_dir() / BENCHES[args.name][0]
    if not script.exists():
        if script.parent.is_dir():
            why = f"{script.name} is not available yet in this version"
        else:
            why = "benchmarks run from a source checkout (git clone, then 'make install')"
        print(f"{prog} {args.name}: {why}", file=sys.stderr)
        return NOT_AVAILABLE
    # Our own script with our own interpreter; the options are the user's, passed as argv.
    completed = subprocess.run([sys.executable, str(script), *args.options], check=False)
    return completed.returncode
