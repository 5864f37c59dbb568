"""A real memory cgroup with a limit, for tests of what the dedup reads from the kernel."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MIB = 1 << 20
_ROOT = Path("/sys/fs/cgroup")


def memory_cgroup_base() -> tuple[Path, str] | None:
    """The writable memory hierarchy (v1's, else v2's where its root hands the memory
    controller to children) and its limit file's name, or None."""
    v1 = _ROOT / "memory"
    if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK):
        return v1, "memory.limit_in_bytes"
    try:
        delegated = "memory" in (_ROOT / "cgroup.subtree_control").read_text().split()
    except OSError:
        delegated = False
    if delegated and os.access(_ROOT, os.W_OK):
        return _ROOT, "memory.max"
    return None


needs_memory_cgroup = pytest.mark.skipif(
    memory_cgroup_base() is None, reason="needs a writable memory cgroup (root)"
)


@contextmanager
def limited_cgroup(limit_mib: int) -> Iterator[Path]:
    """A new memory cgroup with this limit; yields its ``cgroup.procs``. A process writes its pid
    there to enter; the group is removed after (its processes must have exited)."""
    found = memory_cgroup_base()
    assert found is not None
    base, limit_file = found
    group = base / f"kafka-diode-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(limit_mib * MIB))
        yield group / "cgroup.procs"
    finally:
        group.rmdir()


def enter_then_exec(procs: Path, argv: list[str]) -> list[str]:
    """A command that moves itself into the cgroup, then runs ``argv`` in its place."""
    code = (
        f"import os, sys; open({str(procs)!r}, 'w').write(str(os.getpid())); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", code, *argv]
