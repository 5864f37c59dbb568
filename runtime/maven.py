"""Jars for the embedded Kafka broker and Spark's Kafka connector, fetched once and cached.

Guarantee: a jar set is either *complete* in the cache (its directory exists and holds a
``COMPLETE`` marker listing every jar, all present) or it is fetched again. A fetch runs Maven into
a temporary sibling directory and renames it into place only after Maven succeeded and the marker is
written, so an interrupted or failed download never looks complete. Once a set is complete, this
module touches neither the network nor Maven: it only reads the directory.

Cache layout (``KAFKA_DIODE_CACHE`` or ``~/.cache/kafka-diode``)::

    jars/kafka-broker-<kafka version>/*.jar + COMPLETE
    jars/spark-kafka-<spark version>/*.jar + COMPLETE
    maven/settings.xml     the mirror settings every mvn call uses (Maven Central only)
    maven/<set>/pom.xml    the generated pom of the last fetch

Environment: ``KAFKA_DIODE_CACHE`` (cache root), ``KAFKA_DIODE_MVN`` (the Maven executable,
default ``mvn`` on ``PATH``), ``JAVA_HOME`` (the Java to use; default ``java`` on ``PATH``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.errors import LocalKafkaError

log = logging.getLogger(__name__)

#: The one pinned Apache Kafka release the embedded broker runs (KRaft only since 4.0).
KAFKA_VERSION = "4.1.1"
#: Kafka 4.1 logs through slf4j 1.7; this log4j2 release and its slf4j 1.x binding carry the logs.
LOG4J_VERSION = "2.24.3"
#: Must equal the pinned pyspark version: Spark refuses a connector built for another release.
SPARK_VERSION = "4.2.0"
#: The kafka-clients and commons-pool2 versions spark-sql-kafka-0-10 4.2.0 was built against.
SPARK_KAFKA_CLIENTS_VERSION = "3.9.2"
COMMONS_POOL2_VERSION = "2.13.1"
SCALA_BINARY_VERSION = "2.13"
MIN_JAVA_MAJOR = 17
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"

MARKER = "COMPLETE"
#: A cold fetch of the broker set took 1-2 minutes here; ten is generous for a slow mirror.
FETCH_TIMEOUT_S = 600.0
JAVA_PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class JarSet:
    """A named, versioned group of Maven artifacts cached together in one directory."""

    name: str
    """Directory prefix in the cache, e.g. ``kafka-broker``."""
    version: str
    """The version that names the set (the directory is ``<name>-<version>``)."""
    coordinates: tuple[str, ...]
    """``group:artifact:version`` of every artifact asked for directly."""
    transitive: bool
    """Whether dependencies of the coordinates are fetched too (runtime scope)."""

    @property
    def dirname(self) -> str:
        """The set's directory name under ``jars/``."""
        return f"{self.name}-{self.version}"


KAFKA_BROKER_JARS = JarSet(
    name="kafka-broker",
    version=KAFKA_VERSION,
    coordinates=(
        f"org.apache.kafka:kafka_{SCALA_BINARY_VERSION}:{KAFKA_VERSION}",
        f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
        f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
    ),
    transitive=True,
)

# Non-transitive on purpose: everything else the connector needs (Spark itself, Hadoop, slf4j,
# lz4, snappy, zstd) ships inside pyspark's own jars directory, and two copies on one classpath
# is how version conflicts start.
SPARK_CONNECTOR_JARS = JarSet(
    name="spark-kafka",
    version=SPARK_VERSION,
    coordinates=(
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{SPARK_VERSION}",
        f"org.apache.spark:spark-token-provider-kafka-0-10_{SCALA_BINARY_VERSION}:{SPARK_VERSION}",
        f"org.apache.kafka:kafka-clients:{SPARK_KAFKA_CLIENTS_VERSION}",
        f"org.apache.commons:commons-pool2:{COMMONS_POOL2_VERSION}",
    ),
    transitive=False,
)

