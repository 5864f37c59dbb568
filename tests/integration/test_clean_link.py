"""A healthy link delivers everything first time, at the settings users run (issue #14).

The README's configuration scaled to this machine: a paced sender (``--rate-bytes``) emptying a
backlog pre-filled upstream before it starts (at least four times the receiver's replay window in
datagrams), values from 50 B to 100 KB plus a few of 2-3 MB, tombstones, headers, the netem relay
with the ``clean`` profile (no impairment) between sender and receiver, the Spark dedup. Every
record must be in its clean topic exactly once **before any resend**, the receiver must refuse
none of the sender's datagrams as replayed (or time out a reassembly), and no gap may ever have
been reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.verify import read_topic
from tests.chaos.harness import _labelled, scrape

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

REPLAY_WINDOW = 8192  # the receiver's default, which the README's receiver keeps


def test_paced_backlog_with_large_records_needs_no_resend(
    upstream_kafka: LocalBroker, downstream_kafka: LocalBroker, tmp_path: Path
) -> None:
    spec = PipelineSpec(
        records=3600,
        value_size=50,
        value_size_max=100_000,
        huge_every=1200,  # three records of 2-3 MB
        huge_size=2_500_000,
        profile="clean",
        rate_bytes=8_000_000,
        heartbeat_interval=2.0,
        gap_emit_interval=2.0,
    )
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.setup()
        produced = p.produce()  # the whole backlog waits upstream before the sender starts
        assert produced == spec.records
        p.start_components(receiver_first=True)
        verdict = p.wait_settled(timeout=600, want_ok=True)
        sender = scrape(p.ep.metrics["sender"])
        receiver = scrape(p.ep.metrics["receiver"])
        gaps = read_topic(p.ep.downstream, p.ep.gap_topic, committed_only=False)
    assert verdict.ok, verdict.line()
    assert verdict.exactly_once == spec.records
    assert gaps == [], f"{len(gaps)} gap records on a clean link"
    drops = _labelled(receiver, "kafka_diode_receiver_drops_total", "reason")
    assert {reason for reason, n in drops.items() if n} == set(), drops
    # The setting is what the issue asks for: the backlog was deeper than 4 replay windows.
    assert sender["kafka_diode_sender_datagrams_sent_total"] >= 4 * REPLAY_WINDOW
