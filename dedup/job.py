"""The dedup query on Spark: raw topic(s) -> clean topic(s) + gap topic. The only pyspark import.

Theory of operation (docs/dedup.md has the long form):

1. **Read** the raw topic(s) and the control topic with Spark's Kafka source (``includeHeaders``;
   ``startingOffsets=earliest`` for a new checkpoint; at most ``MAX_OFFSETS_PER_TRIGGER`` records
   per micro-batch).
2. **Classify in SQL** (JVM, vectorised): split the key ``<topic>:<partition>:<offset>`` on its
   last two ``:``; a record with a ``diode.control`` header is a control record (``heartbeat`` or
   ``reset``); a data record must end with the four provenance headers of docs/topics.md in order,
   with a ``diode.timestamp`` the writer's ``common.raw_topic.restore`` accepts (the same rule, so
   every data record can be restored later). Anything else is *malformed*: counted, never forwarded.
3. **Project away the payload.** Only small integer columns go on: the source (topic, partition,
   offset), the kind, the heartbeat fields and the raw record's own position (index of its topic
   in ``(*RAW_TOPICS, CONTROL_TOPIC)``, partition, offset). Key, value and headers never reach the
   shuffle, Arrow or pandas: that round trip was most of the job's cost (docs/benchmarks.md
   "Third round").
4. **Detect per source (topic, partition)** with ``applyInPandasWithState``: the state is the pure
   detector's ``to_bytes()`` (``dedup/gaps.py``); each group's rows of one micro-batch are handled
   as a whole: resets first, then ``observe_many`` over the data offsets sorted by source offset
   (stable, so the first copy in raw order wins), then the heartbeats' highest offset, then the
   gap scan when ``GAP_EMIT_INTERVAL_SEC`` has passed since the last one. Timeouts run the scan
   for partitions that received nothing (Spark fires timeouts only for keys without data).
   ``now`` is Spark's batch timestamp, which is recorded in the offset log, so a replayed batch
   computes the same output from the same state. The first-seen records leave packed, one
   binary ``positions`` value per group (``dedup.positions.pack_positions``), not a row each.
5. **Write** each micro-batch with ``dedup.writer.TransactionalBatchWriter`` in one Kafka
   transaction fenced by the batch id (effectively-once, see that module). The writer re-reads
   the first-seen raw records by their raw position and restores them
   (``common.raw_topic.restore``).

Output rows carry ``kind`` = ``records`` (the group's first-seen records of the batch: source
offset and raw position of each, packed in one binary column; no payload), ``gap`` (key and JSON
value of a gap report) or ``stat`` (one per group and batch: counters for metrics).
"""

from __future__ import annotations

import array
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812  Spark's conventional alias
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from common import gap_record
from common.errors import LocalProtocolError
from common.raw_topic import (
    CHAIN_COUNT,
    CHAIN_INDEX,
    CHAIN_SHARE,
    CONTROL_HEADER,
    HEARTBEAT,
    HEARTBEAT_LOW_OFFSET,
    HEARTBEAT_STARTED_AT,
    KEY_PATTERN,
    PROVENANCE_HEADERS,
    RESET,
    TIMESTAMP_PATTERN,
    WITHHELD,
    WITHHELD_LAST,
)
from dedup import gaps, spark_compat
from dedup.config import DedupConfig
from dedup.positions import KIND_RECORDS, MAX_POSITIONS_PER_ROW, POSITION_FIELDS, pack_positions

if TYPE_CHECKING:
    from dedup.writer import TransactionalBatchWriter

log = logging.getLogger(__name__)
spark_compat.apply()

#: Input kinds computed in SQL (a tinyint column, cheap across Arrow).
KIND_DATA, KIND_HEARTBEAT, KIND_RESET, KIND_MALFORMED, KIND_WITHHELD = 0, 1, 2, 3, 4
#: Group key of raw records whose key does not parse (counted as malformed).
UNPARSED_TOPIC, UNPARSED_PARTITION = "", -1

