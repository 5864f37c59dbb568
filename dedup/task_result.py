"""What a write task hands back to the driver: one ``task`` row and its ``stat`` rows.

The contract between the write tasks (executors: ``dedup/batch_driver.py``'s ``write_task``) and the
driver's accounting (``TransactionalBatchWriter.account``). Runs on both sides; no pyspark import at
module level.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from dedup.rows import STAT_COLUMNS
from dedup.writer_settings import BatchResult

#: Columns of what a write task hands back to the driver (``mapInArrow``'s output, as DDL so
#: this module needs no pyspark import): the ``stat`` rows of its partition unchanged, plus one
#: ``task`` row with what the task wrote.
RESULT_COLUMNS = (
    ("kind", "string"),
    ("src_topic", "string"),
    ("src_partition", "int"),
    *((name, "bigint") for name in STAT_COLUMNS),
    ("state_bytes", "bigint"),
    ("task_partition", "int"),
    ("attempt", "int"),
    ("records", "bigint"),
    ("gaps", "bigint"),
    ("replaced", "bigint"),
    ("payload_bytes", "bigint"),
    ("record_bytes", "bigint"),
    ("skipped", "boolean"),
    ("fence_ms", "bigint"),
    ("write_ms", "bigint"),
)
RESULT_DDL = ", ".join(f"{name} {kind}" for name, kind in RESULT_COLUMNS)
_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "boolean": pa.bool_(),
}
RESULT_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in RESULT_COLUMNS])


def task_result(  # noqa: PLR0917  one call per task
    partition: int,
    attempt: int,
    result: BatchResult,
    stat_parts: Sequence[pa.RecordBatch],
    fence_ms: int,
    write_ms: int,
) -> Iterator[pa.RecordBatch]:
    """The ``stat`` rows of a task (``stat_parts``, in the stateful step's output schema) and
    its ``task`` row: what it wrote, or nothing when a marker said the batch was committed."""
    stats = pa.Table.from_batches(stat_parts) if stat_parts else None
    n = 0 if stats is None else stats.num_rows
    columns: dict[str, list[Any]] = {name: [None] * (n + 1) for name in RESULT_SCHEMA.names}
    columns["kind"] = ["stat"] * n + ["task"]
    if stats is not None:
        for name in ("src_topic", "src_partition", *STAT_COLUMNS, "state_bytes"):
            columns[name][:n] = stats.column(name).to_pylist()
    columns["task_partition"] = [partition] * (n + 1)
    columns["attempt"][n] = attempt
    columns["records"][n] = 0 if result.fenced else result.records
    columns["gaps"][n] = 0 if result.fenced else result.gaps
    columns["replaced"][n] = 0 if result.fenced else result.replaced
    columns["payload_bytes"][n] = result.payload_bytes
    columns["record_bytes"][n] = result.record_bytes
    columns["skipped"][n] = result.fenced
    columns["fence_ms"][n] = fence_ms
    columns["write_ms"][n] = write_ms
    yield from pa.Table.from_pydict(columns, schema=RESULT_SCHEMA).to_batches()


def task_attempt() -> tuple[int, int]:
    """(partition, attempt number) of the Spark task this code runs in (on an executor).

    The partition is the stateful step's (``foreachBatch`` maps the batch without a shuffle),
    or, in the direct layout, the source's: one per raw partition.
    """
    from pyspark import TaskContext  # noqa: PLC0415  only inside a task; --help stays light

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not inside a Spark task")
    return context.partitionId(), context.attemptNumber()
