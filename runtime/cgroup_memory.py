"""The memory limit a service manager gives this process: systemd's ``MemoryMax=``, a container's.

Both are cgroup limits: cgroup v2's ``memory.max``, v1's ``memory.limit_in_bytes``, on the
process's cgroup or any ancestor; the smallest applies. A process past it is killed by the kernel
with no word of its own, so the dedup (its JVM heap) and the receiver (its buffers) compare what
they may hold with it at start. :func:`read_memory_limit` takes the file reader (tests give
fake files); :func:`service_memory_limit` reads the real ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

#: Limits at or above this are "no limit" (cgroup v1 writes 2**63 rounded down to a page).
_UNLIMITED = 1 << 60

Reader = Callable[[str], "str | None"]
MIB = 1 << 20


def read_memory_limit(read: Reader, root: str = "/sys/fs/cgroup") -> int | None:
    """The smallest memory limit, in bytes, on this process's cgroup and its ancestors (v2 and
    v1), or None without one. ``read(path)`` returns a file's text or None if it cannot."""
    table = read("/proc/self/cgroup")
    if table is None:
        return None
    limits: list[int] = []
    for line in table.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            limits += _limits(read, PurePosixPath(root), path, "memory.max")
        elif "memory" in controllers.split(","):
            limits += _limits(read, PurePosixPath(root, "memory"), path, "memory.limit_in_bytes")
    return min(limits, default=None)


def _limits(read: Reader, base: PurePosixPath, path: str, name: str) -> list[int]:
    found: list[int] = []
    node = PurePosixPath("/", path)
    for level in (node, *node.parents):
        text = read(str(base.joinpath(*level.parts[1:], name)))
        if text is not None and text.strip().isdigit() and int(text) < _UNLIMITED:
            found.append(int(text))
    return found


def read_text(path: str) -> str | None:
    """A small file's text, or None if it cannot be read."""
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return None


def service_memory_limit() -> int | None:
    """This process's memory limit in bytes (None: none)."""
    return read_memory_limit(read_text)