OUTPUT_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("src_topic", StringType()),
        StructField("src_partition", IntegerType()),
        StructField("src_offset", LongType()),
        # kind "records": the first-seen records of the group, packed (see POSITION_FIELDS)
        StructField("positions", BinaryType()),
        StructField("gap_key", BinaryType()),
        StructField("gap_value", BinaryType()),
        StructField("delivered", LongType()),
        StructField("duplicates", LongType()),
        StructField("malformed", LongType()),
        StructField("heartbeats", LongType()),
        StructField("resets", LongType()),
        StructField("open_gaps", LongType()),
        StructField("state_bytes", LongType()),
        StructField("below_window", LongType()),
        StructField("budget_evictions", LongType()),
        StructField("expired_gaps", LongType()),
        StructField("withheld", LongType()),
        StructField("chains_missing", LongType()),
    ]
)
STATE_SCHEMA = StructType(
    [StructField("detector", BinaryType()), StructField("last_scan_ms", LongType())]
)
_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields]
_STAT_COLUMNS = (
    "delivered",
    "duplicates",
    "malformed",
    "heartbeats",
    "resets",
    "open_gaps",
    "below_window",
    "budget_evictions",
    "expired_gaps",
    "withheld",
    "chains_missing",
)


@dataclass(frozen=True, slots=True)
class DetectParams:
    """What the per-group function needs on the executors (pickled with it)."""

    window_size: int
    """Offsets per window."""
    max_windows: int
    """Windows per partition."""
    max_expired_gaps: int
    """Expired gaps remembered per partition."""
    max_state_bytes: int
    """Memory budget of one partition's state."""
    scan_interval_ms: int
    """Milliseconds between gap scans of one partition."""


# -- step 2: classification in SQL -----------------------------------------------------------


def classify(raw: DataFrame, topics: Sequence[str]) -> DataFrame:
    """Parse keys, tell data from control from malformed (docs/topics.md); drop the payload.

    ``topics`` is ``(*RAW_TOPICS, CONTROL_TOPIC)``: a row's ``raw_topic`` is its index there. The
    data rule is ``common.raw_topic.restore``'s, so the writer can restore every data record.
    """
    n = "coalesce(size(headers), 0)"
    prov_ok = " AND ".join(
        [f"{n} >= 4"]
        + [
            f"try_element_at(headers, {i - 4}).key = '{name}'"
            for i, name in enumerate(PROVENANCE_HEADERS)
        ]
    )
    stamp = "cast(try_element_at(headers, -3).value as string)"
    control = f"try_element_at(filter(headers, h -> h.key = '{CONTROL_HEADER}'), 1).value"
    pattern = f"'{KEY_PATTERN}'"
    topic_index = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(topics))
    parsed = raw.select(
        F.expr(f"regexp_extract(cast(key as string), {pattern}, 1)").alias("src_topic"),
        F.expr(f"try_cast(regexp_extract(cast(key as string), {pattern}, 2) as int)").alias(
            "src_partition"
        ),
        F.expr(f"try_cast(regexp_extract(cast(key as string), {pattern}, 3) as bigint)").alias(
            "src_offset"
        ),
        F.expr(f"cast({control} as string)").alias("control"),
        # Heartbeat fields (docs/topics.md): absent (older receivers) or invalid -> -1. Never
        # null: a nullable long column reaches pandas as float64, which rounds above 2^53.
        # A withheld range's last offset rides in hb_low too (one column less across Arrow).
        F.expr(
            f"CASE WHEN {control} IS NULL THEN -1 "
            f"WHEN cast({control} as string) = '{WITHHELD.decode()}' "
            f"THEN {_json_long(WITHHELD_LAST)} ELSE {_json_long(HEARTBEAT_LOW_OFFSET)} END"
        ).alias("hb_low"),
        F.expr(f"if({control} IS NULL, -1, {_json_long(HEARTBEAT_STARTED_AT)})").alias(
            "hb_started"
        ),
        # A share chain's heartbeat (docs/sender.md "Chains"): N * 256 + I, else -1.
        F.expr(
            f"CASE WHEN {control} IS NOT NULL AND {_json_long(CHAIN_SHARE)} = 1 "
            f"THEN coalesce({_json_long(CHAIN_COUNT)} * 256 + {_json_long(CHAIN_INDEX)}, -1) "
            "ELSE -1 END"
        ).alias("hb_chain"),
        F.expr(prov_ok).alias("prov_ok"),
        # restore()'s rule: ASCII decimal that fits a signed 64-bit integer
        F.expr(
            f"if(regexp_extract({stamp}, '^({TIMESTAMP_PATTERN})', 1) = {stamp}, "
            f"try_cast({stamp} as bigint), null)"
        ).alias("prov_ts"),
        F.expr(f"cast(CASE topic {topic_index} ELSE -1 END as int)").alias("raw_topic"),
        F.col("partition").alias("raw_partition"),
        F.col("offset").alias("raw_offset"),
    )
    return parsed.select(
        F.expr(f"if(src_topic = '', '{UNPARSED_TOPIC}', src_topic)").alias("src_topic"),
        F.expr(f"coalesce(src_partition, {UNPARSED_PARTITION})").alias("src_partition"),
        F.expr("coalesce(src_offset, -1)").alias("src_offset"),
        F.expr(
            f"""cast(CASE
                WHEN src_topic = '' OR src_partition IS NULL OR src_offset IS NULL
                    THEN {KIND_MALFORMED}
                WHEN src_offset < 0 OR src_offset > {gaps.MAX_OFFSET} THEN {KIND_MALFORMED}
                WHEN control = '{HEARTBEAT.decode()}' THEN {KIND_HEARTBEAT}
                WHEN control = '{RESET.decode()}' THEN {KIND_RESET}
                WHEN control = '{WITHHELD.decode()}' AND hb_low >= src_offset
                    AND hb_low <= {gaps.MAX_OFFSET} THEN {KIND_WITHHELD}
                WHEN control IS NOT NULL THEN {KIND_MALFORMED}
                WHEN raw_topic < 0 THEN {KIND_MALFORMED}
                WHEN coalesce(prov_ok, false) AND prov_ts IS NOT NULL THEN {KIND_DATA}
                ELSE {KIND_MALFORMED} END as tinyint)"""
        ).alias("kind"),
        F.col("raw_topic"),
        F.col("raw_partition"),
        F.col("raw_offset"),
        F.col("hb_low"),
        F.col("hb_started"),
        F.col("hb_chain"),
    )


