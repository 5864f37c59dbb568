"""The dedup's own JVM class, ``LocalCheckpointFileManager.java`` beside this module.

Spark's checkpoint file manager for a direct checkpoint on a local disk: Hadoop's local file
system starts a ``chmod`` process for every file it creates when its native library is absent
(pyspark ships none), four per micro-batch for the offset and commit logs; this manager writes
them without one (docs/dedup-internals.md "A micro-batch's fixed cost in the JVM"). Compiled
against pyspark's jars on first use and cached (``runtime/jvm_build.py``); where no ``javac``
is installed the dedup runs Spark's ``FileSystemBasedCheckpointFileManager`` and says so.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path

from common.errors import JvmBuildError
from runtime.jvm_build import compiled_jar

log = logging.getLogger(__name__)

#: the class ``spark.sql.streaming.checkpointFileManagerClass`` names
CHECKPOINT_MANAGER_CLASS = "kafkadiode.dedup.LocalCheckpointFileManager"
SOURCES = (Path(__file__).with_name("LocalCheckpointFileManager.java"),)
JAR_NAME = "kafka-diode-dedup-jvm"


def spark_jars_dir() -> Path:
    """pyspark's jars (the pinned Spark the dedup's JVM runs), found without importing it."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:  # pragma: no cover - a dependency of the package
        raise JvmBuildError("pyspark is not installed")
    return Path(spec.origin).parent / "jars"


def build(env: Mapping[str, str] | None = None) -> Path:
    """The jar, compiled if the cache lacks it (``kafka-diode local-kafka fetch`` runs this, so
    that a cache built where a JDK is carries it to hosts with a Java runtime only).

    Raises:
        JvmBuildError: no ``javac``, it failed, or the cache cannot be written.
    """
    return compiled_jar(JAR_NAME, SOURCES, [spark_jars_dir()], env)


def checkpoint_manager_jar(env: Mapping[str, str] | None = None) -> Path | None:
    """The jar of :data:`CHECKPOINT_MANAGER_CLASS`, compiled if needed; None (and a WARNING
    naming the fix) when it cannot be built."""
    try:
        return build(env)
    except JvmBuildError as exc:
        log.warning(
            "checkpoint logs go through Hadoop's local file system, which starts a chmod "
            "process per file (4 per micro-batch): %s",
            exc,
        )
        return None
