"""Run one named chaos scenario end to end and judge it record by record.

A scenario is the whole system (``kafka_diode.pipeline``: real ``kafka-diode`` processes against
the session's two real brokers, topics prefixed per run) plus one impairment: a netem profile on the
relay between sender and receiver, or a process fault injected mid-run (SIGKILL + restart of a
component, a restart of the downstream broker). The verdict comes from the topics alone
(``kafka_diode.verify``), never from a component's counters.

Sequence, per scenario:

1. start receiver, relay, sender and dedup; produce the workload upstream (paced in a background
   thread when a fault must land mid-stream);
2. fault scenarios: wait for a progress condition (records in the raw topic, or the first clean
   output for the dedup), then inject the fault. Cluster faults hold the second half of the
   workload back until the fault has happened (``Run.fault_happened``), so records flow after it
   by construction and every "more progress after the fault" condition must become true if the
   promise holds, whatever the machine's speed;
3. wait until the run is *settled*: ``ok``, or every record accounted for (delivered, or inside an
   open gap) and the verdict unchanged for ``quiet`` s (at least 4 dedup micro-batches);
4. if records are missing: a resend pass (``bundle create`` + ``resend``, the real commands), settle
   again; at most ``MAX_RESEND_PASSES``;
5. append the figures as one JSON line to the results file and return them; the test asserts.

Settling waits on conditions with deadlines; the only notion of time is "no change for ``quiet``
seconds", which is what "the system is idle" means for a stream with no end marker.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.local_kafka.cluster import LocalCluster
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import wait_until
from kafka_diode.verify import Verdict, clean_topic_for, read_topic

MAX_RESEND_PASSES = 3

#: Receiver drop reasons that a flipped bit can cause. Anything else (duplicate, replayed, overflow)
#: is not evidence of corruption.
INTEGRITY_DROPS = frozenset(
    {
        "auth_failed",
        "bad_magic",
        "unsupported_version",
        "unknown_key",
        "malformed",
        "trailing_bytes",
        "too_large",
        "too_many_fragments",
        "fragment_mismatch",
        "cleartext_refused",
    }
)

FAULTS = ("receiver-sigkill", "dedup-sigkill", "sender-sigkill", "downstream-broker-restart")
#: Faults of one node of a cluster (tests/chaos/failover.py), on the side named in the scenario.
CLUSTER_FAULTS = (
    "raw-leader-sigkill",
    "clean-leader-sigkill",
    "txn-coordinator-sigkill",
    "group-coordinator-sigkill",
    "rolling-restart",
    "node-down-60s",
    "downstream-outage",
)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One named, seeded chaos scenario."""

    name: str
    """Name in test ids, results and docs/chaos.md."""
    profile: str | None = None
    """netem profile on the relay (netem.profile.NAMED_PROFILES); None: no relay."""
    fault: str | None = None
    """A process fault injected mid-run (one of FAULTS); None: none."""
    seed: int = 1
    """Seed of the workload and of the relay's random decisions."""
    records: int = 3000
    """Records produced upstream (3 topics x 3 partitions)."""
    produce_seconds: float = 0.0
    """Spread production over this long (a background thread), so a fault lands mid-stream."""
    resend_copies: int = 1
    """Copies of each datagram during resend passes (the resend crosses the same bad link)."""
    check_integrity_drops: bool = False
    """Also require the relay's corruptions to show up as receiver integrity drops."""
    fec_overhead: float = 0.0
    """Sender FEC overhead in percent (0: off)."""
    sender_env: tuple[tuple[str, str], ...] = ()
    """Extra environment of every component: ``DIODE_SENDER_*`` (e.g. FEC block settings),
    ``DIODE_RECEIVER_*`` (e.g. small buffers)."""
    receiver_first: bool = False
    """Start the sender only once receiver and relay listen (scenarios that promise zero gaps
    before any resend must not lose the first datagrams to a socket nobody has opened yet)."""
    cluster_fault: str | None = None
    """A fault of one node of the downstream or upstream cluster (CLUSTER_FAULTS; the run's
    brokers must be LocalClusters); None: none."""
    cluster_side: str = "downstream"
    """The cluster ``rolling-restart`` and ``node-down-60s`` act on: downstream or upstream."""

    def spec(self) -> PipelineSpec:
        """The pipeline for this scenario."""
        return PipelineSpec(
            records=self.records,
            profile=self.profile,
            seed=self.seed,
            produce_rate=self.records / self.produce_seconds if self.produce_seconds else None,
            heartbeat_interval=0.5,
            gap_emit_interval=1.0,
            persist_interval_ms=500,
            fec_overhead=self.fec_overhead,
            extra_env=self.sender_env,
        )


