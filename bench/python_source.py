"""Whether the raw payloads should bypass Spark's JVM: a Python streaming source against Kafka's.

The dedup reads the raw topic through Spark's Kafka source, so every payload byte is fetched by
the JVM's consumer, copied into a row, then into Arrow for the Python task
(docs/dedup-internals.md "A micro-batch's fixed cost in the JVM": ~a quarter of a settled JVM's
CPU, mostly per byte). Measured before and not built: Spark carrying offsets only, each task
reading its range itself, where Spark's source still fetched every record. This bench measures
the other way round: a **Python streaming data source** (Spark 4's ``DataSourceStreamReader``)
whose offsets are the raw partitions' end offsets, planned by Spark as any source's (offset log,
replay), and whose ``read`` runs in a Python worker and reads its offset range with librdkafka
itself, so no payload enters the JVM. Both cases count the value bytes they get in Python and
write nothing (Spark's ``noop`` sink), on the dedup's 1 s trigger, in one SparkSession as the
dedup builds it, alternated per round, on a raw topic a paced writer fills with runs of six
``--value-bytes`` records (``bench/realtime_mode.py``'s writer):

- ``kafka_source``: Spark's Kafka source -> ``mapInArrow`` counting the bytes (what the dedup's
  tasks get);
- ``python_source``: the Python source; ``read`` counts the bytes of its range (a consumer per
  task, as the dedup's tasks have a producer each);
- ``kafka_source_dedup``: Spark's Kafka source -> ``mapInArrow`` running the direct layout's task
  (``dedup.direct_task.DirectPartition``: producer, fence, state read, detection, transaction;
  ``bench/realtime_mode.py``'s ``micro_batch_dedup``), without the driver's ``foreachBatch``;
- ``python_source_dedup``: the Python source handing each task one row, its raw partition's range;
  ``mapInArrow`` reads the range with librdkafka into Arrow batches of the columns Spark's source
  gives (key, value, topic, partition, offset, headers) and runs the same task on them;
- ``python_source_dedup_kept``: the same, each Python worker keeping its consumer across tasks.

Per case: MB/s of raw values, and the CPU of this process tree (driver, JVM, Python workers;
not the broker nor the writer) per second and per GB.

    .venv/bin/python bench/python_source.py [--mbps 10] [--raw-partitions 2] [--rounds 2]
        [--warm 30] [--seconds 60]

Prints one line per case and round, and one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from bench.realtime_mode import (
    TOPIC,
    alternate,
    arrow_counter,
    case_parser,
    dedup_spec,
    job_config,
    measure,
    micro_batch_dedup,
    save,
)
from dedup import job
from dedup.direct_task import DirectPartition
from dedup.writer_settings import TaskSpec

CASES = (
    "kafka_source",
    "python_source",
    "kafka_source_dedup",
    "python_source_dedup",
    "python_source_dedup_kept",
)
#: the columns of Spark's Kafka source that the direct task reads
RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
#: raw records per Arrow batch handed to the task (~4 MiB of 64 KiB runs: the direct layout's
#: ``arrow.maxBytesPerBatch``)
ARROW_RUNS = 64
#: a task that has not read its range by then fails the query (the broker is gone)
READ_TIMEOUT_S = 60.0


class RangePartition(InputPartition):
    """One raw partition's offsets ``[start, end)`` of a micro-batch."""

    def __init__(self, partition: int, start: int, end: int, out: str) -> None:
        super().__init__((partition, start, end))
        self.partition, self.start, self.end, self.out = partition, start, end, out


class RawRanges(DataSource):
    """``spark.readStream.format("raw_ranges")``: options ``bootstrap``, ``topic``, ``out``."""

    @classmethod
    def name(cls) -> str:
        return "raw_ranges"

    def schema(self) -> str:
        if self.options.get("mode") == "ranges":
            return "partition int, start long, end long"
        return "partition int, bytes long"

    def streamReader(self, schema):  # noqa: N802  Spark's name
        return RangesReader(self.options)


class RangesReader(DataSourceStreamReader):
    """Offsets: ``{"<partition>": next offset}``; a batch reads up to each partition's end."""

    def __init__(self, options) -> None:
        self.bootstrap, self.topic, self.out = (
            options["bootstrap"],
            options["topic"],
            options["out"],
        )
        self.ranges = options.get("mode") == "ranges"
        self.admin = None
        self.raw_partitions: list[int] | None = None

    def __getstate__(self) -> dict:
        # the reader is pickled to each task; its planning client stays in the driver's worker
        return {**self.__dict__, "admin": None}

    def _ends(self) -> dict:
        """Each raw partition's log end: one ListOffsets request per broker, as Spark's source."""
        if self.admin is None:
            self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        if self.raw_partitions is None:
            meta = self.admin.list_topics(self.topic, timeout=10).topics[self.topic]
            self.raw_partitions = sorted(meta.partitions)
        futures = self.admin.list_offsets(
            {TopicPartition(self.topic, p): OffsetSpec.latest() for p in self.raw_partitions},
            request_timeout=10,
        )
        return {str(tp.partition): f.result().offset for tp, f in futures.items()}

    def initialOffset(self) -> dict:  # noqa: N802
        return self._ends()  # the topic's end: as startingOffsets=latest

    def latestOffset(self, start: dict, limit) -> dict:  # noqa: N802
        return self._ends()

    def partitions(self, start: dict, end: dict):
        return [
            RangePartition(int(p), start.get(p, 0), end[p], self.out)
            for p in sorted(end, key=int)
            if end[p] > start.get(p, 0)
        ]

    def read(self, partition: RangePartition):
        if self.ranges:
            yield (partition.partition, partition.start, partition.end)
            return
        seen = 0
        for batch in read_range(self.bootstrap, self.topic, *partition.value):
            seen += batch.column("value").buffers()[2].size
        save(f"{partition.out}/py-{partition.partition}-{partition.start}", seen)
        yield (partition.partition, seen)

    def commit(self, end: dict) -> None:
        pass


