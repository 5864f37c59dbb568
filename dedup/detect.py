"""The dedup's stateful step: the gap detectors over one group's rows of a micro-batch.

Runs in the **executors**, inside ``applyInPandasWithState`` (``dedup/job.py`` wires it): Spark
calls :func:`detect_group` once per group with data in a micro-batch, and once per
processing-time timeout for a group without data. A group is a **bucket** (the source
partitions of one state partition, their detectors in one ``dedup/detector_set.py`` state value;
the call splits its rows by source partition; ``dedup/layouts/buckets.py``). The direct layout's
task drives the same detectors through :class:`LiveBucket`. Nothing here imports pyspark at run
time (``GroupState`` is only a type), so the unit tests call it with pandas frames and a stand-in.

Theory of operation, per source partition (:func:`detect_partition`):

1. **Resets first**, before the saved state is read (a reset discards it, readable or not).
2. **Data** (``dedup/classify_sql.py`` kinds): v2 runs are checked against their key
   (``common.raw_run.check_run``: a run that disagrees with its key is malformed, counted and
   never forwarded, so its offsets stay gaps); v1 records (raw layout v1, written by receivers
   before the upgrade) are runs of one. Sorted by first offset (stable: the first copy in input
   order wins; sorting also keeps ordinary reordering inside a batch from looking like a gap),
   each is observed at once: ``observe_run`` for consecutive offsets, ``observe_many`` for a
   share chain's stride. A run with any first-seen record leaves as one ``run`` row carrying its
   payload and the selection of its first-seen records (``dedup/rows.py``); a v1 record leaves
   re-encoded as a run of one, so the write tasks only ever handle runs.
3. **Withheld ranges**, after the records (an offset that came both as a record and withheld is
   delivered), then **heartbeats** (highest offset, per share chain, and each low offset).
4. **Scan** when ``GAP_EMIT_INTERVAL_SEC`` has passed since the last one; ``now`` is Spark's batch
   timestamp (in the offset log), so a replayed batch computes the same output from the same state.
   A bucket scans each of its partitions on that partition's own schedule (those without rows
   too), and its timeout is the soonest scan due.
"""

from __future__ import annotations

import array
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from common import gap_record
from common.errors import LocalProtocolError, RemoteProtocolError
from common.raw_run import RunBuilder, check_run
from common.raw_topic import PROVENANCE_HEADERS
from dedup import detector_set
from dedup.detector import (
    DetectorConfig,
    GapReport,
    GapState,
    GapStateError,
    PartitionDetector,
    WindowSizeMismatchError,
)
from dedup.rows import (
    COLUMN_NAMES,
    KIND_DATA,
    KIND_GAP,
    KIND_HEARTBEAT,
    KIND_MALFORMED,
    KIND_RESET,
    KIND_RUN,
    KIND_RUN_IN,
    KIND_STAT,
    KIND_WITHHELD,
    OUTPUT_SCHEMA,
    STAT_COLUMNS,
    UNPARSED_PARTITION,
    UNPARSED_TOPIC,
    InputRows,
    pack_selection,
)
from dedup.worker_heap import FreezeOnLoad

if TYPE_CHECKING:
    from pyspark.sql.streaming.state import GroupState

log = logging.getLogger(__name__)


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
    heap: FreezeOnLoad = field(default_factory=FreezeOnLoad)
    """Unpickled in a Python worker, freezes its loaded code out of the collector's walks
    (``dedup/worker_heap.py``)."""


_COLUMN = {name: i for i, name in enumerate(COLUMN_NAMES)}


