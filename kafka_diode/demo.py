"""``kafka-diode demo``: the whole system on one machine over a lossy link, with a live view.

Starts an upstream and a downstream broker, creates topics, produces a realistic stream, runs
sender -> impairment relay -> receiver -> dedup as separate processes, shows live figures scraped
from each component's Prometheus endpoint, then runs the bundle -> resend loop until no gap is open
(at most ``--resend-passes`` times) and prints the verdict, which comes from reading the upstream,
clean and gap topics (``kafka_diode.verify``), never from the demo's counters:

    N/N records delivered exactly once; 0 open gaps

Ctrl+C stops every process it started (components first, then brokers) and exits 130.

``kafka-diode demo produce`` and ``kafka-diode demo verify`` are the two halves on their own, used
by ``docker-compose.yml`` where each component is its own container.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

from common import settings
from common.errors import DiodeError
from common.logging import configure
from kafka_diode.demo_topics import create_demo_topics
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.verify import verify
from kafka_diode.workload import Workload, produce

log = logging.getLogger(__name__)

#: The demo sender's pacing (bytes/s): packaging/compose/sender.toml's rate_bytes, so both demos
#: run the same command; far above what the demo produces, as a link's rate should be.
DEMO_RATE_BYTES = 20_000_000.0

#: (row label, component, metric family, label filter) shown in the live table.
ROWS: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("sent by the sender", "sender", "kafka_diode_sender_records_sent", {}),
    ("datagrams sent", "sender", "kafka_diode_sender_datagrams_sent", {}),
    ("lost on the link", "relay", "kafka_diode_netem_datagrams", {"event": "dropped_loss"}),
    ("duplicated on the link", "relay", "kafka_diode_netem_datagrams", {"event": "duplicated"}),
    ("reordered on the link", "relay", "kafka_diode_netem_datagrams", {"event": "reordered"}),
    ("corrupted on the link", "relay", "kafka_diode_netem_datagrams", {"event": "corrupted"}),
    ("received (records)", "receiver", "kafka_diode_receiver_records", {}),
    ("datagrams dropped (all reasons)", "receiver", "kafka_diode_receiver_drops", {}),
    ("delivered clean", "dedup", "kafka_diode_dedup_records_forwarded", {}),
    ("duplicates dropped", "dedup", "kafka_diode_dedup_duplicates_dropped", {}),
    ("gaps open", "dedup", "kafka_diode_dedup_gaps_open", {}),
)


#: Rows that show a level (a gauge), not a count.
GAUGE_ROWS = frozenset({"gaps open"})


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a component's /metrics by family name (counters without ``_total``)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        samples = [
            (dict(s.labels), float(s.value))
            for s in family.samples
            if not s.name.endswith(("_created", "_bucket", "_count", "_sum"))
        ]
        out[family.name] = samples
    return out


def _value(samples: list[tuple[dict[str, str], float]], wanted: dict[str, str]) -> float:
    return sum(v for labels, v in samples if all(labels.get(k) == x for k, x in wanted.items()))


class LiveView:
    """A table refreshed once a second from the components' metrics."""

    def __init__(self, pipeline: Pipeline, produced: Callable[[], int]) -> None:
        self.pipeline = pipeline
        self.produced = produced
        self.started = time.monotonic()
        self.phase = "starting"
        self._last: dict[str, tuple[float, float]] = {}
        self._active: dict[str, tuple[float, float, float]] = {}

    def table(self, *, final: bool = False) -> Table:
        """Render the current figures; ``final``: each row's peak rate over the run.

        At the end nothing moves any more, so a live rate would be empty or 0; the highest rate a
        stage reached between two refreshes says how fast it went.
        """
        elapsed = time.monotonic() - self.started
        table = Table(title=f"kafka-diode demo — {self.phase} — {elapsed:5.0f} s", min_width=64)
        table.add_column("what")
        table.add_column("count", justify="right")
        table.add_column("per second (peak)" if final else "per second", justify="right")
        now = time.monotonic()
        rate = self._peak if final else self._rate
        self._track("produced", float(self.produced()), now)
        table.add_row("produced upstream", f"{self.produced():,}", rate("produced", now))
        scraped: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = {}
        for label, component, family, wanted in ROWS:
            port = self.pipeline.ep.metrics.get(component)
            if port is None:
                continue
            if component not in scraped:
                scraped[component] = scrape(port)
            value = _value(scraped[component].get(family, []), wanted)
            self._remember(label, value, now)
            self._track(label, value, now)
            table.add_row(label, f"{value:,.0f}", rate(label, now))
        return table

    def _track(self, key: str, value: float, now: float) -> None:
        """Keep the highest rate ``key`` reached between two refreshes (the final table's)."""
        since, before, peak = self._active.get(key, (self.started, 0.0, 0.0))
        if now - since < 0.5:
            return
        peak = max(peak, (value - before) / (now - since))
        self._active[key] = (now, value, peak)

    def _peak(self, key: str, _now: float) -> str:
        if key in GAUGE_ROWS:
            return "-"  # a level, not a count: it has no rate
        return f"{self._active.get(key, (0.0, 0.0, 0.0))[2]:,.0f}"

    def _remember(self, key: str, value: float, now: float) -> None:
        previous = self._last.get(key)
        if previous is None or now - previous[0] >= 1.0:
            self._last[key] = (now, value) if previous is None else previous
            self._last[key + "/now"] = (now, value)

    def _rate(self, key: str, now: float) -> str:
        if key == "produced":
            self._remember(key, float(self.produced()), now)
        first, current = self._last.get(key), self._last.get(key + "/now")
        if not first or not current or current[0] - first[0] < 0.5:
            return ""
        rate = (current[1] - first[1]) / (current[0] - first[0])
        self._last[key] = current
        return f"{rate:,.0f}"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the whole system on this machine over a lossy link and judge the result "
        "from the topics. Subcommands 'produce' and 'verify' run the two halves on their own.",
        allow_abbrev=False,
    )
    parser.add_argument("--records", type=int, default=20_000, help="records to produce (20000)")
    parser.add_argument(
        "--rate", type=float, default=5_000.0, help="records/s offered upstream (5000; 0: max)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="produce for this many seconds at --rate instead of --records",
    )
    parser.add_argument(
        "--profile", default="demo", help="netem profile of the link (demo); see netem profiles"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of workload and link (1)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic (3)")
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="nodes of each side's Kafka: 1 (a single broker, fast) or 3 (a KRaft cluster with "
        "replication factor 3 and min.insync.replicas 2, as production runs; slower) (1)",
    )
    parser.add_argument(
        "--security",
        default="plaintext",
        choices=("plaintext", "sasl_ssl"),
        help="each side's Kafka: plaintext, or sasl_ssl (TLS listener, SCRAM users; every "
        "component connects as docs/security.md shows) (plaintext)",
    )
    parser.add_argument(
        "--rate-bytes",
        type=float,
        default=DEMO_RATE_BYTES,
        help="sender pacing in bytes/s, as on a real link (%(default).0f, the docker-compose "
        "demo's; 0: unpaced, which a real diode punishes with loss)",
    )
    parser.add_argument(
        "--resend-passes", type=int, default=3, help="bundle -> resend rounds at most (3)"
    )
    parser.add_argument("--work-dir", type=Path, help="logs, keys, broker data (a temp dir)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after (600 s)")
    parser.add_argument("--no-live", action="store_true", help="plain log lines, no live table")
    sub = parser.add_subparsers(dest="command")
    prod = sub.add_parser(
        "produce", help="produce the demo workload to a broker and exit", allow_abbrev=False
    )
    prod.add_argument("--bootstrap-servers", required=True, help="upstream Kafka host:port")
    prod.add_argument("--records", type=int, default=20_000, help="records (20000)")
    prod.add_argument("--rate", type=float, default=0.0, help="records/s (0: as fast as possible)")
    prod.add_argument("--partitions", type=int, default=3, help="partitions per topic (3)")
    prod.add_argument("--seed", type=int, default=1, help="workload seed (1)")
    settings.add_list_argument(
        prod, "--topics", help=f"topics (default: {','.join(Workload().topics)})"
    )
    ver = sub.add_parser(
        "verify", help="judge the promise from upstream, clean and gap topics", allow_abbrev=False
    )
    ver.add_argument("--upstream", required=True, help="upstream Kafka host:port")
    ver.add_argument("--downstream", required=True, help="downstream Kafka host:port")
    settings.add_list_argument(
        ver, "--topics", help=f"source topics (default: {','.join(Workload().topics)})"
    )
    ver.add_argument("--clean-topic", default="clean.{topic}", help="CLEAN_TOPIC name/template")
    ver.add_argument("--gap-topic", default="kafka-diode.gaps", help="GAP_TOPIC")
    ver.add_argument("--json", action="store_true", help="print the figures as JSON too")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "kafka-diode demo") -> int:
    """Entry point; returns 0 when every record was delivered exactly once and no gap is open."""
    args = _parser(prog).parse_args(argv)
    configure("WARNING" if not args.no_live else "INFO")
    try:
        if args.command == "produce":
            return _produce_only(args)
        if args.command == "verify":
            return _verify_only(args)
        return _run(args)
    except DiodeError as exc:
        print(f"kafka-diode demo: {exc}", file=sys.stderr)
        return 1


