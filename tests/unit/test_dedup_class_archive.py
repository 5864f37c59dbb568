"""The driver JVM's class-data archive (dedup/class_archive.py): where it lives, when a start maps
it or writes it, and that only a JVM's complete, clean exit puts one in place.

The JVM here is a real child process speaking the same protocol as pyspark's (EOF on its stdin
ends it; it writes the file it was asked for on the way out); the real JVM writing and mapping a
real archive is tests/integration/test_dedup.py::
test_a_direct_checkpoint_reads_on_with_either_reader.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import ConfigError
from dedup import class_archive, cli
from dedup.class_archive import ArchivePlan
from dedup.config import from_sources


def fake_jvm(writes: Path | None, code: int = 0) -> subprocess.Popen[bytes]:
    """A child that waits for EOF on stdin, then writes ``writes`` and exits with ``code``."""
    script = (
        "import sys\n"
        "sys.stdin.buffer.read()\n"
        f"path = {str(writes) if writes else ''!r}\n"
        "if path:\n"
        "    open(path, 'wb').write(b'archive' * 1000)\n"
        f"sys.exit({code})\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


def test_auto_is_systemds_cache_directory_else_the_cache_root(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    unit = {"CACHE_DIRECTORY": "/var/cache/kafka-diode/dedup-a:/var/cache/other"}
    assert class_archive.directory("auto", unit, root) == Path(
        "/var/cache/kafka-diode/dedup-a/jvm-classes"
    )
    assert class_archive.directory("auto", {}, root) == root / "jvm-classes"
    assert class_archive.directory(" off ", unit, root) is None
    assert class_archive.directory("/srv/jvm", unit, root) == Path("/srv/jvm")


def test_the_name_follows_the_java_binary_and_every_jar(tmp_path: Path) -> None:
    java = tmp_path / "java"
    java.write_bytes(b"java")
    spark = tmp_path / "spark-jars"
    spark.mkdir()
    (spark / "spark-core.jar").write_bytes(b"core")
    extra = tmp_path / "connector.jar"
    extra.write_bytes(b"connector")
    name = class_archive.archive_name(java, [spark], [str(extra)])
    assert name == class_archive.archive_name(java, [spark], [str(extra)])
    assert name.startswith("dedup-")

    (spark / "spark-core.jar").write_bytes(b"core, upgraded")
    upgraded = class_archive.archive_name(java, [spark], [str(extra)])
    assert upgraded != name
    (spark / "spark-sql.jar").write_bytes(b"sql")
    added = class_archive.archive_name(java, [spark], [str(extra)])
    assert added != upgraded
    assert class_archive.archive_name(java, [spark], []) != added
    other_java = tmp_path / "java17"
    other_java.write_bytes(b"java")
    assert class_archive.archive_name(other_java, [spark], [str(extra)]) != added


def test_a_start_without_an_archive_writes_one_to_its_own_file_and_with_one_maps_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "jvm-classes"
    first = class_archive.plan(folder, "dedup-x", explicit=False, pid=101)
    assert first is not None
    assert first.writing == folder / "dedup-x.101.part"
    assert first.option.startswith(f"-XX:ArchiveClassesAtExit={first.writing} ")
    assert first.archive == folder / "dedup-x.jsa"

    first.archive.write_bytes(b"archive")
    second = class_archive.plan(folder, "dedup-x", explicit=False, pid=102)
    assert second == ArchivePlan(f"-XX:SharedArchiveFile={first.archive}", first.archive, None)


def test_part_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    folder = tmp_path / "jvm-classes"
    folder.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = folder / f"dedup-x.{gone.stdout.strip()}.part"
    live = folder / f"dedup-y.{os.getpid()}.part"
    dead.write_bytes(b"half")
    live.write_bytes(b"writing")
    class_archive.plan(folder, "dedup-z", explicit=False, pid=7)
    assert not dead.exists()
    assert live.exists()


def test_an_unusable_directory_stops_the_start_only_when_the_operator_named_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        class_archive.plan(blocker / "jvm", "dedup-x", explicit=True)
    assert "JVM_CLASS_ARCHIVE_DIR" in str(err.value)
    assert "off" in str(err.value)
    with caplog.at_level(logging.INFO, logger="dedup.class_archive"):
        assert class_archive.plan(blocker / "jvm", "dedup-x", explicit=False) is None
    assert "JVM_CLASS_ARCHIVE_DIR=off" in caplog.text


@pytest.mark.parametrize("mode", ["--check-config", "start"])
def test_a_named_directory_that_cannot_be_used_stops_the_command_before_any_wait(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mode: str,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    env = {"RAW_TOPICS": "raw", "STATE_DIR_CONFIG": str(tmp_path / "state")}
    env["BOOTSTRAP_SERVERS"] = "127.0.0.1:9"  # nothing answers: a start would wait for Kafka
    env["JVM_CLASS_ARCHIVE_DIR"] = str(blocker / "jvm")
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def waited(*_args: object, **_kwargs: object) -> int:
        raise AssertionError("the dedup started before refusing its configuration")

    monkeypatch.setattr(cli, "run", waited)
    argv = ["--check-config"] if mode == "--check-config" else []
    assert cli.main(argv, prog="dedup") == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "JVM_CLASS_ARCHIVE_DIR" in err
    assert f"{blocker} is not a directory" in err
    assert not (blocker / "jvm").exists()


@pytest.mark.parametrize("setting", ["auto", "off", " off ", "{tmp}/new/jvm", "{tmp}"])
def test_a_usable_or_default_setting_passes_the_start_check(tmp_path: Path, setting: str) -> None:
    class_archive.check_setting(setting.format(tmp=tmp_path))
    assert not (tmp_path / "new").exists()  # the check creates nothing


def test_a_clean_exit_puts_the_archive_in_place_and_keeps_the_newest(tmp_path: Path) -> None:
    folder = tmp_path / "jvm-classes"
    folder.mkdir()
    old = [folder / f"dedup-old{i}.jsa" for i in range(3)]
    for i, path in enumerate(old):
        path.write_bytes(b"old")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    plan = class_archive.plan(folder, "dedup-new", explicit=False)
    assert plan is not None
    assert plan.writing is not None
    class_archive.finish(plan, fake_jvm(plan.writing))
    assert plan.archive.read_bytes() == b"archive" * 1000
    assert not plan.writing.exists()
    kept = sorted(p.name for p in folder.iterdir())
    assert kept == sorted([plan.archive.name, old[2].name])[: class_archive.KEEP]


@pytest.mark.parametrize("code", [1, -9])
def test_a_failed_jvm_leaves_no_archive(tmp_path: Path, code: int) -> None:
    plan = class_archive.plan(tmp_path / "jvm", "dedup-x", explicit=False)
    assert plan is not None
    assert plan.writing is not None
    jvm = fake_jvm(plan.writing, code if code > 0 else 0)
    if code < 0:
        jvm.kill()  # killed before it wrote a whole file
    class_archive.finish(plan, jvm)
    assert list(plan.archive.parent.iterdir()) == []


def test_an_archive_the_jvm_did_not_map_is_removed(tmp_path: Path) -> None:
    archive = tmp_path / "dedup-x.jsa"
    archive.write_bytes(b"archive")
    plan = ArchivePlan(f"-XX:SharedArchiveFile={archive}", archive, None)
    jvm = fake_jvm(None)  # maps no archive
    try:
        assert class_archive.check_mapped(plan, jvm) is False
    finally:
        jvm.communicate(b"")
    assert not archive.exists()


def test_an_archive_in_the_jvms_memory_map_is_kept(tmp_path: Path) -> None:
    archive = tmp_path / "dedup-x.jsa"
    archive.write_bytes(b"archive" * 1000)
    script = (
        "import mmap, sys\n"
        f"f = open({str(archive)!r}, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('mapped', flush=True)\n"
        "sys.stdin.buffer.read()\n"
    )
    jvm = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert jvm.stdout is not None
        assert jvm.stdout.readline() == b"mapped\n"
        plan = ArchivePlan(f"-XX:SharedArchiveFile={archive}", archive, None)
        assert class_archive.check_mapped(plan, jvm) is True
    finally:
        jvm.communicate(b"")
    assert archive.exists()


def test_an_empty_setting_is_refused_naming_the_key() -> None:
    env = {
        "RAW_TOPICS": "raw",
        "BOOTSTRAP_SERVERS": "localhost:9092",
        "STATE_DIR_CONFIG": "/tmp/x",
        "JVM_CLASS_ARCHIVE_DIR": " ",
    }
    with pytest.raises(ConfigError) as err:
        from_sources(env, [])
    assert "JVM_CLASS_ARCHIVE_DIR" in str(err.value)
