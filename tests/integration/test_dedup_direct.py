"""The direct layout's task against a real broker, without Spark (fast).

What one raw partition's task can go through (docs/dedup.md "The direct layout"); a
``read_committed`` reader must see every first-seen record exactly once:

1. A zombie attempt has produced and not committed when the retry runs: the retry fences it and
   writes the batch, the zombie's commit fails, a third attempt skips the batch.
2. An attempt committed, then died before Spark heard of it: the next attempt of the same batch
   writes nothing; the next batch is written, and it finds the detectors the first one left
   (a run that overlaps the first batch's is written only for its new offsets).
3. The state record holds every source partition of the raw partition, and each raw partition
   has its own record and fence.
4. A Python worker keeps the state record it committed (``dedup/state_reader.py``) and uses it
   only while the state partition has not moved since: a worker whose raw partition another
   worker ran meanwhile reads the newer record, or finds it in the file the other worker left
   in their daemon's shared directory.
5. A long task commits its batch in parts and dies after one: the next attempt goes on after
   the part, and reads none of what the part covered again.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest

from common.errors import ServiceError
from common.raw_run import RunBuilder
from common.raw_topic import TICK
from dedup import runner, state_reader
from dedup.config import from_sources
from dedup.detect import DetectParams
from dedup.direct_state import state_key
from dedup.direct_task import DirectTransaction
from dedup.raw_batch import RawBatch
from dedup.state_reader import read_state
from dedup.writer_settings import BatchResult, TaskSpec, WriterSettings
from runtime import kafka
from tests.kafka_helpers import consume_all, create_topic, wait_committed

pytestmark = [pytest.mark.kafka]

SOURCE = "orders.eu"
#: An hour ago: records older than the broker's retention (7 days) are deleted by its first
#: retention check (30 s after it starts), with the segment they are in, while a test reads them.
TS = int(time.time() * 1000) - 3_600_000
PARAMS = DetectParams(
    window_size=64,
    max_windows=64,
    max_expired_gaps=1000,
    max_state_bytes=1 << 20,
    scan_interval_ms=1000,
)


@pytest.fixture(autouse=True, scope="module")
def _close_kept_consumers() -> Iterator[None]:
    yield
    state_reader.close()  # the tasks ran in this process: its consumers outlive no broker


def setup(bootstrap: str, raw_partitions: int = 1) -> tuple[WriterSettings, str, str]:
    raw = create_topic(bootstrap, partitions=raw_partitions)
    tag = raw
    create_topic(bootstrap, f"gaps.{tag}", partitions=1, config={"cleanup.policy": "compact"})
    create_topic(bootstrap, f"state.{tag}", partitions=raw_partitions,
                 config={"cleanup.policy": "compact"})  # fmt: skip
    create_topic(bootstrap, f"clean.{tag}.{SOURCE}", partitions=4)
    settings = WriterSettings(
        bootstrap_servers=bootstrap,
        clean_topic=f"clean.{tag}.{{topic}}",
        gap_topic=f"gaps.{tag}",
        progress_topic=f"progress.{tag}",
        state_topic=f"state.{tag}",
        transactional_id=f"txn.{tag}",
    )
    return settings, f"query-{tag}", raw


def runs(
    raw: str, raw_partition: int, spans: list[tuple[int, int, int]], first_offset: int = 0
) -> RawBatch:
    """Raw records as Spark's source reads them: a v2 run per ``(source partition, first,
    last)``, then the driver's tick, at raw offsets from ``first_offset`` on."""
    return topic_runs(raw, raw_partition, [(SOURCE, *span) for span in spans], first_offset)


def topic_runs(
    raw: str, raw_partition: int, spans: list[tuple[str, int, int, int]], first_offset: int = 0
) -> RawBatch:
    """``runs`` of ``(source topic, source partition, first, last)``."""
    rows = []
    for topic, partition, first, last in spans:
        run = RunBuilder(topic, partition, 1, first, TS + first)
        for o in range(first, last + 1):
            run.append(o, TS + o, b"k%d" % o, b"v%d-%d" % (partition, o), ())
        session = [{"key": "diode.session", "value": b"ab"}]
        rows.append({"key": run.key().encode(), "value": run.encode(), "headers": session})
    rows.append(
        {"key": b"tick", "value": b"", "headers": [{"key": "diode.control", "value": TICK}]}
    )
    for offset, row in enumerate(rows, first_offset):
        row |= {"topic": raw, "partition": raw_partition, "offset": offset}
    return RawBatch.from_arrow(pa.RecordBatch.from_pylist(rows))


