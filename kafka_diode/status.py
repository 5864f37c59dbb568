"""``kafka-diode status``: the low side at a glance, and whether a person is needed.

What it reads (all on the low side, nothing is written):

- the **raw topic's tail** (the last ``--scan-records`` raw records of each partition): per source
  (topic, partition) the latest sender heartbeat (the offset the sender vouches it has sent, and
  how long ago the receiver wrote it, by the raw record's timestamp: the receiver's clock, never
  the high side's), and the highest source offset received;
- the **gap topic** (from its beginning, ``read_committed``, as ``kafka-diode gaps`` does): open
  gaps and the records in them, which is exactly what ``kafka-diode bundle create`` would carry
  now;
- the **receiver's metrics** (one or more ``/metrics`` endpoints, one per worker): datagrams per
  second and drops by reason over ``--rate-window`` seconds (two scrapes);
- the **dedup's metrics**: raw records written but not yet read (``raw_offsets_behind``: how far
  the clean topics are behind the raw topic), its open-gap gauge, and where it reads each raw
  partition next (``raw_next_offset``). Raw records below that offset belong to micro-batches it
  has committed: their source records are in the clean topic (or were duplicates, or lie in
  reported gaps). So per source (topic, partition) the highest source offset among them is how far
  the **clean topic** has come (``clean``), and the sender's vouched offset minus it is how far the
  clean topic is behind what the sender vouched for (``clean_behind``). When the dedup reads
  further back than the raw tail, a second window of ``--scan-records`` raw records ending at its
  next offset is read for this (the part of it the tail does not hold).

A person is needed (exit code 1, each reason one line) when a gap is open (a resend is due), a
source partition's last heartbeat is older than ``--silent-after`` seconds (link or sender down),
the sender vouched for records the raw topic does not have and no gap covers them yet (in flight,
or about to become a gap), the dedup is more than ``--max-backlog`` raw records behind, a source
partition's clean topic is more than ``--max-clean-lag`` records behind what the sender vouched for
(records of open gaps not counted: they have their own line), a
receiver dropped datagrams for a reason other than the harmless ones (copies, replays) during the
window, or an endpoint does not answer. Exit 0: nothing to do. 2: a configuration error.
3: Kafka cannot be read. ``--watch`` redraws every ``--interval`` seconds until Ctrl+C and exits
with the last round's code.

The judgement (:func:`assess`) is pure; reading is in :func:`gather`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from common import settings
from common.errors import ConfigError, DiodeError, ServiceError
from common.gap_record import latest_gaps
from common.raw_run import parse_run_key
from common.raw_topic import CONTROL_HEADER, HEARTBEAT, parse_raw_key
from dedup.config import check_environment
from runtime.named_files import check_files, table_variable

EXIT_OK = 0
EXIT_ATTENTION = 1
EXIT_CONFIG = 2
EXIT_UNREADABLE = 3
#: Drop reasons that are normal operation (redundant copies, replays of them).
HARMLESS_DROPS = frozenset({"duplicate", "replayed"})
_RECEIVER = "kafka_diode_receiver"
_DEDUP = "kafka_diode_dedup"


@dataclass(frozen=True, kw_only=True)
class StatusConfig:
    """What ``kafka-diode status`` reads and its thresholds."""

    bootstrap_servers: str
    """Downstream Kafka (BOOTSTRAP_SERVERS)."""
    raw_topics: tuple[str, ...] = ("diode.raw",)
    """Raw topic(s) (RAW_TOPICS, comma-separated)."""
    gap_topic: str = "kafka-diode.gaps"
    """Gap topic (GAP_TOPIC)."""
    receiver_metrics: tuple[str, ...] = ()
    """host:port of each receiver /metrics endpoint (one per worker)."""
    dedup_metrics: str | None = None
    """host:port of the dedup's /metrics endpoint."""
    kafka_conf: Mapping[str, str] = field(default_factory=dict, repr=False)
    """librdkafka properties (KAFKA_CONF_<NAME>, the dedup's env), e.g. security."""
    silent_after: float = 30.0
    """Seconds without a heartbeat of a source partition before it needs a person."""
    max_backlog: int = 100_000
    """Raw records the dedup may be behind before it needs a person."""
    max_clean_lag: int = 100_000
    """Records a source partition's clean topic may be behind what the sender vouched for (open
    gaps not counted) before it needs a person; needs dedup_metrics."""
    scan_records: int = 5000
    """Raw records read from the end of each raw partition to find the latest heartbeats."""
    rate_window: float = 2.0
    """Seconds between the two scrapes that give datagrams/s and drops (one-shot mode)."""
    timeout: float = 30.0
    """Seconds to read each topic."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("--bootstrap-servers", "is empty", "give BOOTSTRAP_SERVERS")
        if not self.raw_topics or not all(self.raw_topics):
            raise ConfigError("--raw-topics", "names no raw topic", "e.g. diode.raw")
        checks = (
            ("--silent-after", self.silent_after > 0),
            ("--max-backlog", self.max_backlog >= 0),
            ("--max-clean-lag", self.max_clean_lag >= 0),
            ("--scan-records", 1 <= self.scan_records <= 10_000_000),
            ("--rate-window", 0 < self.rate_window <= 300),
            ("--timeout", self.timeout > 0),
        )
        for key, ok in checks:
            if not ok:
                raise ConfigError(
                    key, f"{getattr(self, key[2:].replace('-', '_'))} is out of range"
                )
        endpoints = [*self.receiver_metrics]
        if self.dedup_metrics is not None:
            endpoints.append(self.dedup_metrics)
        for endpoint in endpoints:
            if not _is_endpoint(endpoint):
                raise ConfigError(
                    "--receiver-metrics/--dedup-metrics", f"{endpoint!r}", "host:port"
                )


def _is_endpoint(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


@dataclass
class SourceStatus:
    """One source (topic, partition) as the low side sees it."""

    topic: str
    partition: int
    vouched: int | None = None
    """The latest heartbeat's high offset (the sender has sent up to here)."""
    heartbeat_age: float | None = None
    """Seconds since the receiver wrote that heartbeat."""
    received: int | None = None
    """Highest source offset in the scanned raw tail."""
    clean: int | None = None
    """Highest source offset the dedup has carried to the clean topic (module docstring)."""
    open_gaps: int = 0
    gap_records: int = 0

    @property
    def clean_behind(self) -> int | None:
        """Records the sender vouched for that the clean topic does not hold yet (offsets from
        ``clean`` to ``vouched``, open gaps among them included); None when either is unknown."""
        if self.vouched is None or self.clean is None:
            return None
        return max(0, self.vouched - self.clean)


