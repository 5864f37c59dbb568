"""The one commit path: a write task's transaction of one micro-batch, for every state layout.

:func:`commit_batch` holds the transaction; a layout only says what its part of a batch is
(:class:`BatchWork`: how to fence and what was committed, what to produce per batch of input, what
to write last), ``dedup/transaction.py`` for the buckets layout, ``dedup/direct_task.py`` for the
direct one. :func:`produce_waiting` is the one produce-retry loop and :func:`abort` the one abort.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from confluent_kafka import KafkaException, Producer

from common.errors import ServiceError
from dedup.faults import fault, fault_during
from dedup.fence import wait_for_room
from dedup.writer_settings import KAFKA_TIMEOUT_S, BatchResult

log = logging.getLogger(__name__)

#: A transaction open this share of ``transaction.timeout.ms`` logs a WARNING (once): past the
#: timeout the broker aborts it, and a replay of the batch takes as long.
LONG_SHARE = 0.5

#: What a layout's write task reads: Arrow batches of Spark's rows (buckets), a direct task's
#: ``RawBatch``es.
_Input_contra = TypeVar("_Input_contra", contravariant=True)
_In = TypeVar("_In")


class BatchWork(Protocol[_Input_contra]):
    """One write task's part of a batch, as the layout sees it (``commit_batch`` drives it)."""

    #: how logs and errors name the part: ``partition 3``, ``raw partition raw:3``
    name: str
    #: the task's key for the fault hooks (its partition)
    fault_key: int
    #: after a skip, the rest of the input is still read (the buckets layout: its rows come
    #: from Spark's stateful step in the same stage, which must see its input to the end)
    drain_skipped: bool
    #: seconds the broker lets a transaction stay open (the producer's ``transaction.timeout.ms``)
    timeout_s: float

    def publishes(self, batch: _Input_contra) -> bool:
        """Whether ``batch`` has anything to publish (called for every batch of input)."""

    def fence(self) -> tuple[Producer, int]:
        """A producer that fenced every older attempt, and the batch committed last (-1: none)."""

    def produce(self, producer: Producer, batch: _Input_contra, result: BatchResult) -> None:
        """Produce what ``batch`` publishes, counting it in ``result``."""

    def finish(self, producer: Producer, result: BatchResult) -> None:
        """Produce what says the batch is committed (a marker, a state record)."""

    def part_due(self) -> bool:
        """Whether to commit what was produced so far as a part of the batch, now (the direct
        layout, whose state record can say where a part ends and a replay resumes; the buckets
        layout's batch is always one transaction)."""

    def finish_part(self, producer: Producer, result: BatchResult) -> None:
        """Produce what says the batch is committed up to here (``part_due`` said so)."""

    def ended(self, committed: bool, abort_failed: bool) -> None:
        """The transaction committed, or was aborted (``abort_failed``: the abort itself failed)."""


