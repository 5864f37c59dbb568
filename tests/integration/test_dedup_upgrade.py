"""An upgrade on one checkpoint: a previous release's dedup, then this tree's.

Each release in ``PREVIOUS`` (the last one before this test, state by bucket) is taken from this
repository's own history (``git archive``) and runs first on a fresh checkpoint, as a deployed
dedup would have. This tree's dedup then continues from that checkpoint with v1 records and v2
runs mixed: a run over the old tail, a whole copy, a
resend that fills the gap the old release reported, and new offsets. This tree's
``kafka-diode gaps`` reads the gap the release reported; every record reaches the clean topic
once, byte-identical, and the gap is filled.

Two things broke this before it was tested (docs/dedup.md "Upgrading"): Spark refused the
checkpoint because the grouping key's ``src_partition`` had become nullable
(``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``), and ``--until-idle`` stopped after the replayed
batch, before reading the new records.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from dedup.layouts import LAYOUT_FILE
from tests.integration.test_dedup import (
    BASE_TS,
    SOURCE,
    finish,
    job_env,
    raw_record,
    run_dedup,
    run_record,
    source_record,
)
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

#: Releases a site upgrades from -> the state layout their new checkpoints record.
PREVIOUS = {
    # 2026-11-29, v2 runs and state by bucket, the last commit before this test
    "0c88856882e1dacae2f7f7b91be94a4662ff1a1a": "buckets",
    # 2026-12-05, direct with Spark's Kafka source, the last commit before the librdkafka reader
    # (its offset log is the Kafka source's, which dedup/raw_ranges.py reads on)
    "30474ccc3ef3c94057074c1599824aa9013117db": "direct",
}
#: 2026-11-25, the last commit before raw layout v2: no layout file (one group per source
#: partition, the retired partitions layout) and the driver-side whole-batch writer's era.
PARTITIONS_RELEASE = "b5af0ab18251bf7956d226ff01c6e06000833cef"
REPO = Path(__file__).resolve().parents[2]


def extract_release(commit: str, into: Path) -> Path:
    """``commit``'s source tree under ``into``, from this repository's history (skips the test
    in a checkout without that history)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs this repository's git history (a clone, not an sdist)")
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True, check=False).returncode != 0:  # fmt: skip
        pytest.skip(f"{commit[:7]} is not in this clone's history (a shallow clone)")
    archive = into / f"{commit[:7]}.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), commit], check=True)
    tree = into / commit[:7]
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def release_env(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a process of the release in ``tree`` (run with ``cwd=tree``): its own
    package first on the path (the working directory, for ``-m``, then PYTHONPATH); checked."""
    env = {**env, "PYTHONPATH": str(tree)}
    if "state_topic" not in (tree / "dedup" / "config.py").read_text():
        env.pop("STATE_TOPIC", None)  # a release before the state topic
    where = subprocess.run([sys.executable, "-c", "import dedup, sender; print(sender.__file__)"],
                           env={**os.environ, **env}, cwd=tree, capture_output=True, text=True,
                           check=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(tree), where.stdout
    return env


@pytest.fixture(params=list(PREVIOUS), ids=lambda commit: commit[:7])
def previous_release(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """A release's commit and its source tree, extracted from this repository's history."""
    return request.param, extract_release(request.param, tmp_path)


def v1(partition: int, offsets: range) -> list[Record]:
    return [raw_record(partition, o, key=source_record(partition, o)[0],
                       value=source_record(partition, o)[1],
                       headers=source_record(partition, o)[2]) for o in offsets]  # fmt: skip


def test_the_previous_release_checkpoint_is_continued_exactly_once(
    downstream_kafka, kafka_topic, tmp_path, previous_release
) -> None:
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    clean_topic = f"clean.{tag}.{SOURCE}"
    create_topic(downstream_kafka, clean_topic, partitions=3)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag)
    env["SHUFFLE_PARTITIONS"] = "1"

    # the previous release: v1 records, partition 0's 100..119 lost on the link for now
    produce_records(downstream_kafka, raw, v1(0, range(100)) + v1(0, range(120, 150))
                    + v1(1, range(60)) + v1(2, range(30)))  # fmt: skip
    commit, tree = previous_release
    finish(run_dedup(release_env(tree, env), "--until-idle", "8", cwd=tree))
    checkpoint = Path(env["STATE_DIR_CONFIG"])
    assert (checkpoint / "commits").is_dir()
    layout = checkpoint / LAYOUT_FILE
    recorded = json.loads(layout.read_text())["layout"] if layout.exists() else None
    assert recorded == PREVIOUS[commit]
    assert len(consume_all(downstream_kafka, clean_topic, timeout=30)) == 220
    # this tree's tools read the gap the release reported (what a bundle would carry)
    listed = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "gaps", "--json", "--timeout", "30"],
        env={**os.environ, "BOOTSTRAP_SERVERS": downstream_kafka.bootstrap,
             "GAP_TOPIC": f"gaps.{tag}"},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert [(g["topic"], g["partition"], g["first"], g["last"])
            for g in json.loads(listed.stdout)] == [(SOURCE, 0, 100, 119)]  # fmt: skip

    # this tree, same checkpoint: runs over the old tail and a copy, the resend, new offsets
    produce_records(downstream_kafka, raw, [
        run_record(0, 140, 199), run_record(0, 140, 199), run_record(0, 95, 125),
        run_record(1, 50, 80), run_record(2, 30, 40), *v1(2, range(41, 45)),
    ])  # fmt: skip
    finish(run_dedup(env, "--until-settled"))

    clean = consume_all(downstream_kafka, clean_topic, timeout=30)
    seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert [k for k, n in seen.items() if n > 1] == []
    expected = {(0, o) for o in range(200)} | {(1, o) for o in range(81)}
    expected |= {(2, o) for o in range(45)}
    assert set(seen) == expected
    for r in clean:
        assert (r.key, r.value, tuple(r.headers)) == source_record(
            r.partition, r.timestamp - BASE_TS
        )
    gaps = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gaps if r.value is not None}
    assert [(g["partition"], g["first"], g["last"], g["state"]) for g in latest.values()] == [
        (0, 100, 119, "filled")
    ]


@pytest.mark.slow
def test_a_partitions_checkpoint_is_refused_and_the_upgrade_step_continues_it_once(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    """The retired partitions layout (docs/operations.md "Upgrading"): this tree refuses the
    checkpoint with the step in its message; the step (gaps resolved, the old release run until
    idle, a new checkpoint from the old one's last offsets) loses and repeats nothing.

    Slow (~90 s, a one-off path for checkpoints made before 2026-11-28); CI keeps the refusal
    itself (tests/unit/test_dedup_state_layout.py) and the upgrade from the previous release
    above."""
    tree = extract_release(PARTITIONS_RELEASE, tmp_path)
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    clean_topic = f"clean.{tag}.{SOURCE}"
    create_topic(downstream_kafka, clean_topic, partitions=3)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag)
    env["SHUFFLE_PARTITIONS"] = "1"
    old = release_env(tree, env)

    # the old release: 100..119 lost, reported, resent (the step's first part: no open gap)
    produce_records(downstream_kafka, raw, v1(0, range(100)) + v1(0, range(120, 150))
                    + v1(1, range(60)) + v1(2, range(30)))  # fmt: skip
    finish(run_dedup(old, "--until-idle", "8", cwd=tree))
    produce_records(downstream_kafka, raw, v1(0, range(100, 120)))
    finish(run_dedup(old, "--until-idle", "8", cwd=tree))
    checkpoint = Path(env["STATE_DIR_CONFIG"])
    assert not (checkpoint / LAYOUT_FILE).exists()
    assert len(consume_all(downstream_kafka, clean_topic, timeout=30)) == 240

    # this tree refuses it, and names the step with this checkpoint's offsets
    refused = run_dedup(env, "--until-settled")
    refused.wait(timeout=400)
    log = refused.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
    assert refused.returncode != 0
    assert "partitions state layout" in log
    start = log.index("KAFKA_SOURCE_STARTINGOFFSETS='") + len("KAFKA_SOURCE_STARTINGOFFSETS='")
    offsets = json.loads(log[start : log.index("'", start)])
    assert offsets == {raw: {"0": 150, "1": 60, "2": 30}}  # the raw topic alone: direct

    # the step: a new checkpoint that starts there; new records only, each once
    produce_records(downstream_kafka, raw, [
        run_record(0, 150, 199), run_record(1, 60, 80), run_record(2, 30, 40),
        *v1(2, range(41, 45)),
    ])  # fmt: skip
    new = {**env, "STATE_DIR_CONFIG": str(tmp_path / "checkpoint-new"),
           "KAFKA_SOURCE_STARTINGOFFSETS": json.dumps(offsets)}  # fmt: skip
    finish(run_dedup(new, "--until-settled"))
    assert json.loads((tmp_path / "checkpoint-new" / LAYOUT_FILE).read_text())["layout"] == "direct"

    clean = consume_all(downstream_kafka, clean_topic, timeout=30)
    seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert [k for k, n in seen.items() if n > 1] == []
    expected = {(0, o) for o in range(200)} | {(1, o) for o in range(81)}
    expected |= {(2, o) for o in range(45)}
    assert set(seen) == expected
    gaps = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    latest = {r.key: json.loads(r.value) for r in gaps if r.value is not None}
    assert [g["state"] for g in latest.values()] == ["filled"]


@pytest.mark.slow
def test_a_new_checkpoint_from_the_old_ones_last_offsets_repeats_and_loses_nothing(
    downstream_kafka, kafka_topic, tmp_path
) -> None:
    """Starting over (docs/dedup.md "Starting over"): the old dedup caught up and stopped,
    the receiver kept writing meanwhile, and a new checkpoint starts at the old one's last
    offsets, read from its ``offsets/`` as the docs say. Every record reaches the clean topic
    once: those the old job delivered are not repeated, those written while no dedup ran are not
    skipped (``latest``, the advice this replaced, would start past them). Slow (~60 s)."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    tag = raw
    clean_topic = f"clean.{tag}.{SOURCE}"
    create_topic(downstream_kafka, clean_topic, partitions=3)
    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, tag)
    produce_records(downstream_kafka, raw, [run_record(p, 0, 99) for p in range(3)])
    finish(run_dedup(env, "--until-settled"))
    assert len(consume_all(downstream_kafka, clean_topic, timeout=30)) == 300

    # the receiver keeps writing while no dedup runs
    produce_records(downstream_kafka, raw, [run_record(p, 100, 149) for p in range(3)])
    offsets_dir = Path(env["STATE_DIR_CONFIG"]) / "offsets"
    last = max((p for p in offsets_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    offsets = json.loads(last.read_text().splitlines()[2])
    assert set(offsets) == {raw}  # the direct layout reads the raw topic alone
    new = {**env, "STATE_DIR_CONFIG": str(tmp_path / "checkpoint-new"),
           "STATE_TOPIC": f"state-new.{raw}",
           "KAFKA_SOURCE_STARTINGOFFSETS": json.dumps(offsets)}  # fmt: skip
    finish(run_dedup(new, "--until-settled"))

    clean = consume_all(downstream_kafka, clean_topic, timeout=30)
    seen = Counter((r.partition, int(r.timestamp - BASE_TS)) for r in clean)
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) == {(p, o) for p in range(3) for o in range(150)}
    try:
        gaps = consume_all(downstream_kafka, f"gaps.{tag}", timeout=30)
    except RuntimeError:  # never created: no gap was ever reported
        gaps = []
    latest = {r.key: json.loads(r.value) for r in gaps if r.value is not None}
    assert [g for g in latest.values() if g["state"] == "open"] == []
