"""FEC over a lossy link with real processes: sender -> netem relay -> receiver -> raw topic.

The real ``kafka-diode`` sender, relay and receiver (``kafka_diode.pipeline``, no Spark) against the
session's two brokers. With repairs and no copies, every upstream record must reach the raw topic
without any resend although the relay drops datagrams; the receiver's FEC counters prove that
blocks were rebuilt (the link really lost datagrams that mattered). The same through the dedup to
the clean topic, and loss beyond repair, are chaos scenarios (tests/chaos/test_fec.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import wait_until
from kafka_diode.verify import read_topic
from tests.chaos.harness import scrape
from tests.kafka_helpers import consume_all

pytestmark = pytest.mark.kafka

#: (profile, fec overhead %, extra sender environment, seed): documented in docs/sender.md,
#: "Forward error correction", with the loss table that justifies them (bench/fec_loss.py).
CASES = [
    pytest.param(
        "lossy-5", 20.0, (("DIODE_SENDER_FEC_BLOCK_SIZE", "64"),), 105, id="random-5pct-fec20-b64"
    ),
    pytest.param(
        "bursty", 50.0, (("DIODE_SENDER_FEC_INTERLEAVE", "4"),), 130, id="gilbert-elliott-fec50-i4"
    ),
]


def _raw_keys(p: Pipeline) -> set[str]:
    """The v1 keys (``topic:partition:offset``) of every record in the raw topic: the receiver
    writes runs (layout v2, issue #24), expanded here into the records they stand for."""
    prefix = p.ep.prefix
    return {
        key
        for m in consume_all(p.ep.downstream, p.ep.raw_topic, timeout=10, expand_runs=True)
        if (key := (m.key or b"").decode("ascii", "replace")).startswith(prefix)
    }


@pytest.mark.parametrize(("profile", "overhead", "env", "seed"), CASES)
def test_lossy_link_with_fec_delivers_every_record_without_resend(
    profile: str,
    overhead: float,
    env: tuple[tuple[str, str], ...],
    seed: int,
    upstream_kafka: LocalBroker,
    downstream_kafka: LocalBroker,
    tmp_path: Path,
) -> None:
    spec = PipelineSpec(
        records=6000,
        profile=profile,
        seed=seed,
        fec_overhead=overhead,
        run_dedup=False,
        heartbeat_interval=0.5,
        extra_env=env,
    )
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.setup()
        p.start_components(receiver_first=True)
        p.produce()
        expected = {
            f"{m.topic}:{m.partition}:{m.offset}"
            for topic in p.ep.source_topics
            for m in read_topic(p.ep.upstream, topic)
        }
        assert len(expected) == p.produced == spec.records
        seen: set[str] = set()

        def all_raw() -> bool:
            seen.update(_raw_keys(p))
            return expected <= seen

        with contextlib.suppress(TimeoutError):  # the assertions below say what is missing
            wait_until(
                all_raw,
                timeout=120,
                interval=1.0,
                what="every record in the raw topic",
                alive=list(p.group.processes.values()),
            )
        receiver = scrape(p.ep.metrics["receiver"])
        relay = scrape(p.ep.metrics["relay"])
        fec = {k: v for k, v in receiver.items() if "_fec_" in k}
        missing = sorted(expected - seen)
        assert not missing, f"{len(missing)} records missing, e.g. {missing[:5]}; {fec}; {relay}"
        lost = relay.get("kafka_diode_netem_datagrams_total{event=dropped_loss}", 0.0)
        assert lost > 0, relay
        assert receiver["kafka_diode_receiver_fec_datagrams_reconstructed_total"] > 0, fec
        assert receiver["kafka_diode_receiver_fec_blocks_unrecoverable_total"] == 0, fec