@dataclass
class Observation:
    """Everything :func:`gather` read, input to :func:`assess`."""

    sources: dict[tuple[str, int], SourceStatus] = field(default_factory=dict)
    gap_ranges: list[tuple[str, int, int, int]] = field(default_factory=list)
    receiver: dict[str, float] = field(default_factory=dict)
    """datagrams_per_s, records_per_s and drops_<reason> over the window, summed over workers."""
    dedup_backlog: float | None = None
    dedup_gaps_open: float | None = None
    dedup_next: dict[tuple[str, int], int] = field(default_factory=dict)
    """Raw (topic, partition) -> the offset the dedup reads next (its ``raw_next_offset``)."""
    unreachable: list[str] = field(default_factory=list)


@dataclass
class Report:
    """The assessment: what :func:`render` prints, ``problems`` decide the exit code."""

    observation: Observation
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_ATTENTION if self.problems else EXIT_OK


def assess(obs: Observation, config: StatusConfig) -> Report:
    """Judge ``obs`` (pure): which conditions need a person."""
    report = Report(observation=obs)
    say = report.problems.append
    gaps = [s for s in obs.sources.values() if s.open_gaps]
    if gaps:
        records = sum(s.gap_records for s in gaps)
        say(
            f"{sum(s.open_gaps for s in gaps)} open gap(s), {records} record(s) missing in "
            f"{len(gaps)} partition(s): carry a bundle up (kafka-diode bundle create)"
        )
    for s in sorted(obs.sources.values(), key=lambda s: (s.topic, s.partition)):
        name = f"{s.topic}[{s.partition}]"
        if s.heartbeat_age is None:
            say(f"{name}: no heartbeat in the last {config.scan_records} raw records per partition")
        elif s.heartbeat_age > config.silent_after:
            say(f"{name}: last heartbeat {s.heartbeat_age:.0f} s ago: link or sender silent")
        if s.vouched is not None and (s.received is None or s.received < s.vouched):
            missing = s.vouched - (s.received if s.received is not None else -1)
            if missing > s.gap_records:
                say(
                    f"{name}: the sender vouched for offset {s.vouched} but the raw topic ends "
                    f"at {s.received}: {missing - s.gap_records} record(s) in flight or lost, "
                    "not yet in a gap"
                )
    for s in sorted(obs.sources.values(), key=lambda s: (s.topic, s.partition)):
        behind = s.clean_behind
        if behind is not None and behind - s.gap_records > config.max_clean_lag:
            say(
                f"{s.topic}[{s.partition}]: the clean topic is {behind - s.gap_records} record(s)"
                f" behind what the sender vouched for (offset {s.vouched}, clean up to "
                f"{s.clean}; more than {config.max_clean_lag}): the dedup falls behind"
            )
    if obs.dedup_backlog is not None and obs.dedup_backlog > config.max_backlog:
        say(f"dedup is {obs.dedup_backlog:.0f} raw records behind (more than {config.max_backlog})")
    bad = {
        k[len("drops_") :]: v
        for k, v in obs.receiver.items()
        if k.startswith("drops_") and v > 0 and k[len("drops_") :] not in HARMLESS_DROPS
    }
    if bad:
        listed = ", ".join(f"{k} {v:.0f}" for k, v in sorted(bad.items()))
        say(f"receiver dropped datagrams in the last window: {listed} (docs/operations.md)")
    for endpoint in obs.unreachable:
        say(f"{endpoint} does not answer")
    return report


