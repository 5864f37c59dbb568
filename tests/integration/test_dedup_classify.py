"""The dedup's SQL classification (``dedup/classify_sql.py``) against its Python twins, in Spark.

Keys of both raw layouts, canonical and not, control records and v1 provenance: the kind, source
partition and offsets Spark computes must be what ``common.raw_run.parse_run_key`` and
``common.raw_topic.parse_raw_key`` / ``restore`` say, so ``kafka-diode raw dump`` and the dedup
never disagree about a raw record. One local SparkSession over a static DataFrame.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest

from common.gap_record import MAX_OFFSET
from common.raw_run import parse_run_key
from common.raw_topic import parse_raw_key, restore
from dedup.classify_python import classify_batch
from dedup.rows import (
    KIND_DATA,
    KIND_HEARTBEAT,
    KIND_MALFORMED,
    KIND_RESET,
    KIND_RUN_IN,
    KIND_WITHHELD,
)

pytestmark = [pytest.mark.spark]

PROVENANCE = [("diode.key", b"k"), ("diode.timestamp", b"12"), ("diode.timestamp-type", b"1"),
              ("diode.session", b"ab")]  # fmt: skip
KEYS = [
    "t:0:5", "t:0:05", "t:00:5", "t:0:+5", "t:0: 5", "t:0:-5", "t:0:9223372036854775807",
    "t:0:9223372036854775808", "t:2147483648:1", "a:b:c:3:7", ":0:5", "t:0:", "t::5", "t0:5",
    "t:1:0-9", "t:1:9-0", "t:1:0-9/3", "t:1:0-9/1", "t:1:0-8/3", "t:1:0-9/65", "t:1:0-9/03",
    "t:1:00-9", "t:1:0-09", "t:1:0--9", "t:1:0-9/", "t:1:-1-9", "x.y-z:4:10-10",
    "t:1:9223372036854775800-9223372036854775807", "t:1:9223372036854775800-9223372036854775806",
]  # fmt: skip


def expected_kind(key: str) -> tuple[int, int, int, int]:
    """(kind, first, last, stride) by the Python rules, for a record with provenance headers."""
    run = parse_run_key(key)
    if run is not None and run[3] <= MAX_OFFSET:  # the detector's range (offset + 1 must fit)
        return KIND_RUN_IN, run[2], run[3], run[4]
    parsed = parse_raw_key(key)
    if parsed is None or not 0 <= parsed[2] <= MAX_OFFSET:
        return KIND_MALFORMED, -1, -1, 1
    assert restore(PROVENANCE) is not None
    return KIND_DATA, parsed[2], parsed[2], 1


def test_sql_classification_agrees_with_the_python_parsers(tmp_path) -> None:
    from pyspark.sql import SparkSession  # noqa: PLC0415
    from pyspark.sql.types import (  # noqa: PLC0415
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )  # fmt: skip

    from dedup.classify_sql import classify  # noqa: PLC0415

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("headers", ArrayType(header)),
    ])  # fmt: skip
    rows = []
    for i, key in enumerate(KEYS):
        headers = [] if "-" in key.rsplit(":", 1)[-1] else PROVENANCE
        rows.append((key.encode(), b"v", "raw", 0, i, headers))
    controls = [
        ("t:0:7", b'{"high_offset": 7, "low_offset": 2}', "heartbeat", KIND_HEARTBEAT),
        (
            "t:0:8",
            b'{"low_offset": "3", "started_at_ms": 1700000000000, "chain_share": 1, '
            b'"chain_index": 1, "chain_count": 3}',
            "heartbeat",
            KIND_HEARTBEAT,
        ),  # a share chain's
        ("t:0:9", b'{"chain_share": 1, "chain_index": 2}', "heartbeat", KIND_HEARTBEAT),
        ("t:0:9", b"not json", "heartbeat", KIND_HEARTBEAT),
        ("t:0:3", b'{"last": "12"}', "withheld", KIND_WITHHELD),
        ("t:0:0", b"{}", "reset", KIND_RESET),
        ("t:0:3", b'{"last": 9}', "withheld", KIND_WITHHELD),
        ("t:0:3", b'{"last": 1}', "withheld", KIND_MALFORMED),  # last below first
        ("t:0:3-9", b"{}", "heartbeat", KIND_MALFORMED),  # control with a run key
        ("t:0:3", b"{}", "other", KIND_MALFORMED),
    ]
    for j, (key, value, control, _) in enumerate(controls):
        rows.append(
            (key.encode(), value, "raw", 0, 1000 + j, [("diode.control", control.encode())])
        )
    rows.append((b"t:0:4", b"v", "elsewhere", 0, 2000, PROVENANCE))  # a topic we do not read
    rows.append((b"t:0:6", b"v", "raw", 0, 2001, [*PROVENANCE[:3], ("diode.session", None)]))
    rows.append((b"t:0:6", b"v", "raw", 0, 2002, [PROVENANCE[1], *PROVENANCE[1:]]))
    rows.append((b"t:0:6", b"v", "raw", 0, 2003, [("x", b"1"), *PROVENANCE[:1],
                 ("diode.timestamp", b"-9223372036854775809"), *PROVENANCE[2:]]))  # fmt: skip
    rows.append((b"t:1:0-4", b"run", "elsewhere", 0, 2004, []))  # a run of a topic not read
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    try:
        frame = spark.createDataFrame(rows, schema)
        out = classify(frame, ["raw", "control"]).collect()
    finally:
        spark.stop()
    # the direct layout's twin (dedup/classify_python.py): the same verdicts, field for field
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "key": r[0],
                "value": r[1],
                "topic": r[2],
                "headers": [{"key": k, "value": v} for k, v in r[5]],
            }
            for r in rows
        ]
    )
    twin = classify_batch(batch, ("raw", "control"))
    fields = ("kind", "src_topic", "src_partition", "src_offset", "src_last", "stride",
              "hb_low", "hb_started", "hb_chain")  # fmt: skip
    for i, row in enumerate(out):
        sql = tuple(getattr(row, name) for name in fields)
        python = tuple(getattr(twin[n][i], "item", lambda v=twin[n][i]: v)() for n in fields)
        if row.kind == KIND_MALFORMED:  # which source partition counts it may differ; never a kind
            assert python[0] == KIND_MALFORMED, (rows[i][0], sql, python)
            continue
        assert python == sql, (rows[i][0], rows[i][1])
        assert (twin["payload"][i] is not None) == (row.payload is not None)
        if row.kind == KIND_DATA:
            assert list(twin["h_keys"][i]) == list(row.h_keys)
            sql_values = [bytes(v) if v is not None else None for v in row.h_values]
            assert list(twin["h_values"][i]) == sql_values
    got = [(r.kind, r.src_offset, r.src_last, r.stride) for r in out]
    for key, (kind, first, last, stride) in zip(KEYS, got, strict=False):
        want = expected_kind(key)
        if want[0] == KIND_MALFORMED:
            assert kind == KIND_MALFORMED, key
        else:
            assert (kind, first, last, stride) == want, key
    for (key, _, _, kind), row in zip(controls, out[len(KEYS) :], strict=False):
        assert row.kind == kind, key
    # a topic not read; a null header value is data; provenance out of order; a timestamp
    # beyond 64 bits; a run of a topic not read
    assert [r.kind for r in out[-5:]] == [KIND_MALFORMED, KIND_DATA] + [KIND_MALFORMED] * 3
    heartbeat = out[len(KEYS)]
    assert (heartbeat.src_offset, heartbeat.hb_low) == (7, 2)
    assert out[len(KEYS) + 6].hb_low == 9  # a withheld range's last rides in hb_low
    assert out[len(KEYS) + 1].hb_chain == 3 * 256 + 1
    # the payload goes on for data only
    assert all((r.payload is not None) == (r.kind in (KIND_DATA, KIND_RUN_IN)) for r in out)