class Output:
    """The output rows of one call, built as one frame at the end.

    One frame per call, from one object array: building a frame costs per column, and a call
    that built one frame per row kind paid that two or three times (measured: ~1.5 ms of a
    call's ~2.2 ms went to frames at 256 source partitions per batch). pyspark casts each column
    to ``OUTPUT_DDL``'s type when it converts the frames to Arrow.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, dict[str, Any]]] = []

    def add(self, kind: str, topic: str, partition: int, **values: Any) -> None:
        self.rows.append((kind, topic, partition, values))

    def frame(self) -> pd.DataFrame:
        table = np.full((len(self.rows), len(COLUMN_NAMES)), None, dtype=object)
        topic_col, partition_col = _COLUMN["src_topic"], _COLUMN["src_partition"]
        for i, (kind, topic, partition, values) in enumerate(self.rows):
            row = table[i]
            row[0], row[topic_col], row[partition_col] = kind, topic, partition
            for name, value in values.items():
                row[_COLUMN[name]] = value
        return pd.DataFrame(table, columns=list(COLUMN_NAMES), copy=False)

    def record_batch(self) -> pa.RecordBatch:
        """The rows as one Arrow batch in ``OUTPUT_SCHEMA`` (the direct layout's task)."""
        columns: dict[str, list[Any]] = {name: [None] * len(self.rows) for name in COLUMN_NAMES}
        kinds, topics, partitions = columns["kind"], columns["src_topic"], columns["src_partition"]
        for i, (kind, topic, partition, values) in enumerate(self.rows):
            kinds[i], topics[i], partitions[i] = kind, topic, partition
            for name, value in values.items():
                columns[name][i] = value
        return pa.RecordBatch.from_pydict(columns, schema=OUTPUT_SCHEMA)


def detect_group(
    params: DetectParams,
    key: tuple[Any, ...],
    frames: Iterator[pd.DataFrame],
    state: GroupState,
) -> Iterator[pd.DataFrame]:
    """Run the detector over one group's rows of one micro-batch (or its timeout).

    A group is a bucket (key ``("", j)``, ``j >= 0``, ``dedup/detector_set.py``); the one
    group per source partition of checkpoints created before the buckets is retired
    (``dedup/layouts/``).
    """
    del key  # every group is a bucket, its detectors in its state
    now = int(state.getCurrentProcessingTimeMs())
    parts = [f for f in frames if len(f)]
    batch = (
        (parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)) if parts else None
    )
    rows = None if batch is None else InputRows.from_frame(batch)
    out = Output()
    _detect_bucket(params, rows, state, now, out)
    yield out.frame()


def _count_unparsed(count: int, out: Output) -> None:
    stats = dict.fromkeys(STAT_COLUMNS, 0)
    stats["malformed"] = count
    out.add(KIND_STAT, UNPARSED_TOPIC, UNPARSED_PARTITION, state_bytes=0, **stats)


def _detect_bucket(
    params: DetectParams, rows: InputRows | None, state: GroupState, now: int, out: Output
) -> None:
    """One bucket's call: each source partition with rows, then each whose scan is due."""
    if state.exists:
        bucket = detector_set.DetectorSet.from_bytes(bytes(state.get[0]))
    else:
        bucket = detector_set.DetectorSet()
    detect_bucket_rows(params, rows, bucket, now, out)
    state.update((bucket.to_bytes(), -1))
    state.setTimeoutDuration(bucket.next_due_in(now, params.scan_interval_ms))


def detect_bucket_rows(  # noqa: PLR0917  one call per bucket and batch
    params: DetectParams,
    rows: InputRows | None,
    bucket: detector_set.DetectorSet,
    now: int,
    out: Output,
    total_bytes: int = detector_set.BUCKET_STATE_BYTES,
) -> None:
    """The detectors of ``bucket`` over ``rows`` (any source partitions), in place: each source
    partition with rows, then each whose scan is due (the stateful step's bucket call)."""
    live = LiveBucket(params, bucket, now, total_bytes)
    live.observe(rows, out)
    live.finish(out)


