"""The upgrade order docs/operations.md "Upgrading" gives: the low side first, the sender last.

A sender of the release before raw layout v2 (``test_dedup_upgrade.PREVIOUS``'s first commit,
from this repository's history) sends a paced backlog over real UDP into this tree's receiver
and dedup: every record in its clean topic exactly once, no gap.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.pipeline import Pipeline, PipelineSpec, _serves
from kafka_diode.processes import wait_until
from tests.integration.test_dedup_upgrade import PREVIOUS, extract_release, release_env

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

BEFORE_RUNS = next(iter(PREVIOUS))


def test_a_previous_release_sender_into_this_low_side_delivers_exactly_once(
    upstream_kafka: LocalBroker, downstream_kafka: LocalBroker, tmp_path: Path
) -> None:
    tree = extract_release(BEFORE_RUNS, tmp_path)
    spec = PipelineSpec(records=30_000, value_size=200, profile=None, rate_bytes=8_000_000,
                        heartbeat_interval=2.0, gap_emit_interval=2.0)  # fmt: skip
    with Pipeline(
        spec, tmp_path / "run", upstream=upstream_kafka.bootstrap,
        downstream=downstream_kafka.bootstrap,
    ) as p:  # fmt: skip
        p.setup()
        assert p.produce() == spec.records
        env = p._env()
        receiver = p.group.add("receiver", p.receiver_argv(), env=env)
        port = p.ep.metrics["receiver"]
        wait_until(lambda: _serves(port), timeout=120, what="receiver to listen", alive=[receiver])
        log = (tmp_path / "old-sender.log").open("wb")
        sender = subprocess.Popen(p.sender_argv(), env=release_env(tree, env), cwd=tree,
                                  stdout=log, stderr=log)  # fmt: skip
        try:
            p.group.add("dedup", p.dedup_argv(), env=p.dedup_env(), stop_timeout=60)
            verdict = p.wait_settled(timeout=400, want_ok=True)
            assert sender.poll() is None, (tmp_path / "old-sender.log").read_text()[-2000:]
        finally:
            sender.terminate()
            sender.wait(60)
            log.close()
    assert verdict.ok, verdict.line()
    assert verdict.exactly_once == spec.records