@dataclass
class Outcome:
    """Figures of one scenario run (one JSON line in the results file)."""

    scenario: str
    profile: str | None
    fault: str | None
    seed: int
    records: int = 0
    delivered: int = 0
    """Delivered exactly once before any resend."""
    gaps_reported: int = 0
    """Open gaps before any resend."""
    missing_reported: int = 0
    """Records inside those gaps before any resend."""
    false_gaps: int = 0
    """Offsets reported missing although delivered, at the end (any is a broken promise)."""
    false_gaps_seen: int = 0
    """Most such offsets seen in any intermediate verdict (diagnostic)."""
    duplicates: int = 0
    """Records in the clean topic more than once, at the end."""
    foreign_in_clean: int = 0
    """Clean-topic records that match no upstream record (bad data), at the end."""
    missing_silent: int = 0
    """Records neither delivered nor in a gap, at the end."""
    resend_passes: int = 0
    final_delivered: int = 0
    final_open_gaps: int = 0
    promise_kept: bool = False
    ok: bool = False
    seconds: float = 0.0
    relay: dict[str, float] = field(default_factory=dict)
    integrity_drops: dict[str, float] = field(default_factory=dict)
    fec: dict[str, float] = field(default_factory=dict)
    """Receiver FEC counters (blocks_complete, blocks_recovered, ...), at the end."""
    events: list[str] = field(default_factory=list)
    """What a cluster fault did, in order (which node, why it was chosen)."""
    error: str = ""


def scrape(port: int | None) -> dict[str, float]:
    """One Prometheus endpoint as ``{"name{label=value}": value}`` ({} if unreachable)."""
    if not port:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def _labelled(metrics: dict[str, float], name: str, label: str) -> dict[str, float]:
    prefix = f"{name}{{{label}="
    return {k[len(prefix) : -1]: v for k, v in metrics.items() if k.startswith(prefix)}


