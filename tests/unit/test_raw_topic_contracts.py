"""The receiver and the dedup share three contracts of ``common/raw_topic.py`` (docs/topics.md):
where a source partition lands in the raw topic (``raw_partition_of``), how many share chains
there may be (``MAX_CHAINS``) and how a ``{topic}`` template is filled (``fill_topic``). Each side
is pinned here to the one definition, so neither can drift from the other."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import common.raw_run
import sender.config
from common.errors import LocalProtocolError
from common.raw_run import parse_run_key, run_key
from common.raw_topic import MAX_CHAINS, TOPIC_FIELD, fill_topic, raw_partition_of
from dedup.config import from_sources
from dedup.detector import DetectorConfig, PartitionDetector
from dedup.direct_task import _drop_misrouted
from dedup.rows import KIND_DATA, KIND_MALFORMED, UNPARSED_PARTITION, UNPARSED_TOPIC
from dedup.transaction import PartitionWriter
from dedup.writer_settings import WriterSettings
from receiver.config import ReceiverConfig
from tests.unit.test_receiver_sink import FakeProducer, _batch, _group, _sink


def test_raw_partition_of_is_p_mod_n_on_ints_and_arrays() -> None:
    assert [raw_partition_of(p, 3) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    partitions = np.arange(7, dtype=np.int64)
    assert raw_partition_of(partitions, 3).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_the_receiver_writes_each_source_partition_into_raw_partition_of() -> None:
    fake = FakeProducer({"raw": 3})
    sink, _ = _sink(fake)
    sink.write_batch(_batch(*(_group(p, range(2)) for p in range(7))))
    assert asyncio.run(sink.close(1.0)) == 0
    placed = {parse_run_key(call[2])[1]: call[3] for call in fake.calls if call[0] == "raw"}  # type: ignore[index]
    assert placed == {p: raw_partition_of(p, 3) for p in range(7)}


def test_the_direct_dedup_takes_only_the_source_partitions_of_raw_partition_of() -> None:
    partitions = np.arange(7, dtype=np.int64)
    columns = {
        "kind": np.full(7, KIND_DATA),
        "src_partition": partitions.copy(),
        "src_topic": np.array(["t"] * 7, dtype=object),
    }
    _drop_misrouted(columns, 3, "raw", 1)
    kept = columns["kind"] != KIND_MALFORMED
    assert partitions[kept].tolist() == [p for p in range(7) if raw_partition_of(p, 3) == 1]
    assert set(columns["src_topic"][~kept]) == {UNPARSED_TOPIC}
    assert set(columns["src_partition"][~kept].tolist()) == {UNPARSED_PARTITION}


def test_every_side_takes_max_chains_from_common() -> None:
    assert sender.config.MAX_CHAINS is MAX_CHAINS
    assert common.raw_run.MAX_STRIDE == MAX_CHAINS
    assert parse_run_key(run_key("t", 0, 0, MAX_CHAINS, MAX_CHAINS)) is not None
    assert parse_run_key(run_key("t", 0, 0, MAX_CHAINS + 1, MAX_CHAINS + 1)) is None
    detector = PartitionDetector("t", 0, DetectorConfig(window_size=100, max_windows=4))
    detector.chain_heartbeat(MAX_CHAINS, MAX_CHAINS, 10, 0)
    with pytest.raises(LocalProtocolError):
        detector.chain_heartbeat(1, MAX_CHAINS + 1, 10, 0)


@pytest.mark.parametrize("template", ["clean", TOPIC_FIELD, "x.{topic}.y"])
def test_every_side_fills_a_topic_template_with_fill_topic(template: str) -> None:
    expected = fill_topic(template, "orders")
    receiver = ReceiverConfig(bootstrap_servers="k:9092", raw_topic=template, allow_cleartext=True)
    assert receiver.raw_topic_for("orders") == expected
    dedup = from_sources(
        {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/d"},
        {"clean_topic": template},
    )
    assert dedup.clean_topic_for("orders") == expected
    settings = WriterSettings(
        bootstrap_servers="k:9092",
        clean_topic=template,
        gap_topic="gaps",
        progress_topic="progress",
        transactional_id="tx",
    )
    assert PartitionWriter(settings, "q", 0).clean_name("orders") == expected
