"""The dedup started while its Kafka is away (systemd restarting it during an outage) waits for
the cluster instead of failing, then delivers (issue 25: a dedup restart during an outage).

Failing starts would use up the unit's ``StartLimitBurst`` (5 in 600 s at ``RestartSec=15s``)
and leave the dedup down once the cluster is back. A real broker of the test's own is stopped,
the real ``kafka-diode dedup`` process is started against it, and the broker is started again.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.processes import ProcessGroup, diode_command, wait_until
from tests.kafka_helpers import consume_all, create_topic, produce_records, raw_run_record

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

#: How long the cluster stays away after the dedup said it waits (it probes once a second).
OUTAGE_S = 6.0


def test_a_dedup_started_while_kafka_is_away_waits_then_delivers(tmp_path: Path) -> None:
    broker = LocalBroker(f"dedup-wait-{free_port()}", free_port(), data_dir=tmp_path / "kafka")
    broker.start()
    try:
        bootstrap = broker.bootstrap
        raw = create_topic(broker, partitions=1)
        clean = create_topic(broker, f"{raw}.clean.orders", partitions=1)
        produce_records(bootstrap, raw, [raw_run_record("orders", 0, 0, 99)])
        broker.stop()
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "RAW_TOPICS": raw,
            "BOOTSTRAP_SERVERS": bootstrap,
            "CLEAN_TOPIC": f"{raw}.clean.{{topic}}",
            "GAP_TOPIC": f"{raw}.gaps",
            "PROGRESS_TOPIC": f"{raw}.progress",
            "CONTROL_TOPIC": f"{raw}.control",
            "STATE_DIR_CONFIG": str(tmp_path / "checkpoint"),
            "SPARK_MASTER": "local[1]",
            "SHUFFLE_PARTITIONS": "1",
        }
        with ProcessGroup(tmp_path / "logs") as group:
            dedup = group.add(
                "dedup",
                diode_command("dedup", "--metrics-port", str(free_port())),
                env=env,
                stop_timeout=60,
            )
            wait_until(
                lambda: "does not answer" in dedup.log_text(),
                timeout=60,
                what="the dedup saying it waits for Kafka",
                alive=[dedup],
            )
            # the outage's length is the fault itself (as a systemd restart would meet it)
            threading.Event().wait(OUTAGE_S)
            assert dedup.running, dedup.tail()
            assert "before starting Spark" in dedup.log_text()
            broker.start()
            wait_until(
                lambda: len(consume_all(broker, clean, expected_count=100, timeout=5)) >= 100,
                timeout=300,
                interval=2.0,
                what="the 100 records in the clean topic",
                alive=[dedup],
            )
            assert dedup.running
        records = consume_all(broker, clean, expected_count=100, timeout=30)
        assert sorted(int(r.value or b"-1") for r in records) == list(range(100))
    finally:
        broker.stop()
