"""A batch longer than a transaction may be, under real Spark (``kafka-diode dedup``).

A backlog of large records makes a batch whose task writes for longer than the producer's
``transaction.timeout.ms``; the task commits it in parts (docs/dedup-internals.md "Parts of a
batch"). Here the timeout is 3 s (a part every second) and ~400 MB of 4 MiB records sit in one
raw partition (a task of several seconds; the first part came after ~80 MB here): the task
commits a part, its Python worker dies after it (``task-after-part``), and Spark's retry of the
task resumes the batch after the part. The clean topic, read ``read_committed``, holds every
record exactly once; before parts the retry took the
batch as committed and lost its rest.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from common.raw_run import RunBuilder
from dedup.direct_state import MAGIC, PART_MAGIC
from dedup.faults import FAULT_ENV
from tests.integration.test_dedup import BASE_TS, SESSION, SOURCE, finish, job_env, run_dedup
from tests.kafka_helpers import Record, consume_all, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

RECORDS = 96
RECORD_BYTES = 4 << 20
LARGE = {"fetch.max.bytes": 64 << 20, "receive.message.max.bytes": 80 << 20}


def large_records() -> list[Record]:
    """Source partition 0's backlog: each record a run of one (larger than run_max_bytes)."""
    out = []
    for offset in range(RECORDS):
        run = RunBuilder(SOURCE, 0, 1, offset, BASE_TS + offset)
        value = b"%d:" % offset
        run.append(offset, BASE_TS + offset, b"k%d" % offset,
                   value + b"x" * (RECORD_BYTES - len(value)), ())  # fmt: skip
        out.append(
            Record(
                key=run.key().encode(),
                value=run.encode(),
                headers=(("diode.session", SESSION.hex().encode()),),
                partition=0,
            )
        )
    return out


def state_magics(broker: object, state_topic: str) -> list[bytes]:
    """The magic of each committed state record, in order: a part's or a whole batch's."""
    records = consume_all(broker, state_topic, timeout=30, config=LARGE)
    return [bytes(r.value[: len(MAGIC)]) for r in records]


def test_a_task_that_died_after_a_part_of_a_long_batch_is_resumed_exactly_once(
    downstream_kafka, kafka_topic, tmp_path: Path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=1)
    produce_records(downstream_kafka, raw, large_records(), timeout=300,
                    config={"message.max.bytes": 64 << 20, "linger.ms": 0})  # fmt: skip
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw)
    env |= {"STATE_LAYOUT": "direct", "STATE_TOPIC": f"state.{raw}", "SPARK_MASTER": "local[2,3]",
            "KAFKA_CONF_TRANSACTION_TIMEOUT_MS": "3000", "PERSIST_INTERVAL_MS": "1000"}  # fmt: skip
    once = tmp_path / "after-part"
    run = run_dedup({**env, FAULT_ENV: f"task-after-part:*:0:{once}"}, "--until-settled")
    finish(run)
    assert once.exists(), "no part was committed"
    log = run.log_path.read_text()  # type: ignore[attr-defined]
    assert "Python worker exited unexpectedly" in log, log[-3000:]
    assert "committing part 1, through raw offset" in log
    assert "was committed; going on after it" in log
    clean = consume_all(downstream_kafka, f"clean.{raw}.{SOURCE}", expected_count=RECORDS,
                        timeout=120, config=LARGE)  # fmt: skip
    seen = Counter(int(r.value[: r.value.index(b":")]) for r in clean)
    assert seen == Counter(range(RECORDS))
    magics = state_magics(downstream_kafka, f"state.{raw}")
    assert PART_MAGIC in magics[:-1]
    assert magics[-1] == MAGIC
