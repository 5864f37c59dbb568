"""Fault injection for the dedup's crash tests: exit the process at a named point, once.

Set only by tests (``KAFKA_DIODE_DEDUP_FAULT``); read in the write tasks and on the driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


#: ``<point>:<batch>:<partition>:<once-file>`` (several: comma-separated): at that point of
#: that batch (``*``: the first to get there) and partition the process exits (code
#: ``FAULT_EXIT``), once: only if it can
#: create the once-file. Points: ``task-before-commit``, ``task-in-commit`` (during the commit),
#: ``task-after-commit`` (a Python worker of the task dies), ``task-after-part`` (the same after
#: a part of the batch committed, ``dedup.commit.commit_batch``), ``driver-after-commit`` (every
#: task committed, Spark's commit log not written: the driver dies). Crash tests set it; nothing
#: else should.
FAULT_ENV = "KAFKA_DIODE_DEDUP_FAULT"
FAULT_EXIT = 70


def fault_matches(point: str, batch_id: int, partition: int) -> bool:
    for spec in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        name, batch, part, once = spec.split(":", 3)
        if (name, int(part)) != (point, partition) or batch not in ("*", str(batch_id)):
            continue
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        log.warning("injected fault %s at batch %d partition %d", point, batch_id, partition)
        return True
    return False


def fault(point: str, batch_id: int, partition: int) -> None:
    if fault_matches(point, batch_id, partition):
        os._exit(FAULT_EXIT)


@contextlib.contextmanager
def fault_during(point: str, batch_id: int, partition: int) -> Iterator[None]:
    """Exit from another thread while the body (a commit) runs, at a random moment in it."""
    if not fault_matches(point, batch_id, partition):
        yield
        return
    started = threading.Event()

    def kill() -> None:
        started.wait()
        time.sleep(random.uniform(0, 0.005))  # a random crash point in the commit
        os._exit(FAULT_EXIT)

    threading.Thread(target=kill, daemon=True).start()
    started.set()
    yield
    threading.Event().wait()  # the commit returned first: never go on past the crash point
