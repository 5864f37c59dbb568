"""The sender's Prometheus metrics (names ``kafka_diode_sender_*``, docs/sender.md).

One ``SenderMetrics`` per process (or per test) with its own registry. The hot path never touches
a Prometheus object per record: the application keeps plain integer counters and ``sync`` copies
them into the registry a few times per second.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.metrics import CollectorRegistry, Counter, Gauge

_PREFIX = "kafka_diode_sender"
#: Error kinds every sender can count (docs/operations.md, sender metrics).
ERROR_KINDS = ("broker", "consume", "commit", "bad_record", "record_too_large", "keyring_reload")
#: Verdicts of the content filter that withhold a record (sender/record_filter.py LABELS).
WITHHELD_VERDICTS = ("deny_rule", "deny_default", "error")


class SenderMetrics:
    """Counters and gauges of one sender."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.records_read = Counter(
            f"{_PREFIX}_records_read", "Records read from Kafka", registry=r
        )
        self.bytes_read = Counter(
            f"{_PREFIX}_bytes_read", "Key + value bytes read from Kafka", registry=r
        )
        self.records_sent = Counter(
            f"{_PREFIX}_records_sent",
            "Records whose datagrams were all handed to the socket",
            registry=r,
        )
        self.bytes_sent = Counter(
            f"{_PREFIX}_bytes_sent",
            "UDP payload bytes handed to the socket (every copy)",
            registry=r,
        )
        self.datagrams_sent = Counter(
            f"{_PREFIX}_datagrams_sent", "Datagrams handed to the socket (every copy)", registry=r
        )
        self.send_calls = Counter(
            f"{_PREFIX}_send_calls",
            "System calls that handed datagrams to the socket (a UDP GSO run is one)",
            registry=r,
        )
        self.copies_sent = Counter(
            f"{_PREFIX}_copies_sent", "Redundant copies sent (beyond the first)", registry=r
        )
        self.heartbeats_sent = Counter(f"{_PREFIX}_heartbeats_sent", "Heartbeats", registry=r)
        self.records_other_chains = Counter(
            f"{_PREFIX}_records_other_chains",
            "Records read and left to the other share chains (chain_mode share)",
            registry=r,
        )
        self.fec_blocks = Counter(
            f"{_PREFIX}_fec_blocks", "FEC blocks closed (their repairs queued)", registry=r
        )
        self.fec_repairs = Counter(
            f"{_PREFIX}_fec_repairs", "FEC repair datagrams built (before copies)", registry=r
        )
        self.pacing_delay = Counter(
            f"{_PREFIX}_pacing_delay_seconds",
            "Time datagrams were held back by pacing",
            registry=r,
        )
        self.errors = Counter(
            f"{_PREFIX}_errors",
            "Errors by kind (skipped records, send errors, broker)",
            ["kind"],
            registry=r,
        )
        # the fixed kinds exist at 0 from the start, so rate() sees the first error (send_<errno>
        # kinds appear when they happen)
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        self.backlog_bytes = Gauge(
            f"{_PREFIX}_backlog_bytes", "Datagram bytes waiting for pacing", registry=r
        )
        self.paused = Gauge(f"{_PREFIX}_paused", "1 while partitions are paused", registry=r)
        self.lag = Gauge(
            f"{_PREFIX}_consumer_lag",
            "High watermark minus next offset to read",
            ["topic", "partition"],
            registry=r,
        )
        self.stalled = Gauge(
            f"{_PREFIX}_stalled",
            "1 while the consumer lags but nothing was read or sent for stall_timeout",
            registry=r,
        )
        self.stalls = Counter(
            f"{_PREFIX}_stalls", "Stalls detected (each re-created the consumer)", registry=r
        )
        self.commits = Counter(f"{_PREFIX}_commits", "Successful offset commits", registry=r)
        self.keyring_reloads = Counter(
            f"{_PREFIX}_keyring_reloads", "Key file reloads that took effect", registry=r
        )
        self.announcements_sent = Counter(
            f"{_PREFIX}_announcements_sent",
            "Key announcements queued, repeats counted (public-key mode)",
            registry=r,
        )
        self.session_keys = Counter(
            f"{_PREFIX}_session_keys", "Session keys made (public-key mode)", registry=r
        )
        self.records_withheld = Counter(
            f"{_PREFIX}_records_withheld",
            "Records the content filter held back, by verdict (deny_rule, deny_default, error)",
            ["verdict"],
            registry=r,
        )
        self.filter_reloads = Counter(
            f"{_PREFIX}_filter_reloads",
            "Content filter rules file reloads, by outcome (ok, error: old rules kept)",
            ["outcome"],
            registry=r,
        )
        self._last: dict[str, float] = {}

    def enable_filter(self) -> None:
        """Create the content filter's series at 0, so rate() sees the first withheld record."""
        for verdict in WITHHELD_VERDICTS:
            self.records_withheld.labels(verdict=verdict)
        for outcome in ("ok", "error"):
            self.filter_reloads.labels(outcome=outcome)

    def sync_filter(self, withheld: Mapping[str, int], reloads: int, reload_errors: int) -> None:
        """Bring the content filter's series up to its running totals."""
        for verdict, count in withheld.items():
            self._add(f"withheld:{verdict}", self.records_withheld.labels(verdict=verdict), count)
        self._add("reload:ok", self.filter_reloads.labels(outcome="ok"), reloads)
        self._add("reload:error", self.filter_reloads.labels(outcome="error"), reload_errors)

    def _add(self, name: str, counter: Counter, total: float) -> None:
        delta = total - self._last.get(name, 0.0)
        if delta > 0:
            counter.inc(delta)
            self._last[name] = total

    def sync(self, totals: Mapping[str, float], errors: Mapping[str, int]) -> None:
        """Bring the registry up to the application's running totals."""
        for name in (
            "records_read",
            "bytes_read",
            "records_sent",
            "bytes_sent",
            "datagrams_sent",
            "send_calls",
            "copies_sent",
            "heartbeats_sent",
            "records_other_chains",
            "fec_blocks",
            "fec_repairs",
            "pacing_delay",
            "commits",
            "keyring_reloads",
            "stalls",
            "announcements_sent",
            "session_keys",
        ):
            if name in totals:
                self._add(name, getattr(self, name), totals[name])
        for kind, count in errors.items():
            self._add(f"error:{kind}", self.errors.labels(kind=kind), count)
        if "backlog_bytes" in totals:
            self.backlog_bytes.set(totals["backlog_bytes"])
        if "paused" in totals:
            self.paused.set(totals["paused"])
        if "stalled" in totals:
            self.stalled.set(totals["stalled"])

    def set_lag(self, lag: Mapping[tuple[str, int], int]) -> None:
        """Set the consumer lag gauge per partition."""
        for (topic, partition), value in lag.items():
            self.lag.labels(topic=topic, partition=str(partition)).set(value)
