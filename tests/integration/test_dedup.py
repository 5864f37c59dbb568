"""The dedup job end to end: real broker, real Spark (``kafka-diode dedup`` as a subprocess).

1. Duplicates, reordering, known missing offsets (middle and tail, the tail announced by a
   heartbeat; the head of a partition, announced by a heartbeat's ``low_offset``), null
   values/keys/header values and a malformed record: the clean topic holds every delivered record
   exactly once and byte-identical; the gap topic names exactly the missing offsets.
2. Crash: SIGKILL the job mid-run, restart it from the checkpoint: no duplicate, nothing lost.

Each Spark start costs 15-40 s here, so the module starts Spark three times in total.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from common.raw_run import RunBuilder
from dedup.faults import FAULT_ENV
from dedup.job import CHANGELOG_CHECKPOINTING, CHECKPOINT_FILE_MANAGER
from dedup.layouts import LAYOUT_FILE
from dedup.layouts.direct import CHECKPOINT_FILE_MANAGER as SPARKS_MANAGER
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

SESSION = b"ab" * 16
#: Recent source timestamps: the broker's retention (7 days) would delete older ones at once.
BASE_TS = int(time.time() * 1000) - 3_600_000
SOURCE = "orders.eu"


def raw_record(partition: int, offset: int, *, key: bytes | None, value: bytes | None,
               headers: tuple[tuple[str, bytes | None], ...] = (), raw_partitions: int = 3
               ) -> Record:  # fmt: skip
    """A raw record as the receiver writes it (docs/topics.md)."""
    provenance = (
        ("diode.key", key),
        ("diode.timestamp", b"%d" % (BASE_TS + offset)),
        ("diode.timestamp-type", b"1"),
        ("diode.session", SESSION),
    )
    return Record(
        key=f"{SOURCE}:{partition}:{offset}".encode(),
        value=value,
        headers=headers + provenance,
        partition=partition % raw_partitions,
        timestamp=BASE_TS + offset,
    )


def heartbeat(partition: int, high: int, low: int | None = None) -> Record:
    """A raw heartbeat record; ``low=None`` is what receivers before ``low_offset`` wrote."""
    beat: dict[str, object] = {"type": "heartbeat", "high_offset": high}
    if low is not None:
        beat.update(session=SESSION.decode(), started_at_ms=BASE_TS, low_offset=low)
    value = json.dumps(beat).encode()
    return Record(
        key=f"{SOURCE}:{partition}:{high}".encode(),
        value=value,
        headers=(("diode.control", b"heartbeat"),),
        partition=partition % 3,
    )


def source_record(partition: int, offset: int) -> tuple[bytes | None, bytes | None, tuple]:
    """The upstream record (key, value, headers) at ``offset``: some nulls on purpose."""
    key = None if offset % 11 == 0 else (b"" if offset % 13 == 0 else b"k%d" % offset)
    value = None if offset % 7 == 0 else b"v%d-%d" % (partition, offset)
    headers: tuple = ()
    if offset % 5 == 0:
        headers = (("h", None), ("diode.key", b"not-provenance"), ("h", b"%d" % offset))
    return key, value, headers


def run_dedup(
    env: dict[str, str], *args: str, timeout: float = 400, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    # stderr to a file, not a pipe: Spark logs more than a pipe buffer holds, and an unread pipe
    # would block the job mid-run
    log = Path(env["STATE_DIR_CONFIG"]).parent / f"dedup-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kafka_diode", "dedup", *args],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=out,
            cwd=cwd,
        )
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def _log_tail(proc: subprocess.Popen[bytes]) -> str:
    return proc.log_path.read_text(errors="replace")[-4000:]  # type: ignore[attr-defined]


def job_env(bootstrap: str, raw: str, tmp_path: Path, tag: str) -> dict[str, str]:
    return {
        "RAW_TOPICS": raw,
        "BOOTSTRAP_SERVERS": bootstrap,
        "STATE_DIR_CONFIG": str(tmp_path / "checkpoint"),
        "CLEAN_TOPIC": f"clean.{tag}.{{topic}}",
        "GAP_TOPIC": f"gaps.{tag}",
        "PROGRESS_TOPIC": f"progress.{tag}",
        "CONTROL_TOPIC": f"control.{tag}",
        # its own: the default one is made with the first direct checkpoint's raw partition
        # count, and a raw topic of another count refuses it (tests in any order)
        "STATE_TOPIC": f"state.{tag}",
        "GAP_EMIT_INTERVAL_SEC": "1",
        "PERSIST_INTERVAL_MS": "500",
        "NEW_TOPIC_PARTITIONS": "3",
        "SHUFFLE_PARTITIONS": "2",
        "SPARK_MASTER": "local[2]",
        "WINDOW_SIZE": "64",
        "MAX_WINDOWS": "64",
    }


def finish(proc: subprocess.Popen[bytes], timeout: float = 400) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, _log_tail(proc)


def kill_once_committed(
    proc: subprocess.Popen[bytes], broker: object, clean_topic: str, at_least: int
) -> None:
    """SIGKILL ``proc`` once ``clean_topic`` holds ``at_least`` records (a mid-run crash)."""
    try:

        def some_committed() -> bool:
            if proc.poll() is not None:
                raise AssertionError(_log_tail(proc))
            try:
                return len(consume_all(broker, clean_topic, timeout=5)) >= at_least
            except RuntimeError:  # the clean topic does not exist yet
                return False

        wait_until(some_committed, timeout=300, interval=1.0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


#: docs/dedup.md "Settings": one micro-batch per 5 s
SLOW_LINK = {"PERSIST_INTERVAL_MS": "5000"}


@pytest.mark.parametrize(
    ("batching", "layout"),
    [
        ("every trigger", "buckets"),
        # the slow link's trigger is a setting of the buckets layout's batches: CI keeps both
        # layouts at every trigger
        pytest.param("slow link", "buckets", marks=pytest.mark.slow),
        ("every trigger", "direct"),
    ],
)
def test_clean_and_gap_topics_are_exact(
    downstream_kafka, kafka_topic, tmp_path, batching, layout
) -> None:
    """``slow link``: the trigger docs/dedup.md suggests for a slow link; the ticks' batches wait
    for it too, and the gaps still need two scans. ``direct``: the direct layout
    (docs/dedup.md "The direct layout"), whose gap scans run on ticks into the raw partitions;
    a task's Python worker dies before its first commit, and the local master (no count of
    attempts given) retries the task: nothing lost or doubled, the process does not exit."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    # partition 3: its first datagram (offsets 0..9) was lost; only the heartbeat's low_offset
    # tells the dedup that the session started at 0
    missing = {0: {17, *range(40, 45)}, 1: {60}, 2: set(range(95, 100)), 3: set(range(10))}
    sent = {0: 100, 1: 100, 2: 100, 3: 30}
    rng = random.Random(6)
    records: list[Record] = []
    expected: dict[tuple[int, int], tuple] = {}
    for partition in range(4):
        present = [o for o in range(sent[partition]) if o not in missing[partition]]
        if partition == 2:
            present = [o for o in present if o < 95]  # lost tail, announced by the heartbeat
        order = present + rng.sample(present, 15)  # 15 duplicates
        rng.shuffle(order)  # reordered
        for offset in order:
            key, value, headers = source_record(partition, offset)
            records.append(raw_record(partition, offset, key=key, value=value, headers=headers))
            expected[(partition, offset)] = (key, value, headers)
    records.append(heartbeat(2, 99))
    records.append(heartbeat(3, 29, low=0))
    # malformed: provenance headers out of order -> counted, never forwarded
    records.append(
        Record(
            key=f"{SOURCE}:0:500".encode(),
            value=b"bad",
            headers=(
                ("diode.timestamp", b"1"),
                ("diode.key", b"k"),
                ("diode.timestamp-type", b"1"),
                ("diode.session", SESSION),
            ),
            partition=0,
        )
    )
    produce_records(downstream_kafka, raw, records)

    # four source partitions: the clean topic needs four (source partition p -> clean p mod n)
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=4)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag) | {"STATE_LAYOUT": layout}
    if batching == "slow link":
        env |= SLOW_LINK
    died = tmp_path / "died"
    if layout == "direct":
        env[FAULT_ENV] = f"task-before-commit:*:1:{died}"  # group 1: raw partition 1
    finish(run_dedup(env, "--until-settled"))
    assert died.exists() == (layout == "direct")

    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
    seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) == set(expected)
    for r in clean:
        offset = r.timestamp - BASE_TS
        key, value, headers = expected[(r.partition, offset)]
        assert (r.key, r.value, tuple(r.headers)) == (key, value, headers), offset
        assert r.timestamp_type == 1
    gap_records = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gap_records if r.value is not None}
    open_offsets = {
        (g["partition"], o)
        for g in latest.values()
        if g["state"] == "open"
        for o in range(g["first"], g["last"] + 1)
    }
    assert {g["topic"] for g in latest.values()} == {SOURCE}
    assert open_offsets == {(p, o) for p, offs in missing.items() for o in offs}
    layout_file = json.loads((Path(env["STATE_DIR_CONFIG"]) / LAYOUT_FILE).read_text())
    assert layout_file["layout"] == layout
    if layout == "direct":
        # local[2]: raw partitions 0 and 2 commit in one transaction, 1 in another
        assert layout_file == {"layout": "direct", "raw_partitions": 3, "transaction_groups": 2}


