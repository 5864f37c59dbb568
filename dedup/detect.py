"""The dedup's stateful step: the gap detector over one source partition's rows of a micro-batch.

Runs in the **executors**, inside ``applyInPandasWithState`` (``dedup/job.py`` wires it): Spark
calls :func:`detect_group` once per source (topic, partition) with data in a micro-batch, and once
per processing-time timeout for a partition without data. Nothing here imports pyspark at run
time (``GroupState`` is only a type), so the unit tests call it with pandas frames and a stand-in.

Theory of operation, per call:

1. **Resets first**, before the saved state is read (a reset discards it, readable or not).
2. **Data** (``dedup/classify.py`` kinds): v2 runs are checked against their key
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
"""

from __future__ import annotations

import array
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from common import gap_record
from common.errors import LocalProtocolError, RemoteProtocolError
from common.raw_run import RunBuilder, check_run
from common.raw_topic import PROVENANCE_HEADERS
from dedup import gaps
from dedup.rows import COLUMN_NAMES, KIND_GAP, KIND_RUN, KIND_STAT, STAT_COLUMNS, pack_selection
from dedup.worker_heap import FreezeOnLoad

if TYPE_CHECKING:
    from pyspark.sql.streaming.state import GroupState

log = logging.getLogger(__name__)

#: Input kinds computed in SQL (``dedup/classify.py``; a tinyint column, cheap across Arrow).
KIND_DATA, KIND_HEARTBEAT, KIND_RESET, KIND_MALFORMED, KIND_WITHHELD, KIND_RUN_IN = 0, 1, 2, 3, 4, 5
#: Group key of raw records whose key does not parse (counted as malformed).
UNPARSED_TOPIC, UNPARSED_PARTITION = "", -1


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


class _Output:
    """The output rows of one call, built as one frame at the end.

    One frame per call, from one object array: building a frame costs per column, and a call
    that built one frame per row kind paid that two or three times (measured: ~1.5 ms of a
    call's ~2.2 ms went to frames at 256 source partitions per batch). pyspark casts each column
    to ``OUTPUT_DDL``'s type when it converts the frames to Arrow.
    """

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def add(self, kind: str, **values: Any) -> None:
        self.rows.append((kind, values))

    def frame(self) -> pd.DataFrame:
        table = np.full((len(self.rows), len(COLUMN_NAMES)), None, dtype=object)
        table[:, _COLUMN["src_topic"]] = self.topic
        table[:, _COLUMN["src_partition"]] = self.partition
        for i, (kind, values) in enumerate(self.rows):
            row = table[i]
            row[0] = kind
            for name, value in values.items():
                row[_COLUMN[name]] = value
        return pd.DataFrame(table, columns=list(COLUMN_NAMES), copy=False)


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
    batch = (
        (parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)) if parts else None
    )
    stats = dict.fromkeys(STAT_COLUMNS, 0)
    if topic == UNPARSED_TOPIC and partition == UNPARSED_PARTITION:
        stats["malformed"] = 0 if batch is None else len(batch)
        out = _Output(topic, partition)
        out.add(KIND_STAT, state_bytes=0, **stats)
        yield out.frame()
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

    out = _Output(topic, partition)
    if batch is not None:
        stats["malformed"] = int(np.count_nonzero(kinds == KIND_MALFORMED))
        offsets = batch["src_offset"].to_numpy()
        data = np.flatnonzero((kinds == KIND_DATA) | (kinds == KIND_RUN_IN))
        if len(data):
            _observe_data(detector, batch, data, out, now, stats)
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
    for report in reports:
        out.add(
            KIND_GAP, gap_key=gap_record.gap_key(report), gap_value=gap_record.gap_value(report)
        )

    blob = detector.to_bytes()
    state.update((blob, last_scan))
    state.setTimeoutDuration(params.scan_interval_ms)
    stats["open_gaps"] = len(detector.reported_open())
    stats["chains_missing"] = detector.chains_missing
    stats["below_window"] = detector.below_window - below_before
    stats["budget_evictions"] = detector.budget_evictions - budget_before
    stats["expired_gaps"] = sum(1 for r in reports if r.state is gaps.GapState.EXPIRED)
    out.add(KIND_STAT, state_bytes=len(blob), **stats)
    yield out.frame()


def _observe_data(  # noqa: PLR0917  one call per group and batch
    detector: gaps.PartitionDetector,
    batch: pd.DataFrame,
    rows: np.ndarray[Any, Any],
    out: _Output,
    now: int,
    stats: dict[str, int],
) -> None:
    """Observe the data rows ``rows`` of ``batch``; adds a ``run`` row for what is first seen."""
    topic, partition = out.topic, out.partition
    kinds = batch["kind"].to_numpy()
    firsts = batch["src_offset"].to_numpy()
    lasts = batch["src_last"].to_numpy()
    strides = batch["stride"].to_numpy()
    payloads = batch["payload"].to_numpy()
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
            KIND_RUN, src_offset=first, payload=bytes(payload), selection=selection, records=taken
        )
    stats["delivered"] = delivered
    stats["duplicates"] = total - delivered


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


def _v1_as_run(batch: pd.DataFrame, i: int, topic: str, partition: int, offset: int) -> bytes:
    """A first-seen v1 raw record (docs/topics.md "Layout v1") re-encoded as a run of one.

    ``classify`` checked what this relies on: the four provenance headers last, in order, and a
    ``diode.timestamp`` that is a signed 64-bit decimal.
    """
    names = list(batch["h_keys"].iat[i])
    values = list(batch["h_values"].iat[i])
    n = len(PROVENANCE_HEADERS)
    key, stamp, kind = values[-n], values[-n + 1], values[-n + 2]
    ts_type = {b"0": 0, b"1": 1, b"2": 2}.get(bytes(kind) if kind is not None else b"", 1)
    timestamp = int(bytes(stamp))
    source = tuple(
        (str(name), None if value is None else bytes(value))
        for name, value in zip(names[:-n], values[:-n], strict=True)
    )
    value = batch["payload"].iat[i]
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