def _json_long(name: str) -> str:
    """SQL: the integer field ``name`` of the (JSON) value, or -1."""
    return f"coalesce(try_cast(get_json_object(cast(value as string), '$.{name}') as bigint), -1)"


# -- step 3: the stateful per-partition function ---------------------------------------------


def _rows(kind: str, topic: str, partition: int, count: int) -> dict[str, Any]:
    return {
        "kind": [kind] * count,
        "src_topic": [topic] * count,
        "src_partition": np.full(count, partition, dtype=np.int32),
    }


def _frame(columns: dict[str, Any], count: int) -> pd.DataFrame:
    """A frame with every output column; the absent ones are None (NaN would not convert)."""
    nothing = np.full(count, None, dtype=object)
    return pd.DataFrame({name: columns.get(name, nothing) for name in _COLUMNS})


def detect_group(
    params: DetectParams,
    key: tuple[Any, ...],
    frames: Iterator[pd.DataFrame],
    state: GroupState,
) -> Iterator[pd.DataFrame]:
    """Run the detector over one source partition's rows of one micro-batch (or its timeout)."""
    topic, partition = str(key[0]), int(key[1])
    now = int(state.getCurrentProcessingTimeMs())
    parts = [f for f in frames if len(f)]
    batch = pd.concat(parts, ignore_index=True) if parts else None
    stats = dict.fromkeys(_STAT_COLUMNS, 0)
    if topic == UNPARSED_TOPIC and partition == UNPARSED_PARTITION:
        stats["malformed"] = 0 if batch is None else len(batch)
        yield _stat_frame(topic, partition, stats, 0)
        return

    config = gaps.DetectorConfig(
        window_size=params.window_size,
        max_windows=params.max_windows,
        max_expired_gaps=params.max_expired_gaps,
        max_state_bytes=params.max_state_bytes,
    )
    kinds = batch["kind"].to_numpy() if batch is not None else np.empty(0, dtype=np.int8)
    stats["resets"] = int(np.count_nonzero(kinds == KIND_RESET))
    if stats["resets"]:
        # docs/dedup.md "Reset": the reset applies before this batch's records, and before the
        # saved state is read: it discards that state, which may be unreadable (WINDOW_SIZE).
        log.warning("reset of %s:%d requested: state cleared", topic, partition)
        detector = gaps.PartitionDetector(topic, partition, config, reset_at_ms=now)
        last_scan = now
    elif state.exists:
        blob, last_scan = state.get
        detector = load_detector(bytes(blob), config, topic, partition)
    else:
        detector, last_scan = gaps.PartitionDetector(topic, partition, config), now
    below_before, budget_before = detector.below_window, detector.budget_evictions

    out: list[pd.DataFrame] = []
    if batch is not None:
        stats["malformed"] = int(np.count_nonzero(kinds == KIND_MALFORMED))
        offsets = batch["src_offset"].to_numpy()
        rows = np.flatnonzero(kinds == KIND_DATA)
        if len(rows):
            # Row indices only; the raw position columns are taken once, at the end.
            rows = rows[np.argsort(offsets[rows], kind="stable")]
            ordered = array.array("Q")
            ordered.frombytes(offsets[rows].astype(np.uint64).tobytes())  # >= 0: classify
            delivered = np.fromiter(
                detector.observe_many(ordered, now), dtype=bool, count=len(rows)
            )
            stats["delivered"] = int(np.count_nonzero(delivered))
            stats["duplicates"] = len(rows) - stats["delivered"]
            take = rows[delivered]
            if len(take):
                columns = [batch[name].to_numpy()[take] for name in POSITION_FIELDS]
                blobs = [
                    pack_positions([c[i : i + MAX_POSITIONS_PER_ROW] for c in columns])
                    for i in range(0, len(take), MAX_POSITIONS_PER_ROW)
                ]
                records = _rows(KIND_RECORDS, topic, partition, len(blobs))
                records["positions"] = blobs
                out.append(_frame(records, len(blobs)))
        held = np.flatnonzero(kinds == KIND_WITHHELD)
        if len(held):
            # After the records: an offset that came both as a record and withheld (the rules
            # changed between a send and a resend) is delivered.
            lasts = batch["hb_low"].to_numpy()
            stats["withheld"] = sum(
                detector.withhold(int(offsets[i]), int(lasts[i]), now) for i in held.tolist()
            )
        beats = batch[kinds == KIND_HEARTBEAT]
        stats["heartbeats"] = len(beats)
        if len(beats):
            apply_heartbeats(detector, beats, now)

    reports: list[gaps.GapReport] = []
    if now - last_scan >= params.scan_interval_ms:
        reports.extend(detector.scan(now))
        last_scan = now
    reports.extend(detector.drain_reports())
    for warning in detector.drain_warnings():
        log.warning("%s:%d: %s", topic, partition, warning)
    if reports:
        frame = _rows("gap", topic, partition, len(reports))
        frame["gap_key"] = [gap_record.gap_key(r) for r in reports]
        frame["gap_value"] = [gap_record.gap_value(r) for r in reports]
        out.append(_frame(frame, len(reports)))

    blob = detector.to_bytes()
    state.update((blob, last_scan))
    state.setTimeoutDuration(params.scan_interval_ms)
    stats["open_gaps"] = len(detector.reported_open())
    stats["chains_missing"] = detector.chains_missing
    stats["below_window"] = detector.below_window - below_before
    stats["budget_evictions"] = detector.budget_evictions - budget_before
    stats["expired_gaps"] = sum(1 for r in reports if r.state is gaps.GapState.EXPIRED)
    out.append(_stat_frame(topic, partition, stats, len(blob)))
    yield from out


