"""Observing runs (raw layout v2) is observing each offset: the same verdicts, gaps, windows,
expired gaps and withheld marks (docs/receiver.md "Runs").

Runs overlap earlier ones partly or wholly (a resend, a copy chain), cross window boundaries, fall
below the floor and into expired gaps; scans, heartbeats, withheld ranges and state round trips
are interleaved. One detector sees ``observe_run`` per run, the other ``observe`` per offset in
the same order; after every step their answers, reports and states must agree.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dedup.detector import DetectorConfig, PartitionDetector
from tests.property.test_gaps_model import same_state


def ranges_of(offsets: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][1] + 1 == o:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


@st.composite
def run_scenarios(draw):
    ws = draw(st.integers(1, 40))
    mw = draw(st.integers(1, 5))
    mxe = draw(st.integers(0, 6))
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["run"] * 6 + ["scan", "hb", "withheld", "roundtrip"]))
        if kind in ("run", "withheld"):
            first = draw(st.integers(0, 600))
            ops.append((kind, (first, first + draw(st.integers(0, 120)))))
        elif kind == "hb":
            ops.append((kind, (draw(st.integers(0, 700)), draw(st.none() | st.integers(0, 300)))))
        else:
            ops.append((kind, None))
    return DetectorConfig(window_size=ws, max_windows=mw, max_expired_gaps=mxe), ops


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_scenarios())
def test_observe_run_equals_observing_each_offset(scenario) -> None:
    config, ops = scenario
    runs = PartitionDetector("t", 0, config)
    each = PartitionDetector("t", 0, config)
    for now, (op, arg) in enumerate(ops, start=1):
        if op == "run":
            first, last = arg
            expected = [o for o in range(first, last + 1) if each.observe(o, now)]
            assert runs.observe_run(first, last, now) == ranges_of(expected), arg
        elif op == "withheld":
            assert runs.withhold(*arg, now) == each.withhold(*arg, now)
        elif op == "hb":
            high, low = arg
            low = None if low is None or low > high else low
            runs.heartbeat(high, now, low)
            each.heartbeat(high, now, low)
        elif op == "scan":
            assert runs.scan(now) == each.scan(now)
        else:
            runs = PartitionDetector.from_bytes(runs.to_bytes(), config)
            each = PartitionDetector.from_bytes(each.to_bytes(), config)
        assert runs.drain_reports() == each.drain_reports()
        assert same_state(runs, each)
        assert runs.low_watermark == each.low_watermark
        assert runs.first_offset == each.first_offset
