"""kafka-diode's own JVM classes: compiled once with ``javac`` and cached as a jar.

Guarantee: as for the Maven jar sets (``runtime/maven.py``), a compiled jar is either complete in
the cache (its directory holds the jar and a ``COMPLETE`` marker naming it) or built again. A
build compiles into a temporary sibling directory and renames it into place only when the jar
and the marker are written. The directory's name carries a digest of the sources and of the
classpath's jar names (their versions), so a changed source or another Spark builds anew.

Cache layout (``KAFKA_DIODE_CACHE`` or ``~/.cache/kafka-diode``)::

    jars/<name>-<digest>/<name>.jar + COMPLETE

Compiling needs a JDK: ``$JAVA_HOME/bin/javac``, else ``javac`` on ``PATH``. A Java runtime
without it raises :class:`JvmBuildError`, and the caller decides what to run without the class.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.errors import JvmBuildError
from runtime.maven import cache_root, complete_jars, publish

log = logging.getLogger(__name__)

#: Spark 4 runs on Java 17 and later: the classes target 17 whatever the JDK compiling them.
RELEASE = "17"
#: javac of a class or two takes ~2 s; a loaded host is given far more.
JAVAC_TIMEOUT_S = 180.0


def javac_executable(env: Mapping[str, str] | None = None) -> str:
    """``$JAVA_HOME/bin/javac``, else ``javac`` on ``PATH``.

    Raises:
        JvmBuildError: neither exists (a Java runtime without its compiler).
    """
    environ = os.environ if env is None else env
    java_home = environ.get("JAVA_HOME", "").strip()
    if java_home:
        candidate = Path(java_home) / "bin" / "javac"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("javac", path=environ.get("PATH"))
    if found is None:
        raise JvmBuildError(
            "no 'javac' (a Java runtime without its compiler): install a JDK "
            "(apt-get install openjdk-17-jdk-headless) or point JAVA_HOME at one"
        )
    return found


def compiled_jar(
    name: str,
    sources: Sequence[Path],
    classpath: Sequence[Path],
    env: Mapping[str, str] | None = None,
) -> Path:
    """The jar of ``sources`` compiled against the jars in ``classpath`` (directories of jars);
    compiled only if the cache lacks it.

    Raises:
        JvmBuildError: no ``javac``, it failed (its first error in the message), or the cache
            cannot be written.
    """
    digest = _digest(sources, classpath)
    final = cache_root(env) / "jars" / f"{name}-{digest}"
    jars = complete_jars(final)
    if jars is not None:
        return jars[0]
    javac = javac_executable(env)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as exc:  # a read-only cache (a systemd unit's ProtectSystem=strict)
        raise JvmBuildError(
            f"cannot build {name} in {final.parent} ({exc}): run 'kafka-diode local-kafka fetch' "
            "where a JDK is and the cache is writable, and ship its jars/ directory"
        ) from exc
    try:
        classes = staging / "classes"
        command = [
            javac,
            "--release",
            RELEASE,
            "-Xlint:-path",  # Spark's jars name absent jars in their manifests
            "-cp",
            os.pathsep.join(str(directory / "*") for directory in classpath),
            "-d",
            str(classes),
            *(str(source) for source in sources),
        ]
        log.info("compiling %s into %s", name, final)
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JvmBuildError(f"cannot run {javac}: {exc}") from exc
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            raise JvmBuildError(
                f"javac failed on {name} (exit {result.returncode}): {output[0][:300]}"
            )
        jar = staging / f"{name}.jar"
        try:
            with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(classes.rglob("*.class")):
                    archive.write(path, path.relative_to(classes).as_posix())
            shutil.rmtree(classes)
            publish(staging, final, [jar.name], name=name, digest=digest)
        except OSError as exc:
            raise JvmBuildError(f"cannot write {name} into {final}: {exc}") from exc
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    jars = complete_jars(final)
    if jars is None:  # pragma: no cover - publish either completes the directory or raises
        raise JvmBuildError(f"{final} is incomplete after compiling {name}")
    return jars[0]


def _digest(sources: Sequence[Path], classpath: Sequence[Path]) -> str:
    sha = hashlib.sha256(RELEASE.encode())
    for source in sources:
        sha.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    for directory in classpath:
        for jar in sorted(directory.glob("*.jar")):
            sha.update(jar.name.encode() + b"\0")
    return sha.hexdigest()[:16]
