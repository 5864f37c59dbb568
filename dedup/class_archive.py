"""The driver JVM's class-data archive: Spark's classes mapped at start-up, not loaded one by one.

Why: a dedup that starts its own JVM (local mode, or a standalone master without spark-submit)
spends several seconds of every start loading, verifying and linking Spark's classes. Java's
application class-data sharing (AppCDS, a dynamic archive: ``-XX:ArchiveClassesAtExit`` writes
one when a JVM exits, ``-XX:SharedArchiveFile`` maps it) takes most of that away, so a restart
(systemd's after a failure, an upgrade, an operator's) reaches its first micro-batch sooner
(docs/benchmarks.md "Dedup start-up").

How (``JVM_CLASS_ARCHIVE_DIR``, docs/dedup-internals.md "The driver JVM's class archive"):

1. ``plan`` names the archive after what decides whether a JVM may map it: the java binary, the
   jars of Spark's classpath and the jars the dedup adds (a hash, so an upgrade of any of them
   gives a new name, never a stale archive). When it exists the JVM maps it; the JVM itself
   checks it again and starts without it (one warning line) if it does not fit.
2. When it does not exist, the JVM is asked to write one at its exit, to a file of this process's
   own (``<name>.<pid>.part``): two dedups writing at once never share a file.
3. ``finish`` (after a clean stop of the session) ends the JVM, waits for it and renames a
   complete file into place; a JVM that was killed or failed leaves no archive (its part file is
   removed by the next start). At most ``KEEP`` archives stay in the directory (~150 MB each).

Nothing here is needed for correctness: an archive only changes how the JVM loads its classes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from runtime import file_watch

log = logging.getLogger(__name__)

KEY = "JVM_CLASS_ARCHIVE_DIR"
#: Archives kept in the directory (the newest by use); each is ~150 MB.
KEEP = 2
#: How long ``finish`` waits for the JVM to write the archive and exit.
EXIT_WAIT_S = 120.0
_SUFFIX = ".jsa"
_PART = ".part"


@dataclass(frozen=True)
class ArchivePlan:
    """What this start does with the archive."""

    option: str
    """The JVM option: map the archive, or write one at exit."""
    archive: Path
    """The archive's place."""
    writing: Path | None
    """The file the JVM writes at exit (None: the archive exists and is mapped)."""


def directory(setting: str, env: Mapping[str, str], cache_root: Path) -> Path | None:
    """The archive directory ``JVM_CLASS_ARCHIVE_DIR`` names: ``off`` none; ``auto`` systemd's
    ``$CACHE_DIRECTORY`` (a unit's ``CacheDirectory=``) or the cache root's ``jvm-classes``;
    else the path given."""
    value = setting.strip()
    if value == "off":
        return None
    if value == "auto":
        cache = env.get("CACHE_DIRECTORY", "").split(":")[0].strip()
        return Path(cache) / "jvm-classes" if cache else cache_root / "jvm-classes"
    return Path(value)


def check_setting(setting: str) -> None:
    """Refuse, at start and before anything waits (for Kafka, for Spark), a directory the operator
    named that cannot be created or written: its nearest existing ancestor is not a writable
    directory. Creates nothing (``--check-config`` runs it too); ``plan`` checks again.

    Raises:
        ConfigError: naming ``JVM_CLASS_ARCHIVE_DIR`` and the fix.
    """
    if not named(setting):
        return
    existing = Path(setting.strip()).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = _not_writable(existing)
    if why is not None:
        raise _unusable(why)


def named(setting: str) -> bool:
    """The setting names a directory (not ``auto``, not ``off``): one that cannot be used is a
    configuration error, not a quiet start without an archive."""
    return setting.strip() not in {"auto", "off"}


def _not_writable(folder: Path) -> str | None:
    if not folder.is_dir():
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable"
    return None


def _unusable(why: str) -> ConfigError:
    return ConfigError(KEY, f"cannot be used: {why}", "name a writable directory, or off")


