"""The dedup's own JVM class, compiled with the machine's real ``javac`` into a cache
(``runtime/jvm_build.py``, ``dedup/jvm``): built once, rebuilt for a changed source, and a clear
error without a compiler or with a broken source."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from common.errors import JvmBuildError
from dedup import jvm
from runtime.jvm_build import compiled_jar
from runtime.maven import complete_jars


def java_source(directory: Path, body: str = "") -> Path:
    source = directory / "Probe.java"
    source.write_text(f"package probe;\npublic final class Probe {{ {body} }}\n", encoding="utf-8")
    return source


def test_the_checkpoint_manager_compiles_once_against_sparks_jars(tmp_path) -> None:
    env = {**os.environ, "KAFKA_DIODE_CACHE": str(tmp_path / "cache")}
    jar = jvm.checkpoint_manager_jar(env)
    assert jar is not None
    class_file = jvm.CHECKPOINT_MANAGER_CLASS.replace(".", "/") + ".class"
    assert class_file in zipfile.ZipFile(jar).namelist()
    # cached: found again without a compiler on PATH
    no_javac = {"KAFKA_DIODE_CACHE": env["KAFKA_DIODE_CACHE"], "PATH": str(tmp_path / "empty")}
    assert jvm.checkpoint_manager_jar(no_javac) == jar


def test_a_changed_source_builds_a_new_jar_and_the_old_stays(tmp_path) -> None:
    env = {**os.environ, "KAFKA_DIODE_CACHE": str(tmp_path / "cache")}
    source = java_source(tmp_path)
    first = compiled_jar("probe", [source], [jvm.spark_jars_dir()], env)
    java_source(tmp_path, "public static int answer() { return 42; }")
    second = compiled_jar("probe", [source], [jvm.spark_jars_dir()], env)
    assert first != second
    assert complete_jars(first.parent) == [first]
    assert complete_jars(second.parent) == [second]


def test_without_javac_the_error_names_the_fix_and_the_dedup_falls_back(tmp_path, caplog) -> None:
    env = {"KAFKA_DIODE_CACHE": str(tmp_path / "cache"), "PATH": str(tmp_path / "empty")}
    with pytest.raises(JvmBuildError, match="openjdk-17-jdk-headless"):
        compiled_jar("probe", [java_source(tmp_path)], [jvm.spark_jars_dir()], env)
    assert jvm.checkpoint_manager_jar(env) is None
    assert "chmod process per file" in caplog.text


def test_a_cache_it_cannot_write_is_a_build_error_not_a_crash(tmp_path, caplog) -> None:
    """A systemd unit's cache is read-only (ProtectSystem=strict): the dedup falls back."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "KAFKA_DIODE_CACHE": str(blocker / "cache")}
    with pytest.raises(JvmBuildError, match="local-kafka fetch"):
        compiled_jar("probe", [java_source(tmp_path)], [jvm.spark_jars_dir()], env)
    assert jvm.checkpoint_manager_jar(env) is None
    assert "chmod process per file" in caplog.text


def test_a_source_javac_refuses_leaves_nothing_complete_in_the_cache(tmp_path) -> None:
    env = {**os.environ, "KAFKA_DIODE_CACHE": str(tmp_path / "cache")}
    source = java_source(tmp_path, "int broken(")
    with pytest.raises(JvmBuildError, match=r"javac failed on probe .*Probe\.java"):
        compiled_jar("probe", [source], [jvm.spark_jars_dir()], env)
    jars = tmp_path / "cache" / "jars"
    assert not jars.exists() or list(jars.iterdir()) == []


def test_local_kafka_fetch_compiles_it_into_the_users_cache() -> None:
    """docs/local-kafka.md: ``fetch`` fills the cache a build host ships to runtime-only hosts."""
    out = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "local-kafka", "fetch"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    prefix = "dedup checkpoint file manager: "
    printed = [line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)]
    assert printed == [str(jvm.checkpoint_manager_jar())]