# slow (57 s, 40 of them idle): CI keeps the settling rule's unit tests
# (tests/unit/test_idle_tick.py)
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["buckets", "direct"])
def test_a_settled_dedup_ticks_rarely_and_still_reports_every_gap(
    downstream_kafka, kafka_topic, tmp_path, layout
) -> None:
    """dedup/idle_tick.py: once a tick's batch changed nothing and left no gap pending, the
    driver ticks every SETTLED_FACTOR intervals (10 s here) instead of every interval (1 s).
    ``direct``: the ticks go into every raw partition (docs/dedup.md "The direct layout")."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    missing = {10, 11, 12, *range(50, 60)}  # a hole, and a tail only the heartbeat announces
    records = []
    for offset in range(50):
        if offset not in missing:
            key, value, headers = source_record(0, offset)
            records.append(raw_record(0, offset, key=key, value=value, headers=headers))
    records.append(heartbeat(0, 59, low=0))
    produce_records(downstream_kafka, raw, records)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag) | {"STATE_LAYOUT": layout}
    proc = run_dedup(env, "--until-idle", "40")
    finish(proc)

    gap_records = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gap_records if r.value is not None}
    open_offsets = {
        o for g in latest.values() if g["state"] == "open" for o in range(g["first"], g["last"] + 1)
    }
    assert open_offsets == missing
    assert "gap scans settled" in proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
    ticked = consume_all(downstream_kafka, raw if layout == "direct" else f"control.{tag}")
    if layout == "direct":
        assert {r.partition for r in ticked if r.key == b"tick"} == {0, 1, 2}
    ticks = sorted({r.timestamp for r in ticked if r.key == b"tick" and r.partition == 0})
    assert len(ticks) >= 3  # the scans that reported the gaps ran on ticks
    # busy, a tick follows a second of idleness (measured 2.5 s apart with the batch, 8 s once
    # at start); settled, ten seconds: two such pauses within the 40 s of idleness
    pauses = [b - a for a, b in itertools.pairwise(ticks)]
    assert sum(p >= 9_500 for p in pauses) >= 2, pauses


@pytest.mark.parametrize(
    ("layout", "first_commits"),
    [
        # the layouts other than the default run with the slow tests (2.5 min each on CI's
        # machine): CI keeps the default layout (direct); the buckets layout, which chains
        # use, keeps its exact output in CI (test_clean_and_gap_topics_are_exact and
        # tests/integration/test_chains_e2e.py)
        pytest.param("buckets", "changelogs", marks=pytest.mark.slow),
        pytest.param("buckets", "snapshots", marks=pytest.mark.slow),
        ("direct", "state topic"),
    ],
)
def test_sigkill_and_restart_neither_duplicates_nor_loses(
    downstream_kafka, kafka_topic, tmp_path, layout, first_commits
) -> None:
    """Both state layouts (docs/dedup.md "State layout"): direct, what a new checkpoint over
    one raw topic gets, and buckets, what chains get. ``snapshots``: the killed run commits its
    state as earlier versions did (a RocksDB snapshot per commit), the restart as this one does
    (changelogs, docs/dedup.md "Settings"). The retired ``partitions`` layout is refused with its
    upgrade step (tests/integration/test_dedup_upgrade.py)."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    per_partition = 20_000
    records = []
    rng = random.Random(7)
    for partition in range(3):
        # raw layout v2: runs of 100 offsets, 5 of them twice, 5 resends overlapping two runs
        runs = [(first, first + 99) for first in range(0, per_partition, 100)]
        runs += rng.sample(runs, 5)
        runs += [(a + 50, a + 149) for a, _ in rng.sample(runs[:-6], 5)]
        records += [run_record(partition, a, b) for a, b in sorted(runs)]
    produce_records(downstream_kafka, raw, records)
    env = {**job_env(downstream_kafka.bootstrap, raw, tmp_path, tag),
           "MAX_OFFSETS_PER_TRIGGER": "30", "PERSIST_INTERVAL_MS": "0"}  # fmt: skip
    clean_topic = f"clean.{tag}.{SOURCE}"
    record = Path(env["STATE_DIR_CONFIG"]) / LAYOUT_FILE
    env["STATE_LAYOUT"] = "direct" if layout == "direct" else "buckets"

    first_env = dict(env)
    if first_commits == "snapshots":
        first_env[f"SPARK_CONF_{CHANGELOG_CHECKPOINTING.replace('.', '_')}"] = "false"
    if layout == "direct":
        # the killed run writes its logs as a dedup without the dedup's own file manager does
        # (no javac: Hadoop's, with .crc files); the restart takes them over with its own
        first_env[f"SPARK_CONF_{CHECKPOINT_FILE_MANAGER.replace('.', '_')}"] = SPARKS_MANAGER
    proc = run_dedup(first_env)
    kill_once_committed(proc, downstream_kafka, clean_topic, 9_000)
    assert json.loads(record.read_text())["layout"] == layout
    log_text = proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
    assert f"state layout: {layout}" in log_text
    before = len(consume_all(downstream_kafka, clean_topic, timeout=10))
    assert before < 3 * per_partition, "the kill came too late to test anything"
    # the state commits as RocksDB changelogs (dedup/job.py checkpoint_conf): the restart below
    # recovers from them, or from the snapshots
    state_dir = Path(env["STATE_DIR_CONFIG"]) / "state"
    assert bool(list(state_dir.rglob("*.changelog"))) == (first_commits == "changelogs")

    logs = [Path(env["STATE_DIR_CONFIG"]) / name for name in ("offsets", "commits")]
    first_batches = {log: last_batch(log) for log in logs}
    if layout == "direct":
        assert all((log / f".{first_batches[log]}.crc").is_file() for log in logs)

    finish(run_dedup(env, "--until-settled"))
    # the direct layout keeps no Spark state at all (its detectors are in the state topic)
    assert bool(list(state_dir.rglob("*.changelog"))) == (layout != "direct")
    if layout == "direct":
        # the restart's batches went through kafkadiode.dedup.LocalCheckpointFileManager
        # (dedup/jvm): no .crc, no chmod process
        for log in logs:
            assert last_batch(log) > first_batches[log]
            assert not (log / f".{last_batch(log)}.crc").exists()
    clean = consume_all(downstream_kafka, clean_topic, timeout=60)
    counts = Counter((r.partition, r.timestamp) for r in clean)
    assert [k for k, n in counts.items() if n > 1] == []
    assert len(counts) == 3 * per_partition


