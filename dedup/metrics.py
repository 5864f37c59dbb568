"""Prometheus series of the dedup (``kafka_diode_dedup_*``); updated on the driver only.

The write tasks hand their counters back as rows (``dedup/rows.py`` ``stat``,
``dedup/task_result.py`` ``task``); the driver folds them in here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from common.metrics import CollectorRegistry, Counter, Gauge
from dedup.raw_position import records_read


class DedupMetrics:
    """Prometheus series of the dedup (names: ``kafka_diode_dedup_*``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ns, sub, reg = "kafka_diode", "dedup", self.registry
        self.forwarded = Counter(
            "records_forwarded", "Records committed to clean topics", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.duplicates = Counter(
            "duplicates_dropped", "Raw records dropped as duplicates", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.malformed = Counter(
            "malformed_records", "Raw records neither data nor known control", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.heartbeats = Counter(
            "heartbeats", "Heartbeat records applied", namespace=ns, subsystem=sub, registry=reg
        )
        self.gap_reports = Counter(
            "gap_reports", "Gap records committed to the gap topic", namespace=ns, subsystem=sub,
            registry=reg,
        )  # fmt: skip
        self.batches = Counter(
            "batches", "Micro-batches committed", namespace=ns, subsystem=sub, registry=reg
        )
        self.transaction_parts = Counter(
            "transaction_parts", "Task transactions committed as parts of a longer batch",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.replayed = Counter(
            "batches_skipped", "Replayed micro-batches skipped by the fence", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.gaps_open = Gauge(
            "gaps_open", "Open gaps over all source partitions", namespace=ns, subsystem=sub,
            registry=reg,
        )  # fmt: skip
        self.state_bytes = Gauge(
            "state_bytes", "Serialised detector state over all partitions", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.batch_seconds = Gauge(
            "batch_duration_seconds", "Duration of the last micro-batch", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.input_rate = Gauge(
            "input_records_per_second", "Input rate of the last micro-batch", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.processed_rate = Gauge(
            "processed_records_per_second", "Processed rate of the last micro-batch",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        # What the detector counts (docs/dedup.md "Metrics and logs").
        self.below_window = Counter(
            "below_window_dropped", "Raw records dropped as older than the detector's state "
            "(below the oldest window, not in a remembered gap)", namespace=ns, subsystem=sub,
            registry=reg,
        )  # fmt: skip
        self.budget_evictions = Counter(
            "budget_evictions", "Windows evicted early because of MAX_STATE_BYTES", namespace=ns,
            subsystem=sub, registry=reg,
        )  # fmt: skip
        self.gaps_expired = Counter(
            "gaps_expired", "Gaps reported expired (forgotten beyond MAX_EXPIRED_GAPS)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.write_payload_bytes = Counter(
            "write_payload_bytes", "Bytes of run payloads the write tasks consumed (docs/dedup.md "
            "'Each payload read once')", namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.write_record_bytes = Counter(
            "write_record_bytes", "Bytes of the keys, values and headers of the records in those "
            "runs, delivered or duplicate", namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.timestamps_replaced = Counter(
            "timestamps_replaced", "Clean records written with the dedup's time because the clean "
            "topic would refuse their source timestamp (kept in diode.original-timestamp)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.resets = Counter(
            "resets_applied", "Partition state resets applied (kafka-diode dedup reset)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.withheld = Counter(
            "withheld", "Source offsets a sender's content filter withheld (recorded, never gaps)",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self.chains_missing = Gauge(
            "chains_missing", "Share chains not heard from yet, summed over partitions",
            namespace=ns, subsystem=sub, registry=reg,
        )  # fmt: skip
        self._open: dict[tuple[str, int], int] = {}
        self._state: dict[tuple[str, int], int] = {}
        self._missing: dict[tuple[str, int], int] = {}

    def add_stats(self, stats: pa.Table) -> None:
        """Fold the ``stat`` rows of one committed batch into the series."""
        cols = {name: stats.column(name).to_pylist() for name in stats.column_names}
        for i, topic in enumerate(cols["src_topic"]):
            partition = cols["src_partition"][i]
            self.duplicates.inc(cols["duplicates"][i] or 0)
            self.malformed.inc(cols["malformed"][i] or 0)
            self.heartbeats.inc(cols["heartbeats"][i] or 0)
            for counter, name in (
                (self.below_window, "below_window"),
                (self.budget_evictions, "budget_evictions"),
                (self.gaps_expired, "expired_gaps"),
                (self.resets, "resets"),
                (self.withheld, "withheld"),
            ):
                if name in cols:
                    counter.inc(cols[name][i] or 0)
            if topic:
                self._open[(topic, partition)] = cols["open_gaps"][i] or 0
                self._state[(topic, partition)] = cols["state_bytes"][i] or 0
                if "chains_missing" in cols:
                    self._missing[(topic, partition)] = cols["chains_missing"][i] or 0
        self.gaps_open.set(sum(self._open.values()))
        self.state_bytes.set(sum(self._state.values()))
        self.chains_missing.set(sum(self._missing.values()))

    def observe_progress(self, progress: Mapping[str, Any]) -> None:
        """Take rates and duration from a StreamingQueryProgress (as JSON): Spark's rates of its
        rows, in raw records (``raw_position.records_read``: a row may be a range of them)."""
        rows = int(progress.get("numInputRows") or 0)
        scale = records_read(progress) / rows if rows else 0.0
        self.input_rate.set(float(progress.get("inputRowsPerSecond") or 0.0) * scale)
        self.processed_rate.set(float(progress.get("processedRowsPerSecond") or 0.0) * scale)
        duration = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration is not None:
            self.batch_seconds.set(float(duration) / 1000.0)