def spec(settings: WriterSettings, query: str, batch_id: int) -> TaskSpec:
    return TaskSpec(settings=settings, params=PARAMS, query_id=query, batch_id=batch_id, now_ms=TS)


def dies_after_parts(
    task_spec: TaskSpec,
    raw: str,
    input_batches: list[RawBatch],
    caplog: pytest.LogCaptureFixture,
) -> list[str]:
    """An attempt of transaction group 0 whose part is due after every Arrow batch (a clock
    100 s on at each look) and whose worker dies after the first two: the parts it logged."""

    def dies_after_two() -> Iterator[RawBatch]:
        yield from input_batches[:2]
        raise RuntimeError("the Python worker died")

    ticking = itertools.count(step=100.0).__next__
    first = DirectTransaction(task_spec, raw, 0, clock=ticking)
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="died"):
        first.run(dies_after_two(), lambda _: None)
    return [r.getMessage() for r in caplog.records if "committing part" in r.getMessage()]


def resumed(task_spec: TaskSpec, raw: str, input_batches: list[RawBatch]) -> BatchResult:
    """The next attempt of group 0's batch, checked to read none of what a part covered again."""
    stats: list[pa.RecordBatch] = []
    result = DirectTransaction(task_spec, raw, 0).run(input_batches, stats.append)
    rows = pa.Table.from_batches(stats).to_pylist()
    assert sum(r["duplicates"] for r in rows) == 0, "the parts' rows were read again"
    return result


def clean(bootstrap: str, settings: WriterSettings) -> Counter[tuple[int, int]]:
    topic = settings.clean_topic.replace("{topic}", SOURCE)
    wait_committed(bootstrap, topic)
    wait_committed(bootstrap, settings.state_topic)
    records = consume_all(bootstrap, topic, timeout=20)
    return Counter((int(r.value.split(b"-")[0][1:]), r.timestamp - TS) for r in records)


def test_a_zombie_is_fenced_by_its_retry_and_a_third_attempt_skips(downstream_kafka) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    retried: list[int] = []

    def zombie_input() -> Iterator[RawBatch]:
        yield runs(raw, 0, [(0, 0, 19)])
        # the zombie has produced its records: its retry runs to the end meanwhile
        retry = DirectTransaction(spec(settings, query, 0), raw, 0)
        retried.append(retry.run([runs(raw, 0, [(0, 0, 19)])], lambda _: None).records)

    zombie = DirectTransaction(spec(settings, query, 0), raw, 0)
    with pytest.raises(ServiceError, match="aborted"):
        zombie.run(zombie_input(), lambda _: None)
    assert retried == [20]
    third = DirectTransaction(spec(settings, query, 0), raw, 0).run(
        [runs(raw, 0, [(0, 0, 19)])], lambda _: None
    )
    assert third.skipped
    assert third.fenced
    assert clean(bootstrap, settings) == Counter({(0, o): 1 for o in range(20)})


def test_a_committed_batch_is_skipped_and_the_next_one_finds_its_state(downstream_kafka) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    first = DirectTransaction(spec(settings, query, 3), raw, 0)
    assert first.run([runs(raw, 0, [(0, 0, 9), (1, 0, 4)])], lambda _: None).records == 15
    again = DirectTransaction(spec(settings, query, 3), raw, 0)
    assert again.run([runs(raw, 0, [(0, 0, 9)])], lambda _: None).skipped
    stats: list[pa.RecordBatch] = []
    nxt = DirectTransaction(spec(settings, query, 4), raw, 0)
    # 5..9 and 0..4 were delivered by batch 3: only 10..14 and 5..6 are new
    result = nxt.run([runs(raw, 0, [(0, 5, 14), (1, 0, 6)])], stats.append)
    assert result.records == 7
    delivered = pa.Table.from_batches(stats).column("delivered").to_pylist()
    assert sorted(delivered) == [2, 5]
    expected = {(0, o): 1 for o in range(15)} | {(1, o): 1 for o in range(7)}
    assert clean(bootstrap, settings) == Counter(expected)
    state = read_state(settings, state_key(query, raw, 0), 0)
    assert state is not None
    assert state.batch_id == 4
    assert sorted(state.detectors) == [(SOURCE, 0), (SOURCE, 1)]