#: a Python worker's kept consumer per bootstrap (``python_source_dedup_kept``): a reader, unlike
#: a transactional producer, cannot be fenced, so a worker may keep it across tasks
_KEPT: dict[str, Consumer] = {}


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "python-source",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
            "queued.max.messages.kbytes": 16384,
        }
    )


def read_range(
    bootstrap: str, topic: str, partition: int, start: int, end: int, *, kept: bool = False
):
    """Raw records ``[start, end)`` of one partition as Arrow batches of ``RAW_SCHEMA``."""
    if kept:
        if bootstrap not in _KEPT:
            _KEPT[bootstrap] = _consumer(bootstrap)
        consumer = _KEPT[bootstrap]
    else:
        consumer = _consumer(bootstrap)
    at, deadline = start, time.monotonic() + READ_TIMEOUT_S
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        while at < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw partition {partition}: at {at} of [{start}, {end})")
            messages = [
                m
                for m in consumer.consume(ARROW_RUNS, 1.0)
                if m.error() is None and m.offset() < end
            ]
            if not messages:
                continue
            at = messages[-1].offset() + 1
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([m.key() for m in messages], pa.binary()),
                    pa.array([m.value() for m in messages], pa.binary()),
                    pa.array([topic] * len(messages), pa.string()),
                    pa.array([partition] * len(messages), pa.int32()),
                    pa.array([m.offset() for m in messages], pa.int64()),
                    pa.array(
                        [[{"key": k, "value": v} for k, v in m.headers() or ()] for m in messages],
                        RAW_SCHEMA.field("headers").type,
                    ),
                ],
                schema=RAW_SCHEMA,
            )
    finally:
        if kept:
            consumer.unassign()
        else:
            consumer.close()


def range_dedup(spec: TaskSpec, out: str, bootstrap: str, *, kept: bool = False):
    """The direct task over the ranges the Python source hands it, each read with librdkafka."""

    def task(batches):
        context = TaskContext.get()
        name = f"{out}/dedup-{context.taskAttemptId()}"
        batch_id = int(context.getLocalProperty("streaming.sql.batchId"))
        seen = records = 0
        for row in (r for b in batches for r in b.to_pylist()):

            def counting(row=row):
                nonlocal seen
                for batch in read_range(
                    bootstrap, TOPIC, row["partition"], row["start"], row["end"], kept=kept
                ):
                    seen += batch.column("value").buffers()[2].size
                    yield batch

            spec_n = replace(spec, batch_id=batch_id, now_ms=time.time_ns() // 1_000_000)
            part = DirectPartition(spec_n, TOPIC, row["partition"])
            records += part.run(counting(), lambda stats: None).records
        save(name, seen)
        save(f"{name}.records", records)
        yield pa.RecordBatch.from_pydict({"value": [b""]})

    return task


def run_case(spark, bootstrap: str, case: str, work: Path, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=work))
    if case.startswith("kafka_source"):
        options = job.source_options(job_config(bootstrap, work), (TOPIC,))
        stream = (
            spark.readStream.format("kafka")
            .options(**options)
            .option("startingOffsets", "latest")
            .load()
        )
        if case == "kafka_source":
            task = arrow_counter(str(out))
            stream = stream.select("value")
        else:
            task = micro_batch_dedup(dedup_spec(bootstrap, work), str(out))
        stream = stream.mapInArrow(task, "value binary")
    else:
        stream = (
            spark.readStream.format("raw_ranges")
            .option("bootstrap", bootstrap)
            .option("topic", TOPIC)
            .option("out", str(out))
            .option("mode", "ranges" if case.endswith(("_dedup", "_kept")) else "count")
            .load()
        )
        if case.startswith("python_source_dedup"):
            from bench import python_source  # noqa: PLC0415  by reference, as in main

            task = python_source.range_dedup(
                dedup_spec(bootstrap, work), str(out), bootstrap, kept=case.endswith("_kept")
            )
            stream = stream.mapInArrow(task, "value binary")
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(work / f"checkpoint-{out.name}"))
        .trigger(processingTime="1 second")
        .start()
    )
    return measure(query, case, out, args)


def main() -> int:
    args = case_parser(__doc__, CASES).parse_args()

    def prepare(spark):
        # by reference to this module, not pickled by value from __main__ (cloudpickle cannot
        # rebuild librdkafka's classes in a worker)
        from bench import python_source  # noqa: PLC0415

        spark.dataSource.register(python_source.RawRanges)
        return run_case

    return alternate("python_source", args, prepare)


if __name__ == "__main__":
    sys.exit(main())
