"""A link of a thousand busy source partitions, with operations.md's advice for it.

"Many source partitions": a partition receiving fewer than 50 records a second gives about one
run per record, so runs per second ≈ records per second here; the dedup keeps up only while
``MAX_OFFSETS_PER_TRIGGER`` ≥ runs per second x (trigger + batch time), and at about a thousand
busy partitions the page says to lengthen ``PERSIST_INTERVAL_MS``. Ten topics of 100 partitions
(1,000 source partitions, each given a record about once a second) into a raw topic of 2
partitions, through the real sender, receiver and dedup, with the trigger at 5 s and
``MAX_OFFSETS_PER_TRIGGER`` at 20,000: every record exactly once with no resend, every batch done
within the trigger (the median; a busy host may stretch one) and none cut short by the cap.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import wait_until
from kafka_diode.verify import read_topic
from tests.chaos.harness import _labelled, scrape
from tests.integration.test_clean_link import assert_first_time

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

TOPICS = tuple(f"site-{i}.events" for i in range(10))
PARTITIONS = 100
RATE = 1_000  # records/s: one a second per source partition
SECONDS = 60
TRIGGER_MS = 5_000
MAX_OFFSETS = 20_000  # 4x a trigger's runs: room for the batch time and a catch-up


def test_a_thousand_busy_source_partitions_are_deduped_exactly_once_and_kept_up_with(
    upstream_kafka: LocalBroker, downstream_kafka: LocalBroker, tmp_path: Path
) -> None:
    spec = PipelineSpec(
        records=RATE * SECONDS,
        topics=TOPICS,
        partitions=PARTITIONS,
        raw_partitions=2,
        value_size=200,
        produce_rate=RATE,
        profile=None,
        persist_interval_ms=TRIGGER_MS,
        heartbeat_interval=2.0,
        gap_emit_interval=10.0,
        extra_env=(("MAX_OFFSETS_PER_TRIGGER", str(MAX_OFFSETS)),),
    )
    #: (s since production started, raw runs left for a later batch, last batch's duration)
    samples: list[tuple[float, float, float]] = []
    done, measuring = threading.Event(), threading.Event()
    started = 0.0

    def watch_the_dedup(p: Pipeline) -> None:
        """The dedup's position and batch time, every second until the run settles."""
        while not done.wait(1.0):
            metrics = scrape(p.ep.metrics.get("dedup"))
            lag = _labelled(metrics, "kafka_diode_dedup_raw_offsets_behind", "partition")
            batch = metrics.get("kafka_diode_dedup_batch_duration_seconds")
            if lag and batch is not None and measuring.is_set():
                samples.append((time.monotonic() - started, sum(lag.values()), batch))

    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.setup()
        p.start_components(receiver_first=True)

        def gate(seq: int) -> None:
            """After the first second of records, wait for the dedup's first batch: what is
            measured is keeping up, not Spark's start."""
            nonlocal started
            if seq == RATE:
                wait_until(
                    lambda: scrape(p.ep.metrics["dedup"]).get("kafka_diode_dedup_batches_total", 0)
                    > 0,
                    timeout=180, interval=0.5, what="the dedup's first batch",
                    alive=list(p.group.processes.values()),
                )  # fmt: skip
                started = time.monotonic()
                measuring.set()

        watcher = threading.Thread(target=watch_the_dedup, args=(p,), daemon=True)
        watcher.start()
        assert p.produce(gate=gate) == spec.records
        verdict = p.wait_settled(timeout=300, want_ok=True)
        done.set()
        watcher.join()
        sender = scrape(p.ep.metrics["sender"])
        receiver = scrape(p.ep.metrics["receiver"])
        gaps = read_topic(p.ep.downstream, p.ep.gap_topic, committed_only=False)

    assert_first_time(verdict, spec, receiver, gaps)
    lag = _labelled(sender, "kafka_diode_sender_consumer_lag", "partition")
    assert len(lag) == len(TOPICS) * PARTITIONS  # one sender read every source partition
    # kept up: batches took less than the trigger (the dedup was not the bound; one batch may
    # take longer when the host is busy, the next ones catch up), and no batch was cut at
    # MAX_OFFSETS_PER_TRIGGER (raw_offsets_behind is what a capped batch left for the next)
    assert samples, "the dedup's metrics were never scraped"
    loaded = [batch for t, _, batch in samples if t < SECONDS]  # while records arrived
    batches = [batch for i, batch in enumerate(loaded) if i == 0 or batch != loaded[i - 1]]
    assert statistics.median(batches) < TRIGGER_MS / 1000, samples
    assert max(unread for _, unread, _ in samples) == 0, samples
