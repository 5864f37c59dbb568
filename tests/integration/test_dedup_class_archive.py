"""The driver JVM's class archive with a real dedup, JVM and broker (dedup/class_archive.py,
docs/dedup.md "Start-up"): the first start's clean stop writes it, the next start's JVM maps it
(its memory map names the file), and both deliver every record once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.integration.test_dedup import (
    BASE_TS,
    SOURCE,
    finish,
    job_env,
    run_dedup,
    run_record,
)
from tests.kafka_helpers import consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_a_clean_stop_writes_the_archive_and_the_next_start_maps_it(
    downstream_kafka, kafka_topic, tmp_path: Path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=3)
    folder = tmp_path / "jvm-classes"
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag)
    env |= {"STATE_LAYOUT": "direct", "JVM_CLASS_ARCHIVE_DIR": str(folder)}
    expected: set[tuple[int, int]] = set()
    logs = []
    for step in range(2):
        first, last = 20 * step, 20 * step + 19
        produce_records(downstream_kafka, raw, [run_record(p, first, last) for p in range(3)])
        expected |= {(p, o) for p in range(3) for o in range(last + 1)}
        proc = run_dedup(env, "--until-settled")
        finish(proc)
        logs.append(proc.log_path.read_text(errors="replace"))  # type: ignore[attr-defined]
        archives = sorted(p.name for p in folder.iterdir())
        assert len(archives) == 1, archives
        assert archives[0].endswith(".jsa"), archives  # no part file left
        clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
        seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
        assert [k for k, n in seen.items() if n > 1] == []
        assert set(seen) == expected
    assert "wrote the JVM class archive" in logs[0], logs[0][-3000:]
    assert "mapped its class archive" not in logs[0]
    assert "the driver JVM mapped its class archive" in logs[1], logs[1][-3000:]
    assert "wrote the JVM class archive" not in logs[1]