class LiveBucket:
    """The detectors of one bucket, each parsed at its first use and saved once at the end.

    The direct layout's task (``dedup/direct_task.py``: every source partition of one raw partition)
    calls :meth:`observe` once per Arrow batch of its input: parsing and saving each detector
    per Arrow batch made the task's cost grow with the source partitions per raw partition
    (docs/benchmarks.md "Dedup"). Each call does what one call of
    :func:`detect_partition` per source partition does (resets first, data, withheld,
    heartbeats, a due scan, the budget of the bucket's share at that call); the counters of a
    partition's calls are summed into one ``stat`` row by :meth:`finish`, which writes the
    touched detectors back into the bucket. Bounded: the detectors together stay within the
    bucket's ``total_bytes`` (each keeps its share's budget, as when saved per call).
    """

    def __init__(
        self,
        params: DetectParams,
        bucket: detector_set.DetectorSet,
        now: int,
        total_bytes: int = detector_set.BUCKET_STATE_BYTES,
    ) -> None:
        self.params = params
        self.bucket = bucket
        self.now = now
        #: raw records whose key did not parse (or that the caller made malformed), counted in
        #: one ``stat`` row by :meth:`finish`, beside the partitions' rows
        self.unparsed = 0
        self.total_bytes = total_bytes
        self._live: dict[detector_set.Key, _LivePartition] = {}

    def _known(self, key: detector_set.Key) -> bool:
        return key in self._live or self.bucket.get(key) is not None

    def observe(self, rows: InputRows | None, out: Output) -> None:
        """One call's rows (any source partitions, or None: the due scans only)."""
        params, now = self.params, self.now
        seen: set[detector_set.Key] = set()
        groups = {} if rows is None else rows.by_partition()
        joining = sum(1 for key in groups if not self._known(key) and key[1] >= 0)
        held = len(self.bucket) + sum(1 for key in self._live if self.bucket.get(key) is None)
        share = self.total_bytes // max(1, held + joining)
        budget = min(params.max_state_bytes, max(detector_set.MIN_STATE_BYTES, share))
        for key in sorted(groups):
            index = groups[key]
            if key == (UNPARSED_TOPIC, UNPARSED_PARTITION):
                self.unparsed += len(index)
                continue
            seen.add(key)
            assert rows is not None  # groups is empty without rows
            self._partition(key, rows.take(index), budget).call(params, now, out, budget)
        due = [
            key
            for key, part in self._live.items()
            if key not in seen and now - part.last_scan >= params.scan_interval_ms
        ]
        due += [
            key
            for key in self.bucket.due(now, params.scan_interval_ms)
            if key not in seen and key not in self._live
        ]
        for key in sorted(due):
            self._partition(key, None, budget).call(params, now, out, budget)

    def _partition(
        self, key: detector_set.Key, rows: InputRows | None, budget: int
    ) -> _LivePartition:
        part = self._live.get(key)
        if part is None:
            part = _LivePartition.start(self.params, key, rows, self.bucket.get(key), self.now,
                                        budget)  # fmt: skip
            self._live[key] = part
        else:
            part.next_rows(self.params, rows, self.now, budget)
        return part

    def snapshot(self) -> detector_set.DetectorSet:
        """Save the touched detectors into the bucket and go on (a part of a batch commits it;
        the ``stat`` rows still come once, from :meth:`finish`); the bucket."""
        for key, part in self._live.items():
            self.bucket.put(key, part.detector.to_bytes(), part.last_scan)
        return self.bucket

    def finish(self, out: Output) -> detector_set.DetectorSet:
        """Save the touched detectors into the bucket and add their ``stat`` rows; the bucket."""
        for key in sorted(self._live):
            part = self._live[key]
            blob = part.detector.to_bytes()
            self.bucket.put(key, blob, part.last_scan)
            part.add_stat(out, len(blob))
        self._live.clear()
        if self.unparsed:
            # the direct task adds only finish's rows to its stats: a row per observe call,
            # in the output it produces from, was dropped there (and never counted)
            _count_unparsed(self.unparsed, out)
            self.unparsed = 0
        return self.bucket