def test_a_worker_reads_the_state_another_worker_committed_since_its_own(
    downstream_kafka,
) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    key = state_key(query, raw, 0)
    # worker A commits batch 0 and keeps its state record
    assert (
        DirectTransaction(spec(settings, query, 0), raw, 0)
        .run([runs(raw, 0, [(0, 0, 9)])], lambda _: None)
        .records
        == 10
    )
    worker_a = dict(state_reader._kept)
    assert [k.value for k in worker_a.values()] != []
    # worker B, which keeps nothing, runs batch 1
    state_reader._kept.clear()
    assert (
        DirectTransaction(spec(settings, query, 1), raw, 0)
        .run([runs(raw, 0, [(0, 10, 19)])], lambda _: None)
        .records
        == 10
    )
    # worker A runs batch 2: its kept record (batch 0) is stale, the partition has moved
    state_reader._kept.clear()
    state_reader._kept.update(worker_a)
    third = DirectTransaction(spec(settings, query, 2), raw, 0)
    assert third.run([runs(raw, 0, [(0, 0, 24)])], lambda _: None).records == 5
    assert clean(bootstrap, settings) == Counter({(0, o): 1 for o in range(25)})
    state = read_state(settings, key, 0)
    assert state is not None
    assert state.batch_id == 2


def test_a_worker_finds_the_state_another_worker_committed_in_their_shared_directory(
    downstream_kafka, monkeypatch, tmp_path
) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    monkeypatch.setattr(state_reader, "shared_dir", None)
    state_reader.share(tmp_path)
    # worker A commits batch 0
    first = DirectTransaction(spec(settings, query, 0), raw, 0)
    assert first.run([runs(raw, 0, [(0, 0, 9)])], lambda _: None).records == 10
    worker_a = dict(state_reader._kept)

    def no_scan(*_args: object) -> list[bytes]:
        raise AssertionError("the state partition was read although a worker shared its record")

    with monkeypatch.context() as patch:
        patch.setattr(state_reader, "scan_back", no_scan)
        # worker B, which keeps nothing of its own, runs batch 1 from A's shared record
        state_reader._kept.clear()
        second = DirectTransaction(spec(settings, query, 1), raw, 0)
        assert second.run([runs(raw, 0, [(0, 5, 14)])], lambda _: None).records == 5
        # worker A runs batch 2: its own record is stale, B's shared one is not
        state_reader._kept.clear()
        state_reader._kept.update(worker_a)
        third = DirectTransaction(spec(settings, query, 2), raw, 0)
        assert third.run([runs(raw, 0, [(0, 10, 19)])], lambda _: None).records == 5
    assert clean(bootstrap, settings) == Counter({(0, o): 1 for o in range(20)})
    # a failed task's worker forgets the place, for every worker: the next one reads Kafka
    state_reader.forget(settings, state_key(query, raw, 0), 0)
    assert list(tmp_path.iterdir()) == []
    state_reader._kept.clear()
    state = read_state(settings, state_key(query, raw, 0), 0)
    assert state is not None
    assert state.batch_id == 2


def test_a_kept_state_is_used_while_its_partition_has_not_moved(
    downstream_kafka, monkeypatch
) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    key = state_key(query, raw, 0)
    first = DirectTransaction(spec(settings, query, 0), raw, 0)
    assert first.run([runs(raw, 0, [(0, 0, 9)])], lambda _: None).records == 10

    def no_scan(*_args: object) -> list[bytes]:
        raise AssertionError("the state partition was read although it had not moved")

    with monkeypatch.context() as patch:
        patch.setattr(state_reader, "scan_back", no_scan)
        # the next batch starts from it (after its fence) without reading the partition
        nxt = DirectTransaction(spec(settings, query, 1), raw, 0)
        assert nxt.run([runs(raw, 0, [(0, 5, 14)])], lambda _: None).records == 5
    # forgotten (as after a failed task), it is read again
    state_reader.forget(settings, key, 0)
    wait_committed(bootstrap, settings.state_topic)
    state = read_state(settings, key, 0)
    assert state is not None
    assert state.batch_id == 1
    assert clean(bootstrap, settings) == Counter({(0, o): 1 for o in range(15)})


