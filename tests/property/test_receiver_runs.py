"""The run coalescer's promise (receiver/runs.py) under any settings and any arrival order.

Whatever the cap, the linger, the strides, and however records arrive (lost, repeated, reordered,
interleaved over partitions and sessions, values larger than the cap, extreme timestamps, other
timestamp types), every record handed in comes out in exactly one run, the records of each
(session, topic, partition) in the order they were handed in, and every run decodes
(``common.raw_run.check_run``) to exactly its records; a run of more than one record never exceeds
the cap, and no run outlives its linger past a ``flush_due``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.raw_run import check_run, parse_run_key
from common.wire.events import RecordGroup
from receiver.runs import Run, RunCoalescer

SESSIONS = (b"\x01" * 16, b"\x02" * 16)
_payload = st.none() | st.binary(max_size=40) | st.builds(lambda n: b"x" * n, st.integers(0, 3000))
_headers = st.lists(
    st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=8)), max_size=3
).map(tuple)
_timestamp = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 2000)


@st.composite
def arrivals(draw: Any) -> tuple[int, float, list[tuple[str, Any]]]:
    cap = draw(st.integers(300, 6000))
    linger = draw(st.sampled_from([0.0, 0.001, 0.02, 1.0]))
    ops: list[tuple[str, Any]] = []
    nexts: dict[tuple[int, int], int] = {}
    now = 0.0
    for _ in range(draw(st.integers(1, 30))):
        now += draw(st.sampled_from([0.0, 0.0005, 0.01, 0.03]))
        kind = draw(st.sampled_from(["group"] * 6 + ["due", "partition"]))
        if kind == "due":
            ops.append(("due", now))
            continue
        session = draw(st.integers(0, 1))
        partition = draw(st.integers(0, 2))
        if kind == "partition":
            ops.append(("partition", partition))
            continue
        stride = draw(st.sampled_from([1, 1, 1, 2, 5]))
        at = nexts.get((session, partition), draw(st.integers(0, 100)))
        offsets = []
        for _ in range(draw(st.integers(1, 8))):
            offsets.append(at)
            step = draw(st.sampled_from([stride] * 6 + [0, 2 * stride, -3 * stride]))
            at = max(0, at + step)  # repeated, lost, older offsets now and then
        nexts[(session, partition)] = at
        n = len(offsets)
        group = RecordGroup(
            "t",
            partition,
            draw(st.sampled_from([1, 1, 1, 0, 2])),
            tuple(offsets),
            tuple(draw(st.lists(_timestamp, min_size=n, max_size=n))),
            tuple(draw(st.lists(_payload, min_size=n, max_size=n))),
            tuple(draw(st.lists(_payload, min_size=n, max_size=n))),
            tuple(draw(st.lists(_headers, min_size=n, max_size=n)))
            if draw(st.booleans())
            else ((),) * n,  # no headers: a group may continue its run in one piece
        )
        ops.append(("group", (SESSIONS[session], group, now)))
    return cap, linger, ops


def _records(group: RecordGroup) -> list[tuple[Any, ...]]:
    return [
        (group.timestamp_type, *record)
        for record in zip(
            group.offsets, group.timestamps, group.keys, group.values, group.headers, strict=True
        )
    ]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals())
def test_every_record_in_exactly_one_run_in_order(scenario: Any) -> None:
    cap, linger, ops = scenario
    coalescer = RunCoalescer(cap, linger)
    out: list[Run] = []
    handed: dict[tuple[bytes, int], list[tuple[Any, ...]]] = {}
    for kind, arg in ops:
        if kind == "group":
            session, group, now = arg
            handed.setdefault((session, group.partition), []).extend(_records(group))
            coalescer.add_group(session, group, now, out)
        elif kind == "due":
            coalescer.flush_due(arg, out)
            deadline = coalescer.next_deadline()
            assert deadline is None or deadline > arg
        else:
            coalescer.flush_partition("t", arg, out)
            assert all(run.partition != arg for run in _open_after(coalescer))
    coalescer.flush_all(out)
    assert len(coalescer) == 0
    assert coalescer.records == 0
    written: dict[tuple[bytes, int], list[tuple[Any, ...]]] = {}
    for run in out:
        parsed = parse_run_key(run.key)
        assert parsed == ("t", run.partition, run.first, run.last, run.stride)
        decoded = check_run(run.value, *parsed)
        assert len(decoded) == run.count
        if run.count > 1:
            assert len(run.value) <= cap
        written.setdefault((run.session_id, run.partition), []).extend(_records(decoded))
    assert written == handed


def _open_after(coalescer: RunCoalescer) -> list[Run]:
    """The runs still open, without disturbing them (a copy flushed)."""
    clone = RunCoalescer(1 << 20, 1.0)
    clone._open = coalescer._open.copy()
    clone._sessions = {k: set(v) for k, v in coalescer._sessions.items()}
    clone.records = coalescer.records
    runs: list[Run] = []
    clone.flush_all(runs)
    return runs
