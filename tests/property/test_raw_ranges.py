"""What a micro-batch of the direct layout takes of each raw partition (``dedup/raw_ranges.py``),
over any backlog and ``MAX_OFFSETS_PER_TRIGGER``: never past a log end nor before where it
reads on, never more than the limit allows, always something while anything is behind, and
ranges that cover exactly what the batch took."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dedup.raw_ranges import Admission, plan_ends, ranges

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
