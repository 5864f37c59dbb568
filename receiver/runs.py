"""Coalesce decoded records into raw-layout-v2 runs across datagrams (pure: no I/O, ``now`` given).

Theory of operation. The sender puts consecutive offsets of one partition into each datagram; the
receiver keeps them together: one **open run** per (sender session, source topic, source
partition), a :class:`common.raw_run.RunBuilder` that grows record by record as datagrams arrive.
A run is **finished** (handed back to the caller, who produces it as one raw record) when:

(a) the next record of its partition does not continue it (``RunBuilder.follows``: a lost,
    repeated or reordered offset, a different stride) or has another timestamp type, or its
    timestamp is too far from the run's base to be stored as an Avro long delta;
(b) adding the next record could make its value larger than ``max_bytes`` (the record then starts
    the next run; a record larger than ``max_bytes`` on its own is a run of one, finished at once);
(c) it has been open for ``linger`` seconds (:meth:`RunCoalescer.flush_due`, driven by the
    caller's timer through :meth:`RunCoalescer.next_deadline`);
(d) a control record of its (topic, partition) is about to be written
    (:meth:`RunCoalescer.flush_partition`): the dedup relies on a partition's records preceding its
    heartbeat and withheld records in the raw topic;
(e) the caller shuts down (:meth:`RunCoalescer.flush_all`), or more than ``max_open`` runs are
    open (the oldest is finished: bounded state whatever the number of partitions on the wire).

Guarantee (tests/property/test_receiver_runs.py): every record handed in comes out in exactly one
finished run, records of one partition and session in the order they were handed in, and every
run's value decodes (``common.raw_run.check_run``) to exactly its records. Finished runs are
returned in the order they finished; runs of one (topic, partition) finish in arrival order.

Cost: a group that simply continues its open run (the next consecutive offsets: the usual
datagram of a backlog) is appended column-wise in one piece (``RunBuilder.extend``, the same
bytes; its headers as the decoder read them, ``RecordGroup.headers_bytes``, when it has them);
any other group record by record.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from common.raw_run import RunBuilder
from common.wire.events import RecordGroup

#: Avro longs are signed 64-bit: a timestamp delta from the run's base must fit.
_LONG_BOUND: Final = 1 << 63
#: Most bytes one record adds to a run's value besides its key, value and headers: the offset and
#: timestamp deltas (10 bytes each at most), the key's and value's union branch and length (1 + 5),
#: the header array's count and end (10 + 1). Each header adds at most its name's UTF-8 (4 bytes a
#: character), its value, and a length, branch and length (5 + 1 + 5): :data:`_HEADER_FRAMING`.
_RECORD_FRAMING: Final = 10 + 10 + 6 + 6 + 11
_HEADER_FRAMING: Final = 11
#: Open runs at most (oldest finished beyond that): partitions come from the wire.
MAX_OPEN_RUNS: Final = 4096


@dataclass(frozen=True, slots=True)
class Run:
    """A finished run: one raw record to produce."""

    session_id: bytes
    """The sender session whose records these are."""
    topic: str
    """Source topic."""
    partition: int
    """Source partition."""
    first: int
    """First source offset."""
    last: int
    """Last source offset."""
    stride: int
    """Distance between consecutive offsets (1 unless a share chain's)."""
    count: int
    """Records in the run."""
    key: str
    """The raw key (``common.raw_run.run_key``)."""
    value: bytes
    """The raw value (one ``RecordBatch`` group)."""

    def offsets(self) -> range:
        """Every source offset of the run."""
        return range(self.first, self.last + 1, self.stride)


def _finish(session_id: bytes, builder: RunBuilder) -> Run:
    return Run(
        session_id,
        builder.topic,
        builder.partition,
        builder.first,
        builder.last,
        max(1, builder.stride),
        builder.count,
        builder.key(),
        builder.encode(),
    )


class _Open:
    __slots__ = ("builder", "deadline")

    def __init__(self, builder: RunBuilder, deadline: float) -> None:
        self.builder = builder
        self.deadline = deadline


class RunCoalescer:
    """Open runs per (session, topic, partition); see the module docstring."""

    def __init__(self, max_bytes: int, linger: float, *, max_open: int = MAX_OPEN_RUNS) -> None:
        if max_bytes < 1 or linger < 0 or max_open < 1:
            raise ValueError("max_bytes and max_open must be positive, linger not negative")
        self._max_bytes = max_bytes
        self._linger = linger
        self._max_open = max_open
        #: open runs in the order they were opened, so the first is the next to linger out
        self._open: OrderedDict[tuple[bytes, str, int], _Open] = OrderedDict()
        #: (topic, partition) -> sessions with an open run there (for flush_partition)
        self._sessions: dict[tuple[str, int], set[bytes]] = {}
        self.records = 0
        """Records in open runs."""

    def __len__(self) -> int:
        """Open runs."""
        return len(self._open)

    def next_deadline(self) -> float | None:
        """When the oldest open run lingers out, or None when none is open."""
        if not self._open:
            return None
        return next(iter(self._open.values())).deadline

    def add_group(self, session_id: bytes, group: RecordGroup, now: float, out: list[Run]) -> None:
        """Add ``group``'s records of ``session_id``; append the runs this finishes to ``out``."""
        topic, partition, ts_type = group.topic, group.partition, group.timestamp_type
        ident = (session_id, topic, partition)
        opened = self._open.get(ident)
        builder = opened.builder if opened is not None else None
        if builder is not None and builder.ts_type != ts_type:
            self._close(ident, out)
            builder = None
        max_bytes = self._max_bytes
        if builder is not None:
            offsets = group.offsets
            if len(offsets) == 1:  # a record that filled a datagram alone: the usual from 1 KB
                if builder.append_next(
                    offsets[0],
                    group.timestamps[0],
                    group.keys[0],
                    group.values[0],
                    group.headers[0],
                    max_bytes,
                ):
                    self.records += 1
                    return
            elif self._extend(builder, group, max_bytes):
                self.records += len(offsets)
                return
        added = 0
        for offset, timestamp, key, value, headers in zip(
            group.offsets, group.timestamps, group.keys, group.values, group.headers, strict=True
        ):
            # An upper bound of what the record adds: the check never lets a run exceed the cap.
            grown = _RECORD_FRAMING + (len(key) if key else 0) + (len(value) if value else 0)
            if headers:
                grown += sum(
                    len(n) * 4 + (len(v) if v else 0) + _HEADER_FRAMING for n, v in headers
                )
            if builder is not None:
                delta = timestamp - builder.base_ts
                if (
                    not builder.follows(offset)
                    or builder.size + grown > max_bytes
                    or not -_LONG_BOUND <= delta < _LONG_BOUND
                ):
                    self._close(ident, out)
                    builder = None
            if builder is None:
                builder = self._start(ident, topic, partition, ts_type, offset, timestamp, now, out)
            builder.append(offset, timestamp, key, value, headers)
            added += 1
            if builder.size >= max_bytes:  # full (or a record over the cap alone): no waiting
                self.records += added
                added = 0
                self._close(ident, out)
                builder = None
        self.records += added

    @staticmethod
    def _extend(builder: RunBuilder, group: RecordGroup, max_bytes: int) -> bool:
        """The whole group onto ``builder`` in one piece (``RunBuilder.extend``), when it simply
        continues the run: consecutive offsets right after it (stride 1), timestamps whose
        deltas fit, and room under the cap. False: nothing done, take the record path."""
        offsets = group.offsets
        n = len(offsets)
        if not n:
            return False
        o0 = offsets[0]
        if (
            o0 != builder.last + 1
            or builder.stride > 1
            or offsets[-1] != o0 + n - 1
            or (n > 2 and offsets != tuple(range(o0, o0 + n)))
        ):
            return False
        timestamps = group.timestamps
        base = builder.base_ts
        if not (min(timestamps) - base >= -_LONG_BOUND and max(timestamps) - base < _LONG_BOUND):
            return False
        return builder.extend(
            offsets,
            timestamps,
            group.keys,
            group.values,
            group.headers,
            max_bytes,
            group.headers_bytes,
        )

    def _start(  # noqa: PLR0917  the new run's identity, from the hot loop
        self,
        ident: tuple[bytes, str, int],
        topic: str,
        partition: int,
        ts_type: int,
        offset: int,
        timestamp: int,
        now: float,
        out: list[Run],
    ) -> RunBuilder:
        if len(self._open) >= self._max_open:
            self._close(next(iter(self._open)), out)
        builder = RunBuilder(topic, partition, ts_type, offset, timestamp)
        self._open[ident] = _Open(builder, now + self._linger)
        sessions = self._sessions.get((topic, partition))
        if sessions is None:
            sessions = self._sessions[topic, partition] = set()
        sessions.add(ident[0])
        return builder

    def _close(self, ident: tuple[bytes, str, int], out: list[Run]) -> None:
        opened = self._open.pop(ident)
        session_id, topic, partition = ident
        sessions = self._sessions[topic, partition]
        sessions.discard(session_id)
        if not sessions:
            del self._sessions[topic, partition]
        builder = opened.builder
        self.records -= builder.count
        out.append(_finish(session_id, builder))

    def flush_partition(self, topic: str, partition: int, out: list[Run]) -> None:
        """Finish every open run of (``topic``, ``partition``), whatever its session."""
        sessions = self._sessions.get((topic, partition))
        if sessions:
            for session_id in list(sessions):
                self._close((session_id, topic, partition), out)

    def flush_due(self, now: float, out: list[Run]) -> None:
        """Finish every run opened ``linger`` seconds or more before ``now``."""
        open_runs = self._open
        while open_runs:
            ident, opened = next(iter(open_runs.items()))
            if opened.deadline > now:
                return
            self._close(ident, out)

    def flush_all(self, out: list[Run]) -> None:
        """Finish every open run (shutdown)."""
        while self._open:
            self._close(next(iter(self._open)), out)
