"""The receiver's counters and their Prometheus view.

The hot path only increments plain integer attributes of :class:`ReceiverStats` (a Prometheus
``Counter.inc`` takes a lock and costs more than the rest of a record's handling); a custom
collector reads them when ``/metrics`` is scraped. Names follow ``common.metrics``:
``kafka_diode_receiver_<what>[_unit][_total]``. Drop reasons are the ``DropReason`` values plus the
receiver's own ``downstream_overflow`` (records) and ``socket_error`` (failed reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from common.metrics import NAMESPACE, CollectorRegistry
from common.wire.events import DropReason
from common.wire.fec import MARGIN_BUCKETS

PREFIX = f"{NAMESPACE}_receiver"
DOWNSTREAM_OVERFLOW = "downstream_overflow"
SOCKET_ERROR = "socket_error"
_KNOWN_REASONS = (*(r.value for r in DropReason), DOWNSTREAM_OVERFLOW, SOCKET_ERROR)
#: Sender sessions whose last sequence is exported; older ones are forgotten (bounded labels).
MAX_SESSION_LABELS = 64
_FEC_DOCS = {
    "blocks_complete": "FEC blocks whose source datagrams all arrived.",
    "blocks_recovered": "FEC blocks with lost datagrams rebuilt from repairs.",
    "datagrams_reconstructed": "Source datagrams rebuilt from FEC repairs.",
    "blocks_unrecoverable": "FEC blocks with lost datagrams too few repairs reached.",
    "repairs_received": "FEC repair datagrams received (valid or not).",
    "repairs_unused": "Authentic FEC repairs of blocks already decided.",
}


@dataclass
class ReceiverStats:
    """Plain counters, incremented on the event loop thread, read by the metrics thread."""

    datagrams: int = 0
    """Datagrams read from the sockets."""
    bytes: int = 0
    """Datagram payload bytes read from the sockets."""
    records: int = 0
    """Source records decoded (duplicates from the sender included)."""
    heartbeats: int = 0
    """Sender heartbeats decoded."""
    heartbeat_repeats: int = 0
    """Heartbeat partitions not written to the raw topic: they repeated the last one written
    less than ``heartbeat_repeat_interval`` ago (receiver/heartbeat_repeats.py)."""
    resend_markers: int = 0
    withheld_ranges: int = 0
    """Resend start/end markers decoded."""
    produced: int = 0
    """Source records handed to the producer inside runs, plus control records (heartbeats,
    withheld ranges)."""
    delivered: int = 0
    """Of those, acknowledged by the downstream Kafka (a run's records when its one report says
    so)."""
    delivery_errors: int = 0
    """Raw records (runs, control records) whose delivery failed for good (their source offsets
    reported as lost ranges)."""
    drops: dict[str, int] = field(default_factory=dict)
    """Dropped datagrams/messages by DropReason value; downstream_overflow counts records."""
    kernel_drops: int = 0
    """Datagrams the kernel dropped because a socket's receive buffer was full (all sockets)."""
    keyring_reloads: int = 0
    """Successful key ring reloads."""
    keyring_reload_errors: int = 0
    """Failed key ring reloads (the previous ring stays in use)."""
    session_keys_learned: int = 0
    """Public-key mode: session keys learned from verified key announcements."""
    last_sequence: dict[str, int] = field(default_factory=dict)
    """Last sequence number seen per sender session (hex id)."""

    def drop(self, reason: str, count: int = 1) -> None:
        """Count ``count`` drops for ``reason``."""
        self.drops[reason] = self.drops.get(reason, 0) + count

    def snapshot(self) -> dict[str, object]:
        """A JSON-friendly copy (the exit summary)."""
        return {
            "datagrams": self.datagrams,
            "bytes": self.bytes,
            "records": self.records,
            "heartbeats": self.heartbeats,
            "produced": self.produced,
            "delivered": self.delivered,
            "delivery_errors": self.delivery_errors,
            "kernel_drops": self.kernel_drops,
            "drops": dict(sorted(self.drops.items())),
        }


