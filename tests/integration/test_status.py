"""``kafka-diode status`` against real processes (issue 25 item 6): a real sender and receiver
on the session brokers; the gap topic holds what the dedup would write. Exit 0 when all is well,
1 with a line per reason when a person is needed (an open gap, a silent link, an endpoint that
does not answer, a clean topic too far behind what the sender vouched for), 3 when Kafka cannot
be read. How far the clean topic is behind is checked against a real dedup."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from common.gap_record import GapReport, GapState, gap_key, gap_value
from kafka_diode.local_kafka.broker import free_port
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import wait_until
from tests.kafka_helpers import create_topic
from tests.kafka_helpers import wait_until as waited

pytestmark = pytest.mark.kafka


def _status(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_diode", "status",
         "--bootstrap-servers", p.ep.downstream, "--raw-topics", p.ep.raw_topic,
         "--gap-topic", p.ep.gap_topic, "--rate-window", "1", *args],
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
    spec = PipelineSpec(
        records=600, topics=("orders",), partitions=2, profile=None, heartbeat_interval=0.5,
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
        # heartbeats arriving (four a second), so it stays behind while 600 more records arrive
        p.group["dedup"].stop()
        slow = {**p.dedup_env(), "MAX_OFFSETS_PER_TRIGGER": "1"}
        p.group.add("dedup-slow", p.dedup_argv(), env=slow, stop_timeout=60)
        dedup = f"127.0.0.1:{p.ep.metrics['dedup']}"  # dedup_argv() gave it a new port
        assert p.produce() == 1200
        seen: list[object] = []

        def behind() -> dict[tuple[str, int], dict[str, Any]] | None:
            view = _clean_view(p, dedup)
            seen[:] = [view]
            arrived = len(view) == 2 and all(
                s["vouched"] == s["received"] and s["clean"] is not None for s in view.values()
            )
            total = sum(s["vouched"] + 1 for s in view.values()) if arrived else 0
            return view if total == 1200 else None

        try:
            after = waited(behind, 240, 1.0, message="the new records in raw")
        except TimeoutError as exc:
            raise AssertionError(f"last status view: {seen}") from exc
        for tp, s in after.items():
            assert before[tp]["clean"] <= s["clean"] <= s["vouched"]
            assert s["clean_behind"] == s["vouched"] - s["clean"]
        assert 10 < sum(s["clean_behind"] for s in after.values()) <= 600
        late = _status(p, "--dedup-metrics", dedup, "--max-clean-lag", "10")
        assert late.returncode == 1, late.stdout
        assert "behind what the sender vouched for" in late.stdout
        # a raw tail of 3 records (heartbeats) holds no run the dedup has read: what status
        # says then comes from the window before the dedup's next offset, and never more than
        # the clean topic holds (a source whose runs are not in that window shows no figure)
        short = _clean_view(p, dedup, "--scan-records", "3")
        latest = _clean_view(p, dedup)
        for tp, s in short.items():
            assert s["clean"] is None or before[tp]["clean"] <= s["clean"] <= latest[tp]["clean"]
