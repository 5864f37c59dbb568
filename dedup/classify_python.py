"""The classifier's rules in Python: raw records (a direct task's ``RawBatch``, or Arrow as Spark's
Kafka source reads them) -> the rows the detectors take (``dedup/detect.py``), for the direct
layout's tasks (``dedup/direct_task.py``).

Runs in the **executors**, inside a direct task. ``dedup/classify_sql.py`` states the same rules in
Spark SQL for the buckets layout, where the classification must happen before the shuffle; the
direct layout has no shuffle, and classifying in its task spares the JVM a projection that copies
every payload once more (docs/benchmarks.md "Dedup"). A run costs one key parse
here; a v1 record (one row per source record, written before raw layout v2) costs more, which
only a v1 backlog pays. ``tests/integration/test_dedup_classify.py`` holds both to the same
verdicts over the same raw records.

Kinds: a v2 run (no ``diode.control`` header, a known topic); a v1 record (its four provenance
headers last, in order, ``diode.timestamp`` a signed 64-bit decimal); control records
(heartbeat, reset, withheld; their JSON fields read as the SQL reads them: an integer, or a
string of decimal digits); the dedup's own tick; anything else malformed.

Pure: raw records in, numpy columns out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa

from common.gap_record import MAX_OFFSET
from common.raw_run import parse_run_key
from common.raw_topic import (
    CHAIN_COUNT,
    CHAIN_INDEX,
    CHAIN_SHARE,
    CONTROL_HEADER,
    HEARTBEAT,
    HEARTBEAT_LOW_OFFSET,
    HEARTBEAT_STARTED_AT,
    PROVENANCE_HEADERS,
    RESET,
    TICK,
    TIMESTAMP_PATTERN,
    WITHHELD,
    WITHHELD_LAST,
    parse_raw_key,
)
from dedup.raw_batch import Header, RawBatch, arrow_headers
from dedup.rows import (
    KIND_DATA,
    KIND_HEARTBEAT,
    KIND_MALFORMED,
    KIND_RESET,
    KIND_RUN_IN,
    KIND_TICK,
    KIND_WITHHELD,
    UNPARSED_PARTITION,
    UNPARSED_TOPIC,
)

_TIMESTAMP: Final = re.compile(TIMESTAMP_PATTERN)
_DIGITS: Final = re.compile(r"-?[0-9]+")
_INT64: Final = (-(2**63), 2**63 - 1)
_PROVENANCE: Final = list(PROVENANCE_HEADERS)


def classify_batch(batch: pa.RecordBatch, topics: Collection[str]) -> dict[str, np.ndarray]:
    """The detector's input columns (``dedup.InputRows``) of one Arrow batch of raw records
    (Spark's Kafka source's columns, of any raw topics).

    ``topics``: the raw topics read; a record of any other topic is malformed.
    """
    return _classify_rows(
        batch.column("key").to_pylist(),
        batch.column("value").to_pylist(),
        [topic in topics for topic in batch.column("topic").to_pylist()],
        arrow_headers(batch),
    )


def classify_raw(batch: RawBatch) -> dict[str, np.ndarray]:
    """The detector's input columns of a direct task's raw records (of its one raw topic)."""
    return _classify_rows(batch.keys, batch.values, [True] * len(batch), batch.headers)


def _classify_rows(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    known: Sequence[bool],
    headers: Sequence[Sequence[Header]],
) -> dict[str, np.ndarray]:
    n = len(keys)
    out: dict[str, list[Any]] = {
        "kind": [KIND_MALFORMED] * n,
        "src_topic": [UNPARSED_TOPIC] * n,
        "src_partition": [UNPARSED_PARTITION] * n,
        "src_offset": [-1] * n,
        "src_last": [-1] * n,
        "stride": [1] * n,
        "payload": [None] * n,
        "h_keys": [None] * n,
        "h_values": [None] * n,
        "hb_low": [-1] * n,
        "hb_started": [-1] * n,
        "hb_chain": [-1] * n,
    }
    for i in range(n):
        _classify(i, keys[i], values[i], known[i], headers[i], out)
    longs = ("src_offset", "src_last", "hb_low", "hb_started", "hb_chain")
    columns = {name: np.asarray(out[name], dtype=np.int64) for name in longs}
    columns["kind"] = np.asarray(out["kind"], dtype=np.int8)
    columns["src_partition"] = np.asarray(out["src_partition"], dtype=np.int32)
    columns["stride"] = np.asarray(out["stride"], dtype=np.int32)
    for name in ("src_topic", "payload", "h_keys", "h_values"):
        column = np.empty(n, dtype=object)
        column[:] = out[name]
        columns[name] = column
    return columns


def _classify(  # noqa: PLR0917  one raw record, the rules in the SQL's order
    i: int,
    key: bytes | None,
    value: bytes | None,
    known: bool,
    headers: Sequence[Header],
    out: dict[str, list[Any]],
) -> None:
    control = next((v for k, v in headers if k == CONTROL_HEADER), None)
    if control == TICK:
        out["kind"][i] = KIND_TICK
        return
    run = parse_run_key(key)
    if run is not None:
        topic, partition, first, last, stride = run
        out["src_topic"][i], out["src_partition"][i] = topic, partition
        out["src_offset"][i], out["src_last"][i], out["stride"][i] = first, last, stride
        if control is None and known and last <= MAX_OFFSET:
            out["kind"][i] = KIND_RUN_IN
            out["payload"][i] = value
        return
    record = parse_raw_key(key)
    if record is None or record[2] < 0:
        return
    topic, partition, offset = record
    out["src_topic"][i], out["src_partition"][i] = topic, partition
    out["src_offset"][i] = out["src_last"][i] = offset
    if offset > MAX_OFFSET:
        return
    if control is not None:
        fields = _json_fields(value)
        if control != WITHHELD:
            out["hb_low"][i] = _json_long(fields, HEARTBEAT_LOW_OFFSET)
        out["hb_started"][i] = _json_long(fields, HEARTBEAT_STARTED_AT)
        if _json_long(fields, CHAIN_SHARE) == 1:  # absent fields count -1, as in the SQL
            chain = _json_long(fields, CHAIN_COUNT) * 256 + _json_long(fields, CHAIN_INDEX)
            out["hb_chain"][i] = chain if _INT64[0] <= chain <= _INT64[1] else -1
        if control == HEARTBEAT:
            out["kind"][i] = KIND_HEARTBEAT
        elif control == RESET:
            out["kind"][i] = KIND_RESET
        elif control == WITHHELD:
            last = _json_long(fields, WITHHELD_LAST)
            out["hb_low"][i] = last
            if offset <= last <= MAX_OFFSET:
                out["kind"][i] = KIND_WITHHELD
        return
    if not known or len(headers) < len(_PROVENANCE):
        return
    names = [k for k, _ in headers]
    if names[-len(_PROVENANCE) :] != _PROVENANCE:
        return
    stamp = headers[-3][1]
    text = stamp.decode("ascii", "replace") if stamp is not None else ""
    if not _TIMESTAMP.fullmatch(text) or not _INT64[0] <= int(text) <= _INT64[1]:
        return
    out["kind"][i] = KIND_DATA
    out["payload"][i] = value
    out["h_keys"][i] = names
    out["h_values"][i] = [v for _, v in headers]


def _json_fields(value: bytes | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        fields = json.loads(value)
    except (ValueError, RecursionError):
        return {}
    return fields if isinstance(fields, dict) else {}


def _json_long(fields: dict[str, Any], name: str) -> int:
    """The SQL's ``coalesce(try_cast(get_json_object(value, '$.name') as bigint), -1)`` for the
    values a receiver writes: an integer, or a string of decimal digits; else -1."""
    value = fields.get(name)
    if isinstance(value, bool):
        return -1
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        return value
    return -1