# -- reading ---------------------------------------------------------------------------------


def scrape(endpoint: str, timeout: float = 5.0) -> dict[str, float] | None:
    """``{"name{label=value}": value}`` from ``http://endpoint/metrics``; None if it is down."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    try:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _receiver_totals(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    prefix = f"{_RECEIVER}_drops_total{{reason="
    for metrics in samples:
        for key, value in metrics.items():
            if key in (f"{_RECEIVER}_datagrams_total", f"{_RECEIVER}_records_total"):
                name = key[len(_RECEIVER) + 1 : -len("_total")]
                totals[name] = totals.get(name, 0.0) + value
            elif key.startswith(prefix):
                name = "drops_" + key[len(prefix) : -1]
                totals[name] = totals.get(name, 0.0) + value
    return totals


def receiver_rates(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """Per-second datagrams and records, and drops by reason, between two summed scrapes."""
    out: dict[str, float] = {}
    for name, value in after.items():
        delta = max(0.0, value - before.get(name, 0.0))
        if name.startswith("drops_"):
            out[name] = delta
        else:
            out[f"{name}_per_s"] = delta / seconds if seconds > 0 else 0.0
    return out


def dedup_next_offsets(metrics: Mapping[str, float]) -> dict[tuple[str, int], int]:
    """Raw (topic, partition) -> ``raw_next_offset`` from a scrape of the dedup (:func:`scrape`
    keys: ``name{partition=P,topic=T}``)."""
    prefix = f"{_DEDUP}_raw_next_offset{{"
    out: dict[tuple[str, int], int] = {}
    for key, value in metrics.items():
        if not key.startswith(prefix):
            continue
        labels = dict(part.split("=", 1) for part in key[len(prefix) : -1].split(","))
        if "topic" in labels and labels.get("partition", "").isdigit():
            out[(labels["topic"], int(labels["partition"]))] = int(value)
    return out


def _read_raw_tail(config: StatusConfig, obs: Observation, now_ms: float) -> None:
    """The last ``scan_records`` of each raw partition; and the ``scan_records`` before the
    dedup's next offset, where the tail does not hold them (for ``clean`` only).

    Raises:
        KafkaClientError: the brokers cannot be read (refused credentials, none answering).
    """
    from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

    from runtime import kafka  # noqa: PLC0415

    conf = {
        "bootstrap.servers": config.bootstrap_servers,
        "group.id": "kafka-diode-status",  # never committed
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        **config.kafka_conf,
    }
    consumer = kafka.consumer(conf)
    scan = config.scan_records
    try:
        tail: dict[tuple[str, int], tuple[int, int]] = {}
        head: dict[tuple[str, int], tuple[int, int]] = {}
        for topic in config.raw_topics:
            meta = consumer.list_topics(topic, timeout=config.timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                raise ServiceError(f"raw topic {topic!r} cannot be read")
            for p in sorted(meta.partitions):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=config.timeout
                )
                if high <= low:
                    continue
                start = max(low, high - scan)
                tail[(topic, p)] = (start, high)
                nxt = obs.dedup_next.get((topic, p))
                # the window before nxt, less what the tail holds: a tail starting just below
                # nxt (at a heartbeat, say) would otherwise be all of it
                if nxt is not None and max(low, nxt - scan) < min(nxt, start):
                    head[(topic, p)] = (max(low, nxt - scan), min(nxt, start))
        _read_ranges(consumer, config, tail, lambda msg: _observe_raw(obs, msg, now_ms))
        _read_ranges(consumer, config, head, lambda msg: _observe_raw(obs, msg, now_ms, tail=False))
    except KafkaException as exc:  # refused credentials, no broker: "Kafka cannot be read"
        raise kafka.error(exc, "reading the raw topic") from exc
    finally:
        consumer.close()


def _read_ranges(
    consumer: Any,
    config: StatusConfig,
    ranges: Mapping[tuple[str, int], tuple[int, int]],
    observe: Any,
) -> None:
    """Hand ``observe`` every record of each raw partition's ``[start, end)``, in order."""
    from confluent_kafka import KafkaError, TopicPartition  # noqa: PLC0415

    from runtime import kafka  # noqa: PLC0415

    if not ranges:
        return
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in ranges.items()])
    pending = set(ranges)
    deadline = time.monotonic() + config.timeout
    while pending and time.monotonic() < deadline:
        for msg in consumer.consume(5000, 0.5):
            tp = (msg.topic(), msg.partition())
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(tp)
                    continue
                raise kafka.error(err, "reading the raw topic")
            if tp not in pending:
                continue
            end = ranges[tp][1]
            if msg.offset() < end:
                observe(msg)
            if msg.offset() >= end - 1:
                pending.discard(tp)
    consumer.unassign()


