"""The direct layout's source: Spark plans offset ranges of the raw topic, the tasks read them.

Spark's Kafka source fetches every raw record in the JVM, copies it into a row and again into
Arrow for the Python task: most of a direct task's CPU per byte outside Python
(docs/dedup-internals.md "The raw payloads outside the JVM"). This source hands Spark offsets
only. Its offsets are the raw partitions' next offsets, in the Kafka source's JSON shape
(``{"raw": {"0": 1200, "1": 1180}}``), so Spark plans, logs and replays them as it did the Kafka
source's: a checkpoint written by either source reads on with the other. Each micro-batch is
one row per raw partition with input, ``(topic, partition, start, end)``, in one task per
transaction group, or at most as many as Spark runs at once (:func:`task_groups`). The source's
``read`` runs the dedup's write task over its task's ranges (the ``task`` option), which reads
each ``[start, end)`` itself with librdkafka (``dedup/range_reader.py``): no payload enters the
JVM, and the rows Spark gets are the write task's result cells (``RESULT_DDL``). Mapped over the
ranges in a second Python evaluation instead, each task would cost another round trip through a
Python worker (docs/dedup-internals.md "A micro-batch's fixed cost in the JVM").

The planning (which offsets a batch takes) is pure (:func:`plan_ends`, :func:`rate_limit`,
:func:`starting_offsets`); :class:`RawRangesReader` asks Kafka for the log ends and runs in the
driver's Python data source process. The options are the Kafka source's, where the dedup used
them: ``startingOffsets``, ``failOnDataLoss``, ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``
with ``maxTriggerDelay``.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from common.errors import ConfigError, ServiceError
from dedup.task_result import RESULT_DDL

log = logging.getLogger(__name__)

#: ``spark.readStream.format(SOURCE_NAME)``
SOURCE_NAME: Final = "kafka_diode_raw_ranges"
#: The write task's input: one row per raw partition with input in the task's share of a batch.
RANGE_ARROW_SCHEMA: Final = pa.schema(
    [("topic", pa.string()), ("partition", pa.int32()), ("start", pa.int64()), ("end", pa.int64())]
)
#: The Kafka source's sentinels in ``startingOffsets`` JSON.
EARLIEST: Final = -2
LATEST: Final = -1
#: Seconds a planning request (metadata, list offsets) may take before the batch fails.
PLAN_TIMEOUT_S: Final = 30.0
#: Spark's ``maxTriggerDelay`` when only ``minOffsetsPerTrigger`` is set.
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000

Offsets = dict[str, int]
"""One raw topic's next offset per partition (keys: the partition as text, as the JSON has)."""
WriteTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""The dedup's write task over one task's ranges (``TransactionalBatchWriter.task_function``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """How much a micro-batch takes: the Kafka source's options of the same names."""

    max_offsets: int
    """``maxOffsetsPerTrigger``: raw records per batch at most, spread over the partitions."""
    min_offsets: int = 0
    """``minOffsetsPerTrigger``: wait for this many new raw records (0: no wait) ..."""
    max_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    """... or this long since the last batch (``maxTriggerDelay``)."""


def duration_ms(text: str, key: str) -> int:
    """A Spark duration (``10s``, ``500ms``, ``15m``, ``1h``; a bare number is milliseconds).

    Raises:
        ConfigError: naming ``key``.
    """
    units = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in (*units, ""):
        raise ConfigError(key, f"is {text!r}", "use a duration such as 10s, 500ms or 15m")
    return int(match.group(1)) * units.get(match.group(2), 1)


def starting_offsets(value: str, topic: str) -> Mapping[str, int] | str:
    """``startingOffsets``: ``earliest``, ``latest``, or the Kafka source's JSON (``-2``
    earliest, ``-1`` latest per partition) for ``topic``.

    Raises:
        ConfigError: naming ``KAFKA_SOURCE_STARTINGOFFSETS``.
    """
    key = "KAFKA_SOURCE_STARTINGOFFSETS"
    if value.strip().lower() in ("earliest", "latest"):
        return value.strip().lower()
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not isinstance(parsed.get(topic), dict):
        raise ConfigError(
            key,
            f"is {value!r}",
            f'use earliest, latest or JSON such as {{"{topic}": {{"0": 1200, "1": -2}}}}',
        )
    parts = parsed[topic]
    if not all(str(p).isdigit() and isinstance(o, int) and o >= EARLIEST for p, o in parts.items()):
        raise ConfigError(key, f"is {value!r}", "give each partition an offset, -2 or -1")
    return {str(p): int(o) for p, o in parts.items()}


def initial_offsets(starting: Mapping[str, int] | str, lows: Offsets, highs: Offsets) -> Offsets:
    """Each partition's first offset of a new checkpoint (a partition ``starting`` does not
    name starts at the earliest, as with the Kafka source)."""
    if starting == "latest":
        return dict(highs)
    if starting == "earliest" or isinstance(starting, str):
        return dict(lows)
    out = {}
    for p, low in lows.items():
        chosen = starting.get(p, EARLIEST)
        out[p] = low if chosen == EARLIEST else highs[p] if chosen == LATEST else chosen
    return out


def rate_limit(limit: int, start: Offsets, ends: Offsets) -> Offsets:
    """``ends`` with at most about ``limit`` records taken, spread by each partition's share of
    the backlog (the Kafka source's rule: a share under one record rounds up, others down)."""
    sizes = {p: end - start[p] for p, end in ends.items() if p in start and end > start[p]}
    total = sum(sizes.values())
    if total <= limit:
        return dict(ends)
    out = dict(ends)
    for p, size in sizes.items():
        share = limit * size / total
        take = int(share) if share >= 1 else 1
        out[p] = min(ends[p], start[p] + take)
    return out


def plan_ends(
    start: Offsets,
    highs: Offsets,
    lows: Offsets,
    *,
    admission: Admission | None,
    waited_ms: float,
    fail_on_data_loss: bool,
    topic: str,
) -> Offsets:
    """The end offsets of the next micro-batch (``start`` itself: no batch yet).

    A partition new since ``start`` starts at its earliest; one whose log end fell below its
    start (the topic recreated, an unclean leader election) lost records: the query stops with
    ``fail_on_data_loss``, else the batch goes on from the log end.

    Raises:
        ServiceError: records lost and ``fail_on_data_loss``.
    """
    begin = {p: start.get(p, lows.get(p, 0)) for p in highs}
    shrunk = sorted((int(p), begin[p], high) for p, high in highs.items() if high < begin[p])
    if shrunk:
        message = (
            f"raw partitions of {topic} end below where the dedup reads on ((partition, next "
            f"offset, log end): {shrunk}): records were lost or the topic was recreated"
        )
        if fail_on_data_loss:
            raise ServiceError(message + "; FAIL_ON_DATA_LOSS=true stops the query")
        log.warning("%s: reading on from the log end (FAIL_ON_DATA_LOSS=false)", message)
    ends = dict(highs)
    if admission is None:
        return {**start, **ends}
    new = sum(max(0, ends[p] - begin[p]) for p in ends)
    if admission.min_offsets and new < admission.min_offsets and waited_ms < admission.max_delay_ms:
        return dict(start)
    limited = rate_limit(admission.max_offsets, begin, ends)
    return {**start, **limited}


@dataclass(frozen=True, slots=True)
class RangeOptions:
    """The source's options, parsed (``spark.readStream.option``: all text)."""

    topic: str
    conf: Mapping[str, Any]
    """librdkafka settings of the tasks' consumers (``dedup/range_reader.py``)."""
    admin: Mapping[str, Any]
    """librdkafka settings of the planning client (bootstrap and ``KAFKA_CONF_*``)."""
    starting: Mapping[str, int] | str
    admission: Admission
    fail_on_data_loss: bool
    task: WriteTask
    """The write task ``read`` runs over each task's ranges (the ``task`` option)."""
    tasks: int
    """Spark tasks per micro-batch at most (0: one per raw partition with input)."""
    groups: int = 0
    """The checkpoint's transaction groups: one task per group with input (0: ``tasks``)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> RangeOptions:
        topic = options["topic"]
        max_delay = options.get("maxTriggerDelay")
        return cls(
            topic=topic,
            conf=json.loads(options["conf"]),
            admin=json.loads(options["admin"]),
            starting=starting_offsets(options.get("startingOffsets", "earliest"), topic),
            admission=Admission(
                max_offsets=int(options["maxOffsetsPerTrigger"]),
                min_offsets=int(options.get("minOffsetsPerTrigger", "0")),
                max_delay_ms=(
                    duration_ms(max_delay, "KAFKA_SOURCE_MAXTRIGGERDELAY")
                    if max_delay
                    else DEFAULT_MAX_TRIGGER_DELAY_MS
                ),
            ),
            fail_on_data_loss=options.get("failOnDataLoss", "false").lower() == "true",
            task=_decode_task(options["task"]),
            tasks=int(options.get("tasks", "0")),
            groups=int(options.get("groups", "0")),
        )


def _encode_task(task: WriteTask) -> str:
    return base64.b64encode(pickle.dumps(task)).decode("ascii")


def _decode_task(text: str) -> WriteTask:
    # the query's own driver pickled it (``source_options``), as Spark pickles a mapped function
    task: WriteTask = pickle.loads(base64.b64decode(text))  # noqa: S301
    return task


#: The Kafka source's options this source takes (Spark's names ignore case): lower case -> name.
SHARED_OPTIONS: Final = {
    name.lower(): name
    for name in (
        "startingOffsets",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "failOnDataLoss",
        "maxOffsetsPerTrigger",
    )
}


def source_options(
    topic: str,
    consumer_conf: Mapping[str, Any],
    admin_conf: Mapping[str, Any],
    *,
    max_offsets: int,
    fail_on_data_loss: bool,
    kafka_source: Mapping[str, str],
    task: WriteTask,
    tasks: int = 0,
    groups: int = 0,
) -> dict[str, str]:
    """The options of ``spark.readStream.format(SOURCE_NAME)`` from the dedup's settings; the
    Kafka source options this source shares (``KAFKA_SOURCE_<NAME>``, any case) win.

    Raises:
        ConfigError: a shared option that does not parse.
    """
    options = {
        "topic": topic,
        "conf": json.dumps(dict(consumer_conf), sort_keys=True),
        "admin": json.dumps(dict(admin_conf), sort_keys=True),
        "maxOffsetsPerTrigger": str(max_offsets),
        "failOnDataLoss": str(fail_on_data_loss).lower(),
        "tasks": str(tasks),
        "groups": str(groups),
        "task": _encode_task(task),
    }
    for key, value in kafka_source.items():
        if key.lower() in SHARED_OPTIONS:
            options[SHARED_OPTIONS[key.lower()]] = value
    for key in ("minOffsetsPerTrigger", "maxOffsetsPerTrigger"):
        if key in options and not (options[key].isdigit() and int(options[key]) >= 0):
            raise ConfigError(
                "KAFKA_SOURCE_" + key.upper(), f"is {options[key]!r}", "use a whole number"
            )
    RangeOptions.parse(options)  # refuses the rest at start-up, not in the first batch
    return options


Range = tuple[str, int, int, int]
"""``(topic, partition, start, end)``: one raw partition's offsets ``[start, end)``."""


class RangePartition(InputPartition):
    """The offset ranges one task of a micro-batch reads, one raw partition after another."""

    def __init__(self, group: Sequence[Range]) -> None:
        super().__init__(tuple(group))


def ranges(topic: str, start: Offsets, end: Offsets) -> list[Range]:
    """``(topic, partition, start, end)`` of every partition with records in ``[start, end)``."""
    return [
        (topic, int(p), start.get(p, e), e)
        for p, e in sorted(end.items(), key=lambda item: int(item[0]))
        if e > start.get(p, e)
    ]


def task_groups(found: Sequence[Range], tasks: int, groups: int = 0) -> list[list[Range]]:
    """``found`` in Spark tasks, each in partition order; the same arguments always give the
    same tasks.

    With ``groups`` (a checkpoint's transaction groups), one task per group with input: raw
    partition ``p``'s range goes with the others of group ``p mod groups``, which commit in one
    transaction of one ``transactional.id`` (two tasks of one group would fence each other).
    Without, at most ``tasks`` (0: one range each) of about equal offsets: the longest range
    goes first, into the task with the fewest offsets so far (a backlog of one partition stays
    alone). A Spark task costs a Python evaluation (the source's ``read``, running the
    write task) beside what its ranges cost (docs/dedup-internals.md "A task's fixed cost").
    """
    if groups > 0:
        by_group: dict[int, list[Range]] = {}
        for r in sorted(found, key=lambda r: r[1]):
            by_group.setdefault(r[1] % groups, []).append(r)
        return [by_group[g] for g in sorted(by_group)]
    if tasks <= 0 or len(found) <= tasks:
        return [[r] for r in found]
    out: list[list[Range]] = [[] for _ in range(tasks)]
    load = [0] * tasks
    for r in sorted(found, key=lambda r: (-(r[3] - r[2]), r[1])):
        least = min(range(tasks), key=lambda i: (load[i], i))
        out[least].append(r)
        load[least] += r[3] - r[2]
    return sorted((sorted(g, key=lambda r: r[1]) for g in out), key=lambda g: g[0][1])


class RawRangesSource(DataSource):
    """``spark.readStream.format("kafka_diode_raw_ranges")`` over the options of
    :func:`source_options`."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return RESULT_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802  Spark's name
        return RawRangesReader(RangeOptions.parse(self.options))


class RawRangesReader(DataSourceStreamReader):
    """Offsets ``{topic: {"<partition>": next offset}}``; runs in the driver's Python data
    source process (one per query), which keeps it between batches."""

    def __init__(
        self,
        options: RangeOptions,
        watermarks: Callable[[bool], Offsets] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self._watermarks = watermarks
        self._clock = clock
        self._last_batch = clock()
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled to the tasks for ``read``: its planning client stays here
        return {**self.__dict__, "_watermarks": None}

    def _marks(self, *, earliest: bool) -> Offsets:
        if self._watermarks is None:
            self._watermarks = kafka_watermarks(self.options.admin, self.options.topic)
        marks = self._watermarks(earliest)
        if not earliest:
            self._latest = marks
        return marks

    def initialOffset(self) -> dict[str, Offsets]:  # noqa: N802
        highs = self._marks(earliest=False)
        lows = self._marks(earliest=True)
        return {self.options.topic: initial_offsets(self.options.starting, lows, highs)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.admission.max_offsets)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Offsets]:  # noqa: N802
        topic = self.options.topic
        highs = self._marks(earliest=False)
        now = self._clock()
        begin = {str(p): int(o) for p, o in (start.get(topic) or {}).items()}
        # a partition new since the last batch starts at its log start
        lows = self._marks(earliest=True) if set(highs) - set(begin) else {}
        admission = None if isinstance(limit, ReadAllAvailable) else self.options.admission
        ends = plan_ends(
            begin,
            highs,
            lows,
            admission=admission,
            waited_ms=(now - self._last_batch) * 1000,
            fail_on_data_loss=self.options.fail_on_data_loss,
            topic=topic,
        )
        if ends != begin:
            self._last_batch = now
        return {topic: ends}

    def reportLatestOffset(self) -> dict[str, Offsets] | None:  # noqa: N802
        return None if self._latest is None else {self.options.topic: dict(self._latest)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        topic = self.options.topic
        begin = {str(p): int(o) for p, o in (start.get(topic) or {}).items()}
        until = {str(p): int(o) for p, o in (end.get(topic) or {}).items()}
        if new := set(until) - set(begin):
            # read from its log start, as latestOffset planned it (and the Kafka source reads a
            # new partition): a partition new since the last batch, or every partition when the
            # checkpoint's last batch read another raw topic. Left out, its records up to the
            # batch's end would never be read, and come back only as gaps.
            lows = self._marks(earliest=True)
            begin.update({p: lows.get(p, 0) for p in new})
        found = ranges(topic, begin, until)
        groups = task_groups(found, self.options.tasks, self.options.groups)
        return [RangePartition(g) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The write task's result cells for ``partition``'s ranges."""
        ranges = pa.RecordBatch.from_pylist(
            [dict(zip(RANGE_ARROW_SCHEMA.names, r, strict=True)) for r in partition.value],
            schema=RANGE_ARROW_SCHEMA,
        )
        yield from self.options.task(iter((ranges,)))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to commit: the checkpoint's offset log is where the dedup reads on."""


def kafka_watermarks(conf: Mapping[str, Any], topic: str) -> Callable[[bool], Offsets]:
    """``(earliest) -> log starts or log ends`` of every partition of ``topic``: one ListOffsets
    request per broker, as the Kafka source's planning does."""
    from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415  driver only
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # noqa: PLC0415

    from runtime import kafka  # noqa: PLC0415

    admin = kafka.admin(conf)

    def listed(partitions: list[int], spec: Any) -> Offsets:
        futures = admin.list_offsets(
            {TopicPartition(topic, p): spec for p in partitions}, request_timeout=PLAN_TIMEOUT_S
        )
        try:
            return {str(tp.partition): int(f.result().offset) for tp, f in futures.items()}
        except KafkaException as exc:  # the batch fails; Spark runs it again
            raise ServiceError(f"cannot list the offsets of raw topic {topic}: {exc}") from exc

    def watermarks(earliest: bool) -> Offsets:
        meta = admin.list_topics(topic, timeout=PLAN_TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ServiceError(f"raw topic {topic} is not there: {getattr(meta, 'error', None)}")
        spec = OffsetSpec.earliest() if earliest else OffsetSpec.latest()  # type: ignore[no-untyped-call]
        return listed(sorted(meta.partitions), spec)

    return watermarks
