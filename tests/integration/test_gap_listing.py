"""``kafka-diode gaps``: the open gaps of a real gap topic, as a table and as JSON.

The gap topic is written with the gap record codec the dedup uses (common/gap_record.py), so
what the command lists is exactly what the dedup reported: the latest state per gap key, open
ones only, tombstones and malformed records skipped (the latter counted on stderr).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from common.gap_record import GapReport, GapState, gap_key, gap_value
from tests.kafka_helpers import bootstrap_of, produce_records


def _gap(topic: str, partition: int, first: int, last: int, state: GapState) -> GapReport:
    return GapReport(
        topic=topic, partition=partition, first=first, last=last, state=state,
        detected_at=1_700_000_000_000, reported_at=1_700_000_001_000,
    )  # fmt: skip


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_diode", "gaps", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "BOOTSTRAP_SERVERS": ""},
    )


def test_gaps_lists_the_latest_open_state_of_each_gap(
    downstream_kafka: object, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(downstream_kafka, partitions=2)
    bootstrap = bootstrap_of(downstream_kafka)  # type: ignore[arg-type]
    reports = [
        _gap("orders", 0, 10, 19, GapState.OPEN),
        _gap("orders", 0, 10, 19, GapState.FILLED),  # closed later: not listed
        _gap("orders", 1, 5, 5, GapState.OPEN),
        _gap("audit", 0, 100, 149, GapState.OPEN),
        _gap("audit", 0, 300, 300, GapState.EXPIRED),
    ]
    records: list[tuple[bytes | None, bytes | None]] = [(gap_key(r), gap_value(r)) for r in reports]
    records += [(b"audit:0:100", None), (b"audit:0:100", gap_value(reports[3]))]  # back again
    records += [(b"orders:0:7", b"{not json")]
    produce_records(downstream_kafka, topic, records)

    listed = _run("--bootstrap-servers", bootstrap, "--gap-topic", topic, "--json")
    assert listed.returncode == 0, listed.stderr
    gaps = json.loads(listed.stdout)
    assert [(g["topic"], g["partition"], g["first"], g["last"], g["count"]) for g in gaps] == [
        ("audit", 0, 100, 149, 50),
        ("orders", 1, 5, 5, 1),
    ]
    assert "1 unreadable record(s)" in listed.stderr

    table = _run("--bootstrap-servers", bootstrap, "--gap-topic", topic, "--topic", "orders")
    assert table.returncode == 0, table.stderr
    assert "1 open gap(s), 1 offset(s) missing" in table.stdout
    assert "audit" not in table.stdout


def test_gaps_says_what_is_wrong_when_the_topic_is_missing(downstream_kafka: object) -> None:
    bootstrap = bootstrap_of(downstream_kafka)  # type: ignore[arg-type]
    missing = _run(
        "--bootstrap-servers", bootstrap, "--gap-topic", "no-such-gaps", "--timeout", "10"
    )
    assert missing.returncode == 1
    assert "no-such-gaps" in missing.stderr
    assert "Traceback" not in missing.stderr
    no_bootstrap = _run("--gap-topic", "x")
    assert no_bootstrap.returncode == 2
    assert "BOOTSTRAP_SERVERS" in no_bootstrap.stderr
