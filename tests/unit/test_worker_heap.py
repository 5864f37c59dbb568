"""The Python workers' heap freeze (dedup/worker_heap.py): it happens where a task's function is
unpickled, before any data, and again only when new modules were loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pyspark import cloudpickle

from dedup.batch_driver import TaskSpec
from dedup.detect import DetectParams
from dedup.worker_heap import FreezeOnLoad
from dedup.writer_settings import WriterSettings

PARAMS = DetectParams(
    window_size=1000,
    max_windows=10,
    max_expired_gaps=10,
    max_state_bytes=1 << 20,
    scan_interval_ms=10_000,
)
SPEC = TaskSpec(
    settings=WriterSettings(
        bootstrap_servers="127.0.0.1:1",
        clean_topic="c",
        gap_topic="g",
        progress_topic="p",
        transactional_id="t",
    ),
    query_id="q",
    batch_id=7,
)


def _freeze_counts_after_loading(payload: bytes) -> list[int]:
    """In a fresh interpreter (a worker): the frozen object count before and after unpickling
    ``payload``, and after unpickling it again."""
    script = textwrap.dedent(
        """
        import gc, sys
        from pyspark import cloudpickle
        payload = sys.stdin.buffer.read()
        counts = [gc.get_freeze_count()]
        cloudpickle.loads(payload)
        counts.append(gc.get_freeze_count())
        cloudpickle.loads(payload)
        counts.append(gc.get_freeze_count())
        print(counts)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], input=payload, capture_output=True, check=True
    )
    return [int(n) for n in out.stdout.decode().strip("[]\n").split(",")]


def test_a_task_function_unpickled_in_a_worker_freezes_its_loaded_code_once() -> None:
    def detect(rows: int) -> int:  # a closure over the params, as dedup/job.py pickles it
        return rows + PARAMS.window_size

    before, loaded, again = _freeze_counts_after_loading(cloudpickle.dumps(detect))
    assert before == 0
    # the modules the function needs (pandas, pyarrow, this package) are frozen
    assert loaded > 10_000
    # a second task of the same kind loads no module: nothing more is frozen
    assert again == loaded


def test_the_write_tasks_spec_carries_the_freeze_and_round_trips() -> None:
    before, loaded, _ = _freeze_counts_after_loading(cloudpickle.dumps(SPEC))
    assert before == 0
    assert loaded > 10_000
    assert cloudpickle.loads(cloudpickle.dumps(SPEC)) == SPEC
    assert cloudpickle.loads(cloudpickle.dumps(PARAMS)) == PARAMS


def test_the_marker_holds_nothing() -> None:
    assert FreezeOnLoad() == FreezeOnLoad()
    assert len(cloudpickle.dumps(FreezeOnLoad())) < 100
