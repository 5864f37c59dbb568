"""What a write task hands back to the driver: one ``task`` row and its ``stat`` rows.

The contract between the write tasks (executors: ``dedup/batch_driver.py``'s ``write_task``) and the
driver's accounting (``TransactionalBatchWriter.account``). Runs on both sides; no pyspark import at
module level.

Spark sees one binary cell per task (``RESULT_DDL``): the rows in ``RESULT_SCHEMA``, as an Arrow
IPC stream, which ``decode_results`` opens on the driver. Spark generates and compiles code for a
task's output schema in every task, and plans and serializes it in every batch: with the rows as
~30 typed columns that was ~2.5 ms of the JVM's CPU per task (GenerateUnsafeProjection), a fixed
cost each micro-batch paid per raw partition whatever it carried (docs/dedup-internals.md
"A task's fixed cost").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from common.errors import ServiceError
from dedup.rows import STAT_COLUMNS
from dedup.writer_settings import BatchResult

#: Columns of what a write task hands back to the driver: the ``stat`` rows of its partition
#: unchanged, plus one ``task`` row with what the task wrote.
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
    ("parts", "bigint"),
    ("skipped", "boolean"),
    ("fence_ms", "bigint"),
    ("write_ms", "bigint"),
)
_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "boolean": pa.bool_(),
}
RESULT_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in RESULT_COLUMNS])
#: The one column Spark carries (``mapInArrow``'s output, as DDL so that this module needs no
#: pyspark import): per task, its rows as an Arrow IPC stream in ``RESULT_SCHEMA``.
RESULT_CELL = "result"
RESULT_DDL = f"{RESULT_CELL} binary"
_CELL_SCHEMA = pa.schema([(RESULT_CELL, pa.binary())])


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
    columns["parts"][n] = result.parts
    columns["skipped"][n] = result.fenced
    columns["fence_ms"][n] = fence_ms
    columns["write_ms"][n] = write_ms
    rows = pa.Table.from_pydict(columns, schema=RESULT_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RESULT_SCHEMA) as stream:
        stream.write_table(rows)
    cell = sink.getvalue().to_pybytes()  # a few hundred bytes per source partition
    yield pa.record_batch([pa.array([cell], pa.binary())], schema=_CELL_SCHEMA)


def decode_results(cells: pa.Table) -> pa.Table:
    """The rows of a batch's tasks (``RESULT_SCHEMA``) from the cells Spark collected.

    Raises:
        ServiceError: a cell is not a stream of this version's rows (executors that run another
            version of kafka-diode than the driver).
    """
    tables = [RESULT_SCHEMA.empty_table()]
    for cell in cells.column(RESULT_CELL).to_pylist():
        try:
            table = pa.ipc.open_stream(cell).read_all()
        except (pa.ArrowInvalid, TypeError) as exc:
            raise ServiceError(f"a write task's result does not decode: {exc}") from exc
        if not table.schema.equals(RESULT_SCHEMA):
            raise ServiceError(
                "a write task handed back rows of another schema: the executors run another "
                "version of kafka-diode than the driver (install the same one on every node)"
            )
        tables.append(table)
    return pa.concat_tables(tables)


#: The local properties Spark's stream execution sets on a micro-batch's jobs, so every task of
#: the batch can read them (the task function is built once, when the query starts).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def task_batch() -> tuple[str, int]:
    """(query id, micro-batch id) of the Spark task this code runs in (on an executor).

    Raises:
        RuntimeError: not inside a task of a streaming query's micro-batch.
    """
    from pyspark import TaskContext  # noqa: PLC0415  only inside a task; --help stays light

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not inside a Spark task")
    query = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    if not query or batch is None:
        raise RuntimeError("not inside a task of a streaming query's micro-batch")
    return query, int(batch)


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