def end_offsets(bootstrap: str, topics: list[str]) -> int:
    """Sum of the high watermarks of every partition of ``topics`` (a progress indicator)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-diode-chaos-probe"})
    try:
        total = 0
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            for partition in meta.partitions:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                total += high
        return total
    finally:
        consumer.close()


def clean_record_count(p: Pipeline) -> int:
    """Committed records in every clean topic of the run."""
    names = {clean_topic_for(p.ep.clean_template, t) for t in p.ep.source_topics}
    return sum(len(read_topic(p.ep.downstream, n, committed_only=True)) for n in names)


class Run:
    """One scenario against the session brokers; ``execute()`` never raises, it records."""

    def __init__(
        self,
        scenario: Scenario,
        work_dir: Path,
        *,
        upstream: LocalBroker | LocalCluster,
        downstream: LocalBroker | LocalCluster,
        quiet: float = 8.0,
        quiet_broken: float = 45.0,
        settle_timeout: float = 240.0,
    ) -> None:
        self.sc = scenario
        self.upstream = upstream
        self.downstream = downstream
        self.quiet = quiet
        self.quiet_broken = quiet_broken
        self.settle_timeout = settle_timeout
        self.pipeline = Pipeline(
            scenario.spec(),
            work_dir,
            upstream=upstream.bootstrap,
            downstream=downstream.bootstrap,
        )
        self.outcome = Outcome(
            scenario=scenario.name,
            profile=scenario.profile,
            fault=scenario.fault or scenario.cluster_fault,
            seed=scenario.seed,
        )
        self.final: Verdict | None = None
        self.first: Verdict | None = None
        self.fault_happened = threading.Event()
        """Set by a cluster fault right after its first kill or stop: the producer holds the
        workload's second half (from ``hold_at``) back until then."""
        self.hold_at = scenario.records // 2

    # -- the run ----------------------------------------------------------------------------

    def execute(self) -> Outcome:
        """Run the scenario; any exception is recorded in ``outcome.error``."""
        t0 = time.monotonic()
        p = self.pipeline
        try:
            p.setup()
            p.start_components(receiver_first=self.sc.receiver_first)
            self._produce_and_fault()
            self.first = self.settle()
            verdict = self.first
            while (
                not verdict.ok
                and verdict.promise_kept
                and self.outcome.resend_passes < MAX_RESEND_PASSES
            ):
                self.outcome.resend_passes += 1
                p.resend_pass(copies=self.sc.resend_copies)
                verdict = self.settle()
            self.final = verdict
            self._record_metrics()
            self.outcome.foreign_in_clean = max(0, clean_record_count(p) - self._clean_expected())
        except Exception as exc:  # recorded; the test asserts with logs
            self.outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.outcome.seconds = round(time.monotonic() - t0, 1)
            self._fill_outcome()
            p.stop()
        return self.outcome

    def _produce_and_fault(self) -> None:
        p = self.pipeline
        if self.sc.fault is None and self.sc.cluster_fault is None and not self.sc.produce_seconds:
            p.produce()
            return
        failure: list[BaseException] = []

        def hold(seq: int) -> None:
            if seq != self.hold_at:
                return
            if not self.fault_happened.wait(self.settle_timeout):
                raise TimeoutError(f"the fault did not happen within {self.settle_timeout:.0f} s")
            self.outcome.events.append(f"records {seq}-{self.sc.records - 1} produced after it")

        gate = hold if self.sc.cluster_fault is not None else None

        def produce() -> None:
            try:
                p.produce(gate=gate)
            except BaseException as exc:  # re-raised on the test's thread
                failure.append(exc)

        producer = threading.Thread(target=produce, name="chaos-producer", daemon=True)
        producer.start()
        try:
            if self.sc.fault is not None:
                self._inject(self.sc.fault)
            if self.sc.cluster_fault is not None:
                from tests.chaos.failover import inject  # noqa: PLC0415

                inject(self, self.sc.cluster_fault)
        finally:
            self.fault_happened.set()  # a failed injection must not leave the producer held
            producer.join(timeout=self.settle_timeout)
        if producer.is_alive():
            raise TimeoutError("the producer did not finish")
        if failure:
            raise failure[0]

    def _inject(self, fault: str) -> None:
        p = self.pipeline
        raw = [p.ep.raw_topic]
        third = self.sc.records // 3
        alive = list(p.group.processes.values())
        if fault == "dedup-sigkill":
            # Kill right after the first clean output: the batch is written, its checkpoint may not
            # be, so the restart replays it; the fence must keep the clean topic free of copies.
            clean = sorted({clean_topic_for(p.ep.clean_template, t) for t in p.ep.source_topics})
            wait_until(
                lambda: end_offsets(p.ep.downstream, clean) > 0,
                timeout=self.settle_timeout,
                interval=0.2,
                what="first clean output of the dedup",
                alive=alive,
            )
            p.restart("dedup", crash=True)
            return
        wait_until(
            lambda: end_offsets(p.ep.downstream, raw) >= third,
            timeout=self.settle_timeout,
            interval=0.2,
            what=f"{third} records in the raw topic",
            alive=alive,
        )
        if fault == "receiver-sigkill":
            p.restart("receiver", crash=True)
        elif fault == "sender-sigkill":
            p.restart("sender", crash=True)
        elif fault == "downstream-broker-restart":
            assert isinstance(self.downstream, LocalBroker)
            self.downstream.stop()
            self.downstream.start()
        else:
            raise ValueError(f"unknown fault {fault!r}; use one of {FAULTS}")

    def settle(self) -> Verdict:
        """Wait until ok, or every record accounted for and nothing changing for ``quiet`` s."""
        p = self.pipeline
        deadline = time.monotonic() + self.settle_timeout
        last_change = time.monotonic()
        last_key: tuple[int, ...] | None = None
        verdict = Verdict()
        while True:
            verdict = p.verdict()
            self.outcome.false_gaps_seen = max(
                self.outcome.false_gaps_seen, verdict.false_gap_offsets
            )
            # Not the raw topic's end: heartbeats keep it growing while the sender runs.
            key = (
                verdict.exactly_once,
                verdict.missing_silent,
                verdict.duplicated,
                verdict.missing_reported,
                verdict.open_gaps,
            )
            now = time.monotonic()
            if key != last_key:
                last_key, last_change = key, now
            # upstream may hold more than was acknowledged: a producer's retry can write a record
            # twice (kafka_diode.verify.sort_records), never less
            if verdict.ok and verdict.produced >= p.produced:
                return verdict
            accounted = verdict.exactly_once + verdict.missing_reported
            quiet = self._quiet()
            if (
                verdict.promise_kept
                and accounted >= verdict.produced >= p.produced > 0
                and now - last_change >= quiet
            ):
                return verdict
            # A broken promise that stays put for longer than a Spark restart will not heal: stop
            # waiting (the test fails with the details) instead of running into the deadline.
            # A dedup process that has not finished a batch yet (Spark starting after a kill, on
            # a loaded host ~90 s) can still heal it: wait for its first batch, then judge.
            if (
                now - last_change >= max(self.quiet_broken, quiet)
                and verdict.exactly_once > 0
                and self._dedup_has_run()
            ):
                return verdict
            if now > deadline:
                return verdict
            self._check_alive()
            time.sleep(1.0)  # poll interval of a condition with a deadline, not synchronisation

    def _quiet(self) -> float:
        """How long "nothing changed" must last: ``quiet``, or 4 of the dedup's last micro-batch
        durations on a loaded machine (a gap needs two scans, a fill one batch, to show)."""
        metrics = scrape(self.pipeline.ep.metrics.get("dedup"))
        batch = metrics.get("kafka_diode_dedup_batch_duration_seconds", 0.0)
        return max(self.quiet, 4 * batch)

    def _dedup_has_run(self) -> bool:
        """The running dedup process committed or skipped a micro-batch (its counters start at
        0 with each process); True without a dedup (nothing to wait for)."""
        endpoint = self.pipeline.ep.metrics.get("dedup")
        if endpoint is None:
            return True
        metrics = scrape(endpoint)
        return (
            metrics.get("kafka_diode_dedup_batches_total", 0.0)
            + metrics.get("kafka_diode_dedup_batches_skipped_total", 0.0)
        ) > 0

    def _check_alive(self) -> None:
        for proc in self.pipeline.group.processes.values():
            if proc.proc is not None and not proc.running:
                raise RuntimeError(f"{proc.name} exited with {proc.returncode}")

    # -- figures ----------------------------------------------------------------------------

    def _clean_expected(self) -> int:
        v = self.final
        if v is None:
            return 0
        # Every clean record must be an upstream record: delivered once, or one of the copies of a
        # duplicated one (counted here as two, the least a duplicate can be).
        return v.exactly_once + v.wrong_partition + 2 * v.duplicated

    def _record_metrics(self) -> None:
        p = self.pipeline
        relay = scrape(p.ep.metrics.get("relay"))
        self.outcome.relay = _labelled(relay, "kafka_diode_netem_datagrams_total", "event")
        receiver = scrape(p.ep.metrics.get("receiver"))
        drops = _labelled(receiver, "kafka_diode_receiver_drops_total", "reason")
        self.outcome.integrity_drops = {k: v for k, v in drops.items() if k in INTEGRITY_DROPS}
        prefix = "kafka_diode_receiver_fec_"
        self.outcome.fec = {
            k[len(prefix) : -len("_total")]: v
            for k, v in receiver.items()
            if k.startswith(prefix) and k.endswith("_total")
        }

    def _fill_outcome(self) -> None:
        o = self.outcome
        if self.first is not None:
            o.records = self.first.produced
            o.delivered = self.first.exactly_once
            o.gaps_reported = self.first.open_gaps
            o.missing_reported = self.first.missing_reported
        v = self.final
        if v is not None:
            o.records = v.produced
            o.false_gaps = v.false_gap_offsets
            o.duplicates = v.duplicated
            o.missing_silent = v.missing_silent
            o.final_delivered = v.exactly_once
            o.final_open_gaps = v.open_gaps
            o.promise_kept = v.promise_kept and o.foreign_in_clean == 0
            o.ok = v.ok and o.foreign_in_clean == 0

    def explain(self) -> str:
        """Everything a red run needs to explain itself: verdicts, examples, log tails."""
        parts = [
            f"scenario {self.sc.name} (seed {self.sc.seed}): {json.dumps(asdict(self.outcome))}"
        ]
        for label, v in (("first", self.first), ("final", self.final)):
            if v is not None:
                parts.append(f"{label} verdict: {v.line()}")
                parts.extend(f"  {example}" for example in v.examples)
        log_dir = self.pipeline.group.log_dir
        for path in sorted(log_dir.glob("*.log")):
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            parts.append(f"--- {path.name} (last {len(lines)} lines) ---")
            parts.extend(lines)
        return "\n".join(parts)


def append_result(path: Path, outcome: Outcome) -> None:
    """Append the outcome as one JSON line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(outcome), sort_keys=True) + "\n")


def check(run: Run, outcome: Outcome, *, fail: Callable[[str], Any]) -> None:
    """Assert the promise and the scenario's extras; ``fail`` gets the full explanation."""
    problems = []
    if outcome.error:
        problems.append(outcome.error)
    if not outcome.promise_kept:
        problems.append("promise broken (silent loss, duplicate, misplaced, false gap or bad data)")
    if not outcome.ok:
        problems.append(f"not every record delivered after {outcome.resend_passes} resend passes")
    if run.sc.check_integrity_drops:
        corrupted = outcome.relay.get("corrupted", 0.0)
        dropped = sum(outcome.integrity_drops.values())
        if corrupted <= 0:
            problems.append("the relay corrupted nothing: the scenario did not test corruption")
        if outcome.integrity_drops.get("auth_failed", 0.0) <= 0:
            problems.append("no authentication drops in the receiver's metrics")
        if dropped > corrupted:
            problems.append(f"{dropped} integrity drops but only {corrupted} corrupted datagrams")
    if problems:
        fail("; ".join(problems) + "\n" + run.explain())
