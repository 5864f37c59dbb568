"""PySpark's worker daemon, with the workers' code loaded once before it forks them.

Runs in the executors, as the process Spark starts to fork Python workers from
(``spark.python.daemon.module``, set by ``dedup/job.py``); never on the driver.

PySpark's own daemon forks each worker bare, and every worker then imports pandas, pyarrow,
PySpark's worker side, confluent-kafka and this package itself: ~0.75 CPU-s and ~74 MB of private
memory each, four times over in a local session (two concurrent tasks, each pipelining the
stateful step's worker into the write task's). Imported here, before the fork, those pages are
shared copy-on-write by every worker, and ``gc.freeze()`` keeps the collector's walks from
writing to them (a walk dirties each object's header, and a dirtied page is copied). Pages a
worker writes to later (reference counts of the objects it uses) are still copied one by one, so
the saving is measured, not assumed: docs/benchmarks.md "Dedup".

PySpark's daemon imports its worker after the fork "because pandas and pyarrow start threads when
imported" (its comment). Both do (a jemalloc background thread and an Arrow pool thread), and
both are fork-safe by design: Arrow re-creates its thread pools in a forked child and jemalloc
registers its own fork handlers (and our workers allocate through glibc,
``ARROW_DEFAULT_MEMORY_POOL=system``). The forked workers run every dedup test this suite has.

A preload that fails (a module missing on an executor) is reported on stderr and the daemon runs
as PySpark's would: the workers import what they need themselves.

The daemon also makes the directory its workers share the direct layout's committed state
records through (``dedup/state_reader.py``), private to this user, and removes it when it exits.
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from pyspark import daemon

#: What every worker of the dedup imports: the modules its tasks' functions live in pull in the
#: rest (pandas, pyarrow, confluent-kafka, pyroaring, fastavro).
PRELOADED_MODULES = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.streaming.state",
    "pandas",
    "pyarrow",
    "dedup.detect",
    "dedup.batch_driver",
)

#: The pid of the process that preloaded; a worker forked from it sees its parent's pid here
#: (tests/integration/test_dedup_workers.py asks a real worker).
preloaded_by: int | None = None


def preload() -> bool:
    """Import what the workers need and freeze it out of the collector's walks; True if all did."""
    global preloaded_by  # noqa: PLW0603  one per daemon process, by design
    try:
        for name in PRELOADED_MODULES:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001  any failure here only costs the sharing, never a task
        print(
            "kafka-diode worker daemon: preloading failed; workers import on their own:\n"
            + traceback.format_exc(),
            file=sys.stderr,
        )
        return False
    preloaded_by = os.getpid()
    gc.collect()
    gc.freeze()
    return True


def share_state() -> Path | None:
    """Make the directory the workers share committed state records through; None if it cannot
    be made (each worker then keeps its own, as PySpark's daemon's workers do)."""
    try:
        from dedup import state_reader  # noqa: PLC0415  a failed preload may mean it fails too

        shared = Path(tempfile.mkdtemp(prefix="kafka-diode-state-"))  # mode 0700
    except Exception:  # noqa: BLE001  any failure here only costs the sharing, never a task
        print(
            "kafka-diode worker daemon: no shared state directory:\n" + traceback.format_exc(),
            file=sys.stderr,
        )
        return None
    state_reader.share(shared)
    return shared


def main() -> None:
    preload()
    shared = share_state()
    owner = os.getpid()
    try:
        daemon.manager()
    finally:
        if shared is not None and os.getpid() == owner:
            # a forked worker leaves with os._exit, never through here
            shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    # ``python -m`` runs this file as ``__main__``; the workers look for ``preloaded_by`` in
    # ``dedup.worker_daemon``, so the preload runs in that module, not in this copy
    from dedup.worker_daemon import main as _main

    _main()