def detect_partition(  # noqa: PLR0917  one call per source partition and batch
    params: DetectParams,
    topic: str,
    partition: int,
    rows: InputRows | None,
    saved: tuple[bytes, int] | None,
    now: int,
    out: Output,
    max_state_bytes: int | None = None,
) -> tuple[bytes, int]:
    """One source partition's rows of one batch (or its scan): adds its output rows to ``out``,
    returns its detector's bytes and last scan time to save.

    ``max_state_bytes``: the partition's share of its bucket's budget, when below
    ``MAX_STATE_BYTES`` (``detector_set.DetectorSet.budget``).
    """
    budget = params.max_state_bytes if max_state_bytes is None else max_state_bytes
    part = _LivePartition.start(params, (topic, partition), rows, saved, now, budget)
    part.call(params, now, out, budget)
    blob = part.detector.to_bytes()
    part.add_stat(out, len(blob))
    return blob, part.last_scan


def _detector_config(params: DetectParams, budget: int) -> DetectorConfig:
    return DetectorConfig(
        window_size=params.window_size,
        max_windows=params.max_windows,
        max_expired_gaps=params.max_expired_gaps,
        max_state_bytes=budget,
    )


def _reset(
    key: detector_set.Key,
    rows: InputRows | None,
    config: DetectorConfig,
    now: int,
    stats: dict[str, int],
) -> PartitionDetector | None:
    """A new detector if ``rows`` hold a reset of the partition (counted in ``stats``)."""
    resets = 0 if rows is None else int(np.count_nonzero(rows["kind"] == KIND_RESET))
    if not resets:
        return None
    stats["resets"] += resets
    log.warning("reset of %s:%d requested: state cleared", *key)
    return PartitionDetector(key[0], key[1], config, reset_at_ms=now)


