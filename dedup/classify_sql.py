"""Step 2 of the dedup query: classify raw records in Spark SQL (JVM, vectorised, no Python).

Runs in the **executors**, before the shuffle (the buckets layout). The direct layout, which has
no shuffle, classifies in its task by the same rules in Python (``dedup/classify_python.py``;
``tests/integration/test_dedup_classify.py`` holds the two to the same verdicts).

Both raw layouts (docs/topics.md) parse here, without a regular expression: the key is split on
its last two ``:`` (``:`` cannot occur in a topic name) and the offset part on ``-`` and ``/``;
a key counts only in its canonical form (the parsed numbers, printed again, give the key back),
the rule of ``common.raw_run.parse_run_key`` and ``common.raw_topic.parse_raw_key``.

- **v2 run** (key ``<topic>:<partition>:<first>-<last>[/<stride>]``, no ``diode.control``): kind
  ``run``; its value (the run) is the payload. The run's value is checked against its key in the
  stateful step (``common.raw_run.check_run``), where Python reads Avro.
- **v1 record** (key ``<topic>:<partition>:<offset>``, the four provenance headers last, in order,
  with a ``diode.timestamp`` that is a signed 64-bit decimal): kind ``data``; value and header
  names and values are the payload (re-encoded as a run of one by the stateful step).
- **control** (``diode.control`` header, v1 key form): heartbeat, reset, withheld; the fields the
  detector needs come out of the JSON value here, the value itself stays behind.
- a **tick** (``diode.control: tick``) of the control topic, the dedup's own (``dedup/runner.py``):
  dropped here; it only makes a micro-batch run.
- anything else is **malformed**: counted, never forwarded.

Only what the stateful step needs goes on: the payload of data only, never of control records.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812  Spark's conventional alias

from common.gap_record import MAX_OFFSET
from common.raw_run import MAX_STRIDE
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
)
from dedup.detector_set import BUCKET_TOPIC
from dedup.rows import (
    KIND_DATA,
    KIND_HEARTBEAT,
    KIND_MALFORMED,
    KIND_RESET,
    KIND_RUN_IN,
    KIND_WITHHELD,
    UNPARSED_PARTITION,
    UNPARSED_TOPIC,
)


def classify(
    raw: DataFrame,
    topics: Sequence[str],
    bucket_keys: Sequence[int] | None = None,
    state_partitions: int = 0,
) -> DataFrame:
    """Parse keys, tell runs from v1 records from control from malformed; keep data payloads.

    ``topics`` is ``(*RAW_TOPICS, CONTROL_TOPIC)``: a record of any other topic is malformed.
    ``bucket_keys`` (bucketed state layout, ``dedup/detector_set.py``): the group key of each
    bucket, the buckets of state partition ``s`` at ``s * per .. s * per + per - 1`` of
    ``state_partitions`` (``dedup/job.py bucket_keys``); a row then also carries its group key
    ``(g_topic, g_partition)``: a bucket of the state partition its source (topic, partition)
    hashes to (Spark's own placement), chosen by a second, independent hash.
    """
    control = f"try_element_at(filter(headers, h -> h.key = '{CONTROL_HEADER}'), 1).value"
    if topics:  # the control topic's ticks are no input (a tick elsewhere is malformed)
        tick = f"coalesce(cast({control} as string) = '{TICK.decode()}', false)"
        raw = raw.filter(F.expr(f"NOT (topic = '{topics[-1]}' AND {tick})"))
    n = "coalesce(size(headers), 0)"
    prov_ok = " AND ".join(
        [f"{n} >= 4"]
        + [
            f"try_element_at(headers, {i - 4}).key = '{name}'"
            for i, name in enumerate(PROVENANCE_HEADERS)
        ]
    )
    stamp = "cast(try_element_at(headers, -3).value as string)"
    known = " OR ".join(f"topic = '{name}'" for name in topics) or "false"
    k = "cast(key as string)"
    split = raw.select(
        F.expr(k).alias("k"),
        F.expr(f"substring_index({k}, ':', -1)").alias("off_s"),
        F.expr(f"substring_index(substring_index({k}, ':', -2), ':', 1)").alias("part_s"),
        F.col("value"),
        F.col("headers"),
        F.expr(f"cast({control} as string)").alias("control"),
        F.expr(known).alias("known"),
    )
    parsed = split.select(
        "*",
        F.expr("substring(k, 1, length(k) - length(part_s) - length(off_s) - 2)").alias(
            "src_topic"
        ),
        F.expr("try_cast(part_s as int)").alias("part"),
        F.expr("instr(off_s, '-') > 0").alias("is_run"),
        F.expr("try_cast(substring_index(off_s, '-', 1) as bigint)").alias("first"),
        F.expr("substring_index(off_s, '-', -1)").alias("tail_s"),
    ).select(
        "*",
        F.expr("try_cast(substring_index(tail_s, '/', 1) as bigint)").alias("last"),
        F.expr(
            "if(instr(tail_s, '/') > 0, try_cast(substring_index(tail_s, '/', -1) as int), 1)"
        ).alias("stride"),
    )
    # canonical: the parsed numbers printed again give the key back (no signs, zeros, blanks)
    v1_ok = (
        "NOT is_run AND src_topic <> '' AND part IS NOT NULL AND first IS NOT NULL "
        "AND concat(src_topic, ':', part, ':', first) = k"
    )
    v2_ok = (
        "is_run AND src_topic <> '' AND part IS NOT NULL AND first IS NOT NULL "
        f"AND last IS NOT NULL AND stride BETWEEN 1 AND {MAX_STRIDE} AND first <= last "
        "AND (last - first) % stride = 0 AND concat(src_topic, ':', part, ':', first, '-', last, "
        "if(instr(tail_s, '/') > 0, concat('/', stride), '')) = k "
        "AND NOT (instr(tail_s, '/') > 0 AND stride = 1)"
    )
    flagged = parsed.select(
        "*",
        F.expr(f"part >= 0 AND first >= 0 AND ({v1_ok} OR {v2_ok})").alias("key_ok"),
        F.expr(f"{_json_long(HEARTBEAT_STARTED_AT)}").alias("hb_started_raw"),
    )
    kind = f"""cast(CASE
        WHEN NOT coalesce(key_ok, false) THEN {KIND_MALFORMED}
        WHEN first > {MAX_OFFSET} OR coalesce(last, first) > {MAX_OFFSET}
            THEN {KIND_MALFORMED}
        WHEN is_run AND control IS NULL AND known THEN {KIND_RUN_IN}
        WHEN is_run THEN {KIND_MALFORMED}
        WHEN control = '{HEARTBEAT.decode()}' THEN {KIND_HEARTBEAT}
        WHEN control = '{RESET.decode()}' THEN {KIND_RESET}
        WHEN control = '{WITHHELD.decode()}' AND {_json_long(WITHHELD_LAST)} >= first
            AND {_json_long(WITHHELD_LAST)} <= {MAX_OFFSET} THEN {KIND_WITHHELD}
        WHEN control IS NOT NULL THEN {KIND_MALFORMED}
        WHEN NOT known THEN {KIND_MALFORMED}
        WHEN coalesce({prov_ok}, false)
            AND regexp_extract({stamp}, '^({TIMESTAMP_PATTERN})', 1) = {stamp}
            AND try_cast({stamp} as bigint) IS NOT NULL THEN {KIND_DATA}
        ELSE {KIND_MALFORMED} END as tinyint)"""
    typed = flagged.select("*", F.expr(kind).alias("kind"))
    data = f"kind IN ({KIND_DATA}, {KIND_RUN_IN})"
    out = typed.select(
        F.expr(f"if(coalesce(key_ok, false), src_topic, '{UNPARSED_TOPIC}')").alias("src_topic"),
        # Never null (the outer coalesce): Spark checks a checkpoint's grouping key schema,
        # nullability included, and releases before the runs grouped by a non-null partition.
        F.expr(
            f"coalesce(if(coalesce(key_ok, false), part, {UNPARSED_PARTITION}), "
            f"{UNPARSED_PARTITION})"
        ).alias("src_partition"),
        F.expr("coalesce(if(key_ok, first, -1), -1)").alias("src_offset"),
        F.expr("coalesce(if(key_ok AND is_run, last, first), -1)").alias("src_last"),
        F.expr("coalesce(if(key_ok AND is_run, stride, 1), 1)").alias("stride"),
        F.col("kind"),
        F.expr(f"if({data}, value, null)").alias("payload"),
        F.expr(f"if(kind = {KIND_DATA}, transform(headers, h -> h.key), null)").alias("h_keys"),
        F.expr(f"if(kind = {KIND_DATA}, transform(headers, h -> h.value), null)").alias("h_values"),
        # Heartbeat fields (docs/topics.md): absent (older receivers) or invalid -> -1. Never
        # null: a nullable long column reaches pandas as float64, which rounds above 2^53.
        # A withheld range's last offset rides in hb_low too (one column less across Arrow).
        F.expr(
            f"CASE WHEN control IS NULL THEN -1 "
            f"WHEN control = '{WITHHELD.decode()}' THEN {_json_long(WITHHELD_LAST)} "
            f"ELSE {_json_long(HEARTBEAT_LOW_OFFSET)} END"
        ).alias("hb_low"),
        F.expr("if(control IS NULL, -1, hb_started_raw)").alias("hb_started"),
        # A share chain's heartbeat (docs/sender.md "Chains"): N * 256 + I, else -1.
        F.expr(
            f"CASE WHEN control IS NOT NULL AND {_json_long(CHAIN_SHARE)} = 1 "
            f"THEN coalesce({_json_long(CHAIN_COUNT)} * 256 + {_json_long(CHAIN_INDEX)}, -1) "
            "ELSE -1 END"
        ).alias("hb_chain"),
    )
    if not bucket_keys:
        return out
    keys = ", ".join(str(int(j)) for j in bucket_keys)
    per = len(bucket_keys) // state_partitions
    slot = (
        f"cast(pmod(hash(src_topic, src_partition), {state_partitions}) * {per} "
        f"+ pmod(xxhash64(src_topic, src_partition), {per}) as int) + 1"
    )
    return out.select(
        "*",
        F.lit(BUCKET_TOPIC).alias("g_topic"),
        F.expr(f"element_at(array({keys}), {slot})").alias("g_partition"),
    )


def _json_long(name: str) -> str:
    """SQL: the integer field ``name`` of the (JSON) value, or -1."""
    return f"coalesce(try_cast(get_json_object(cast(value as string), '$.{name}') as bigint), -1)"