def _observe_raw(obs: Observation, msg: Any, now_ms: float, *, tail: bool = True) -> None:
    """Fold one raw record (a run, a v1 record, or a control record) into ``obs``; ``tail``
    False: a record from before the raw tail, read only for ``clean``."""
    key = msg.key()
    control = next((v for k, v in msg.headers() or [] if k == CONTROL_HEADER), None)
    if control == HEARTBEAT and tail:
        parsed = parse_raw_key(key)
        if parsed is None:
            return
        topic, partition, high = parsed
        s = obs.sources.setdefault((topic, partition), SourceStatus(topic, partition))
        if s.vouched is None or high >= s.vouched:
            s.vouched = high
            s.heartbeat_age = max(0.0, (now_ms - msg.timestamp()[1]) / 1000)
        return
    if control is not None:
        return  # withheld ranges, resets
    run = parse_run_key(key)
    if run is not None:
        topic, partition, _first, last, _stride = run
    else:
        single = parse_raw_key(key)
        if single is None:
            return
        topic, partition, last = single
    s = obs.sources.setdefault((topic, partition), SourceStatus(topic, partition))
    if tail:
        s.received = last if s.received is None else max(s.received, last)
    nxt = obs.dedup_next.get((msg.topic(), msg.partition()))
    if nxt is not None and msg.offset() < nxt:
        s.clean = last if s.clean is None else max(s.clean, last)


