"""A write task's rows travel to the driver as one Arrow IPC cell per task (pure: no Spark).

What ``task_result`` yields in an executor, ``decode_results`` gives back on the driver row for
row; a cell of another schema (executors of another version) or of no stream at all stops the
batch with an error that says so, instead of folding wrong counters into the metrics.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from common.errors import ServiceError
from dedup.rows import STAT_COLUMNS
from dedup.task_result import RESULT_DDL, RESULT_SCHEMA, decode_results, task_result
from dedup.writer_settings import BatchResult


def stat_batch(partitions: list[int]) -> pa.RecordBatch:
    columns = {
        "src_topic": pa.array(["t"] * len(partitions)),
        "src_partition": pa.array(partitions, pa.int32()),
        **{name: pa.array([p * 10 + i for p in partitions], pa.int64())
           for i, name in enumerate(STAT_COLUMNS)},
        "state_bytes": pa.array([100] * len(partitions), pa.int64()),
    }  # fmt: skip
    return pa.RecordBatch.from_pydict(columns)


def cells(*tasks: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches([batch for task in tasks for batch in task])


def test_spark_carries_one_binary_column() -> None:
    assert RESULT_DDL == "result binary"


def test_rows_of_several_tasks_come_back_as_written() -> None:
    wrote = BatchResult(7, records=40, gaps=2, replaced=1, parts=3)
    first = list(task_result(3, 1, wrote, [stat_batch([0, 1])], 5, 9))
    fenced = list(task_result(4, 0, BatchResult(7, records=8, fenced=True), [], 6, 10))
    assert [b.num_rows for b in first + fenced] == [1, 1]  # one cell per task
    rows = decode_results(cells(first, fenced))
    assert rows.schema.equals(RESULT_SCHEMA)
    assert rows.column("kind").to_pylist() == ["stat", "stat", "task", "task"]
    assert rows.column("src_partition").to_pylist() == [0, 1, None, None]
    assert rows.column(STAT_COLUMNS[0]).to_pylist() == [0, 10, None, None]
    assert rows.column("task_partition").to_pylist() == [3, 3, 3, 4]
    tasks = rows.filter(pa.compute.equal(rows.column("kind"), "task")).to_pylist()
    assert [(t["records"], t["gaps"], t["replaced"], t["skipped"], t["parts"]) for t in tasks] == [
        (40, 2, 1, False, 3),
        (0, 0, 0, True, 0),  # a fenced replay counts nothing
    ]
    assert [(t["attempt"], t["fence_ms"], t["write_ms"]) for t in tasks] == [(1, 5, 9), (0, 6, 10)]


def test_no_task_no_rows() -> None:
    empty = pa.Table.from_pydict({"result": pa.array([], pa.binary())})
    assert decode_results(empty).equals(RESULT_SCHEMA.empty_table())


def test_a_cell_of_another_schema_is_refused() -> None:
    other = pa.schema([("kind", pa.string()), ("records", pa.int32())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other) as stream:
        stream.write_table(pa.table({"kind": ["task"], "records": [1]}, schema=other))
    table = pa.table({"result": pa.array([sink.getvalue().to_pybytes()], pa.binary())})
    with pytest.raises(ServiceError, match="another version of kafka-diode"):
        decode_results(table)


def test_a_cell_that_is_no_stream_is_refused() -> None:
    table = pa.table({"result": pa.array([b"not arrow"], pa.binary())})
    with pytest.raises(ServiceError, match="does not decode"):
        decode_results(table)