@dataclass
class Gauges:
    """Values read from live objects at scrape time (callables, so they are always current)."""

    reassemblies_in_flight: Callable[[], int] = lambda: 0
    producer_queue: Callable[[], int] = lambda: 0
    backlog_records: Callable[[], int] = lambda: 0
    rcvbuf_bytes: Callable[[], int] = lambda: 0
    held_datagrams: Callable[[], int] = lambda: 0
    """Public-key mode: datagrams held for a session key not yet learned."""
    sockets: Callable[[], list[tuple[int, int, int, int]]] = list
    """Per socket of this process, in order: (local port, datagrams read, kernel drops, reads that
    returned a coalesced run (UDP GRO))."""
    fec: Callable[[], dict[str, int]] = dict
    """FEC counters by name (``FecDecoder``: blocks_complete, blocks_recovered, ...)."""
    fec_margin: Callable[[], tuple[list[int], float]] = lambda: (
        [0] * (len(MARGIN_BUCKETS) + 1),
        0.0,
    )
    """``FecDecoder.margin_used`` (counts per bucket, not cumulative) and ``margin_used_sum``."""
    coalesced_messages: Callable[[], int] = lambda: 0
    """``Decoder.coalesced_messages``: fragmented messages decoded whole from one GRO read."""


class ReceiverCollector(Collector):
    """Expose :class:`ReceiverStats` and :class:`Gauges` to Prometheus."""

    def __init__(
        self, stats: ReceiverStats, gauges: Gauges, clock: Callable[[], float] = time.time
    ) -> None:
        self._stats = stats
        self._gauges = gauges
        self._clock = clock
        # When a scrape first saw the heartbeat count change: the "link silent" alert's input
        # (packaging/prometheus), exact to one scrape interval and free for the hot path. It
        # starts at the process start, so a receiver is given the alert's grace to hear one.
        self._beats_seen = stats.heartbeats
        self._beat_at = clock()

    def collect(self) -> Iterator[Metric]:
        """Build the metric families from the current values."""
        s = self._stats
        for name, doc, value in (
            ("datagrams", "Datagrams read from the UDP sockets.", s.datagrams),
            ("bytes", "Datagram bytes read from the UDP sockets.", s.bytes),
            ("records", "Source records decoded.", s.records),
            ("heartbeats", "Sender heartbeats decoded.", s.heartbeats),
            (
                "heartbeat_repeats_skipped",
                "Heartbeat partitions not written to the raw topic: a repeat of the last one "
                "written, within heartbeat_repeat_interval.",
                s.heartbeat_repeats,
            ),
            ("resend_markers", "Resend markers decoded.", s.resend_markers),
            (
                "withheld_ranges",
                "Offset ranges a sender's content filter withheld (written as control records).",
                s.withheld_ranges,
            ),
            (
                "produced_records",
                "Source records (in runs) and control records handed to the producer.",
                s.produced,
            ),
            (
                "delivered_records",
                "Source records (in runs) and control records acknowledged by Kafka.",
                s.delivered,
            ),
            ("delivery_errors", "Raw records whose delivery failed for good.", s.delivery_errors),
            (
                "kernel_drops",
                "Datagrams dropped by the kernel (receive buffer full).",
                s.kernel_drops,
            ),
            ("keyring_reloads", "Key ring reloads.", s.keyring_reloads),
            ("keyring_reload_errors", "Failed key ring reloads.", s.keyring_reload_errors),
            (
                "session_keys_learned",
                "Session keys learned from key announcements (public-key mode).",
                s.session_keys_learned,
            ),
        ):
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        drops = CounterMetricFamily(
            f"{PREFIX}_drops",
            "Dropped datagrams/messages (records for overflow).",
            labels=["reason"],
        )
        # Every known reason is exported from the start (at 0), so rate() and the alert rules
        # see a drop from its first occurrence rather than from the second scrape after it.
        counts = dict.fromkeys(_KNOWN_REASONS, 0) | dict(s.drops)
        for reason, value in counts.items():
            drops.add_metric([reason], value)
        yield drops
        expired = s.drops.get("reassembly_timeout", 0)
        yield CounterMetricFamily(
            f"{PREFIX}_reassemblies_expired", "Fragmented messages that timed out.", value=expired
        )
        if s.heartbeats != self._beats_seen:
            self._beats_seen, self._beat_at = s.heartbeats, self._clock()
        yield GaugeMetricFamily(
            f"{PREFIX}_last_heartbeat_timestamp_seconds",
            "Unix time a scrape first saw the latest sender heartbeat (process start if none).",
            value=self._beat_at,
        )
        g = self._gauges
        for name, value in g.fec().items():
            yield CounterMetricFamily(
                f"{PREFIX}_fec_{name}", _FEC_DOCS.get(name, f"FEC {name}."), value=value
            )
        yield _margin_histogram(*g.fec_margin())
        yield CounterMetricFamily(
            f"{PREFIX}_coalesced_messages",
            "Fragmented messages decoded whole from one coalesced read (UDP GRO).",
            value=g.coalesced_messages(),
        )
        for name, doc, fn in (
            (
                "reassemblies_in_flight",
                "Fragmented messages being reassembled.",
                g.reassemblies_in_flight,
            ),
            (
                "producer_queue_records",
                "Raw records (runs, control records) in the producer's queue.",
                g.producer_queue,
            ),
            (
                "backlog_records",
                "Records held by the receiver before the producer.",
                g.backlog_records,
            ),
            (
                "held_datagrams",
                "Datagrams held for a session key not yet announced (public-key mode).",
                g.held_datagrams,
            ),
            (
                "socket_rcvbuf_bytes",
                "SO_RCVBUF granted by the kernel (first socket).",
                g.rcvbuf_bytes,
            ),
        ):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=fn())
        seq = GaugeMetricFamily(
            f"{PREFIX}_last_sequence",
            "Last datagram sequence seen per sender session.",
            labels=["session"],
        )
        for session, value in list(s.last_sequence.items()):
            seq.add_metric([session], value)
        yield seq
        per_socket = g.sockets()
        datagrams = CounterMetricFamily(
            f"{PREFIX}_socket_datagrams",
            "Datagrams read per UDP socket (socket: index in this process, port: its local port).",
            labels=["socket", "port"],
        )
        drops_by_socket = CounterMetricFamily(
            f"{PREFIX}_socket_kernel_drops",
            "Datagrams the kernel dropped per UDP socket (receive buffer full).",
            labels=["socket", "port"],
        )
        coalesced_by_socket = CounterMetricFamily(
            f"{PREFIX}_socket_coalesced_reads",
            "Reads per UDP socket that returned a run of datagrams at once (UDP GRO).",
            labels=["socket", "port"],
        )
        for index, (port, read, dropped, coalesced) in enumerate(per_socket):
            datagrams.add_metric([str(index), str(port)], read)
            drops_by_socket.add_metric([str(index), str(port)], dropped)
            coalesced_by_socket.add_metric([str(index), str(port)], coalesced)
        yield datagrams
        yield drops_by_socket
        yield coalesced_by_socket


def _margin_histogram(counts: list[int], total: float) -> HistogramMetricFamily:
    """The FEC margin histogram, exported from the start (all zero without FEC) so the
    KafkaDiodeFecMarginLow rule and dashboards see the series before the first block."""
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*MARGIN_BUCKETS, float("inf")), counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else f"{bound:g}", running))
    return HistogramMetricFamily(
        f"{PREFIX}_fec_margin_used",
        "FEC blocks decided, by the share of their repairs their losses used (1: every repair "
        "needed; above 1: failed, its records become gaps).",
        buckets=buckets,
        sum_value=total,
    )


def make_registry(stats: ReceiverStats, gauges: Gauges) -> CollectorRegistry:
    """A fresh registry exposing the receiver's metrics."""
    registry = CollectorRegistry()
    registry.register(ReceiverCollector(stats, gauges))
    return registry
