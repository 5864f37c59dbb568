"""Topics the dedup creates, on a replicated cluster, with the deployment guide's settings.

docs/deployment.md §3 tells operators to set ``NEW_TOPIC_REPLICATION=3`` (and
``NEW_TOPIC_PARTITIONS``) so that nothing the dedup creates is under-replicated. Here nothing
creates the clean and gap topics beforehand: the dedup creates them (the clean ones from its write
tasks, at the first record of each source topic; the gap, progress and control topics at start)
on a three-node cluster. Every record arrives once; every topic it created has the guide's
partitions and three replicas; and with the node that leads the busiest clean partition killed,
every clean record is still read back, which a topic of one replica on that node would not allow.
The cluster's own default is also three replicas, so that the setting is what decides is checked in
tests/unit/test_dedup_new_topics.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from kafka_diode.local_kafka.cluster import LocalCluster
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.verify import clean_topic_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 12  # the guide's NEW_TOPIC_PARTITIONS
REPLICATION = 3  # the guide's NEW_TOPIC_REPLICATION


def test_topics_the_dedup_creates_have_the_guides_replication_and_outlive_a_node(
    tmp_path: Path,
) -> None:
    spec = PipelineSpec(
        records=20_000,
        brokers=3,
        profile=None,
        dedup_creates_topics=True,
        extra_env=(
            ("NEW_TOPIC_REPLICATION", str(REPLICATION)),
            ("NEW_TOPIC_PARTITIONS", str(PARTITIONS)),
        ),
    )
    with Pipeline(spec, tmp_path) as p:
        p.setup()
        p.start_components(receiver_first=True)
        assert p.produce() == spec.records
        verdict = p.wait_settled(timeout=300, want_ok=True)
        assert verdict.ok, verdict.line()
        assert verdict.exactly_once == spec.records

        admin = AdminClient({"bootstrap.servers": p.ep.downstream})
        topics = admin.list_topics(timeout=30).topics
        clean = sorted(clean_topic_for(p.ep.clean_template, t) for t in p.ep.source_topics)
        compacted = [p.ep.gap_topic, f"{p.ep.prefix}dedup.progress", f"{p.ep.prefix}dedup.control"]
        for name in clean + compacted:
            partitions = topics[name].partitions
            assert len(partitions) == (PARTITIONS if name in clean else 1), name
            assert {len(m.replicas) for m in partitions.values()} == {REPLICATION}, name

        # the node leading the most clean partitions goes down; every record is still there
        leaders = Counter(m.leader for name in clean for m in topics[name].partitions.values())
        node, led = leaders.most_common(1)[0]
        assert led > 0
        downstream = p.brokers[1]
        assert isinstance(downstream, LocalCluster)
        assert downstream.node(node).kill()
        after = p.wait_settled(timeout=180, want_ok=True)
    assert after.ok, after.line()
    assert after.exactly_once == spec.records