_SETTINGS_XML = f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by kafka-diode. Every repository (including those declared in parent poms, such as
     Spark's) is mirrored to Maven Central, the only repository these machines reach. -->
<settings>
  <mirrors>
    <mirror>
      <id>kafka-diode-central</id>
      <mirrorOf>*</mirrorOf>
      <url>{MAVEN_CENTRAL}</url>
    </mirror>
  </mirrors>
</settings>
"""


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The cache root: ``$KAFKA_DIODE_CACHE`` or ``~/.cache/kafka-diode``."""
    environ = os.environ if env is None else env
    configured = environ.get("KAFKA_DIODE_CACHE", "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "kafka-diode"


def jar_dir(jar_set: JarSet, env: Mapping[str, str] | None = None) -> Path:
    """Where ``jar_set`` lives (or will live) in the cache."""
    return cache_root(env) / "jars" / jar_set.dirname


def cached_jars(jar_set: JarSet, env: Mapping[str, str] | None = None) -> list[Path] | None:
    """The jars of a complete cached set, or None when it is missing or incomplete."""
    return complete_jars(jar_dir(jar_set, env))


def complete_jars(directory: Path) -> list[Path] | None:
    """The jars a cache directory's ``COMPLETE`` marker lists, or None unless all are there."""
    marker = directory / MARKER
    try:
        names = json.loads(marker.read_text(encoding="utf-8"))["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    jars = [directory / str(name) for name in names]
    if not jars or not all(jar.is_file() for jar in jars):
        return None
    return jars


def ensure_jars(jar_set: JarSet, env: Mapping[str, str] | None = None) -> list[Path]:
    """Return the jars of ``jar_set``, fetching them with Maven only if the cache lacks them.

    Raises:
        LocalKafkaError: Maven is missing, or the download failed; the message says what to do.
    """
    jars = cached_jars(jar_set, env)
    if jars is not None:
        return jars
    _fetch(jar_set, env)
    jars = cached_jars(jar_set, env)
    if jars is None:  # pragma: no cover - _fetch either completes the set or raises
        raise LocalKafkaError(f"jar cache {jar_dir(jar_set, env)} is incomplete after a fetch")
    return jars


def ensure_kafka_jars(env: Mapping[str, str] | None = None) -> Path:
    """The directory holding the broker's jars (``<dir>/*`` is its classpath)."""
    ensure_jars(KAFKA_BROKER_JARS, env)
    return jar_dir(KAFKA_BROKER_JARS, env)


def spark_connector_jars(env: Mapping[str, str] | None = None) -> list[Path]:
    """Spark's Kafka connector jars (four files) for ``spark.jars``; fetched if missing."""
    return ensure_jars(SPARK_CONNECTOR_JARS, env)


def maven_settings(env: Mapping[str, str] | None = None) -> Path:
    """Write (if needed) and return the Maven settings file that mirrors everything to Central."""
    path = cache_root(env) / "maven" / "settings.xml"
    if not path.is_file() or path.read_text(encoding="utf-8") != _SETTINGS_XML:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_SETTINGS_XML, encoding="utf-8")
    return path


def _pom(jar_set: JarSet) -> str:
    deps = []
    for coordinate in jar_set.coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    body = "\n".join(deps)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by kafka-diode to resolve the {jar_set.dirname} jar set; not a build. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafka-diode.cache</groupId>
  <artifactId>{jar_set.name}</artifactId>
  <version>{jar_set.version}</version>
  <packaging>pom</packaging>
  <dependencies>
{body}
  </dependencies>
</project>
"""


def _mvn_executable(env: Mapping[str, str] | None) -> str:
    environ = os.environ if env is None else env
    configured = environ.get("KAFKA_DIODE_MVN", "").strip()
    found = shutil.which(configured or "mvn", path=environ.get("PATH"))
    if found is None:
        what = f"KAFKA_DIODE_MVN={configured}" if configured else "'mvn' on PATH"
        raise LocalKafkaError(
            f"Maven is needed once to download the Kafka jars but {what} was not found: "
            "install it (apt-get install maven) or set KAFKA_DIODE_MVN"
        )
    return found


def _fetch(jar_set: JarSet, env: Mapping[str, str] | None) -> None:
    mvn = _mvn_executable(env)
    final = jar_dir(jar_set, env)
    final.parent.mkdir(parents=True, exist_ok=True)
    settings = maven_settings(env)
    pom_dir = cache_root(env) / "maven" / jar_set.name
    pom_dir.mkdir(parents=True, exist_ok=True)
    (pom_dir / "pom.xml").write_text(_pom(jar_set), encoding="utf-8")
    staging = Path(tempfile.mkdtemp(prefix=f".{jar_set.dirname}.", dir=final.parent))
    try:
        command = [
            mvn,
            "-q",
            "-B",
            "-s",
            str(settings),
            "-f",
            str(pom_dir / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
            f"-DexcludeTransitive={'false' if jar_set.transitive else 'true'}",
        ]
        log.info("fetching %s from Maven Central into %s", jar_set.dirname, final)
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=FETCH_TIMEOUT_S,
                check=False,
                env=None if env is None else dict(env),
            )
        except subprocess.TimeoutExpired as exc:
            raise LocalKafkaError(
                f"downloading {jar_set.dirname} from Maven Central took over "
                f"{FETCH_TIMEOUT_S:.0f} s: check network access to repo1.maven.org and run "
                "'kafka-diode local-kafka fetch' again"
            ) from exc
        except OSError as exc:
            raise LocalKafkaError(
                f"cannot run Maven ({mvn}): {exc}; check KAFKA_DIODE_MVN"
            ) from exc
        if result.returncode != 0:
            (pom_dir / "mvn.log").write_text(result.stdout + result.stderr, encoding="utf-8")
            raise LocalKafkaError(
                f"downloading {jar_set.dirname} with Maven failed (exit {result.returncode}, "
                f"{_last_error(result.stdout + result.stderr)}); check network access to "
                f"repo1.maven.org, full log in {pom_dir / 'mvn.log'}"
            )
        names = sorted(p.name for p in staging.iterdir() if p.suffix == ".jar")
        if not names:
            raise LocalKafkaError(f"Maven fetched no jars for {jar_set.dirname}; see {pom_dir}")
        publish(staging, final, names, set=jar_set.name, version=jar_set.version)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, final: Path, names: list[str], **meta: str) -> None:
    """Mark ``staging`` complete (its ``COMPLETE`` lists ``names``) and rename it to ``final``."""
    marker = {**meta, "jars": names}
    (staging / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    if final.exists() and complete_jars(final) is None:
        shutil.rmtree(final)  # an incomplete leftover from an older layout; never trusted
    try:
        staging.rename(final)
    except OSError:
        # Another process completed the same set first; its copy is as good as ours.
        if complete_jars(final) is None:
            raise


def _last_error(output: str) -> str:
    errors = [line.strip() for line in output.splitlines() if "[ERROR]" in line and line.strip()]
    text = errors[0] if errors else (output.strip().splitlines() or ["no output"])[-1]
    return text[:300]


def java_path(env: Mapping[str, str] | None = None) -> str | None:
    """Where the ``java`` to run is: ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set (whether
    or not it exists), else ``java`` on PATH (None: none there). Not checked: see
    :func:`java_executable`."""
    environ = os.environ if env is None else env
    java_home = environ.get("JAVA_HOME", "").strip()
    if java_home:
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java", path=environ.get("PATH"))


def java_executable(env: Mapping[str, str] | None = None) -> str:
    """The ``java`` to run (:func:`java_path`), checked to be >= 17.

    Raises:
        LocalKafkaError: Java is missing, unusable or older than 17.
    """
    environ = os.environ if env is None else env
    java_home = environ.get("JAVA_HOME", "").strip()
    candidate = java_path(environ)
    if java_home and not os.access(str(candidate), os.X_OK):
        raise LocalKafkaError(
            f"JAVA_HOME={java_home} has no bin/java: point JAVA_HOME at a Java 17+ installation"
        )
    if candidate is None:
        raise LocalKafkaError(
            "Java 17 or newer is needed to run Kafka but 'java' was not found: "
            "install it (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    major = java_major_version(candidate)
    if major < MIN_JAVA_MAJOR:
        raise LocalKafkaError(
            f"Kafka {KAFKA_VERSION} needs Java {MIN_JAVA_MAJOR}+ but {candidate} is Java {major}: "
            "install a newer JDK and set JAVA_HOME"
        )
    return candidate


def java_major_version(java: str) -> int:
    """The major version ``java -version`` reports (8 for ``1.8.0_x``)."""
    try:
        result = subprocess.run(
            [java, "-version"],
            capture_output=True,
            text=True,
            timeout=JAVA_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalKafkaError(f"cannot run {java} -version ({exc}): check JAVA_HOME") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if match is None:
        raise LocalKafkaError(
            f"cannot tell the Java version of {java}: set JAVA_HOME to a Java 17+ installation"
        )
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major
