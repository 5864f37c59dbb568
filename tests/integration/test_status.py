"""``kafka-diode status`` against real processes (issue 25 item 6): a real sender and receiver
on the session brokers; the gap topic holds what the dedup would write. Exit 0 when all is well,
1 with a line per reason when a person is needed (an open gap, a silent link, an endpoint that
does not answer, a clean topic too far behind what the sender vouched for), 3 when Kafka cannot
be read. How far the clean topic is behind is checked against a real dedup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from common.gap_record import GapReport, GapState, gap_key, gap_value
from common.raw_topic import CONTROL_HEADER, HEARTBEAT, heartbeat_records
from common.wire.events import Heartbeat
from kafka_diode.local_kafka.broker import free_port
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import ProcessGroup, diode_command, wait_until
from kafka_diode.status import dedup_next_offsets, scrape
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records, raw_run_record
from tests.kafka_helpers import wait_until as waited

pytestmark = pytest.mark.kafka


def _status(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return _status_of(p.ep.downstream, p.ep.raw_topic, p.ep.gap_topic, *args)


def _status_of(
    bootstrap: str, raw_topic: str, gap_topic: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_diode", "status",
         "--bootstrap-servers", bootstrap, "--raw-topics", raw_topic,
         "--gap-topic", gap_topic, "--rate-window", "1", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return doc


def test_status_tells_when_a_person_is_needed(
    upstream_kafka: Any, downstream_kafka: Any, tmp_path: Path
) -> None:
    spec = PipelineSpec(
        records=600, topics=("orders",), partitions=2, profile=None, run_dedup=False,
        heartbeat_interval=0.5,
    )  # fmt: skip
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.setup()
        p.start_components(receiver_first=True)
        assert p.produce() == 600
        receiver = f"127.0.0.1:{p.ep.metrics['receiver']}"
        source = p.ep.source_topics[0]

        def caught_up() -> bool:
            doc = _json(_status(p, "--json", "--receiver-metrics", receiver))
            return (
                sum(s["received"] + 1 for s in doc["sources"] if s["received"] is not None) == 600
            )

        wait_until(caught_up, timeout=90, interval=0.5, what="records and heartbeats in raw")

        ok = _status(p, "--receiver-metrics", receiver)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "OK: nothing to do" in ok.stdout
        assert "a bundle now would carry 0 range(s), 0 record(s)" in ok.stdout
        doc = _json(_status(p, "--json", "--receiver-metrics", receiver))
        assert {(s["topic"], s["partition"]) for s in doc["sources"]} == {(source, 0), (source, 1)}
        assert all(s["vouched"] == s["received"] for s in doc["sources"])
        assert all(s["heartbeat_age"] < 30 for s in doc["sources"])
        assert doc["receiver"]["datagrams_per_s"] > 0  # heartbeats keep the link busy

        # the dedup reports a gap: a resend is due, and a bundle would carry exactly it
        now = int(time.time() * 1000)
        gap = GapReport(topic=source, partition=1, first=10, last=14, state=GapState.OPEN,
                        detected_at=now, reported_at=now)  # fmt: skip
        producer = Producer({"bootstrap.servers": p.ep.downstream})
        producer.produce(p.ep.gap_topic, key=gap_key(gap), value=gap_value(gap))
        producer.flush(30)
        gapped = _status(p, "--receiver-metrics", receiver)
        assert gapped.returncode == 1, gapped.stdout
        assert "1 open gap(s), 5 record(s) missing in 1 partition(s)" in gapped.stdout
        assert "a bundle now would carry 1 range(s), 5 record(s)" in gapped.stdout

        # an endpoint that does not answer needs a person too
        nobody = f"127.0.0.1:{free_port()}"
        down = _status(p, "--receiver-metrics", nobody, "--gap-topic", p.ep.raw_topic + "x")
        assert down.returncode == 3  # a gap topic that does not exist: Kafka cannot be read
        missing = _status(p, "--dedup-metrics", nobody)
        assert missing.returncode == 1
        assert f"dedup metrics {nobody} does not answer" in missing.stdout

        # the sender stops: its heartbeats age until status says the link is silent
        p.group["sender"].stop()

        def silent() -> bool:
            result = _status(p, "--silent-after", "3")
            return result.returncode == 1 and "link or sender silent" in result.stdout

        wait_until(silent, timeout=60, interval=1.0, what="status to call the link silent")


def test_a_configuration_error_exits_2_naming_the_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "status", "--bootstrap-servers", "h:1",
         "--scan-records", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--scan-records" in result.stderr


def test_watch_redraws_until_ctrl_c(downstream_kafka: Any, tmp_path: Path) -> None:
    raw = create_topic(downstream_kafka, partitions=2)
    gaps = create_topic(downstream_kafka, partitions=1)
    out = tmp_path / "watch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kafka_diode", "status", "--watch", "--interval", "0.5",
             "--bootstrap-servers", downstream_kafka.bootstrap, "--raw-topics", raw,
             "--gap-topic", gaps],
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(
            lambda: out.read_text().count("OK: nothing to do") >= 2,
            timeout=60,
            interval=0.2,
            what="two rounds of --watch",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _clean_view(p: Pipeline, dedup: str, *args: str) -> dict[tuple[str, int], dict[str, Any]]:
    doc = _json(_status(p, "--json", "--dedup-metrics", dedup, *args))
    return {(s["topic"], s["partition"]): s for s in doc["sources"]}


@pytest.mark.spark
def test_status_shows_how_far_the_clean_topic_is_behind_what_the_sender_vouched_for(
    upstream_kafka: Any, downstream_kafka: Any, tmp_path: Path
) -> None:
    """A real dedup: caught up, each source partition's clean topic reaches the offset the
    sender vouched for; restarted so that it crawls (one raw record per micro-batch) while 600
    more records arrive, the clean topic is that far behind and status says so."""
    # the receiver writes every heartbeat, not only changed ones: they keep the crawler behind
    spec = PipelineSpec(
        records=600, topics=("orders",), partitions=2, profile=None, heartbeat_interval=0.5,
        extra_env=(("DIODE_RECEIVER_HEARTBEAT_REPEAT_INTERVAL", "0"),),
    )  # fmt: skip
    with Pipeline(
        spec, tmp_path, upstream=upstream_kafka.bootstrap, downstream=downstream_kafka.bootstrap
    ) as p:
        p.setup()
        p.start_components(receiver_first=True)
        assert p.produce() == 600
        dedup = f"127.0.0.1:{p.ep.metrics['dedup']}"

        def caught_up() -> dict[tuple[str, int], dict[str, Any]] | None:
            view = _clean_view(p, dedup)
            done = len(view) == 2 and all(
                s["clean"] is not None and s["clean"] == s["vouched"] == s["received"]
                for s in view.values()
            )
            return view if done and sum(s["clean"] + 1 for s in view.values()) == 600 else None

        before = waited(caught_up, 240, 1.0, message="the clean topic caught up")
        assert all(s["clean_behind"] == 0 for s in before.values())
        ok = _status(p, "--dedup-metrics", dedup, "--max-clean-lag", "0")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "CLEAN BEHIND" in ok.stdout

        # the same dedup from its checkpoint, crawling: one raw record per batch, fewer than the
        # heartbeats arriving (four a second). The new records are produced only once it is 30
        # raw records behind, so they sit behind that backlog for ~30 batches: the window in
        # which the clean topic is behind does not depend on how few raw runs carry them.
        p.group["dedup"].stop()
        slow = {**p.dedup_env(), "MAX_OFFSETS_PER_TRIGGER": "1"}
        p.group.add("dedup-slow", p.dedup_argv(), env=slow, stop_timeout=60)
        dedup = f"127.0.0.1:{p.ep.metrics['dedup']}"  # dedup_argv() gave it a new port

        def crawling() -> bool:
            doc = _json(_status(p, "--json", "--dedup-metrics", dedup))
            return (doc["dedup_backlog"] or 0) >= 30

        waited(crawling, 240, 1.0, message="the crawling dedup 30 raw records behind")
        assert p.produce() == 1200
        seen: list[object] = []

        def behind() -> dict[str, Any] | None:
            # one status run gives both the view and the verdict: the crawler moves between runs
            doc = _json(_status(p, "--json", "--dedup-metrics", dedup, "--max-clean-lag", "10"))
            seen[:] = [doc]
            view = {(s["topic"], s["partition"]): s for s in doc["sources"]}
            arrived = len(view) == 2 and all(
                s["vouched"] == s["received"] and s["clean"] is not None for s in view.values()
            )
            total = sum(s["vouched"] + 1 for s in view.values()) if arrived else 0
            return doc if total == 1200 else None

        try:
            late = waited(behind, 240, 1.0, message="the new records in raw")
        except TimeoutError as exc:
            raise AssertionError(f"last status view: {seen}") from exc
        after = {(s["topic"], s["partition"]): s for s in late["sources"]}
        for tp, s in after.items():
            assert before[tp]["clean"] <= s["clean"] <= s["vouched"]
            assert s["clean_behind"] == s["vouched"] - s["clean"]
        assert 10 < sum(s["clean_behind"] for s in after.values()) <= 600, late
        assert late["exit_code"] == 1, late
        assert any("behind what the sender vouched for" in m for m in late["problems"]), late
        # a raw tail of 3 records (heartbeats) holds no run the dedup has read: what status
        # says then comes from the window before the dedup's next offset, and never more than
        # the clean topic holds (a source whose runs are not in that window shows no figure)
        short = _clean_view(p, dedup, "--scan-records", "3")
        latest = _clean_view(p, dedup)
        for tp, s in short.items():
            assert s["clean"] is None or before[tp]["clean"] <= s["clean"] <= latest[tp]["clean"]


#: Records per run of each source partition in the raw topic of the test below.
_RUN_WIDTH = {0: 10, 1: 5}
_SESSION = bytes(range(16))


def _heartbeat_record(topic: str, partition: int, high: int) -> Record:
    """The receiver's raw record of a heartbeat vouching for ``0..high``, in raw partition 0."""
    now = int(time.time() * 1000)
    beat = Heartbeat(
        session_id=_SESSION, sequence=0, sender_id="test", started_at_ms=now - 60_000,
        sent_at_ms=now, high_offsets=((topic, partition, high),),
        low_offsets=((topic, partition, 0),), counters=(),
    )  # fmt: skip
    ((_, _, key, value),) = heartbeat_records(beat)
    return Record(
        key=key.encode(), value=value, headers=((CONTROL_HEADER, HEARTBEAT),), partition=0
    )


