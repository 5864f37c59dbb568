"""A local master gets task attempts, as a cluster does (``dedup.job.with_task_attempts``): with
``local[N]`` Spark gives a task one attempt, so a transient Kafka error in one task would end
the query and the process."""

from __future__ import annotations

import pytest

from dedup.job import LOCAL_TASK_ATTEMPTS, local_slots, with_task_attempts


@pytest.mark.parametrize(
    ("given", "runs"),
    [
        ("local", "local[1,4]"),
        ("local[2]", "local[2,4]"),
        ("local[*]", "local[*,4]"),
        ("local[2,1]", "local[2,1]"),  # a count given: kept, one attempt included
        ("local[*,3]", "local[*,3]"),
        ("spark://master:7077", "spark://master:7077"),
    ],
)
def test_a_local_master_without_a_count_gets_the_clusters_attempts(given: str, runs: str) -> None:
    assert LOCAL_TASK_ATTEMPTS == 4
    assert with_task_attempts(given) == runs
    assert local_slots(runs) == local_slots(given)  # the slots (and the heap for them) unchanged