def load_detector(
    blob: bytes, config: gaps.DetectorConfig, topic: str, partition: int
) -> gaps.PartitionDetector:
    """The saved detector of ``topic:partition``; a WINDOW_SIZE change says how to recover.

    Raises:
        GapStateError: the state is unreadable, or was saved with another WINDOW_SIZE (the
            message names the exact recovery steps, docs/dedup.md "Changing WINDOW_SIZE").
    """
    try:
        return gaps.PartitionDetector.from_bytes(blob, config)
    except gaps.WindowSizeMismatchError as exc:
        old, new = exc.saved, exc.configured
        raise gaps.GapStateError(
            f"the dedup state of {topic}:{partition} was saved with WINDOW_SIZE={old}, but "
            f"WINDOW_SIZE={new} is set. To keep the state: set WINDOW_SIZE={old} again and "
            f"restart. To switch to {new} (each partition forgets which records it delivered "
            f"and which gaps are open): start with WINDOW_SIZE={old}, stop the job once it has "
            "caught up, run 'kafka-diode dedup reset --topic T --partition P --yes' for every "
            f"source partition (here: --topic {topic} --partition {partition}), then start with "
            f"WINDOW_SIZE={new}; a reset is applied before the saved state is read "
            '(docs/dedup.md "Changing WINDOW_SIZE")'
        ) from exc