def gather(config: StatusConfig, *, previous: dict[str, float] | None = None) -> Observation:
    """Read topics and endpoints (module docstring). ``previous``: the receiver totals of the
    last ``--watch`` round (then no second scrape is needed); updated in place.

    Raises:
        ServiceError: a topic cannot be read (KafkaClientError among them).
    """
    from runtime import kafka  # noqa: PLC0415

    obs = Observation()
    first: list[dict[str, float]] = []
    for endpoint in config.receiver_metrics:
        got = scrape(endpoint)
        if got is None:
            obs.unreachable.append(f"receiver metrics {endpoint}")
        else:
            first.append(got)
    began = time.monotonic()
    if config.dedup_metrics is not None:
        dedup = scrape(config.dedup_metrics)
        if dedup is None:
            obs.unreachable.append(f"dedup metrics {config.dedup_metrics}")
        else:
            obs.dedup_backlog = sum(
                v for k, v in dedup.items() if k.startswith(f"{_DEDUP}_raw_offsets_behind")
            )
            obs.dedup_gaps_open = dedup.get(f"{_DEDUP}_gaps_open")
            obs.dedup_next = dedup_next_offsets(dedup)
    _read_raw_tail(config, obs, time.time() * 1000)
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_conf}
    scan = latest_gaps(
        kafka.read_to_end(conf, config.gap_topic, timeout=config.timeout, purpose="status")
    )
    for topic, partition, low, high in scan.open_gaps:
        s = obs.sources.setdefault((topic, partition), SourceStatus(topic, partition))
        s.open_gaps += 1
        s.gap_records += high - low + 1
        obs.gap_ranges.append((topic, partition, low, high))
    if first:
        before = _receiver_totals(first)
        if previous is None:
            wait = config.rate_window - (time.monotonic() - began)
            if wait > 0:
                time.sleep(wait)  # the measurement window of a rate, not a synchronisation
        else:
            before = dict(previous) or before
        t0 = began if previous is None else previous.get("_at", began)
        second = [m for m in (scrape(e) for e in config.receiver_metrics) if m is not None]
        after = _receiver_totals(second)
        now = time.monotonic()
        obs.receiver = receiver_rates(before, after, now - t0)
        if previous is not None:
            previous.clear()
            previous.update(after)
            previous["_at"] = now
    return obs


# -- output ----------------------------------------------------------------------------------


def render(report: Report) -> str:
    """The human view: sources table, link, dedup, bundle, and what needs a person."""
    obs = report.observation
    rows = [
        (
            "SOURCE",
            "PARTITION",
            "VOUCHED",
            "HEARTBEAT AGE",
            "RECEIVED",
            "CLEAN",
            "CLEAN BEHIND",
            "GAPS",
            "MISSING",
        )
    ]
    for s in sorted(obs.sources.values(), key=lambda s: (s.topic, s.partition)):
        rows.append(
            (
                s.topic,
                str(s.partition),
                "-" if s.vouched is None else str(s.vouched),
                "-" if s.heartbeat_age is None else f"{s.heartbeat_age:.1f} s",
                "-" if s.received is None else str(s.received),
                "-" if s.clean is None else str(s.clean),
                "-" if s.clean_behind is None else str(s.clean_behind),
                str(s.open_gaps),
                str(s.gap_records),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if len(rows) == 1:
        lines.append("(no source partition seen in the raw topic's tail or the gap topic)")
    r = obs.receiver
    if r:
        drops = {k[6:]: v for k, v in r.items() if k.startswith("drops_") and v}
        lines.append(
            f"link: {r.get('datagrams_per_s', 0):.0f} datagrams/s, "
            f"{r.get('records_per_s', 0):.0f} records/s; drops: "
            + (", ".join(f"{k} {v:.0f}" for k, v in sorted(drops.items())) or "none")
        )
    if obs.dedup_backlog is not None:
        lines.append(f"dedup: {obs.dedup_backlog:.0f} raw records not yet read")
    records = sum(hi - lo + 1 for _, _, lo, hi in obs.gap_ranges)
    lines.append(f"a bundle now would carry {len(obs.gap_ranges)} range(s), {records} record(s)")
    if report.problems:
        lines.append("NEEDS A PERSON:")
        lines += [f"  - {p}" for p in report.problems]
    else:
        lines.append("OK: nothing to do")
    return "\n".join(lines)


def as_json(report: Report) -> str:
    """The machine view."""
    obs = report.observation
    return json.dumps(
        {
            "sources": [
                {**asdict(s), "clean_behind": s.clean_behind} for s in obs.sources.values()
            ],
            "gaps": [list(g) for g in obs.gap_ranges],
            "receiver": obs.receiver,
            "dedup_backlog": obs.dedup_backlog,
            "problems": report.problems,
            "exit_code": report.exit_code,
        },
        sort_keys=True,
    )


# -- command ---------------------------------------------------------------------------------


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "The low side at a glance: per source partition the last heartbeat and its age, "
            "what the sender vouched for against what the raw topic holds and how far the "
            "clean topic is behind it, open gaps and their "
            "records; the link's datagrams/s and drops; the dedup's backlog; what a bundle "
            "would carry now. Exit 0: nothing to do; 1: a person is needed (each reason "
            "printed); 2: configuration error; 3: Kafka cannot be read."
        ),
        epilog=(
            "environment (the dedup's): BOOTSTRAP_SERVERS, RAW_TOPICS, GAP_TOPIC, "
            "KAFKA_CONF_<NAME> (librdkafka properties, e.g. security); flags win"
        ),
    )
    parser.add_argument("--bootstrap-servers", help="downstream Kafka (BOOTSTRAP_SERVERS)")
    settings.add_list_argument(parser, "--raw-topics", help="raw topic(s) (RAW_TOPICS)")
    parser.add_argument("--gap-topic", help="gap topic (GAP_TOPIC; default kafka-diode.gaps)")
    settings.add_list_argument(
        parser,
        "--receiver-metrics",
        help="host:port of a receiver's /metrics (one per worker)",
    )
    parser.add_argument("--dedup-metrics", help="host:port of the dedup's /metrics")
    parser.add_argument(
        "--silent-after", type=float, default=30.0, help="heartbeat age that needs a person (30 s)"
    )
    parser.add_argument(
        "--max-backlog", type=int, default=100_000, help="dedup backlog that needs a person"
    )
    parser.add_argument(
        "--max-clean-lag",
        type=int,
        default=100_000,
        help="records a source partition's clean topic may be behind what the sender vouched "
        "for (open gaps not counted) before a person is needed (needs --dedup-metrics)",
    )
    parser.add_argument(
        "--scan-records", type=int, default=5000, help="raw records read per partition's end"
    )
    parser.add_argument(
        "--rate-window", type=float, default=2.0, help="seconds between the two scrapes (2)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to read a topic")
    parser.add_argument("--json", action="store_true", help="one JSON object per round")
    parser.add_argument("--watch", action="store_true", help="redraw until Ctrl+C")
    parser.add_argument(
        "--interval", type=float, default=5.0, help="seconds between --watch rounds (5)"
    )
    return parser


