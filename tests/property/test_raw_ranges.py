"""What a micro-batch of the direct layout takes of each raw partition (``dedup/raw_ranges.py``),
over any backlog and ``MAX_OFFSETS_PER_TRIGGER``: never past a log end nor before where it
reads on, never more than the limit allows, always something while anything is behind, and
ranges that cover exactly what the batch took, in at most as many tasks as asked, each range in
exactly one, none of them empty, no task far heavier than it must be."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dedup.raw_ranges import Admission, plan_ends, ranges, task_groups

partitions = st.integers(min_value=1, max_value=16)


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    n = draw(partitions)
    start = {str(p): draw(st.integers(0, 10**12)) for p in range(n)}
    ends = {p: s + draw(st.integers(0, 10**7)) for p, s in start.items()}
    return start, ends


@given(backlogs(), st.integers(min_value=1, max_value=50_000_000))
def test_a_batch_takes_within_the_limit_and_always_makes_progress(
    backlog: tuple[dict[str, int], dict[str, int]], limit: int
) -> None:
    start, highs = backlog
    end = plan_ends(start, highs, {}, admission=Admission(max_offsets=limit), waited_ms=0,
                    fail_on_data_loss=True, topic="raw")  # fmt: skip
    behind = sum(highs[p] - start[p] for p in start)
    taken = sum(end[p] - start[p] for p in start)
    assert all(start[p] <= end[p] <= highs[p] for p in start)
    # each partition's share rounds down, or up to one record when under one
    assert taken <= max(limit, 0) + len(start)
    if behind <= limit:
        assert end == highs
    elif behind:
        assert taken >= min(limit, behind) - len(start)
        assert taken >= 1
    covered = {str(p): (s, e) for _, p, s, e in ranges("raw", start, end)}
    assert covered == {p: (start[p], end[p]) for p in start if end[p] > start[p]}


@given(backlogs(), st.integers(min_value=0, max_value=20))
def test_tasks_take_every_range_once_and_share_the_offsets(
    backlog: tuple[dict[str, int], dict[str, int]], tasks: int
) -> None:
    start, end = backlog
    found = ranges("raw", start, end)
    groups = task_groups(found, tasks)
    assert sorted(r for g in groups for r in g) == sorted(found)
    assert all(groups)
    assert all(g == sorted(g, key=lambda r: r[1]) for g in groups)
    assert len(groups) == (len(found) if tasks == 0 else min(tasks, len(found)))
    if groups:
        # longest first into the lightest: no task exceeds an even share by more than one range
        loads = [sum(r[3] - r[2] for r in g) for g in groups]
        longest = max(r[3] - r[2] for r in found)
        assert max(loads) <= sum(loads) / len(groups) + longest
    assert task_groups(found, tasks) == groups


@given(backlogs(), st.integers(min_value=0, max_value=20), st.integers(min_value=1, max_value=17))
def test_a_group_s_ranges_are_always_in_one_task_alone(
    backlog: tuple[dict[str, int], dict[str, int]], tasks: int, groups: int
) -> None:
    """With transaction groups each task is one group's ranges: never two tasks with one
    ``transactional.id``, never one task with two."""
    start, end = backlog
    found = ranges("raw", start, end)
    out = task_groups(found, tasks, groups)
    assert sorted(r for g in out for r in g) == sorted(found)
    assert all(out)
    assert all(g == sorted(g, key=lambda r: r[1]) for g in out)
    owners = [{r[1] % groups for r in g} for g in out]
    assert all(len(o) == 1 for o in owners)
    assert len({next(iter(o)) for o in owners}) == len(out)
    assert task_groups(found, tasks, groups) == out