def commit_batch(
    work: BatchWork[_In],
    batches: Iterable[_In],
    batch_id: int,
    *,
    before_commit: Callable[[], None] | None = None,
) -> BatchResult:
    """Commit ``work``'s part of batch ``batch_id`` in one Kafka transaction, or skip it.

    Effectively once (docs/dedup-internals.md "Effectively once"), per (batch ``N``, task part
    ``p``): a
    reader with ``isolation.level=read_committed`` sees what ``N`` publishes for ``p`` at most
    once, and exactly once if the query ever completes ``N``, however often a process or task
    crashes, is retried or lingers as a zombie, and however often the query restarts.

    1. **Fixed parts.** ``p`` is a state partition of Spark's stateful step (the number Spark
       fixes for a checkpoint at its first run), or a raw partition (the direct layout, whose
       partition count is checked fixed); a source partition's input is always in the same ``p``.
    2. **One transaction per (N, p)**, of a producer whose ``transactional.id`` is ``p``'s own:
       the clean records, the gap records and what says ``N`` is done for ``p`` (a marker in the
       progress topic, or the direct layout's state record) commit or abort together.
    3. **Fence first.** Every attempt creates its producer and calls ``init_transactions``,
       which fences every older producer with that id (an earlier attempt, a retried or
       speculative task, a zombie on an executor declared lost, a task of a crashed driver) and
       aborts its open transaction, or completes it if its commit had begun. Only then does it
       read ``p``'s last committed batch ``M`` (``read_committed``): ``N <= M`` means the batch
       was committed before Spark heard of it, and the attempt skips it. A fenced zombie can no
       longer commit.
    4. Spark writes ``N`` to its commit log only after every task succeeded; a batch missing
       there is re-run with the same offsets, and step 3 decides per part. The buckets layout
       replays it from the same state version (the same output); the direct layout's state is
       the committed state record itself, so committed work is never redone.

    A task's share of a long batch may commit in several transactions (``work.part_due``: the
    direct layout, whose transaction would otherwise outlive ``transaction.timeout.ms`` and be
    aborted by the broker at every attempt): each ends with what says how far it is committed,
    and an attempt that finds a part committed goes on after it (``work.fence`` reports the
    batch before, and ``work.produce`` passes over what the part covered).

    The fence runs at the first Arrow batch that publishes anything; a part with none opens no
    transaction and writes nothing (its replay has none either). ``before_commit`` runs after
    everything was produced, before the commit (tests: a zombie or a second attempt between).

    Raises:
        ServiceError: a Kafka call failed; the transaction was aborted, nothing is visible.
    """
    result = BatchResult(batch_id)
    producer: Producer | None = None
    pending = iter(batches)
    opened: float | None = None  # when the open transaction began
    warned = False
    try:
        for batch in pending:
            if not work.publishes(batch):
                continue
            if producer is None:
                producer, committed = work.fence()
                if batch_id <= committed:
                    log.info(
                        "batch %d %s already committed (batch %d): skipped",
                        batch_id,
                        work.name,
                        committed,
                    )
                    if work.drain_skipped:
                        for rest in pending:
                            work.publishes(rest)
                    return BatchResult(batch_id, skipped=True, fenced=True)
                producer.begin_transaction()
                opened = time.monotonic()
            work.produce(producer, batch, result)
            if work.part_due():
                work.finish_part(producer, result)
                producer.commit_transaction(KAFKA_TIMEOUT_S * 4)
                result.parts += 1
                fault("task-after-part", batch_id, work.fault_key)
                producer.begin_transaction()
                opened, warned = time.monotonic(), False
            elif not warned and opened is not None:
                warned = _warn_long(work, batch_id, time.monotonic() - opened)
        if producer is None:
            result.skipped = True
            return result
        work.finish(producer, result)
        if before_commit is not None:
            before_commit()
        fault("task-before-commit", batch_id, work.fault_key)
        with fault_during("task-in-commit", batch_id, work.fault_key):
            producer.commit_transaction(KAFKA_TIMEOUT_S * 4)
    except KafkaException as exc:
        open_s = None if opened is None else time.monotonic() - opened
        if producer is not None:
            work.ended(False, not abort(producer, work.name))
        raise ServiceError(
            f"writing batch {batch_id} {work.name} failed and was aborted "
            f"(nothing of it is visible): {exc}" + _outlived(work, open_s)
        ) from exc
    except BaseException:
        if producer is not None:
            work.ended(False, not abort(producer, work.name))
            log.error("batch %d %s aborted", batch_id, work.name)  # noqa: TRY400  re-raised below with the cause
        raise
    work.ended(True, False)
    fault("task-after-commit", batch_id, work.fault_key)
    return result


def _warn_long(work: BatchWork[Any], batch_id: int, open_s: float) -> bool:
    """Log that the transaction is long (past ``LONG_SHARE`` of its timeout); True if it is.

    The executors log WARNING and up: an operator sees a batch outgrow its transaction before
    the broker aborts it (the direct layout commits a part at a third: it never gets here)."""
    if open_s < work.timeout_s * LONG_SHARE:
        return False
    log.warning(
        "batch %d %s: its transaction has been open %.0f s of the %.0f s transaction.timeout.ms "
        "allows; lower MAX_OFFSETS_PER_TRIGGER or raise KAFKA_CONF_TRANSACTION_TIMEOUT_MS before "
        'batches outgrow it (docs/operations.md "Known limitations")',
        batch_id,
        work.name,
        open_s,
        work.timeout_s,
    )
    return True


def _outlived(work: BatchWork[Any], open_s: float | None) -> str:
    """What to do when the failed transaction was open past ``transaction.timeout.ms``: the
    broker aborts such a transaction, and every replay of the batch (Spark's offset log keeps
    it) is as long, so the query fails at every restart until the timeout is raised."""
    if open_s is None or open_s < work.timeout_s:
        return ""
    return (
        f"; the transaction was open {open_s:.0f} s, past transaction.timeout.ms "
        f"({work.timeout_s:.0f} s), after which the broker aborts a transaction, and a "
        "restart replays the same batch: set KAFKA_CONF_TRANSACTION_TIMEOUT_MS above the "
        "batch's write time (at most the brokers' transaction.max.timeout.ms, 900000 by "
        "default) and restart "
        '(docs/operations.md "Known limitations")'
    )


def abort(producer: Producer, name: str) -> bool:
    """Abort the open transaction; False if that failed (the producer is then dropped)."""
    try:
        producer.abort_transaction(KAFKA_TIMEOUT_S)
    except KafkaException:
        # fenced (a newer attempt took over) or the broker is away: the newer attempt's, or the
        # next, init_transactions aborts what is left open
        log.warning("abort of %s failed; the producer is dropped", name)
        return False
    return True


def produce_waiting(  # noqa: PLR0917  produce's own arguments
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    partition: int = -1,
    timestamp: int = 0,
    headers: Any = None,
    *,
    on_delivery: Callable[[Any, Any], None] | None = None,
    full: bool = False,
) -> None:
    """``produce``, waiting for room in librdkafka's bounded local queue as often as it is full
    (``full``: it just was, so wait before the first try). The one produce-retry loop."""
    while True:
        if full:
            wait_for_room(producer)
        try:
            # positional: keywords cost produce() a dict per call
            producer.produce(topic, value, key, partition, on_delivery, None, timestamp, headers)
        except BufferError:
            full = True
            continue
        return
