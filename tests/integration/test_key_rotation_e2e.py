"""A link key rotated and the old one retired while records flow, as docs/security.md says.

"Link keys: creation and rotation", steps 1-6, with the real commands on the real processes: a
new key appended with ``keygen --add`` on a copy of the ring (the trusted machine), installed
with ``install`` on the receiver first and on the sender second, each side reloading by itself
(``key_check_interval``); later the old key removed from the ring, receiver first again. Records
flow during the rotation; after the retirement the receiver holds only the new key, so records
arriving then prove the sender encrypts with it. Nothing may be dropped (``unknown_key`` or any
other reason) and every record must reach its clean topic once, with no gap ever reported.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker
from kafka_diode.pipeline import Pipeline, PipelineSpec
from kafka_diode.processes import diode_command, wait_until
from kafka_diode.verify import read_topic
from tests.chaos.harness import scrape
from tests.integration.test_clean_link import assert_first_time

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

RECORDS = 30_000
ROTATE_AT = 10_000  # records produced when the rotation starts (production goes on)
RETIRE_AT = 20_000  # production waits here until the old key is retired on both sides
RATE = 1_000  # records/s offered upstream: ~3 MB/s of values from 50 B to 20 KB

SENDER_RELOADS = "kafka_diode_sender_keyring_reloads_total"
RECEIVER_RELOADS = "kafka_diode_receiver_keyring_reloads_total"


def install(ring: Path, target: Path) -> None:
    """The docs' ``install -m 0640 ... link.key /etc/kafka-diode/keys/link.key`` (as root)."""
    subprocess.run(["install", "-m", "0640", str(ring), str(target)], check=True)


def wait_reloads(p: Pipeline, component: str, metric: str, count: int) -> None:
    def reloaded() -> bool:
        return scrape(p.ep.metrics[component]).get(metric, 0.0) >= count

    wait_until(reloaded, timeout=30, interval=0.2, what=f"{component} to reload its key ring")


def records_sent(p: Pipeline) -> float:
    return scrape(p.ep.metrics["sender"])["kafka_diode_sender_records_sent_total"]


def test_rotating_and_retiring_the_link_key_while_records_flow_drops_nothing(
    upstream_kafka: LocalBroker, downstream_kafka: LocalBroker, tmp_path: Path
) -> None:
    spec = PipelineSpec(
        records=RECORDS,
        value_size=50,
        value_size_max=20_000,
        produce_rate=RATE,
        profile="clean",
        heartbeat_interval=2.0,
        gap_emit_interval=2.0,
    )
    trusted = tmp_path / "trusted-machine" / "link.key"
    flowing, at_retire, retired = threading.Event(), threading.Event(), threading.Event()

    def gate(seq: int) -> None:
        if seq == ROTATE_AT:
            flowing.set()
        elif seq == RETIRE_AT:
            at_retire.set()
            retired.wait(timeout=300)

    with Pipeline(
        spec, tmp_path / "run", upstream=upstream_kafka.bootstrap,
        downstream=downstream_kafka.bootstrap,
    ) as p:  # fmt: skip
        p.setup()
        p.start_components(receiver_first=True)
        producer = threading.Thread(target=p.produce, kwargs={"gate": gate}, daemon=True)
        producer.start()
        try:
            assert flowing.wait(timeout=120), "production did not reach the rotation point"
            old_id = json.loads(p.ep.key_file.read_text())["active"]

            # 1. a new key, on a copy of the ring; 2. receiver first; 4. sender second
            trusted.parent.mkdir()
            install(p.ep.key_file, trusted)
            keygen = subprocess.run(
                diode_command("keygen", "--add", "--out", str(trusted)),
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            new_id = keygen.stdout.split()[0]
            assert new_id != old_id
            sent_before = records_sent(p)
            install(trusted, p.ep.key_file)
            wait_reloads(p, "receiver", RECEIVER_RELOADS, 1)
            install(trusted, p.ep.sender_key_file)
            wait_reloads(p, "sender", SENDER_RELOADS, 1)
            sent_during = records_sent(p) - sent_before

            # 6. retire the old key once everything sent with it has arrived
            assert at_retire.wait(timeout=120), "production did not reach the retirement point"
            wait_until(
                lambda: (v := p.verdict()).ok and v.exactly_once >= RETIRE_AT,
                timeout=120, interval=1.0, what="the records before the retirement delivered",
            )  # fmt: skip
            ring = json.loads(trusted.read_text())
            ring["keys"] = [k for k in ring["keys"] if k["id"] != old_id]
            assert ring["active"] == new_id
            assert len(ring["keys"]) == 1
            trusted.write_text(json.dumps(ring, indent=2) + "\n")
            install(trusted, p.ep.key_file)
            wait_reloads(p, "receiver", RECEIVER_RELOADS, 2)
            install(trusted, p.ep.sender_key_file)
            wait_reloads(p, "sender", SENDER_RELOADS, 2)
        finally:
            retired.set()
        producer.join(timeout=120)
        assert not producer.is_alive()

        verdict = p.wait_settled(timeout=300, want_ok=True)
        receiver = scrape(p.ep.metrics["receiver"])
        sender = scrape(p.ep.metrics["sender"])
        gaps = read_topic(p.ep.downstream, p.ep.gap_topic, committed_only=False)

    # the rotation happened while records flowed, and records flowed after the retirement
    assert sent_during > 0, "no record was sent while the key changed"
    assert sender["kafka_diode_sender_records_sent_total"] >= RECORDS
    assert_first_time(verdict, spec, receiver, gaps)  # no unknown_key, no other drop, no gap
    assert receiver[RECEIVER_RELOADS] == 2
    assert sender[SENDER_RELOADS] == 2
    assert receiver.get("kafka_diode_receiver_keyring_reload_errors_total", 0) == 0
