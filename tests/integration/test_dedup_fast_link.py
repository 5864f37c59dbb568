"""The setting docs/dedup.md recommends for fast links of large records, under sustained load
(slow: ~2 minutes).

``KAFKA_SOURCE_MINOFFSETSPERTRIGGER=1600`` with ``KAFKA_SOURCE_MAXTRIGGERDELAY=10s`` ("Fast links
of large records: bigger batches"): a batch waits for 1,600 raw runs (~100 MB of full runs) or
10 s. A paced writer offers runs of six 10 KB records at 10 MB/s for 30 s into the raw topic, as
the receiver writes a busy link, while ``kafka-diode dedup`` runs with its other defaults: every
record reaches the clean topic exactly once, in a handful of batches where the 1 s trigger takes
one a second.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter

import pytest

from common.raw_run import RunBuilder
from tests.integration.test_dedup import BASE_TS, SESSION, SOURCE, finish, job_env, run_dedup
from tests.kafka_helpers import Record, consume_all, produce_records, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

FAST_LINK = {"KAFKA_SOURCE_MINOFFSETSPERTRIGGER": "1600", "KAFKA_SOURCE_MAXTRIGGERDELAY": "10s"}
PARTITIONS = 2
RUN_RECORDS = 6
VALUE_BYTES = 10_000
MBPS = 10
SECONDS = 30
#: Runs offered per partition: 10 MB/s of 60 KB runs for 30 s, over both partitions.
RUNS = MBPS * 1_000_000 * SECONDS // (RUN_RECORDS * VALUE_BYTES) // PARTITIONS
TICK_S = 0.5
_BATCH = re.compile(r"batch (\d+): (\d+) records")


def run(partition: int, index: int) -> Record:
    """Run ``index`` of a partition: six records of 10 KB, each value naming its offset."""
    first = index * RUN_RECORDS
    builder = RunBuilder(SOURCE, partition, 1, first, BASE_TS + first)
    for offset in range(first, first + RUN_RECORDS):
        value = b"%d:%d:" % (partition, offset)
        builder.append(
            offset, BASE_TS + offset, b"k%d" % offset, value.ljust(VALUE_BYTES, b"v"), ()
        )
    return Record(
        key=builder.key().encode(),
        value=builder.encode(),
        headers=(("diode.session", SESSION.hex().encode()),),
        partition=partition,
    )


def test_batches_of_1600_runs_or_10_s_deliver_a_fast_link_exactly_once(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=PARTITIONS)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw) | FAST_LINK
    env |= {"PERSIST_INTERVAL_MS": "1000", "WINDOW_SIZE": "65536", "MAX_WINDOWS": "16"}
    env |= {"STATE_TOPIC": f"state.{raw}", "LOG_LEVEL": "DEBUG"}
    clean_topic = f"clean.{raw}.{SOURCE}"
    proc = run_dedup(env, "--until-idle", "25")
    try:
        # the first run waits out MAXTRIGGERDELAY alone: the dedup is running once it is clean
        produce_records(downstream_kafka, raw, [run(p, 0) for p in range(PARTITIONS)])

        def first_delivered() -> bool:
            assert proc.poll() is None, proc.log_path.read_text()[-4000:]  # type: ignore[attr-defined]
            try:
                return len(consume_all(downstream_kafka, clean_topic, timeout=2)) > 0
            except RuntimeError:  # not created yet
                return False

        wait_until(first_delivered, timeout=180, interval=1.0, message="a first clean record")
        per_tick = round(RUNS * TICK_S / SECONDS)
        started = time.monotonic()
        for tick, first in enumerate(range(1, RUNS, per_tick)):
            # pacing, not synchronisation: the writer offers 10 MB/s as a busy link does
            time.sleep(max(0.0, started + tick * TICK_S - time.monotonic()))
            indices = range(first, min(first + per_tick, RUNS))
            produce_records(
                downstream_kafka, raw, [run(p, i) for i in indices for p in range(PARTITIONS)]
            )
        offered_s = time.monotonic() - started
        finish(proc, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    total = PARTITIONS * RUNS * RUN_RECORDS
    clean = consume_all(downstream_kafka, clean_topic, expected_count=total, timeout=300)
    seen = Counter(r.value[: r.value.index(b":", r.value.index(b":") + 1)] for r in clean)
    assert len(seen) == total
    assert max(seen.values()) == 1
    log = proc.log_path.read_text()  # type: ignore[attr-defined]
    batches = [int(n) for _, n in _BATCH.findall(log) if int(n) > 0]
    assert sum(batches) == total
    # the 1 s trigger makes a batch a second of the 30 or more; 1,600 runs or 10 s make one per
    # 10 s at most, besides the first run's and the tail's
    assert len(batches) <= 2 + math.ceil(offered_s / 10) + 1, (offered_s, batches)
