"""The dedup's SQL classification (``dedup/classify.py``) against its Python twins, in real Spark.

Keys of both raw layouts, canonical and not, control records and v1 provenance: the kind, source
partition and offsets Spark computes must be what ``common.raw_run.parse_run_key`` and
``common.raw_topic.parse_raw_key`` / ``restore`` say, so ``kafka-diode raw dump`` and the dedup
never disagree about a raw record. One local SparkSession over a static DataFrame.
"""

from __future__ import annotations

import sys

import pytest

from common.gap_record import MAX_OFFSET
from common.raw_run import parse_run_key
from common.raw_topic import parse_raw_key, restore
from dedup.detect import (
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

    from dedup.classify import classify  # noqa: PLC0415

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
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    try:
        out = classify(spark.createDataFrame(rows, schema), ["raw", "control"]).collect()
    finally:
        spark.stop()
    got = [(r.kind, r.src_offset, r.src_last, r.stride) for r in out]
    for key, (kind, first, last, stride) in zip(KEYS, got, strict=False):
        want = expected_kind(key)
        if want[0] == KIND_MALFORMED:
            assert kind == KIND_MALFORMED, key
        else:
            assert (kind, first, last, stride) == want, key
    for (key, _, _, kind), row in zip(controls, out[len(KEYS) :], strict=False):
        assert row.kind == kind, key
    assert out[-1].kind == KIND_MALFORMED
    heartbeat = out[len(KEYS)]
    assert (heartbeat.src_offset, heartbeat.hb_low) == (7, 2)
    assert out[len(KEYS) + 2].hb_low == 9  # a withheld range's last rides in hb_low
    # the payload goes on for data only
    assert all((r.payload is not None) == (r.kind in (KIND_DATA, KIND_RUN_IN)) for r in out)
