"""The direct layout's state reads, and what a Python worker keeps of them between its tasks.

Runs in the executors' Python workers (``dedup/direct_task.py``). A worker runs one task at a time,
and Spark hands it the next one (``spark.python.worker.reuse``, on by default), so it keeps:

- one read_committed consumer per Kafka configuration: a new one costs a connection and two
  metadata round trips, ~25 ms on a task's critical path every batch;
- per state key, the last state record it read or committed there, with the state partition's
  end (its last stable offset) just after that record; and, when its daemon made one
  (``dedup/worker_daemon.py``), the same in a file of a directory the executor's workers share.

A task asks for its state only after ``init_transactions``, which completes or aborts the last
transaction of its ``transactional.id`` (the markers are written when it returns). If the
partition's last stable offset then equals the end kept with the record, nothing was written
into that partition since: the record is still the last committed one with its key, and the
read cost one ListOffsets request. Otherwise (another worker ran this raw partition since,
another checkpoint shares the state topic, an attempt aborted after its state record) the
partition is read as before. A worker keeps the record's bytes, decoded per task, so a task that
changes its detectors and then aborts leaves nothing stale behind.

Spark hands a batch's tasks to whichever workers are idle, so a transaction group seldom comes
back to the worker that ran its last batch, and most reads missed (docs/dedup-internals.md "A
task's fixed cost" has the count). The shared file holds the same fact, "with the partition
ending at ``end``, the last committed record with this key is this value", written by whichever
worker committed it, so it needs the same check and no more: the partition's last stable offset
equal to ``end``. Offsets are never reused, so a file can be old, never wrong; one that cannot
be read, or whose checksum fails, is dropped and the partition is read.

A kept consumer may know a partition leader that has gone since (a broker killed or rolled):
it refreshes its metadata first and gets ``KEPT_TIMEOUT_S``; if it fails, a new consumer reads
with the full timeout (and is kept instead), and while the cluster fails over another new one
(``dedup.fence.retrying``). Bounded: ``MAX_CONSUMERS`` consumers and
``MAX_KEPT_BYTES`` of records per worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from common.errors import ServiceError
from dedup.direct_state import StateRecord
from dedup.fence import reader_conf, retrying, scan_back
from dedup.writer_settings import KAFKA_TIMEOUT_S, WriterSettings
from runtime import kafka

log = logging.getLogger(__name__)

#: State records read per step when searching a state partition backwards for this key's last
#: one (with one raw topic, the partition's last committed record is it).
STATE_SCAN_STEP = 8
#: Consumers a worker keeps (one per Kafka configuration; a dedup process has one).
MAX_CONSUMERS = 4
#: Bytes of state records a worker keeps; a larger record is read from Kafka each time.
MAX_KEPT_BYTES = 16 << 20
#: Seconds a kept consumer gets before a new one (fresh metadata, the full timeout) reads instead.
KEPT_TIMEOUT_S = 5.0
#: Bytes of a state record the workers share through a file; a larger one is kept per worker.
#: A healthy source partition's detector is about a kilobyte, so the files of an executor's raw
#: partitions stay small.
MAX_SHARED_BYTES = 1 << 20
#: A shared file: the partition's end after the record, the record's CRC-32, then the record.
_SHARED_HEADER = struct.Struct(">qI")


@dataclass(frozen=True, slots=True)
class _Kept:
    end: int
    value: bytes


#: Python-worker globals: a worker runs one task at a time.
_consumers: OrderedDict[tuple[tuple[str, str], ...], Consumer] = OrderedDict()
_kept: OrderedDict[tuple[str, str, int, bytes], _Kept] = OrderedDict()
#: The directory an executor's workers share their committed records through, set by the worker
#: daemon before it forks them (``share``); None: each worker keeps its own only.
shared_dir: Path | None = None


def share(directory: Path) -> None:
    """Share committed records through files in ``directory`` (owned by this user, mode 0700)
    from now on: the worker daemon calls it before it forks any worker."""
    global shared_dir  # noqa: PLW0603  one per daemon process and its workers, by design
    shared_dir = directory


def read_state(settings: WriterSettings, key: bytes, partition: int) -> StateRecord | None:
    """The last committed state record with ``key`` in partition ``partition`` of the state
    topic (``read_committed``), or None: a raw partition this checkpoint has not written yet.
    Call it only after the raw partition's ``init_transactions`` (see the module's doc).

    Raises:
        ServiceError: the topic cannot be read.
        GapStateError: the record is not one this version reads.
    """
    conf = reader_conf(settings, f"{settings.transactional_id}.state")
    name = tuple(sorted((k, str(v)) for k, v in conf.items()))
    consumer = _consumers.pop(name, None)
    if consumer is not None:
        try:
            # its metadata first: a kept consumer's leader of the partition may be a broker
            # that has gone since (a kill, a roll), and a watermark query waits for that one
            consumer.list_topics(settings.state_topic, timeout=KEPT_TIMEOUT_S)
            value = _read(settings, consumer, key, partition, KEPT_TIMEOUT_S)
        except (KafkaException, ServiceError) as exc:
            _close(consumer)
            log.info("the kept state consumer failed (%s); reading with a new one", exc)
        else:
            _keep_consumer(name, consumer)
            return StateRecord.decode(value) if value is not None else None

    def fresh() -> bytes | None:
        consumer = kafka.consumer(conf)
        try:
            value = _read(settings, consumer, key, partition, KAFKA_TIMEOUT_S)
        except BaseException:
            _close(consumer)
            raise
        _keep_consumer(name, consumer)
        return value

    value = retrying(fresh, f"reading state partition {partition}")
    return StateRecord.decode(value) if value is not None else None


def _read(
    settings: WriterSettings, consumer: Consumer, key: bytes, partition: int, timeout: float
) -> bytes | None:
    """The last committed value with ``key`` in the state partition: the kept one if the
    partition has not moved since it, else read."""
    where = TopicPartition(settings.state_topic, partition)
    low, high = consumer.get_watermark_offsets(where, timeout=timeout)
    value = kept_value(settings, key, partition, high)
    if value is not None:
        return value
    values = scan_back(consumer, where, key, (low, high), STATE_SCAN_STEP)
    if not values:
        return None
    remember(settings, key, partition, high, values[-1])
    return values[-1]


def kept_value(settings: WriterSettings, key: bytes, partition: int, end: int) -> bytes | None:
    """The last committed state record with ``key`` if the partition still ends at ``end`` (its
    last stable offset now) where it ended after that record: this worker's, else the shared
    file's; None if neither holds it."""
    place = _place(settings, key, partition)
    kept = _kept.get(place)
    if kept is not None and kept.end == end:
        _kept.move_to_end(place)
        return kept.value
    shared = _read_shared(place)
    if shared is None or shared.end != end:
        return None
    _keep(place, shared)
    return shared.value


