"""The sender's Prometheus metrics (names ``kafka_diode_sender_*``, docs/sender.md).

One ``SenderMetrics`` per process (or per test) with its own registry. The hot path never touches
a Prometheus object per record: the application keeps plain integer counters and ``sync`` copies
them into the registry a few times per second.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.metrics import CollectorRegistry, Counter, Gauge

_PREFIX = "kafka_diode_sender"


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
        self.copies_sent = Counter(
            f"{_PREFIX}_copies_sent", "Redundant copies sent (beyond the first)", registry=r
        )
        self.heartbeats_sent = Counter(f"{_PREFIX}_heartbeats_sent", "Heartbeats", registry=r)
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
        self._last: dict[str, float] = {}

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
            "copies_sent",
            "heartbeats_sent",
            "pacing_delay",
            "commits",
            "keyring_reloads",
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

    def set_lag(self, lag: Mapping[tuple[str, int], int]) -> None:
        """Set the consumer lag gauge per partition."""
        for (topic, partition), value in lag.items():
            self.lag.labels(topic=topic, partition=str(partition)).set(value)