def test_a_kept_consumer_that_cannot_reach_its_broker_gives_way_to_a_new_one(
    downstream_kafka, monkeypatch
) -> None:
    """A worker's kept consumer whose broker has gone (here: a port where none listens) fails
    within ``KEPT_TIMEOUT_S``; a new consumer reads the state and is kept instead."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    assert (
        DirectTransaction(spec(settings, query, 0), raw, 0)
        .run([runs(raw, 0, [(0, 0, 9)])], lambda _: None)
        .records
        == 10
    )
    monkeypatch.setattr(state_reader, "KEPT_TIMEOUT_S", 2.0)
    conf = state_reader.reader_conf(settings, f"{settings.transactional_id}.state")
    name = tuple(sorted((k, str(v)) for k, v in conf.items()))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{closed.getsockname()[1]}"
    stale = kafka.consumer({**conf, "bootstrap.servers": gone})
    state_reader._consumers.pop(name, None)
    state_reader._consumers[name] = stale
    state_reader.forget(settings, state_key(query, raw, 0), 0)
    wait_committed(bootstrap, settings.state_topic)
    state = read_state(settings, state_key(query, raw, 0), 0)
    assert state is not None
    assert state.batch_id == 0
    assert state_reader._consumers[name] is not stale


def test_raw_partitions_have_their_own_state_and_fence(downstream_kafka) -> None:
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap, raw_partitions=2)
    for p in (0, 1):  # source partitions 0 and 2 in raw 0, 1 and 3 in raw 1
        task = DirectTransaction(spec(settings, query, 0), raw, p)
        assert task.run([runs(raw, p, [(p, 0, 9), (p + 2, 0, 9)])], lambda _: None).records == 20
    # batch 1 of raw partition 1 only: raw partition 0 keeps its state of batch 0
    task = DirectTransaction(spec(settings, query, 1), raw, 1)
    assert task.run([runs(raw, 1, [(1, 0, 14)])], lambda _: None).records == 5
    wait_committed(bootstrap, settings.state_topic)
    states = {p: read_state(settings, state_key(query, raw, p), p) for p in (0, 1)}
    assert {p: s.batch_id for p, s in states.items() if s is not None} == {0: 0, 1: 1}
    assert sorted(states[0].detectors) == [(SOURCE, 0), (SOURCE, 2)]  # type: ignore[union-attr]
    expected = {(p, o): 1 for p in range(4) for o in range(10)} | {(1, o): 1 for o in range(10, 15)}
    assert clean(bootstrap, settings) == Counter(expected)


def test_a_direct_dedup_waits_for_its_raw_topic_to_exist(downstream_kafka, caplog) -> None:
    """docs/dedup.md "The direct layout": the raw topic's partition count is taken at the first
    start, so a dedup started before the receiver created the topic waits for it."""
    bootstrap = downstream_kafka.bootstrap
    name = f"raw-later-{time.monotonic_ns()}"
    config = from_sources(
        {"RAW_TOPICS": name, "BOOTSTRAP_SERVERS": bootstrap, "STATE_DIR_CONFIG": "/tmp/unused",
         "STATE_LAYOUT": "direct"}
    )  # fmt: skip
    creator = threading.Timer(2.0, lambda: create_topic(bootstrap, name, partitions=2))
    creator.start()  # the receiver's first start, two seconds in
    try:
        with caplog.at_level(logging.WARNING, logger="dedup.runner"):
            assert runner.wait_for_raw_topic(config, threading.Event()) == 2
    finally:
        creator.join()
    (line,) = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert f"raw topic {name} does not exist yet" in line
    stop = threading.Event()
    stop.set()  # an operator's stop ends a wait at once
    gone = from_sources({**config_env(config), "RAW_TOPICS": f"{name}-never"})
    assert runner.wait_for_raw_topic(gone, stop) == 0


def config_env(config) -> dict[str, str]:
    return {
        "RAW_TOPICS": ",".join(config.raw_topics),
        "BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "STATE_DIR_CONFIG": config.state_dir_config,
        "STATE_LAYOUT": config.state_layout,
    }


def test_a_task_of_many_source_topics_keeps_their_detectors_across_its_batches(
    downstream_kafka,
) -> None:
    """A raw partition carrying several source topics, its input in several Arrow batches
    (docs/dedup.md "The direct layout"): each detector is parsed once and saved once
    (``detect.LiveBucket``), each record delivered once, one stat row per source partition;
    the clean topics' partition counts are learned together, a missing clean topic created."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    topics = [SOURCE, "orders.us", "orders.ap"]  # the last two: created by the task
    spans = [[(t, p, 0, 9) for t in topics for p in (0, 1)],
             [(t, p, 5, 19) for t in topics for p in (0, 1)],  # 5..9 again: duplicates
             [(t, 1, 20, 24) for t in topics]]  # fmt: skip
    stats: list[pa.RecordBatch] = []
    task = DirectTransaction(spec(settings, query, 0), raw, 0)
    result = task.run([topic_runs(raw, 0, s) for s in spans], stats.append)
    assert result.records == len(topics) * (20 + 25)
    table = pa.Table.from_batches(stats).to_pylist()
    per_partition = {(r["src_topic"], r["src_partition"]): r for r in table}
    assert len(table) == len(per_partition) == 2 * len(topics)
    assert {k: (r["delivered"], r["duplicates"]) for k, r in per_partition.items()} == {
        (t, p): (20 + 5 * p, 5) for t in topics for p in (0, 1)
    }
    for topic in topics:
        records = consume_all(bootstrap, settings.clean_topic.replace("{topic}", topic))
        found = Counter((int(r.value.split(b"-")[0][1:]), r.timestamp - TS) for r in records)
        assert found == Counter({(p, o): 1 for p in (0, 1) for o in range(20 + 5 * p)}), topic
        # source partition p -> clean partition p mod its count: 4 for SOURCE's, 1 for those
        # the task created (NEW_TOPIC_PARTITIONS)
        count = 4 if topic == SOURCE else 1
        assert {(int(r.value.split(b"-")[0][1:]) % count, r.partition) for r in records} <= {
            (0, 0),
            (1, 1),
        }
    state = read_state(settings, state_key(query, raw, 0), 0)
    assert state is not None
    assert sorted(state.detectors) == sorted((t, p) for t in topics for p in (0, 1))


