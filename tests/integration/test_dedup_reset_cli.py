"""``kafka-diode dedup reset``: one reset control record, in the raw-topic layout the job reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from common.raw_topic import CONTROL_HEADER, RESET, parse_raw_key
from dedup.layouts import LAYOUT_FILE
from tests.kafka_helpers import bootstrap_of, consume_all


def test_reset_writes_one_control_record_for_the_partition(
    downstream_kafka: object, kafka_topic: Callable[..., str]
) -> None:
    control = kafka_topic(downstream_kafka, partitions=1)
    env = {
        **os.environ,
        "BOOTSTRAP_SERVERS": bootstrap_of(downstream_kafka),  # type: ignore[arg-type]
        "CONTROL_TOPIC": control,  # the dedup's own variable, as in its env file
        "USER": "night-shift",
    }
    done = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "dedup", "reset", "--topic", "orders",
         "--partition", "2", "--yes"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = consume_all(downstream_kafka, control, expected_count=1)
    assert len(records) == 1
    record = records[0]
    assert parse_raw_key(record.key) == ("orders", 2, 0)
    assert (CONTROL_HEADER, RESET) in list(record.headers)
    value = json.loads(record.value)
    assert value["type"] == "reset"
    assert value["requested_by"] == "night-shift"


def test_reset_without_bootstrap_names_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_SERVERS"}
    done = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "dedup", "reset", "--topic", "t",
         "--partition", "0", "--yes"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 2
    assert "BOOTSTRAP_SERVERS" in done.stderr


def test_a_direct_checkpoints_reset_goes_into_the_source_partitions_raw_partition(
    downstream_kafka: object, kafka_topic: Callable[..., str], tmp_path
) -> None:
    """docs/dedup.md "The direct layout": each raw partition's task holds its source
    partitions' state, so the reset goes there (partition 5 of a 3-partition raw topic: 2),
    found from the checkpoint's layout file; the control topic gets nothing."""
    raw = kafka_topic(downstream_kafka, partitions=3)
    control = kafka_topic(downstream_kafka, partitions=1)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / LAYOUT_FILE).write_text('{"layout": "direct", "raw_partitions": 3}')
    env = {
        **os.environ,
        "BOOTSTRAP_SERVERS": bootstrap_of(downstream_kafka),  # type: ignore[arg-type]
        "CONTROL_TOPIC": control,
        "RAW_TOPICS": raw,
        "STATE_DIR_CONFIG": str(checkpoint),
    }
    done = subprocess.run(
        [sys.executable, "-m", "kafka_diode", "dedup", "reset", "--topic", "orders",
         "--partition", "5", "--yes"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = consume_all(downstream_kafka, raw, expected_count=1)
    assert [(r.partition, parse_raw_key(r.key)) for r in records] == [(2, ("orders", 5, 0))]
    assert (CONTROL_HEADER, RESET) in list(records[0].headers)
    assert f"via {raw} partition 2" in done.stderr
    assert consume_all(downstream_kafka, control, timeout=3) == []