def archive_name(java: Path, classpath_dirs: Sequence[Path], jars: Sequence[str]) -> str:
    """A name that changes with anything the archive depends on: the java binary (its real path,
    size and time), each jar of ``classpath_dirs`` and each of ``jars`` (path, size, time)."""
    digest = hashlib.sha256()
    files = [java.resolve()]
    for folder in classpath_dirs:
        files += sorted(folder.glob("*.jar"))
    files += [Path(jar) for jar in jars]
    for path in files:
        try:
            size = path.stat().st_size
        except OSError:
            digest.update(f"{path}:missing\n".encode())
            continue
        digest.update(f"{path}:{size}:{file_watch.mtime(path)}\n".encode())
    return "dedup-" + digest.hexdigest()[:20]


def plan(
    folder: Path | None, name: str, *, explicit: bool, pid: int | None = None
) -> ArchivePlan | None:
    """This start's use of the archive in ``folder`` (None: none).

    Raises:
        ConfigError: ``explicit`` (the operator named the directory) and it cannot be created or
            written. The default directory that cannot be is only logged: the dedup runs
            without an archive.
    """
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if (why := _not_writable(folder)) is not None:
            raise PermissionError(why)
    except OSError as exc:
        if explicit:
            raise _unusable(str(exc)) from None
        log.info("no JVM class archive (%s; %s=off says so quietly)", exc, KEY)
        return None
    _remove_dead_parts(folder)
    archive = folder / (name + _SUFFIX)
    if archive.is_file():
        archive.touch()  # kept as the newest by use (``_prune``)
        return ArchivePlan(f"-XX:SharedArchiveFile={archive}", archive, None)
    writing = folder / f"{name}.{pid if pid is not None else os.getpid()}{_PART}"
    # the JVM names each class it cannot archive (from signed jars) as a warning: not news
    return ArchivePlan(f"-XX:ArchiveClassesAtExit={writing} -Xlog:cds=error", archive, writing)


def check_mapped(archive_plan: ArchivePlan | None, jvm: subprocess.Popen[bytes] | None) -> bool:
    """Once the JVM runs with an archive to map: whether it mapped it (Linux: its memory map
    names the file). One it did not map (it says why in its own warning) is removed, so that
    the next clean stop writes one that fits. True when there was nothing to check."""
    if archive_plan is None or archive_plan.writing is not None or jvm is None:
        return True
    try:
        maps = Path(f"/proc/{jvm.pid}/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # not Linux, or the JVM is gone (the start fails on its own)
    if os.path.realpath(archive_plan.archive) in maps:
        log.info("the driver JVM mapped its class archive %s", archive_plan.archive)
        return True
    log.warning(
        "the driver JVM did not map its class archive %s (its own warning says why); removed, "
        "the next clean stop writes a new one",
        archive_plan.archive,
    )
    archive_plan.archive.unlink(missing_ok=True)
    return False


def finish(archive_plan: ArchivePlan | None, jvm: subprocess.Popen[bytes] | None) -> None:
    """After the session stopped: when this start writes the archive, end the JVM (EOF on the
    stdin pyspark gave it), wait for it to write and exit, and rename a complete archive into
    place. Never raises: an archive is an optimisation."""
    if archive_plan is None or archive_plan.writing is None:
        return
    writing = archive_plan.writing
    try:
        if jvm is None:
            return
        log.info("writing the JVM class archive %s (once; about 150 MB)", archive_plan.archive)
        if jvm.stdin is not None:
            jvm.stdin.close()
        code = jvm.wait(EXIT_WAIT_S)
        if code == 0 and writing.is_file() and writing.stat().st_size > 0:
            os.replace(writing, archive_plan.archive)
            size = archive_plan.archive.stat().st_size
            log.info(
                "wrote the JVM class archive %s (%d MB); the next start maps it",
                archive_plan.archive,
                size >> 20,
            )
            _prune(archive_plan.archive.parent)
        else:
            log.info("the JVM wrote no class archive (exit code %s)", code)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("no JVM class archive written: %s", exc)
    finally:
        writing.unlink(missing_ok=True)


def _remove_dead_parts(folder: Path) -> None:
    """Part files whose writer is gone (a JVM killed while writing): never complete."""
    for part in folder.glob("*" + _PART):
        pid_text = part.name[: -len(_PART)].rpartition(".")[2]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue
        part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prune(folder: Path) -> None:
    """Keep the ``KEEP`` archives used last."""
    archives = sorted(
        folder.glob("*" + _SUFFIX), key=lambda p: file_watch.mtime(p) or 0, reverse=True
    )
    for old in archives[KEEP:]:
        old.unlink(missing_ok=True)
