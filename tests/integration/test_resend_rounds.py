"""The resend procedure in rounds at volume, as docs/resend.md and docs/operations.md tell it.

A real pipeline (producer, sender, the netem relay at ``lossy-5``, receiver, Spark dedup) loses
a few thousand records in a few hundred gap ranges. Once every record is accounted for (in its
clean topic or inside an open gap), the operator resends in rounds too small for the whole loss:
``bundle create --max-records N`` with N about a quarter of what is missing, ``resend``, then
wait until the gap topic no longer lists what was resent open ("within a few
GAP_EMIT_INTERVAL_SEC"), and only then make the next bundle, until one lists nothing.

Checked: each bundle lists at most N offsets, and exactly the N lowest open ones (partition by
partition in (topic, partition) order); a bundle never lists again an offset an earlier resend
filled; together the bundles list exactly the offsets missing after the first pass; at the end
every record is in its clean topic exactly once and no gap is open.

The resends cross the same lossy link as the live stream, as they do at a site. They go with
``copies`` = 4, so a resent datagram is lost again only when all four copies are (5 % each,
independent: 1 in 160,000), and the test does not depend on that being rare: when the gap topic
still lists a resent offset open after ``FILL_TIMEOUT``, the raw topic must not hold it (it was
lost again on the link, not forgotten by the dedup), and only such offsets may appear in a later
bundle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.raw_topic import parse_raw_key
from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import wait_until
from kafka_diode.verify import latest_gaps, read_topic
from tests.kafka_helpers import consume_all

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.spark]

Offset = tuple[str, int, int]
"""(source topic, partition, offset)"""

#: Copies of each resent datagram over the 5 % link.
COPIES = 4
#: Seconds for the dedup to show a resend's offsets filled (a few GAP_EMIT_INTERVAL_SEC on an
#: idle host; the slow suite shares two cores with other Spark runs).
FILL_TIMEOUT = 120.0
#: Rounds at most, however many are lost again.
MAX_ROUNDS = 10


def bundle_offsets(path: Path) -> tuple[int, list[Offset]]:
    """The bundle file's ``record_count`` and its offsets in the order it lists them."""
    doc = json.loads(path.read_text())
    listed = [
        (part["topic"], part["partition"], offset)
        for part in doc["partitions"]
        for first, last in part["ranges"]
        for offset in range(first, last + 1)
    ]
    return doc["record_count"], listed


def open_offsets(p: Pipeline) -> list[Offset]:
    """Every offset an open gap of the gap topic lists, sorted as a bundle lists them."""
    gaps = latest_gaps(read_topic(p.ep.downstream, p.ep.gap_topic, committed_only=True))
    return sorted(
        (topic, partition, offset)
        for (topic, partition), ranges in gaps.items()
        for first, last in ranges
        for offset in range(first, last + 1)
    )


def raw_offsets(p: Pipeline) -> set[Offset]:
    """The source offsets of every record the receiver wrote to the raw topic."""
    records = consume_all(
        p.ep.downstream,
        p.ep.raw_topic,
        timeout=60,
        isolation_level="read_uncommitted",
        expand_runs=True,
    )
    return {parsed for r in records if (parsed := parse_raw_key(r.key)) is not None}


def wait_filled(p: Pipeline, resent: set[Offset]) -> set[Offset]:
    """Wait until the gap topic lists none of ``resent`` open; returns those lost again on the
    link (still open after ``FILL_TIMEOUT`` and never written to the raw topic)."""
    alive = list(p.group.processes.values())
    try:
        wait_until(
            lambda: not resent.intersection(open_offsets(p)),
            timeout=FILL_TIMEOUT,
            interval=1.0,
            what="the gap topic to show the resent offsets filled",
            alive=alive,
        )
    except TimeoutError:
        still_open = resent.intersection(open_offsets(p))
        arrived = still_open & raw_offsets(p)
        assert not arrived, f"received but still open: {sorted(arrived)[:10]}"
        return still_open
    return set()


def test_resend_in_rounds_with_max_records_fills_every_gap_once(
    upstream_kafka: LocalBroker, downstream_kafka: LocalBroker, tmp_path: Path
) -> None:
    spec = PipelineSpec(
        records=40_000,
        profile="lossy-5",
        seed=11,
        # paced; the resend checks that COPIES copies of a 16 MiB record leave at this rate
        # within the receiver's reassembly timeout
        rate_bytes=10_000_000,
        heartbeat_interval=0.5,
        window_size=1000,
        gap_emit_interval=1.0,
    )
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.start_with_backlog()
        verdict = p.wait_settled(timeout=600)
        assert verdict.promise_kept, verdict.line()
        missing = open_offsets(p)
        assert len(missing) == verdict.missing_reported, verdict.line()
        assert len(missing) >= 1000, verdict.line()  # thousands lost ...
        assert verdict.open_gaps >= 100, verdict.line()  # ... in many ranges

        cap = len(missing) // 4 + 1  # four rounds when nothing is lost again
        resent: set[Offset] = set()
        lost_again: set[Offset] = set()
        counts: list[int] = []
        relisted = 0
        for _ in range(MAX_ROUNDS):
            before = open_offsets(p)
            count, listed = bundle_offsets(p.resend_pass(max_records=cap, copies=COPIES))
            assert count == len(listed) <= cap
            assert listed == before[:cap], "not the lowest open offsets"
            if not listed:
                break
            counts.append(count)
            again = resent.intersection(listed)
            assert again <= lost_again, f"filled, yet listed again: {sorted(again - lost_again)}"
            relisted += len(again)
            resent.update(listed)
            lost_again |= wait_filled(p, set(listed))
        else:
            pytest.fail(f"still open after {MAX_ROUNDS} rounds: {counts}")

        assert len(counts) >= 3, counts
        assert resent == set(missing)  # no bundle listed an offset that was never missing
        assert sum(counts) == len(missing) + relisted  # each offset once, unless lost again
        verdict = p.wait_settled(timeout=120, want_ok=True)
        assert verdict.ok, verdict.line()
        assert verdict.exactly_once == p.produced == spec.records
        assert verdict.open_gaps == 0
