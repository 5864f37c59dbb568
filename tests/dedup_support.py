"""Inputs and outputs of the dedup's stateful step (``dedup/detect.py``) without Spark.

``frame`` builds rows shaped like ``dedup.classify_sql.classify``'s output: a data item becomes a
v2 run (a real run value, ``common.raw_run``); ``delivered`` reads the ``run`` rows back into the
source records they select. ``FakeState`` has the four members of pyspark's ``GroupState`` the
step uses.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from common.raw_run import RunBuilder
from common.wire.batch_decode import decode_record_groups
from dedup import detect
from dedup.rows import KIND_DATA, KIND_RUN, KIND_RUN_IN, InputRows, unpack_selection


class FakeState:
    """The members of pyspark's GroupState that detect_group uses."""

    def __init__(self, value: tuple[bytes, int] | None = None, now: int = 10_000) -> None:
        self.value, self.now = value, now
        self.timeout_ms: int | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[bytes, int]:
        assert self.value is not None
        return self.value

    def getCurrentProcessingTimeMs(self) -> int:
        return self.now

    def update(self, value: tuple[bytes, int]) -> None:
        self.value = value

    def setTimeoutDuration(self, ms: int) -> None:
        self.timeout_ms = ms


def run_value(
    first: int,
    last: int,
    stride: int = 1,
    *,
    topic: str = "t",
    partition: int = 0,
    tag: bytes = b"",
) -> bytes:
    """A run of ``first..last`` by ``stride``; each value is ``tag`` + the offset."""
    run = RunBuilder(topic, partition, 1, first, 1_700_000_000_000)
    for offset in range(first, last + 1, stride):
        run.append(offset, 1_700_000_000_000 + offset, b"k%d" % offset, tag + b"%d" % offset, ())
    return run.encode()


def frame(*items: tuple[int, ...]) -> pd.DataFrame:
    """Rows ``(kind, src_offset, hb_low, hb_started[, hb_chain[, last, stride]])``; data rows are
    runs (``last`` defaults to ``src_offset``, ``stride`` to 1) with a real run value."""
    rows = []
    for item in items:
        kind, offset, low, started, *more = item
        chain = more[0] if more else -1
        last = more[1] if len(more) > 1 else offset
        stride = more[2] if len(more) > 2 else 1
        data = kind in (KIND_DATA, KIND_RUN_IN)
        rows.append(
            {
                "kind": KIND_RUN_IN if data else kind,
                "src_offset": offset,
                "src_last": last if data else offset,
                "stride": stride if data else 1,
                "payload": run_value(offset, last, stride) if data else None,
                "h_keys": None,
                "h_values": None,
                "hb_low": low,
                "hb_started": started,
                "hb_chain": chain,
            }
        )
    return pd.DataFrame(rows)


def delivered(out: pd.DataFrame) -> list[tuple[int, bytes | None]]:
    """``(source offset, value)`` of every record the ``run`` rows of ``out`` select, in order."""
    found: list[tuple[int, bytes | None]] = []
    runs = out[out["kind"] == KIND_RUN]
    for payload, selection in zip(runs["payload"], runs["selection"], strict=True):
        (group,), _ = decode_record_groups(payload)
        for a, b in unpack_selection(selection, len(group)):
            found += list(zip(group.offsets[a : b + 1], group.values[a : b + 1], strict=True))
    return found


def detect_one_partition(
    params: detect.DetectParams,
    key: tuple[str, int],
    frames: Iterator[pd.DataFrame],
    state: FakeState,
) -> Iterator[pd.DataFrame]:
    """One source partition as a group of its own, its detector's bytes and last scan as the
    state (what the retired partitions layout ran): ``detect.detect_partition`` over the frames.
    The tests drive one detector through it, and hold a bucket's output against it."""
    now = int(state.getCurrentProcessingTimeMs())
    parts = [f for f in frames if len(f)]
    batch = pd.concat(parts, ignore_index=True) if parts else None
    rows = None if batch is None else InputRows.from_frame(batch)
    out = detect.Output()
    saved = (bytes(state.get[0]), int(state.get[1])) if state.exists else None
    blob, last_scan = detect.detect_partition(params, key[0], key[1], rows, saved, now, out)
    state.update((blob, last_scan))
    state.setTimeoutDuration(params.scan_interval_ms)
    yield out.frame()