def _dedup_next(endpoint: str, raw_topic: str) -> int | None:
    """The dedup's ``raw_next_offset`` of raw partition 0, None before its first batch."""
    metrics = scrape(endpoint)
    return None if metrics is None else dedup_next_offsets(metrics).get((raw_topic, 0))


@pytest.mark.spark
def test_clean_comes_from_the_window_before_the_dedups_next_offset_when_the_tail_lies_past_it(
    downstream_kafka: Any, tmp_path: Path
) -> None:
    """A raw partition of 120 records as the receiver writes them (30 rounds of a run of each of
    two source partitions, 10 and 5 records, then a heartbeat of each); a real dedup reads the
    first 40 (10 rounds) in one micro-batch and, its trigger an hour long, stays there. The raw
    tail (--scan-records 10) holds no record below the dedup's next offset: ``clean`` (99 and
    49) and ``clean_behind`` (200 and 100) come from the second window, the 10 records before
    that offset, and match what the clean topic holds, what a tail starting just below that
    offset says and what reading the whole partition says."""
    bootstrap = downstream_kafka.bootstrap
    raw = create_topic(downstream_kafka, partitions=1)
    source = "orders"
    clean_topic = create_topic(downstream_kafka, f"{raw}.clean.{source}", partitions=2)
    gap_topic = f"{raw}.gaps"
    rounds, read = 30, 40
    records: list[Record] = []
    runs: list[tuple[int, int, int]] = []  # (raw offset, source partition, last source offset)
    for r in range(rounds):
        for p, width in _RUN_WIDTH.items():
            runs.append((len(records), p, (r + 1) * width - 1))
            records.append(raw_run_record(source, p, r * width, (r + 1) * width - 1, _SESSION))
        records += [_heartbeat_record(source, p, (r + 1) * w - 1) for p, w in _RUN_WIDTH.items()]
    assert produce_records(bootstrap, raw, records) == [(0, o) for o in range(len(records))]
    high = len(records)
    vouched = {p: rounds * width - 1 for p, width in _RUN_WIDTH.items()}

    def clean_at(nxt: int) -> dict[int, int]:
        """Per source partition the highest offset of the runs below raw offset ``nxt``."""
        return {p: max(last for o, q, last in runs if q == p and o < nxt) for p in _RUN_WIDTH}

    port = free_port()
    dedup = f"127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "RAW_TOPICS": raw,
        "BOOTSTRAP_SERVERS": bootstrap,
        "CLEAN_TOPIC": f"{raw}.clean.{{topic}}",
        "GAP_TOPIC": gap_topic,
        "PROGRESS_TOPIC": f"{raw}.progress",
        "CONTROL_TOPIC": f"{raw}.control",
        "STATE_DIR_CONFIG": str(tmp_path / "checkpoint"),
        "SPARK_MASTER": "local[2]",
        "SHUFFLE_PARTITIONS": "2",
        # one micro-batch of the first `read` raw records, then none for an hour (the trigger;
        # Spark aligns it to the clock, so a second batch may come at the full hour: the
        # expectations follow the offset the dedup reports) and no idle tick before that
        "MAX_OFFSETS_PER_TRIGGER": str(read),
        "PERSIST_INTERVAL_MS": "3600000",
        "GAP_EMIT_INTERVAL_SEC": "3600",
    }
    with ProcessGroup(tmp_path / "logs") as group:
        proc = group.add(
            "dedup", diode_command("dedup", "--metrics-port", str(port)), env=env, stop_timeout=60
        )
        wait_until(
            lambda: _dedup_next(dedup, raw) is not None,
            timeout=300,
            interval=0.5,
            what="the dedup's first micro-batch",
            alive=[proc],
        )

        def still(read_once: Any) -> tuple[int, Any]:
            """``read_once()`` and the dedup's next offset, which did not move meanwhile."""

            def attempt() -> tuple[int, Any] | None:
                before = _dedup_next(dedup, raw)
                got = read_once()
                if before is None or before != _dedup_next(dedup, raw):
                    return None
                return before, got

            result = waited(attempt, 120, 0.5, message="the dedup at rest")
            assert result is not None
            return result

        def view(scan: int, *args: str) -> tuple[int, dict[str, Any], int]:
            """The dedup's next offset, status --json and its exit code."""

            def read_once() -> tuple[int, dict[str, Any]]:
                result = _status_of(
                    bootstrap, raw, gap_topic, "--json", "--dedup-metrics", dedup,
                    "--scan-records", str(scan), "--silent-after", "3600", *args,
                )  # fmt: skip
                return result.returncode, _json(result)

            nxt, (code, doc) = still(read_once)
            return nxt, doc, code

        # the tail (10 records) lies wholly past the dedup's next offset
        nxt, doc, code = view(10, "--max-clean-lag", "150")
        assert read <= nxt <= high - 10, "the dedup must read further back than the raw tail"
        clean = clean_at(nxt)
        if nxt == read:  # as planned (the docstring)
            assert clean == {0: 99, 1: 49}
        sources = {s["partition"]: s for s in doc["sources"] if s["topic"] == source}
        assert sorted(sources) == [0, 1], doc
        for p in _RUN_WIDTH:
            s = sources[p]
            assert (s["vouched"], s["received"]) == (vouched[p], vouched[p]), s
            assert (s["clean"], s["clean_behind"]) == (clean[p], vouched[p] - clean[p]), s
        assert doc["problems"] == [
            f"{source}[{p}]: the clean topic is {vouched[p] - clean[p]} record(s) behind what the "
            f"sender vouched for (offset {vouched[p]}, clean up to {clean[p]}; more than 150): "
            "the dedup falls behind"
            for p in _RUN_WIDTH
            if vouched[p] - clean[p] > 150
        ]
        assert code == (1 if doc["problems"] else 0), doc

        # the clean topic holds exactly what `clean` says: every source offset up to it
        def clean_offsets() -> dict[int, set[int]]:
            got: dict[int, set[int]] = {p: set() for p in _RUN_WIDTH}
            for r in consume_all(bootstrap, clean_topic, timeout=30):
                assert r.value is not None
                got[r.partition].add(int(r.value))
            return got

        nxt, held = still(clean_offsets)
        assert held == {p: set(range(c + 1)) for p, c in clean_at(nxt).items()}

        # a tail that starts just below the dedup's next offset, at a heartbeat: the rest of the
        # window before that offset is read too, so a longer tail never says less
        nxt, doc, _ = view(high - read + 1)
        near = {s["partition"]: (s["clean"], s["clean_behind"]) for s in doc["sources"]}
        clean = clean_at(nxt)
        assert near == {p: (clean[p], vouched[p] - clean[p]) for p in _RUN_WIDTH}

        # reading the whole partition at once says the same
        nxt, doc, _ = view(1000)
        whole = {s["partition"]: (s["clean"], s["clean_behind"]) for s in doc["sources"]}
        clean = clean_at(nxt)
        assert whole == {p: (clean[p], vouched[p] - clean[p]) for p in _RUN_WIDTH}