def config_from(args: argparse.Namespace, env: Mapping[str, str]) -> StatusConfig:
    """Flags over the dedup's environment names.

    Raises:
        ConfigError: naming the key.
    """
    check_environment(env)
    raw_topics = (
        tuple(args.raw_topics)
        if args.raw_topics is not None
        else tuple(t.strip() for t in env.get("RAW_TOPICS", "diode.raw").split(",") if t.strip())
    )
    kafka_conf = {
        k[len("KAFKA_CONF_") :].lower().replace("_", "."): v
        for k, v in env.items()
        if k.startswith("KAFKA_CONF_") and len(k) > len("KAFKA_CONF_")
    }
    return StatusConfig(
        bootstrap_servers=args.bootstrap_servers or env.get("BOOTSTRAP_SERVERS", ""),
        raw_topics=raw_topics,
        gap_topic=args.gap_topic or env.get("GAP_TOPIC") or "kafka-diode.gaps",
        receiver_metrics=tuple(args.receiver_metrics or ()),
        dedup_metrics=args.dedup_metrics,
        kafka_conf=kafka_conf,
        silent_after=args.silent_after,
        max_backlog=args.max_backlog,
        max_clean_lag=args.max_clean_lag,
        scan_records=args.scan_records,
        rate_window=args.rate_window,
        timeout=args.timeout,
    )


def main(argv: Sequence[str], prog: str = "kafka-diode status") -> int:
    """Run ``kafka-diode status``; returns the exit code."""
    args = _parser(prog).parse_args(list(argv))
    try:
        config = config_from(args, os.environ)
        check_files(config, key=table_variable({"kafka_conf": "KAFKA_CONF_"}))
        if args.interval <= 0:
            raise ConfigError("--interval", "must be positive", "e.g. 5")
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    previous: dict[str, float] | None = {} if args.watch else None
    code = EXIT_OK
    try:
        while True:
            try:
                report = assess(gather(config, previous=previous), config)
            except DiodeError as exc:
                print(f"{prog}: cannot read Kafka: {exc}", file=sys.stderr)
                code = EXIT_UNREADABLE
            else:
                code = report.exit_code
                text = as_json(report) if args.json else render(report)
                if args.watch and not args.json:
                    text = f"\033[2J\033[H{time.strftime('%H:%M:%S')}  {prog}\n{text}"
                print(text, flush=True)
            if not args.watch:
                return code
            time.sleep(args.interval)  # the refresh period of a display, not a synchronisation
    except KeyboardInterrupt:
        return code