@dataclass(slots=True)
class _LivePartition:
    """One source partition's parsed detector, the rows of its next call and its counters."""

    detector: PartitionDetector
    last_scan: int
    rows: InputRows | None
    stats: dict[str, int]

    @classmethod
    def start(  # noqa: PLR0917  one call per source partition and task
        cls,
        params: DetectParams,
        key: detector_set.Key,
        rows: InputRows | None,
        saved: tuple[bytes, int] | None,
        now: int,
        budget: int,
    ) -> _LivePartition:
        """The partition's first call: its saved detector (or a new one), unless a reset in
        ``rows`` discards it before it is read (docs/dedup.md "Reset": the saved state may be
        unreadable, WINDOW_SIZE)."""
        config = _detector_config(params, budget)
        stats = dict.fromkeys(STAT_COLUMNS, 0)
        reset = _reset(key, rows, config, now, stats)
        if reset is not None:
            return cls(reset, now, rows, stats)
        if saved is not None:
            blob, last_scan = saved
            return cls(load_detector(bytes(blob), config, *key), last_scan, rows, stats)
        return cls(PartitionDetector(key[0], key[1], config), now, rows, stats)

    def next_rows(
        self, params: DetectParams, rows: InputRows | None, now: int, budget: int
    ) -> None:
        """A later call of the same task: a reset in ``rows`` applies before them."""
        self.rows = rows
        detector = self.detector
        config = _detector_config(params, budget)
        key = (detector.topic, detector.partition)
        reset = _reset(key, rows, config, now, self.stats)
        if reset is not None:
            self.detector, self.last_scan = reset, now
        else:
            detector.config = config  # the bucket's share at this call, as if saved and loaded

    def call(self, params: DetectParams, now: int, out: Output, budget: int) -> None:
        """Observe the taken rows, scan if due, add the gap rows to ``out``."""
        detector, rows, stats = self.detector, self.rows, self.stats
        self.rows = None
        below_before, budget_before = detector.below_window, detector.budget_evictions
        if rows is not None:
            kinds = rows["kind"]
            stats["malformed"] += int(np.count_nonzero(kinds == KIND_MALFORMED))
            offsets = rows["src_offset"]
            data = np.flatnonzero((kinds == KIND_DATA) | (kinds == KIND_RUN_IN))
            if len(data):
                _observe_data(detector, rows, data, out, now, stats)
            held = np.flatnonzero(kinds == KIND_WITHHELD)
            if len(held):
                # After the records: an offset that came both as a record and withheld (the
                # rules changed between a send and a resend) is delivered.
                lasts = rows["hb_low"]
                stats["withheld"] += sum(
                    detector.withhold(int(offsets[i]), int(lasts[i]), now) for i in held.tolist()
                )
            beats = np.flatnonzero(kinds == KIND_HEARTBEAT)
            stats["heartbeats"] += len(beats)
            if len(beats):
                apply_heartbeats(detector, rows.take(beats), now)

        reports: list[GapReport] = []
        if now - self.last_scan >= params.scan_interval_ms:
            reports.extend(detector.scan(now))
            self.last_scan = now
        reports.extend(detector.drain_reports())
        for warning in detector.drain_warnings():
            why = ""
            if budget < params.max_state_bytes:
                why = (
                    " (here: this partition's share of its bucket's "
                    f"{detector_set.BUCKET_STATE_BYTES} "
                    "bytes, MAX_STATE_BYTES being higher; more buckets need a new checkpoint with "
                    'a higher SHUFFLE_PARTITIONS, docs/dedup.md "State layout")'
                )
            log.warning("%s:%d: %s%s", detector.topic, detector.partition, warning, why)
        for report in reports:
            out.add(
                KIND_GAP,
                detector.topic,
                detector.partition,
                gap_key=gap_record.gap_key(report),
                gap_value=gap_record.gap_value(report),
            )
        stats["below_window"] += detector.below_window - below_before
        stats["budget_evictions"] += detector.budget_evictions - budget_before
        stats["expired_gaps"] += sum(1 for r in reports if r.state is GapState.EXPIRED)

    def add_stat(self, out: Output, state_bytes: int) -> None:
        """The partition's ``stat`` row: its calls' counters, its detector's gauges now."""
        detector, stats = self.detector, self.stats
        stats["open_gaps"] = len(detector.reported_open())
        stats["chains_missing"] = detector.chains_missing
        stats["pending_gaps"] = detector.pending_gaps
        out.add(KIND_STAT, detector.topic, detector.partition, state_bytes=state_bytes, **stats)


