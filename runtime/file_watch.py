"""Files a running service re-reads without a restart, one rule for all of them.

The link key file (sender and receiver, ``runtime.link_key``), the public-key mode's receiver key
and trusted-sender files (``receiver.pubkey_glue``) and the content filter's rules file
(``sender.record_filter``) are all watched the same way:

- a file is re-read on SIGHUP (``reload``) and when its modification time differs from the one
  seen when it was last read (``changed``; ``check`` = ``changed`` then ``reload``; ``poll`` runs
  ``check`` every ``interval`` seconds). The time is taken *before* reading, so a change while
  reading is seen next time; an unreadable file (being replaced) is not a change yet;
- what is read is built completely first (``load``) and only then swapped in (``apply``): a file
  that fails to load leaves what is in force untouched, the failure is counted and logged (no
  traceback: the reason is the message), and the broken file is not retried until it changes
  again. Swapping a working key ring or rule set for an empty one because of a typo would
  surprise an operator at 3 a.m. more than keeping the old one does.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def mtime(path: Path) -> int | None:
    """Modification time of ``path`` in ns, None when it cannot be read."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class FileReloader(Generic[T]):
    """Some files, what was built from them, and the counts of reloads (module docstring)."""

    def __init__(
        self,
        paths: Sequence[Path],
        load: Callable[[], T],
        apply: Callable[[T], str],
        *,
        what: str,
        kept: str,
        errors: tuple[type[Exception], ...],
        seen: Sequence[int | None] | None = None,
    ) -> None:
        """``load`` builds from the files (raising one of ``errors`` when it cannot); ``apply``
        swaps the result in and returns what the success line says after ``"<what> reloaded"``.
        ``what`` and ``kept`` name the thing and what stays on failure in the log lines.
        ``seen``: the files' modification times taken before what is in force was read from
        them (so a change in between reloads); by default taken now."""
        self.paths = tuple(paths)
        self._load = load
        self._apply = apply
        self._what = what
        self._kept = kept
        self._errors = errors
        self._seen = tuple(seen) if seen is not None else self._mtimes()
        self.reloads = 0
        """Reloads that took effect."""
        self.reload_errors = 0
        """Reloads that failed (what was in force stayed)."""

    def _mtimes(self) -> tuple[int | None, ...]:
        return tuple(mtime(p) for p in self.paths)

    def changed(self) -> bool:
        """A file's modification time differs from the one last read (or seen), and every file
        can be read."""
        now = self._mtimes()
        return now != self._seen and None not in now

    def load(self) -> T:
        """Re-read the files now, marking them seen; nothing is swapped in (``reload`` does).

        Raises:
            Exception: one of ``errors``: the files are unusable.
        """
        self._seen = self._mtimes()
        return self._load()

    def reload(self, why: str) -> bool:
        """Re-read the files and swap in what they hold; on failure keep what is in force.

        Returns:
            True when the new content is in use.
        """
        try:
            fresh = self.load()
        except self._errors as exc:
            self.reload_errors += 1
            log.error(  # noqa: TRY400  the reason is in the message; a traceback adds nothing
                "%s: %s NOT reloaded, %s: %s", why, self._what, self._kept, exc
            )
            return False
        said = self._apply(fresh)
        self.reloads += 1
        log.info("%s: %s reloaded%s", why, self._what, said)
        return True

    def check(self, why: str) -> bool:
        """``reload`` when ``changed``; True when something new is in use."""
        return self.changed() and self.reload(why)


async def poll(reloader: FileReloader[T], interval: float, why: str) -> None:
    """Forever: every ``interval`` seconds, ``reloader.check(why)``."""
    while True:
        await asyncio.sleep(interval)
        reloader.check(why)
