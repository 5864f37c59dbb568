"""Faults of one node of a real Kafka cluster while records flow (issue 25 item 2).

``inject(run, fault)`` runs on the chaos harness's main thread while the producer thread feeds the
upstream cluster. Every fault picks its node from the cluster's own metadata at that moment:

The harness produces only the first half of the workload until a fault's first kill or stop
(``inject`` sets ``run.fault_happened``), so every condition below that waits for progress after
the fault is one that must become true if the promise holds: the records it counts were produced
after the fault, and each one pre-fault condition asks for less than the first half.

- ``raw-leader-sigkill`` (downstream): SIGKILL the leader of the raw partition with the most
  records, once a third of the records are in the raw topic; restart it once the raw topic grew
  by another sixth of the records without it (the receiver wrote through the new leader).
- ``clean-leader-sigkill`` (downstream): the same for the busiest clean partition, once the dedup
  has written; restart after the clean topics grew without it.
- ``txn-coordinator-sigkill`` (downstream): SIGKILL the transaction coordinator of the dedup's
  writers (the leader of the ``__transaction_state`` partition of their ``transactional.id``\\ s,
  read from the dedup's log: ``abs(javaHashCode(id)) % partitions``, Kafka's own rule) once it has
  committed; restart after it committed another sixth of the records, all produced after the
  kill, so committed through the new coordinator.
- ``group-coordinator-sigkill`` (upstream): SIGKILL the coordinator of the sender's consumer
  group (``describe_consumer_groups``) once a third of the records crossed; restart after
  another sixth crossed.
- ``rolling-restart`` (``Scenario.cluster_side``): stop and start every node in turn, each only
  once every partition of the cluster is fully in sync again (how operators upgrade).
- ``node-down-60s`` (``Scenario.cluster_side``): SIGKILL the busiest raw (or source) leader and
  keep it down for 60 s of traffic (the outage's length is the fault, not a synchronisation).
- ``downstream-outage`` (downstream): SIGKILL two of the three nodes (the busiest raw leader and
  another): the controller quorum and every partition's ``min.insync.replicas`` are gone, so
  nothing can be written downstream. They stay down until the receiver's buffers (made small by
  the scenario) overflowed ``OVERFLOW_RECORDS`` records, i.e. an outage longer than the buffer,
  then start again together. The dedup's batch may fail meanwhile: it exits 1 (documented in
  docs/operations.md, Failure cases) and is started again as its systemd unit would.

Afterwards the harness settles and judges as for every scenario: clean topics read
``read_committed`` hold every record exactly once; gaps only where datagrams were lost (none are
here: no relay), so the first verdict must already be ``ok`` without a resend.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from kafka_diode.local_kafka.cluster import LocalCluster
from kafka_diode.processes import wait_until
from kafka_diode.verify import clean_topic_for

if TYPE_CHECKING:
    from tests.chaos.harness import Run

#: How long ``node-down-60s`` keeps its node down.
OUTAGE_S = 60.0
#: Records (and heartbeats) the receiver must have dropped as ``downstream_overflow`` before
#: ``downstream-outage`` ends.
OVERFLOW_RECORDS = 400
#: ``transaction.state.log.num.partitions`` and ``offsets.topic.num.partitions`` of local clusters.
INTERNAL_PARTITIONS = 5


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around), signed."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int = INTERNAL_PARTITIONS) -> int:
    """The internal-topic partition whose leader coordinates ``key`` (Kafka's ``Utils.abs``)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _admin(bootstrap: str) -> Any:
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def partition_leaders(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """``{partition: (leader, replicas, isr)}`` of ``topic``."""
    meta = _admin(bootstrap).list_topics(topic, timeout=10).topics[topic]
    return {n: (p.leader, list(p.replicas), list(p.isrs)) for n, p in meta.partitions.items()}


def busiest_leader(bootstrap: str, topics: list[str], timeout: float = 60.0) -> tuple[int, str]:
    """The node leading the partition of ``topics`` with the most records, and which it is;
    asked again while leadership moves (``NOT_LEADER_FOR_PARTITION`` from stale metadata, as
    after a rolling restart's leader rebalancing)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _busiest_leader(bootstrap, topics)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # poll interval of a retry under a deadline


def _busiest_leader(bootstrap: str, topics: list[str]) -> tuple[int, str]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-diode-chaos-probe"})
    try:
        best = (-1, -1, "")
        for topic in topics:
            for partition, (leader, _r, _i) in partition_leaders(bootstrap, topic).items():
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                if high > best[0]:
                    best = (high, leader, f"{topic}[{partition}]")
        return best[1], best[2]
    finally:
        consumer.close()


def all_in_sync(bootstrap: str) -> bool:
    """Whether every partition of every topic has its whole replica set in sync."""
    try:
        topics = _admin(bootstrap).list_topics(timeout=10).topics
    except KafkaException:
        return False
    return all(
        p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas)
        for meta in topics.values()
        for p in meta.partitions.values()
    )


def txn_coordinator(bootstrap: str, transactional_ids: list[str]) -> int:
    """The node coordinating most of ``transactional_ids``."""
    leaders = partition_leaders(bootstrap, "__transaction_state")
    votes = Counter(leaders[coordinator_partition(t)][0] for t in transactional_ids)
    return votes.most_common(1)[0][0]


def group_coordinator(bootstrap: str, group: str) -> int:
    """The node coordinating consumer group ``group``."""
    admin = _admin(bootstrap)  # kept alive until the answer: a destroyed client drops it
    future = admin.describe_consumer_groups([group], request_timeout=30)[group]
    return int(future.result(timeout=60).coordinator.id)


def dedup_transactional_ids(run: Run) -> list[str]:
    """The dedup's writers' ``transactional.id``\\ s: ``<base>-p<partition>`` for each of its
    stateful partitions (SHUFFLE_PARTITIONS, default the driver's cores), the base read from the
    driver's "writer ready" log line."""
    text = (run.pipeline.group.log_dir / "dedup.log").read_text(errors="replace")
    bases = sorted(set(re.findall(r"transactional\.id=(\S+)-p<partition>", text)))
    return [f"{base}-p{i}" for base in bases for i in range(os.cpu_count() or 1)]


def _metric(run: Run, component: str, name: str) -> float:
    from tests.chaos.harness import scrape  # noqa: PLC0415

    return scrape(run.pipeline.ep.metrics.get(component)).get(name, 0.0)


def crossed(run: Run) -> float:
    """Source records the receiver has written to the raw topic (acknowledged by the cluster)."""
    return _metric(run, "receiver", "kafka_diode_receiver_delivered_records_total")


def overflowed(run: Run) -> float:
    """Records and control records the receiver dropped because its buffers were full."""
    return _metric(run, "receiver", "kafka_diode_receiver_drops_total{reason=downstream_overflow}")


def committed(run: Run) -> float:
    """Records the dedup has committed to clean topics."""
    return _metric(run, "dedup", "kafka_diode_dedup_records_forwarded_total")


def inject(run: Run, fault: str) -> None:
    """Inject ``fault`` into the run's clusters (module docstring); returns once it is over."""
    p = run.pipeline
    sc = run.sc
    upstream_faults = {"group-coordinator-sigkill"}
    on_side = {"rolling-restart", "node-down-60s"}
    if fault in upstream_faults or (fault in on_side and sc.cluster_side == "upstream"):
        side = run.upstream
    else:
        side = run.downstream
    assert isinstance(side, LocalCluster), "cluster faults need LocalCluster brokers"
    alive = list(p.group.processes.values())
    limit = run.settle_timeout
    raw = [p.ep.raw_topic]
    clean = sorted({clean_topic_for(p.ep.clean_template, t) for t in p.ep.source_topics})
    down = p.ep.downstream
    third, sixth = sc.records // 3, sc.records // 6
    events = run.outcome.events

    def wait(predicate: Any, what: str) -> None:
        wait_until(predicate, timeout=limit, interval=0.2, what=what, alive=alive)

    def kill_then_restart(node_id: int, why: str, progress: Any, what: str) -> None:
        """Kill the node, let the held records flow, and restart it once ``progress()`` grew by
        a sixth of the records: at most half were produced before the kill, so that many more
        must follow it."""
        node = side.node(node_id)
        events.append(f"SIGKILL {node.name} ({why})")
        node.kill()
        before = progress()
        run.fault_happened.set()
        wait(lambda: progress() >= before + sixth, what)
        events.append(f"restart {node.name}")
        node.start()
        wait(lambda: all_in_sync(side.bootstrap), f"{node.name} back in sync")

    if fault == "raw-leader-sigkill":
        wait(lambda: crossed(run) >= third, f"{third} records in the raw topic")
        leader, where = busiest_leader(down, raw)
        kill_then_restart(
            leader,
            f"leader of {where}",
            lambda: crossed(run),
            "records written to the raw topic without the killed leader",
        )
    elif fault == "clean-leader-sigkill":
        wait(lambda: committed(run) >= sixth, "clean output of the dedup")
        leader, where = busiest_leader(down, clean)
        kill_then_restart(
            leader,
            f"leader of {where}",
            lambda: committed(run),
            "clean records committed without the killed leader",
        )
    elif fault == "txn-coordinator-sigkill":
        wait(lambda: committed(run) >= sixth, "clean output of the dedup")
        ids = dedup_transactional_ids(run)
        assert ids, "the dedup's log names no transactional.id"
        kill_then_restart(
            txn_coordinator(down, ids),
            f"transaction coordinator of {', '.join(ids)}",
            lambda: committed(run),
            "commits through the new transaction coordinator",
        )
    elif fault == "group-coordinator-sigkill":
        wait(lambda: crossed(run) >= third, f"{third} records in the raw topic")
        group = f"{p.ep.prefix}sender"
        kill_then_restart(
            group_coordinator(p.ep.upstream, group),
            f"coordinator of consumer group {group}",
            lambda: crossed(run),
            "records crossing after the coordinator moved",
        )
    elif fault == "rolling-restart":
        wait(lambda: crossed(run) >= sixth, f"{sixth} records in the raw topic")
        for node in side.nodes:
            wait(lambda: all_in_sync(side.bootstrap), "every partition in sync")
            events.append(f"rolling: stop {node.name}")
            node.stop()
            run.fault_happened.set()
            events.append(f"rolling: start {node.name}")
            node.start()
        wait(lambda: all_in_sync(side.bootstrap), "every partition in sync after the roll")
    elif fault == "node-down-60s":
        wait(lambda: crossed(run) >= sixth, f"{sixth} records in the raw topic")
        topics = raw if sc.cluster_side == "downstream" else list(p.ep.source_topics)
        leader, where = busiest_leader(side.bootstrap, topics)
        node = side.node(leader)
        events.append(f"SIGKILL {node.name} (leader of {where}) for {OUTAGE_S:.0f} s")
        node.kill()
        run.fault_happened.set()
        began = time.monotonic()
        threading.Event().wait(OUTAGE_S)  # the outage's length is the fault itself
        events.append(f"restart {node.name} after {time.monotonic() - began:.0f} s")
        node.start()
        wait(lambda: all_in_sync(side.bootstrap), f"{node.name} back in sync")
    elif fault == "downstream-outage":
        wait(lambda: crossed(run) >= sixth, f"{sixth} records in the raw topic")
        leader, where = busiest_leader(down, raw)
        victims = [side.node(leader), *[n for n in side.nodes if n is not side.node(leader)][:1]]
        dedup = p.group["dedup"]
        links = [proc for proc in alive if proc is not dedup]  # these must never exit
        events.append(
            f"SIGKILL {', '.join(n.name for n in victims)} (leader of {where} and one more: no"
            " quorum, no in-sync majority)"
        )
        began = time.monotonic()
        for node in victims:
            node.kill()
        run.fault_happened.set()
        wait_until(
            lambda: overflowed(run) >= OVERFLOW_RECORDS,
            timeout=limit,
            interval=0.2,
            what=f"{OVERFLOW_RECORDS} records overflowing the receiver's buffers",
            alive=links,
        )
        events.append(
            f"restart {', '.join(n.name for n in victims)} after {time.monotonic() - began:.0f}"
            f" s; the receiver had overflowed {overflowed(run):.0f} records"
        )
        side.start()
        wait_until(
            lambda: all_in_sync(side.bootstrap),
            timeout=limit,
            interval=0.2,
            what="every partition in sync after the outage",
            alive=links,
        )
        # The dedup either lived through it and commits again, or exited 1 (its batch's Kafka
        # calls timed out): then it starts again, as systemd's Restart=on-failure does.
        before = committed(run) if dedup.running else 0.0
        wait_until(
            lambda: not dedup.running or committed(run) > before,
            timeout=limit,
            interval=0.5,
            what="the dedup committing again or exiting",
            alive=links,
        )
        if not dedup.running:
            code = dedup.returncode
            events.append(f"dedup exited {code} during the outage; restarted (systemd)")
            assert code == 1, f"the dedup exited {code}, not the documented 1"
            dedup.start()
    else:
        raise ValueError(f"unknown cluster fault {fault!r}")
