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
- ``python_source``: the Python source; ``read`` counts the bytes of its range;
- ``kafka_source_dedup``: Spark's Kafka source -> ``mapInArrow`` running the direct layout's task
  (``dedup.direct_task.DirectTransaction``: producer, fence, state read, detection, transaction;
  ``bench/realtime_mode.py``'s ``micro_batch_dedup``), without the driver's ``foreachBatch``;
- ``python_source_dedup_kept``: the Python source handing each task one row, its raw partition's
  range; ``mapInArrow`` reads the range with the dedup's reader (``dedup/range_reader.py``, a
  consumer kept per Python worker) and runs the same task on the batches.

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
from confluent_kafka import TopicPartition
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
from dedup.direct_task import DirectTransaction
from dedup.range_reader import RangeReading, read_range
from dedup.raw_position import consumer_conf
from dedup.writer_settings import TaskSpec

CASES = (
    "kafka_source",
    "python_source",
    "kafka_source_dedup",
    "python_source_dedup_kept",
)


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
        for batch in read_range(reading(self.bootstrap), self.topic, *partition.value):
            seen += batch.column("value").buffers()[2].size
        save(f"{partition.out}/py-{partition.partition}-{partition.start}", seen)
        yield (partition.partition, seen)

    def commit(self, end: dict) -> None:
        pass


def reading(bootstrap: str) -> RangeReading:
    """The dedup's range reading (``dedup/range_reader.py``: a consumer kept per worker)."""
    return RangeReading(conf=consumer_conf({"bootstrap.servers": bootstrap}, {},
                                           group_id="python-source"))  # fmt: skip


def range_dedup(spec: TaskSpec, out: str, bootstrap: str):
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
                    reading(bootstrap), TOPIC, row["partition"], row["start"], row["end"]
                ):
                    seen += batch.column("value").buffers()[2].size
                    yield batch

            spec_n = replace(spec, batch_id=batch_id, now_ms=time.time_ns() // 1_000_000)
            part = DirectTransaction(spec_n, TOPIC, row["partition"])
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
            .option("mode", "ranges" if case.endswith("_kept") else "count")
            .load()
        )
        if case.startswith("python_source_dedup"):
            from bench import python_source  # noqa: PLC0415  by reference, as in main

            task = python_source.range_dedup(dedup_spec(bootstrap, work), str(out), bootstrap)
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