def _produce_only(args: argparse.Namespace) -> int:
    workload = Workload(
        topics=tuple(args.topics or Workload().topics), records=args.records, seed=args.seed
    )
    created = create_demo_topics(args.bootstrap_servers, workload.topics, args.partitions)
    if created:
        print(f"created topics {', '.join(created)} with {args.partitions} partitions each")
    acked = produce(
        args.bootstrap_servers,
        workload,
        partitions=args.partitions,
        rate=args.rate or None,
        clock=time.monotonic,
        sleep=time.sleep,
    )
    print(f"produced {acked} records")
    return 0


def _verify_only(args: argparse.Namespace) -> int:
    verdict = verify(
        upstream=args.upstream,
        downstream=args.downstream,
        source_topics=list(args.topics or Workload().topics),
        clean_template=args.clean_topic,
        gap_topic=args.gap_topic,
    )
    if args.json:
        print(json.dumps(verdict.as_dict()))
    print(verdict.line())
    return 0 if verdict.ok else 1


def _run(args: argparse.Namespace) -> int:
    records = int(args.rate * args.duration) if args.duration else args.records
    spec = PipelineSpec(
        records=records,
        partitions=args.partitions,
        produce_rate=args.rate or None,
        profile=args.profile,
        seed=args.seed,
        rate_bytes=args.rate_bytes,
        brokers=args.brokers,
        security=args.security,
    )
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="kafka-diode-demo-"))
    console = Console(stderr=False)
    console.print(f"[bold]kafka-diode demo[/bold]: {records:,} records over profile "
                  f"'{args.profile}', sender paced at --rate-bytes {args.rate_bytes:.0f}; "
                  f"logs in {work_dir}/logs")  # fmt: skip
    interrupted = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        if interrupted.is_set():
            raise SystemExit(130)  # second Ctrl+C: leave now (the pipeline still stops children)
        interrupted.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    pipeline = Pipeline(spec, work_dir)
    try:
        with pipeline:
            return _drive(pipeline, args, console)
    except KeyboardInterrupt:
        console.print("interrupted: stopped every process this demo started")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drive(pipeline: Pipeline, args: argparse.Namespace, console: Console) -> int:
    if args.brokers > 1:
        console.print(
            f"starting two Kafka clusters of {args.brokers} nodes (upstream, downstream)…"
        )
    else:
        console.print("starting two Kafka brokers (upstream, downstream)…")
    pipeline.setup()
    console.print(f"upstream {pipeline.ep.upstream}, downstream {pipeline.ep.downstream}")
    pipeline.start_components(receiver_first=True)
    produced = [0]
    view = LiveView(pipeline, lambda: produced[0])
    deadline = time.monotonic() + args.timeout

    def progress(n: int) -> None:
        produced[0] = n

    with Live(view.table(), console=console, refresh_per_second=2, transient=False) as live:
        stop_refresh = threading.Event()

        def refresher() -> None:
            while not stop_refresh.wait(1.0):
                table = view.table()  # also with --no-live: the final averages need the samples
                if not args.no_live:
                    live.update(table)

        thread = threading.Thread(target=refresher, daemon=True)
        thread.start()
        try:
            view.phase = "producing"
            produced[0] = pipeline.produce(progress)
            view.phase = "waiting for the far side"
            verdict = pipeline.wait_settled(timeout=max(30.0, deadline - time.monotonic()))
            passes = 0
            while not verdict.ok and passes < args.resend_passes and verdict.promise_kept:
                passes += 1
                view.phase = f"resend pass {passes}: bundle -> resend"
                pipeline.resend_pass()
                verdict = pipeline.wait_settled(
                    timeout=max(30.0, min(180.0, deadline - time.monotonic())),
                    want_ok=True,
                    # two gap scans plus a few micro-batches without change: another pass is due
                    stable_for=3 * pipeline.spec.gap_emit_interval + 10,
                )
            view.phase = "done"
        finally:
            stop_refresh.set()
            thread.join(2)
        live.update(view.table(final=True))
    if verdict.examples and not verdict.ok:
        for example in verdict.examples[:10]:
            console.print(f"  {example}")
    console.print()
    console.print(verdict.line(), markup=False, highlight=False)
    return 0 if verdict.ok else 1
