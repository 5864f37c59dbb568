"""The direct layout's classifier (``dedup/classify_python.py``) on what only it sees: ticks, and
the columns it hands the detectors. Its agreement with the SQL classifier over every key form
and control record is ``tests/integration/test_dedup_classify.py``."""

from __future__ import annotations

import pyarrow as pa

from dedup.classify_python import classify_batch
from dedup.rows import KIND_DATA, KIND_MALFORMED, KIND_RUN_IN, KIND_TICK

PROVENANCE = [("diode.key", b"k"), ("diode.timestamp", b"-12"), ("diode.timestamp-type", b"1"),
              ("diode.session", b"ab")]  # fmt: skip


def batch(*rows: tuple[bytes | None, bytes | None, str, list]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {"key": k, "value": v, "topic": t, "headers": [{"key": a, "value": b} for a, b in h]}
            for k, v, t, h in rows
        ]
    )


def test_ticks_runs_v1_records_and_the_malformed_get_their_kinds() -> None:
    cols = classify_batch(
        batch(
            (b"tick", b"", "raw", [("diode.control", b"tick")]),
            (b"orders:3:10-19", b"RUN", "raw", [("diode.session", b"ab")]),
            (b"orders:3:9", b"v", "raw", [("h", None), *PROVENANCE]),
            (b"orders:3:10-19", b"RUN", "other", []),  # a topic not read
            (b"orders:3:10-19", b"{}", "raw", [("diode.control", b"heartbeat")]),
            (None, b"v", "raw", PROVENANCE),
        ),
        ("raw",),
    )
    assert cols["kind"].tolist() == [KIND_TICK, KIND_RUN_IN, KIND_DATA] + [KIND_MALFORMED] * 3
    assert cols["src_topic"].tolist()[:3] == ["", "orders", "orders"]
    assert cols["src_partition"].tolist()[:3] == [-1, 3, 3]
    assert (cols["src_offset"][1], cols["src_last"][1], cols["stride"][1]) == (10, 19, 1)
    assert cols["payload"].tolist()[:4] == [None, b"RUN", b"v", None]
    assert cols["h_keys"][2] == ["h", *(name for name, _ in PROVENANCE)]
    assert cols["h_values"][2] == [None, *(value for _, value in PROVENANCE)]
    assert cols["kind"].dtype.name == "int8"
    assert cols["src_offset"].dtype.name == "int64"


def test_an_empty_batch_gives_empty_columns() -> None:
    empty = pa.RecordBatch.from_pylist(
        [],
        schema=pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                          ("headers", pa.list_(pa.struct([("key", pa.string()),
                                                          ("value", pa.binary())])))]),
    )  # fmt: skip
    cols = classify_batch(empty, ("raw",))
    assert all(len(column) == 0 for column in cols.values())