def apply_heartbeats(detector: gaps.PartitionDetector, beats: pd.DataFrame, now: int) -> None:
    """Apply one batch's heartbeat rows: the highest offset (per share chain, or of all the
    unchained ones), and each valid low offset."""
    highs = beats["src_offset"].to_numpy()
    chains = beats["hb_chain"].to_numpy() if "hb_chain" in beats else np.full(len(beats), -1)
    plain = chains < 0
    if plain.any():
        detector.heartbeat(int(highs[plain].max()), now)
    for chain, high in zip(chains[~plain].tolist(), highs[~plain].tolist(), strict=True):
        try:
            detector.chain_heartbeat(chain & 255, chain >> 8, int(high), now)
        except LocalProtocolError as exc:  # the raw topic is input we do not control
            log.warning("%s:%d: heartbeat ignored: %s", detector.topic, detector.partition, exc)
    if "hb_low" not in beats:
        return
    lows = beats["hb_low"].tolist()
    started = beats["hb_started"].tolist()
    seen: set[tuple[int, int | None]] = set()
    for high, low, start, chain in zip(highs.tolist(), lows, started, chains.tolist(), strict=True):
        # -1: no low_offset (older receivers). A low the heartbeat cannot mean (above its own
        # high) is ignored, not fatal: the raw topic is input we do not control.
        if not 0 <= low <= high:
            continue
        key = (int(low), None if start < 0 else int(start))
        if key not in seen:
            seen.add(key)
            if chain < 0:
                detector.heartbeat(int(high), now, key[0], session_started_ms=key[1])
            else:  # a share chain's high vouches for its share only: apply the low alone
                detector.session_low(key[0], now, session_started_ms=key[1])


def _stat_frame(
    topic: str, partition: int, stats: dict[str, int], state_bytes: int
) -> pd.DataFrame:
    row: dict[str, Any] = _rows("stat", topic, partition, 1)
    for name, value in stats.items():
        row[name] = [value]
    row["state_bytes"] = [state_bytes]
    return _frame(row, 1)


# -- session and query -----------------------------------------------------------------------


def build_session(config: DedupConfig, jars: list[str]) -> SparkSession:
    """The SparkSession with the settings FACTS.md measured; pass-through ``SPARK_CONF_*`` last.

    Under spark-submit the master and already-set options come from spark-submit.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("kafka-diode-dedup")
    if "SPARK_SUBMIT_OPTS" not in os.environ and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        builder = builder.master(config.spark_master)
    conf: dict[str, str] = {
        "spark.sql.shuffle.partitions": str(config.effective_shuffle_partitions()),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.arrow_max_records_per_batch),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.sql.streaming.stopTimeout": "120s",
    }
    if jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(config.spark_conf)
    for name, value in conf.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    return spark


def raw_stream(spark: SparkSession, config: DedupConfig) -> DataFrame:
    """Spark's Kafka source over the raw topic(s) and the control topic."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.bootstrap_servers)
        .option("subscribe", ",".join((*config.raw_topics, config.control_topic)))
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", str(config.fail_on_data_loss).lower())
        .option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    )
    for name, value in config.kafka_source.items():
        reader = reader.option(name, value)
    return reader.load()


def detected(classified: DataFrame, config: DedupConfig) -> DataFrame:
    """The stateful step: per source (topic, partition), the detector over each micro-batch."""
    params = DetectParams(
        window_size=config.window_size,
        max_windows=config.max_windows,
        max_expired_gaps=config.max_expired_gaps,
        max_state_bytes=config.max_state_bytes,
        scan_interval_ms=max(1, round(config.gap_emit_interval_sec * 1000)),
    )

    def func(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        return detect_group(params, key, frames, state)

    return classified.groupBy("src_topic", "src_partition").applyInPandasWithState(
        func,
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def start_query(
    spark: SparkSession,
    config: DedupConfig,
    writer: TransactionalBatchWriter,
    transform: Callable[[DataFrame], DataFrame] | None = None,
) -> StreamingQuery:
    """Start the whole query; ``writer`` is bound to the query id before its first batch runs."""
    # The control topic must exist before Spark subscribes to it; the gap and progress topics
    # are compacted (latest gap state per key; markers are small either way).
    writer.ensure_topics([config.control_topic], partitions=1)
    writer.ensure_topics([config.gap_topic, config.progress_topic], compact=True)
    raw = raw_stream(spark, config)
    topics = (*config.raw_topics, config.control_topic)
    output = transform(raw) if transform is not None else detected(classify(raw, topics), config)
    query = (
        output.writeStream.queryName("kafka-diode-dedup")
        .foreachBatch(writer)
        .option("checkpointLocation", config.state_dir_config)
        .trigger(processingTime=f"{config.persist_interval_ms} milliseconds")
        .start()
    )
    writer.bind(str(query.id))
    return query


def task_attempt() -> tuple[int, int]:
    """(partition, attempt number) of the Spark task this code runs in (on an executor).

    The partition is the stateful step's: ``foreachBatch`` maps the batch without a shuffle.
    """
    from pyspark import TaskContext  # noqa: PLC0415  only inside a task

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not inside a Spark task")
    return context.partitionId(), context.attemptNumber()