def test_a_full_producer_queue_is_sent_at_once_not_after_the_write_linger(
    downstream_kafka,
) -> None:
    """The write producers linger long (``fence.WRITE_LINGER_MS``: the commit flushes anyway);
    a task whose local queue fills before then sends every partial batch at once
    (``fence.wait_for_room``) instead of polling until the linger expires. Here the queue holds
    50 records, the task writes 600 into 12 clean partitions and the linger is 30 s: polling
    would stall that long at each full queue."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    settings = dataclasses.replace(
        settings,
        kafka_conf={"linger.ms": "30000", "queue.buffering.max.messages": "50"},
    )
    topics = [SOURCE, *(f"orders.r{i}" for i in range(5))]
    task = DirectTransaction(spec(settings, query, 0), raw, 0)
    done: list[object] = []

    def write() -> None:
        try:
            done.append(
                task.run(
                    [topic_runs(raw, 0, [(t, p, 0, 49) for t in topics for p in (0, 1)])],
                    lambda _: None,
                )
            )
        except BaseException as exc:  # reported by the assertion below
            done.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(20)  # a stall lasts the linger: 30 s
    assert done, "the task stalled on its full queue"
    assert not isinstance(done[0], BaseException), done[0]
    for topic in topics:
        records = consume_all(bootstrap, settings.clean_topic.replace("{topic}", topic))
        found = Counter((int(r.value.split(b"-")[0][1:]), r.timestamp - TS) for r in records)
        assert found == Counter({(p, o): 1 for p in (0, 1) for o in range(50)}), topic


def test_a_record_in_the_wrong_raw_partition_is_malformed_not_a_second_detector(
    downstream_kafka, caplog
) -> None:
    """Source partition p belongs in raw partition p mod N (the receiver writes it nowhere
    else; docs/dedup.md "The direct layout"). A run of source partition 1 found in raw
    partition 0 of two is counted as malformed and logged, never delivered, and starts no
    detector in partition 0's state; partition 0's own runs are delivered."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap, raw_partitions=2)
    stats: list[pa.RecordBatch] = []
    task = DirectTransaction(
        dataclasses.replace(spec(settings, query, 0), raw_partitions=2), raw, 0
    )
    with caplog.at_level(logging.WARNING, logger="dedup.direct_task"):
        result = task.run([runs(raw, 0, [(0, 0, 9), (1, 0, 4), (2, 0, 9)])], stats.append)
    assert result.records == 20
    assert clean(bootstrap, settings) == Counter({(p, o): 1 for p in (0, 2) for o in range(10)})
    rows = {
        (r["src_topic"], r["src_partition"]): r for r in pa.Table.from_batches(stats).to_pylist()
    }
    assert rows[("", -1)]["malformed"] == 1
    assert (SOURCE, 1) not in rows
    assert "belong in other raw partitions" in caplog.text
    assert f"source {SOURCE}:1" in caplog.text
    state = read_state(settings, state_key(query, raw, 0), 0)
    assert state is not None
    assert sorted(state.detectors) == [(SOURCE, 0), (SOURCE, 2)]