def last_batch(log: Path) -> int:
    """The last batch a Spark metadata log (``offsets``, ``commits``) holds."""
    return max(int(path.name) for path in log.iterdir() if path.name.isdigit())


def run_record(partition: int, first: int, last: int, stride: int = 1, *,
               raw_partitions: int = 3) -> Record:  # fmt: skip
    """A v2 raw record (docs/topics.md "Layout v2"): one run of ``source_record``s."""
    run = RunBuilder(SOURCE, partition, 1, first, BASE_TS + first)
    for offset in range(first, last + 1, stride):
        key, value, headers = source_record(partition, offset)
        run.append(offset, BASE_TS + offset, key, value, headers)
    return Record(
        key=run.key().encode(),
        value=run.encode(),
        headers=(("diode.session", SESSION.hex().encode()),),
        partition=partition % raw_partitions,
    )


# CI keeps the default layout; the buckets case runs with the slow tests
@pytest.mark.parametrize("layout", [pytest.param("buckets", marks=pytest.mark.slow), "direct"])
def test_a_raw_topic_with_v1_records_then_v2_runs_is_carried_exactly_once(
    downstream_kafka, kafka_topic, tmp_path, layout
) -> None:
    """An upgrade: v1 records first, then runs that repeat some of them (a whole copy, a resend
    that partly overlaps), a share chain's stride run, and a run whose value lies about its key
    (malformed: its offsets stay a gap)."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    records = [raw_record(0, o, key=source_record(0, o)[0], value=source_record(0, o)[1],
                          headers=source_record(0, o)[2]) for o in range(50)]  # fmt: skip
    records += [
        run_record(0, 40, 99),  # overlaps the v1 tail 40..49
        run_record(0, 40, 99),  # a whole copy
        run_record(0, 120, 139),  # 100..119 lost for now
        run_record(0, 95, 125),  # a resend: 100..119 new, the rest duplicates
        run_record(1, 0, 8, 2),  # a share chain's run (stride 2): 1, 3, 5, 7 are gaps
        run_record(1, 9, 12),
    ]
    liar = replace(run_record(2, 0, 9), key=f"{SOURCE}:2:0-10".encode())  # the value: 0..9
    records += [liar, run_record(2, 11, 20), heartbeat(2, 20, low=0)]
    produce_records(downstream_kafka, raw, records)
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=3)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag) | {"STATE_LAYOUT": layout}
    finish(run_dedup(env, "--until-settled"))

    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
    seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert [k for k, n in seen.items() if n > 1] == []
    expected = {(0, o) for o in range(140)} | {(1, o) for o in (0, 2, 4, 6, 8, 9, 10, 11, 12)}
    expected |= {(2, o) for o in range(11, 21)}
    assert set(seen) == expected
    for r in clean:
        offset = r.timestamp - BASE_TS
        assert (r.key, r.value, tuple(r.headers)) == source_record(r.partition, offset), offset
    gap_records = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gap_records if r.value is not None}
    open_offsets = {
        (g["partition"], o)
        for g in latest.values()
        if g["state"] == "open"
        for o in range(g["first"], g["last"] + 1)
    }
    assert open_offsets == {(1, 1), (1, 3), (1, 5), (1, 7), *((2, o) for o in range(11))}


# slow (55 s): CI keeps where the command writes the reset (tests/integration/
# test_dedup_reset_cli.py) and what a reset does to the state (tests/unit/test_dedup_job.py)
@pytest.mark.slow
def test_a_reset_in_the_direct_layout_clears_its_source_partitions_state(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    """docs/dedup.md "The direct layout": `kafka-diode dedup reset` finds the checkpoint's
    layout and writes the reset into the source partition's raw partition, whose task clears
    that partition's detector before its records: a repeat of offsets 0..9 after the reset is
    delivered again (new), one of partition 0 is still a duplicate."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag) | {"STATE_LAYOUT": "direct"}
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=3)
    produce_records(downstream_kafka, raw, [run_record(p, 0, 49) for p in (0, 1)])
    finish(run_dedup(env, "--until-settled"))
    done = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "dedup", "reset", "--topic", SOURCE,
         "--partition", "1", "--yes"],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"via {raw} partition 1" in done.stderr
    produce_records(downstream_kafka, raw, [run_record(p, 0, 9) for p in (0, 1)])
    finish(run_dedup(env, "--until-settled"))

    clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
    counts = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert {k for k, n in counts.items() if n > 1} == {(1, o) for o in range(10)}
    assert set(counts) == {(p, o) for p in (0, 1) for o in range(50)}


