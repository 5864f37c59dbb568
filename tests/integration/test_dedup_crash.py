"""Crash points of the per-task writer under real Spark (``kafka-diode dedup`` subprocesses).

1. The driver dies after every write task of a batch committed and before Spark's commit log
   (``driver-after-commit``): the restart replays the batch, every task skips it by its marker.
2. A retried task (``SPARK_MASTER=local[2,3]``: Spark retries a failed task): one task's Python
   worker dies before its commit, another's after its commit; the retries abort / skip.

Each time the clean topic, read ``read_committed``, holds every source record exactly once.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from dedup.faults import FAULT_ENV, FAULT_EXIT
from tests.integration.test_dedup import SOURCE, finish, job_env, run_dedup, run_record
from tests.kafka_helpers import consume_all, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PER_PARTITION = 3_000


def fill(downstream_kafka, kafka_topic) -> str:
    raw = kafka_topic(downstream_kafka, partitions=3)
    rng = random.Random(11)
    records = []
    for partition in range(3):
        # raw layout v2: runs of 20 offsets, 10 of them twice
        runs = [(first, first + 19) for first in range(0, PER_PARTITION, 20)]
        runs += rng.sample(runs, 10)
        records += [run_record(partition, a, b) for a, b in sorted(runs)]
    produce_records(downstream_kafka, raw, records)
    return raw


def assert_exactly_once(downstream_kafka, clean_topic: str) -> None:
    clean = consume_all(downstream_kafka, clean_topic, timeout=60)
    counts = Counter((r.partition, r.timestamp) for r in clean)
    assert [k for k, n in counts.items() if n > 1] == []
    assert len(counts) == 3 * PER_PARTITION


@pytest.mark.slow  # two Spark starts; test_dedup_fencing.py covers the fence in CI without Spark
@pytest.mark.parametrize("layout", ["buckets", "direct"])
def test_driver_killed_between_the_kafka_commits_and_sparks_commit_log(
    downstream_kafka, kafka_topic, tmp_path: Path, layout: str
) -> None:
    """``direct``: each raw partition's state record is its marker (docs/dedup.md "The direct
    layout")."""
    raw = fill(downstream_kafka, kafka_topic)
    env = {**job_env(downstream_kafka.bootstrap, raw, tmp_path, raw), "STATE_LAYOUT": layout,
           "MAX_OFFSETS_PER_TRIGGER": "100", "PERSIST_INTERVAL_MS": "0"}  # fmt: skip
    once = tmp_path / "driver-fault"
    crashing = run_dedup({**env, FAULT_ENV: f"driver-after-commit:2:0:{once}"})
    crashing.wait(400)
    assert crashing.returncode == FAULT_EXIT, crashing.log_path.read_text()[-3000:]  # type: ignore[attr-defined]
    clean_topic = f"clean.{raw}.{SOURCE}"
    before = len(consume_all(downstream_kafka, clean_topic, timeout=10))
    assert 0 < before < 3 * PER_PARTITION, "batch 2 must be committed, later ones not"

    restarted = run_dedup(env, "--until-settled")
    finish(restarted)
    log = restarted.log_path.read_text()  # type: ignore[attr-defined]
    assert re.search(r"batch 2: partitions \[.*\] already committed", log), log[-3000:]
    assert_exactly_once(downstream_kafka, clean_topic)


@pytest.mark.slow  # a Spark start with task retries; the fence itself: test_dedup_fencing.py
@pytest.mark.parametrize("layout", ["buckets", "direct"])
def test_retried_tasks_after_a_worker_died_before_and_after_its_commit(
    downstream_kafka, kafka_topic, tmp_path: Path, layout: str
) -> None:
    """``direct``: partitions are raw partitions, each task's fence and state record its own."""
    raw = fill(downstream_kafka, kafka_topic)
    # "*": the first batch with records in that partition (how Spark cuts batches varies)
    faults = (f"task-before-commit:*:0:{tmp_path / 'before'},"
              f"task-after-commit:*:1:{tmp_path / 'after'}")  # fmt: skip
    env = {**job_env(downstream_kafka.bootstrap, raw, tmp_path, raw),
           "MAX_OFFSETS_PER_TRIGGER": "100", "PERSIST_INTERVAL_MS": "0",
           "SPARK_MASTER": "local[2,3]", FAULT_ENV: faults, "STATE_LAYOUT": layout}  # fmt: skip
    run = run_dedup(env, "--until-settled")
    finish(run)
    assert (tmp_path / "before").exists()
    assert (tmp_path / "after").exists()
    log = run.log_path.read_text()  # type: ignore[attr-defined]
    assert re.search(r"batch \d+: partitions \[(0, )?1\] already committed", log), log[-3000:]
    assert_exactly_once(downstream_kafka, f"clean.{raw}.{SOURCE}")