def remember(settings: WriterSettings, key: bytes, partition: int, end: int, value: bytes) -> None:
    """``value`` is the last committed state record with ``key`` while the partition ends at
    ``end`` (its last stable offset)."""
    place = _place(settings, key, partition)
    _keep(place, _Kept(end, value))
    _write_shared(place, end, value)


def forget(settings: WriterSettings, key: bytes, partition: int) -> None:
    """Keep nothing of ``key`` (a task of it failed: what it wrote is not known here)."""
    place = _place(settings, key, partition)
    _kept.pop(place, None)
    path = _shared_path(place)
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _keep(place: tuple[str, str, int, bytes], kept: _Kept) -> None:
    _kept.pop(place, None)
    if len(kept.value) > MAX_KEPT_BYTES:
        return
    _kept[place] = kept
    total = sum(len(k.value) for k in _kept.values())
    while total > MAX_KEPT_BYTES:
        _, dropped = _kept.popitem(last=False)
        total -= len(dropped.value)


def _shared_path(place: tuple[str, str, int, bytes]) -> Path | None:
    if shared_dir is None:
        return None
    return shared_dir / hashlib.sha256(repr(place).encode()).hexdigest()[:40]


def _write_shared(place: tuple[str, str, int, bytes], end: int, value: bytes) -> None:
    """Best effort: a file that cannot be written costs the next worker a read, never a task."""
    path = _shared_path(place)
    if path is None:
        return
    if len(value) > MAX_SHARED_BYTES:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)  # an older, smaller record would only miss
        return
    # written aside and renamed: a reader sees the old file or the new one, never a part
    temp = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(_SHARED_HEADER.pack(end, zlib.crc32(value)))
            out.write(value)
        temp.replace(path)
    except OSError as exc:
        log.debug("cannot share the state record through %s: %s", path, exc)
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)


def _read_shared(place: tuple[str, str, int, bytes]) -> _Kept | None:
    path = _shared_path(place)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None  # none yet (or gone with its directory)
    if len(data) >= _SHARED_HEADER.size and len(data) <= _SHARED_HEADER.size + MAX_SHARED_BYTES:
        end, crc = _SHARED_HEADER.unpack_from(data)
        value = data[_SHARED_HEADER.size :]
        if zlib.crc32(value) == crc:
            return _Kept(end, value)
    log.warning("dropping the unreadable shared state file %s; reading the partition", path)
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
    return None


def _place(settings: WriterSettings, key: bytes, partition: int) -> tuple[str, str, int, bytes]:
    return (settings.bootstrap_servers, settings.state_topic, partition, key)


def _keep_consumer(name: tuple[tuple[str, str], ...], consumer: Consumer) -> None:
    _consumers[name] = consumer
    while len(_consumers) > MAX_CONSUMERS:
        _close(_consumers.popitem(last=False)[1])


def _close(consumer: Consumer) -> None:
    with contextlib.suppress(KafkaException, RuntimeError):  # closed already
        consumer.close()


def close() -> None:
    """Close the kept consumers and keep no records (a process that ran tasks in-line, as the
    tests do, before its brokers go)."""
    _kept.clear()
    while _consumers:
        _close(_consumers.popitem()[1])