def test_a_direct_checkpoint_reads_on_with_either_reader(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    """docs/dedup.md "The direct layout": ``DIRECT_READER`` may change between two starts of a
    checkpoint without transaction groups (both readers' offsets are the Kafka source's JSON):
    librdkafka, then Spark's source, each on new runs and repeats of old ones; every record
    once. (Spark's source then librdkafka is the upgrade, tests/integration/
    test_dedup_upgrade.py, which continues a release's checkpoint of Spark's source with this
    tree's librdkafka reader; a checkpoint with groups refuses Spark's source,
    tests/unit/test_dedup_state_layout_direct.py.)

    The two starts also carry the driver JVM's class archive (dedup/class_archive.py) in a
    directory of their own, as a restart does: the first start's clean stop writes it, the
    second start's JVM maps it (its memory map names the file)."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=3)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag)
    env |= {"STATE_LAYOUT": "direct", "DIRECT_TRANSACTIONS": "3"}  # each raw partition alone
    archives = tmp_path / "jvm-classes"
    env["JVM_CLASS_ARCHIVE_DIR"] = str(archives)
    expected: set[tuple[int, int]] = set()
    for step, reader in enumerate(("librdkafka", "spark")):
        first, last = 40 * step, 40 * step + 39
        # new offsets, and a repeat of the previous step's tail (duplicates)
        produce_records(downstream_kafka, raw, [run_record(p, max(0, first - 10), last)
                                                for p in range(3)])  # fmt: skip
        expected |= {(p, o) for p in range(3) for o in range(last + 1)}
        proc = run_dedup(env | {"DIRECT_READER": reader}, "--until-settled")
        finish(proc)
        log = proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
        assert ("each task with librdkafka" if reader == "librdkafka" else "Spark's source") in log
        clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
        seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
        assert [k for k, n in seen.items() if n > 1] == [], reader
        assert set(seen) == expected, reader
        written = [p.name for p in archives.iterdir()]
        assert len(written) == 1, written
        assert written[0].endswith(".jsa"), written  # whole, no part file left
        if step == 0:
            assert "wrote the JVM class archive" in log, log[-3000:]
        else:
            assert "the driver JVM mapped its class archive" in log, log[-3000:]
            assert "wrote the JVM class archive" not in log


def test_a_direct_checkpoint_whose_raw_topic_changed_reads_the_new_one_from_its_start(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    """RAW_TOPICS names another topic between two starts of a direct checkpoint: the last batch
    in its offset log read the old topic, so every partition of the new one is new to the
    query, and is read from its log start (dedup/raw_ranges.py), as Spark's Kafka source reads a
    new partition: every record of both topics in the clean topic once."""
    tag = kafka_topic(downstream_kafka, partitions=3)
    create_topic(downstream_kafka, f"clean.{tag}.{SOURCE}", partitions=3)
    expected: set[tuple[int, int]] = set()
    for step in range(2):
        raw = kafka_topic(downstream_kafka, partitions=3)
        first, last = 40 * step, 40 * step + 39
        produce_records(downstream_kafka, raw, [run_record(p, first, last) for p in range(3)])
        expected |= {(p, o) for p in range(3) for o in range(first, last + 1)}
        env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag) | {"STATE_LAYOUT": "direct"}
        finish(run_dedup(env, "--until-settled"))
        clean = consume_all(downstream_kafka, f"clean.{tag}.{SOURCE}", timeout=30)
        seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
        assert [k for k, n in seen.items() if n > 1] == [], step
        assert set(seen) == expected, sorted(expected - set(seen))[:10]