def test_a_task_that_died_after_a_part_of_its_batch_is_resumed_after_the_part(
    downstream_kafka, caplog
) -> None:
    """A task commits a part of its batch whenever its transaction has been open a third of
    ``transaction.timeout.ms`` (docs/dedup-internals.md "Parts of a batch"; here a clock that
    makes it due after every Arrow batch). It dies after two parts: the state record says
    through which raw offset the batch is committed, and the next attempt of the same batch
    writes the rest only, without reading the parts' rows again (a reset among them would
    otherwise be applied twice). Before parts the attempt would have skipped the batch."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    input_batches = [
        runs(raw, 0, [(0, 0, 9)], first_offset=0),  # a run and a tick: offsets 0, 1
        runs(raw, 0, [(0, 10, 19)], first_offset=2),
        runs(raw, 0, [(0, 20, 29), (1, 0, 4)], first_offset=4),
    ]

    assert len(dies_after_parts(spec(settings, query, 7), raw, input_batches, caplog)) == 2
    part = read_state(settings, state_key(query, raw, 0), 0)
    assert part is not None
    assert (part.batch_id, part.through_offset, part.complete) == (7, 3, False)
    assert clean(bootstrap, settings) == Counter({(0, o): 1 for o in range(20)})

    result = resumed(spec(settings, query, 7), raw, input_batches)
    assert (result.records, result.skipped, result.parts) == (15, False, 0)
    expected = {(0, o): 1 for o in range(30)} | {(1, o): 1 for o in range(5)}
    assert clean(bootstrap, settings) == Counter(expected)
    done = read_state(settings, state_key(query, raw, 0), 0)
    assert done is not None
    assert (done.batch_id, done.complete) == (7, True)
    again = DirectTransaction(spec(settings, query, 7), raw, 0)
    assert again.run(input_batches, lambda _: None).skipped


def test_a_task_that_writes_longer_than_the_transaction_timeout_commits_in_parts(
    downstream_kafka,
) -> None:
    """The broker aborts a transaction open longer than the producer's ``transaction.timeout.ms``
    (it looks every 10 s, Kafka's ``transaction.abort.timed.out.transaction.cleanup.interval.ms``),
    and a replay of the batch would be as long (docs/dedup-internals.md "Parts of a batch"). A
    task whose input takes 15.6 s to come (a large batch) at a timeout of 3 s commits a part
    every second (each open ~1.3 s: room on a loaded host) and completes the batch exactly once;
    in one transaction it fails (open past 3 s + the broker's 10 s between looks)."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap)
    settings = dataclasses.replace(settings, kafka_conf={"transaction.timeout.ms": "3000"})

    def slow_input() -> Iterator[RawBatch]:
        for i in range(24):
            yield runs(raw, 0, [(0, 10 * i, 10 * i + 9)], first_offset=2 * i)
            time.sleep(0.65)  # the work of a large Arrow batch: the transaction stays open

    task = DirectTransaction(spec(settings, query, 0), raw, 0)
    result = task.run(slow_input(), lambda _: None)
    assert result.records == 240
    assert result.parts >= 8
    assert clean(bootstrap, settings) == Counter({(0, o): 1 for o in range(240)})
    state = read_state(settings, state_key(query, raw, 0), 0)
    assert state is not None
    assert (state.batch_id, state.complete) == (0, True)


def group_spec(settings: WriterSettings, query: str, batch_id: int) -> TaskSpec:
    """Four raw partitions in two transaction groups: raw 0 and 2 commit together."""
    return dataclasses.replace(
        spec(settings, query, batch_id), raw_partitions=4, transaction_groups=2
    )


def test_a_group_commits_its_raw_partitions_together_fenced_and_skipped_as_one(
    downstream_kafka,
) -> None:
    """docs/dedup-internals.md "Transaction groups": one ``transactional.id`` and one commit for
    raw partitions 0 and 2, each with its own state record; a zombie of the group is fenced by
    its retry, a replay skips the whole group, and the next batch finds each partition's
    detectors."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap, raw_partitions=4)
    batches = [runs(raw, 0, [(0, 0, 9)]), runs(raw, 2, [(2, 0, 9), (6, 0, 4)])]
    retried: list[int] = []

    def zombie_input() -> Iterator[RawBatch]:
        yield from batches
        retry = DirectTransaction(group_spec(settings, query, 0), raw, 0)
        retried.append(retry.run(batches, lambda _: None).records)

    zombie = DirectTransaction(group_spec(settings, query, 0), raw, 0)
    assert zombie.transactional_id == f"{settings.transactional_id}-{raw}-0of2"
    with pytest.raises(ServiceError, match="aborted"):
        zombie.run(zombie_input(), lambda _: None)
    assert retried == [25]
    third = DirectTransaction(group_spec(settings, query, 0), raw, 0).run(batches, lambda _: None)
    assert (third.skipped, third.fenced) == (True, True)
    wait_committed(bootstrap, settings.state_topic)
    states = {p: read_state(settings, state_key(query, raw, p), p) for p in (0, 2)}
    assert {p: (s.batch_id, s.complete, s.records) for p, s in states.items() if s} == {
        0: (0, True, 10),
        2: (0, True, 15),
    }
    nxt = DirectTransaction(group_spec(settings, query, 1), raw, 0)
    later = [runs(raw, 2, [(2, 5, 14)], first_offset=3), runs(raw, 0, [(0, 8, 11)], first_offset=2)]
    assert nxt.run(later, lambda _: None).records == 7
    expected = {(p, o): 1 for p in (0, 2) for o in range(10)} | {(6, o): 1 for o in range(5)}
    expected |= {(2, o): 1 for o in range(10, 15)} | {(0, o): 1 for o in (10, 11)}
    assert clean(bootstrap, settings) == Counter(expected)
    other = DirectTransaction(group_spec(settings, query, 2), raw, 0)
    with pytest.raises(ServiceError, match=r"got rows of raw partition .*:1"):
        other.run([runs(raw, 1, [(1, 0, 3)])], lambda _: None)


def test_a_group_that_died_after_parts_goes_on_after_each_partition_s_part(
    downstream_kafka, caplog
) -> None:
    """A part of a group's batch writes the state record of each raw partition it read into,
    through its last offset; the next attempt reads none of what a part covered again, in any
    of the group's partitions."""
    bootstrap = downstream_kafka.bootstrap
    settings, query, raw = setup(bootstrap, raw_partitions=4)
    input_batches = [
        runs(raw, 0, [(0, 0, 9)], first_offset=0),
        runs(raw, 2, [(2, 0, 9)], first_offset=0),
        runs(raw, 2, [(2, 10, 19)], first_offset=2),
    ]

    parts = dies_after_parts(group_spec(settings, query, 5), raw, input_batches, caplog)
    assert "through raw offset 1 of 0, 1 of 2" in parts[-1], parts
    result = resumed(group_spec(settings, query, 5), raw, input_batches)
    assert (result.records, result.skipped, result.parts) == (10, False, 0)
    assert clean(bootstrap, settings) == Counter(
        {(0, o): 1 for o in range(10)} | {(2, o): 1 for o in range(20)}
    )
    for p in (0, 2):
        done = read_state(settings, state_key(query, raw, p), p)
        assert done is not None
        assert (done.batch_id, done.complete) == (5, True)
