"""The transactional producers a Python worker keeps between its tasks (the direct layout).

Runs in the executors' Python workers (``dedup/direct_task.py``). Spark reuses a worker for task
after task (``spark.python.worker.reuse``), and a new producer per task (a librdkafka instance,
a connection to every broker, two metadata requests, the coordinator lookup and
``init_transactions``) was the largest part of a live task's fixed cost. So a worker keeps the
producer of a raw partition's ``transactional.id`` after a transaction of it **committed**, and
the next task of that raw partition in this worker takes it instead of starting one.

Theory of operation (docs/dedup-internals.md "Effectively once", step 3, "Fence, then look"):

- **Kept only when clean.** A producer goes back only after its ``commit_transaction``
  returned; any error (fenced, fatal, timeout, a failed abort, an exception of the task) or an
  aborted transaction drops it (its queue purged, the instance released), and the next task
  starts a new one with ``init_transactions``.
- **One user at a time.** ``take`` removes the producer from the keep, ``keep`` puts it back:
  two tasks never hold one producer.
- **Proved current before the state is read.** Another worker's attempt of the same raw
  partition may have called ``init_transactions`` since (Spark hands a batch's tasks to
  whichever worker is idle): that bumped the producer epoch and fenced the kept producer. So a
  kept producer first **opens its transaction with a probe**: a tombstone under the state key
  with ``/open`` appended, into the raw partition's state partition, flushed. The transaction
  coordinator accepts the partition (``AddPartitionsToTxn``) only from the newest epoch of the
  ``transactional.id``: if the probe is delivered, every older producer of the id stays fenced
  and nothing newer exists, exactly the guarantee ``init_transactions`` gave, and only then is the
  state read. If the probe fails (fenced, or anything else), the producer is dropped and a new
  one fences as before, in the same task, before any input was consumed. A newer attempt that
  fences the producer after the probe makes its later calls fail: the task fails and Spark retries
  it (a new producer), as with a producer started in the task.
- **Bounded.** ``MAX_PRODUCERS`` per worker (least recently used dropped first).

The committed batch always comes from Kafka (the state record, ``dedup/state_reader.py``), never
from here. The probe is written in the batch's own transaction: committed or aborted with it,
never read (readers look for the state key itself), and compaction keeps one per raw partition.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from dedup.fence import init_producer, writer_conf
from dedup.writer_settings import KAFKA_TIMEOUT_S, WriterSettings

log = logging.getLogger(__name__)

#: Producers a worker keeps (a raw partition each; a worker runs one task at a time).
MAX_PRODUCERS = 16
#: Appended to the state key for the probe record (a tombstone, never read).
PROBE_SUFFIX = b"/open"


@dataclass
class Counts:
    """What this worker's tasks did for their producers (tests, logs)."""

    started: int = 0
    """New producers (``init_transactions``)."""
    reused: int = 0
    """Kept producers whose probe proved them current."""
    stale: int = 0
    """Kept producers whose probe failed (fenced by another worker's attempt since)."""
    dropped: int = 0
    """Producers dropped after an error or an abort, or evicted."""


counts = Counts()

_Name = tuple[tuple[str, str], ...]
#: Python-worker globals: a worker runs one task at a time; the lock keeps take/keep whole.
_kept: OrderedDict[_Name, Producer] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Probe:
    """Where a kept producer's probe goes: the raw partition's state partition and key."""

    topic: str
    partition: int
    key: bytes


def name_of(settings: WriterSettings, transactional_id: str, message_bytes: int) -> _Name:
    """The keep's key: the ``transactional.id`` and the whole producer configuration."""
    conf = writer_conf(settings, transactional_id, message_bytes)
    return tuple(sorted((k, str(v)) for k, v in conf.items()))


def open_transaction(
    settings: WriterSettings, transactional_id: str, probe: Probe, *, message_bytes: int = 0
) -> Producer:
    """A producer of ``transactional_id`` in a new transaction, after which no older producer
    of the id can commit: a kept one whose probe went through, else a new one
    (``init_transactions``). Give it back with ``keep`` once its transaction committed; drop it
    (``drop``) otherwise.

    Raises:
        ServiceError: a new producer could not initialise its transactions.
        KafkaException: a new producer's ``begin_transaction`` failed.
    """
    name = name_of(settings, transactional_id, message_bytes)
    with _lock:
        producer = _kept.pop(name, None)
    if producer is not None:
        if _probe(producer, probe):
            counts.reused += 1
            return producer
        counts.stale += 1
        log.debug("kept producer %s was fenced since its last task; starting one", transactional_id)
        drop(producer)
    producer = init_producer(settings, transactional_id, message_bytes=message_bytes)
    counts.started += 1
    producer.begin_transaction()
    return producer


def keep(
    settings: WriterSettings, transactional_id: str, producer: Producer, *, message_bytes: int = 0
) -> None:
    """Keep ``producer`` for the next task: call it only after its transaction committed."""
    name = name_of(settings, transactional_id, message_bytes)
    evicted: list[Producer] = []
    with _lock:
        previous = _kept.pop(name, None)
        if previous is not None:
            evicted.append(previous)
        _kept[name] = producer
        while len(_kept) > MAX_PRODUCERS:
            evicted.append(_kept.popitem(last=False)[1])
    for old in evicted:
        drop(old)


def drop(producer: Producer) -> None:
    """Release ``producer`` without waiting: its queue is purged, nothing more is sent (an open
    transaction stays open until the next ``init_transactions`` of its id aborts it)."""
    counts.dropped += 1
    try:
        producer.purge(blocking=False)
        producer.poll(0)
    except (KafkaException, RuntimeError):  # fatal or destroyed already
        log.debug("purging a dropped producer failed", exc_info=True)


def _probe(producer: Producer, probe: Probe) -> bool:
    """Open a transaction and deliver one tombstone in it: True if the producer is the newest
    of its ``transactional.id`` (the coordinator accepted the partition), the transaction then
    open."""
    failed: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    try:
        producer.begin_transaction()
        producer.produce(
            probe.topic, None, probe.key + PROBE_SUFFIX, probe.partition, on_delivery=delivered
        )
        left = producer.flush(KAFKA_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001  any failure: the producer is dropped, a new one fences
        # a fenced producer's fatal error can surface from inside the delivery callback as a
        # SystemError, not only as KafkaException
        log.info("a kept producer's probe failed (%s); starting a new producer", exc)
        return False
    if left or failed:
        log.info(
            "a kept producer's probe was not delivered (%s); starting a new producer",
            failed[0] if failed else "timed out",
        )
        return False
    return True


def close() -> None:
    """Drop every kept producer (a process that ran tasks in-line, as the tests do, before its
    brokers go)."""
    with _lock:
        kept = list(_kept.values())
        _kept.clear()
    for producer in kept:
        drop(producer)
