"""The benches' /proc readings: a child still in its parent's address space counts once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from bench import e2e
from bench.e2e import group_pss, group_usage, shares_address_space

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def test_a_thread_shares_its_process_address_space_and_a_child_does_not() -> None:
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def hold() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert ready.wait(10)
        assert shares_address_space(tid[0], os.getpid())
        assert not shares_address_space(child.pid, os.getpid())
    finally:
        done.set()
        thread.join()
        child.kill()
        child.wait()


@contextlib.contextmanager
def parent_and_child() -> Iterator[int]:
    """A process group of two sleeping interpreters (parent and child): the parent's pid, once
    the child sleeps (its memory no longer grows: readings taken apart agree)."""
    sleeper = "import time; print('asleep', flush=True); time.sleep(30)"
    script = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper!r}])"
    parent = subprocess.Popen(
        [sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"asleep\n", "the child never started"
        yield parent.pid
    finally:
        os.killpg(parent.pid, 9)
        parent.communicate()


def test_a_child_in_its_parent_address_space_is_left_out_of_the_memory_sums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with parent_and_child() as parent:
        both_pss, (_, both_hwm, n) = group_pss(parent), group_usage(parent)
        assert n == 2, "the child never appeared"
        # the kernel's answer for a child that has not called exec yet, which a test cannot
        # hold still long enough to observe
        monkeypatch.setattr(e2e, "shares_address_space", lambda pid, _parent: pid != parent)
        alone_pss, (_, alone_hwm, n) = group_pss(parent), group_usage(parent)
        assert n == 2  # still a member for CPU
        assert 0 < alone_pss < both_pss
        assert 0 < alone_hwm < both_hwm


def test_one_proc_scan_shared_between_readings_finds_the_same_group() -> None:
    """The sampler scans /proc once per sample and hands the members to every reading."""
    with parent_and_child() as parent:
        members = e2e._group_members(parent, e2e.proc_table())
        assert sorted(path for path, _ in members) == sorted(
            path for path, _ in e2e._group_members(parent)
        )
        assert len(members) == 2, "the child never appeared"
        assert group_usage(parent, members)[1:] == group_usage(parent)[1:]
        assert group_pss(parent, members) > 0
        assert group_pss(parent, []) == 0  # the members given are what is read
