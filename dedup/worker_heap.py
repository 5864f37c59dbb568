"""Spark's Python workers: their loaded code kept out of the garbage collector's walks.

Runs in the executors' Python workers, never on the driver. PySpark's daemon calls
``gc.collect()`` after every task of a reused worker, and a full collection walks every object
the worker tracks: pandas, pyarrow, pyspark, confluent-kafka and this package, loaded once and
alive for the worker's life. Each micro-batch runs a few tasks per worker, so a quiet link paid
for those walks once a second whatever it carried: measured with ``perf`` at 5,000 records/s
(``bench/dedup_latency.py``), 60 % of the workers' CPU was ``gc_collect_main`` and its visitors
(docs/benchmarks.md "Dedup").

``gc.freeze()`` moves every object tracked at that moment into a permanent generation that
collections skip. It runs when a task's function is unpickled (``FreezeOnLoad``, carried in what
the job pickles for each task): the modules the task needs are imported by then and the task has
read no data yet, so what is frozen is code and module state. A frozen object still dies when its
last reference goes; only a reference cycle among frozen objects would outlive its use, and module
state does not become garbage. It freezes again only when modules were imported since the last
time (a worker's first task of each kind), so the freeze itself costs nothing per task.
"""

from __future__ import annotations

import gc
import sys

_frozen_modules = 0


def freeze_loaded_code() -> bool:
    """Freeze the tracked heap if modules were imported since the last freeze; True if it did."""
    global _frozen_modules  # noqa: PLW0603  one per worker process, by design
    loaded = len(sys.modules)
    if loaded == _frozen_modules:
        return False
    gc.freeze()
    _frozen_modules = loaded
    return True


class FreezeOnLoad:
    """A marker pickled with a task's function: unpickling it in a worker freezes the heap.

    Carries no data; equal to every other marker, so it changes no comparison of what holds it.
    """

    __slots__ = ()

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_unpickled, ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FreezeOnLoad)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "FreezeOnLoad()"


def _unpickled() -> FreezeOnLoad:
    freeze_loaded_code()
    return FreezeOnLoad()
