"""The resend horizon through the real dedup (docs/gaps.md "Below-window policy"; slow, ~60 s).

A partition runs far past ``WINDOW_SIZE * MAX_WINDOWS`` offsets with three gaps in its early
part, so every window holding them is evicted and ``MAX_EXPIRED_GAPS`` remembers two of the
three below the floor. The dedup is stopped and started again (the expired list is state), then
late records arrive: a resend of a remembered gap is delivered once and the gap reported filled;
a resend of the forgotten one is dropped, its gap reported expired (a loss the operator sees,
never a silent one); a late copy of delivered offsets below the floor is not delivered again.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.integration.test_dedup import BASE_TS, SOURCE, finish, job_env, run_dedup, run_record
from tests.kafka_helpers import consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

HORIZON = {"WINDOW_SIZE": "64", "MAX_WINDOWS": "4", "MAX_EXPIRED_GAPS": "2"}
#: Offsets of partition 0 the link lost, oldest first; 256 offsets of windows are remembered.
LOST = [(10, 19), (30, 39), (50, 59)]
END = 1000


def test_resends_past_the_windows_are_delivered_or_reported_expired_never_silently_lost(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    clean_topic = f"clean.{tag}.{SOURCE}"
    create_topic(downstream_kafka, clean_topic, partitions=3)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag) | HORIZON
    edges = [-1, *(o for gap in LOST for o in gap), END]
    arrived = [run_record(0, edges[i] + 1, edges[i + 1] - 1) for i in range(0, len(edges), 2)]
    produce_records(downstream_kafka, raw, arrived)
    finish(run_dedup(env, "--until-settled"))

    # late: the remembered gap 30..39 resent, the forgotten 10..19 resent, a copy of 100..109
    produce_records(downstream_kafka, raw, [
        run_record(0, 30, 39), run_record(0, 10, 19), run_record(0, 100, 109),
    ])  # fmt: skip
    finish(run_dedup(env, "--until-settled"))

    clean = consume_all(downstream_kafka, clean_topic, timeout=30)
    seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert [k for k, n in seen.items() if n > 1] == []
    never = {o for first, last in (LOST[0], LOST[2]) for o in range(first, last + 1)}
    assert set(seen) == {(0, o) for o in range(END) if o not in never}
    gaps = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gaps if r.value is not None}
    states = sorted((g["first"], g["last"], g["state"]) for g in latest.values())
    assert states == [(10, 19, "expired"), (30, 39, "filled"), (50, 59, "open")]