def _observe_data(  # noqa: PLR0917  one call per source partition and batch
    detector: PartitionDetector,
    batch: InputRows,
    rows: np.ndarray[Any, Any],
    out: Output,
    now: int,
    stats: dict[str, int],
) -> None:
    """Observe the data rows ``rows`` of ``batch``; adds a ``run`` row for what is first seen."""
    topic, partition = detector.topic, detector.partition
    kinds = batch["kind"]
    firsts = batch["src_offset"]
    lasts = batch["src_last"]
    strides = batch["stride"]
    payloads = batch["payload"]
    rows = rows[np.argsort(firsts[rows], kind="stable")]
    total = delivered = 0
    for i in rows.tolist():
        first, last, stride = int(firsts[i]), int(lasts[i]), int(strides[i])
        if kinds[i] == KIND_RUN_IN:
            payload = payloads[i]
            try:
                check_run(payload, topic, partition, first, last, stride)
            except RemoteProtocolError as exc:
                stats["malformed"] += 1
                log.warning("%s:%d: run %d-%d is malformed: %s", topic, partition, first, last, exc)
                continue
        else:  # a v1 record, classified valid in SQL: a run of one
            payload = None
        count = (last - first) // stride + 1
        total += count
        if stride == 1:
            ranges = detector.observe_run(first, last, now)
        else:
            wanted = array.array("Q", range(first, last + 1, stride))
            ranges = _index_ranges(detector.observe_many(wanted, now))
            ranges = [(first + a * stride, first + b * stride) for a, b in ranges]
        if not ranges:
            continue
        taken = sum((b - a) // stride + 1 for a, b in ranges)
        delivered += taken
        if payload is None:
            payload = _v1_as_run(batch, i, topic, partition, first)
        if taken == count:
            selection = b""
        else:
            selection = pack_selection(
                [((a - first) // stride, (b - first) // stride) for a, b in ranges]
            )
        out.add(
            KIND_RUN,
            topic,
            partition,
            src_offset=first,
            payload=bytes(payload),
            selection=selection,
            records=taken,
        )
    stats["delivered"] += delivered
    stats["duplicates"] += total - delivered


def _index_ranges(verdicts: list[bool]) -> list[tuple[int, int]]:
    """Maximal ``(first, last)`` index ranges of True verdicts."""
    out: list[tuple[int, int]] = []
    for i, take in enumerate(verdicts):
        if take:
            if out and out[-1][1] == i - 1:
                out[-1] = (out[-1][0], i)
            else:
                out.append((i, i))
    return out


def _v1_as_run(batch: InputRows, i: int, topic: str, partition: int, offset: int) -> bytes:
    """A first-seen v1 raw record (docs/topics.md "Layout v1") re-encoded as a run of one.

    ``classify`` checked what this relies on: the four provenance headers last, in order, and a
    ``diode.timestamp`` that is a signed 64-bit decimal.
    """
    names = list(batch["h_keys"][i])
    values = list(batch["h_values"][i])
    n = len(PROVENANCE_HEADERS)
    key, stamp, kind = values[-n], values[-n + 1], values[-n + 2]
    ts_type = {b"0": 0, b"1": 1, b"2": 2}.get(bytes(kind) if kind is not None else b"", 1)
    timestamp = int(bytes(stamp))
    source = tuple(
        (str(name), None if value is None else bytes(value))
        for name, value in zip(names[:-n], values[:-n], strict=True)
    )
    value = batch["payload"][i]
    run = RunBuilder(topic, partition, ts_type, offset, timestamp)
    run.append(
        offset,
        timestamp,
        None if key is None else bytes(key),
        None if value is None else bytes(value),
        source,
    )
    return run.encode()


def load_detector(
    blob: bytes, config: DetectorConfig, topic: str, partition: int
) -> PartitionDetector:
    """The saved detector of ``topic:partition``; a WINDOW_SIZE change says how to recover.

    Raises:
        GapStateError: the state is unreadable, or was saved with another WINDOW_SIZE (the
            message names the exact recovery steps, docs/dedup.md "Changing WINDOW_SIZE").
    """
    try:
        return PartitionDetector.from_bytes(blob, config)
    except WindowSizeMismatchError as exc:
        old, new = exc.saved, exc.configured
        raise GapStateError(
            f"the dedup state of {topic}:{partition} was saved with WINDOW_SIZE={old}, but "
            f"WINDOW_SIZE={new} is set. To keep the state: set WINDOW_SIZE={old} again and "
            f"restart. To switch to {new} (each partition forgets which records it delivered "
            f"and which gaps are open): start with WINDOW_SIZE={old}, stop the job once it has "
            "caught up, run 'kafka-diode dedup reset --topic T --partition P --yes' for every "
            f"source partition (here: --topic {topic} --partition {partition}), then start with "
            f"WINDOW_SIZE={new}; a reset is applied before the saved state is read "
            '(docs/dedup.md "Changing WINDOW_SIZE")'
        ) from exc


def apply_heartbeats(detector: PartitionDetector, beats: InputRows, now: int) -> None:
    """Apply one batch's heartbeat rows: the highest offset (per share chain, or of all the
    unchained ones), and each valid low offset."""
    highs = beats["src_offset"]
    chains = beats["hb_chain"] if "hb_chain" in beats else np.full(len(beats), -1)
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
