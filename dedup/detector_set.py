"""A detector set: the detectors of many source partitions in one value (a container, pure).

Two layouts keep their state in it: a bucket of the **buckets** layout (one Spark state row) and
a raw partition's state record of the **direct** layout (``dedup/direct_state.py``).

Why: Spark and pyspark pay a fixed cost per *group* of ``applyInPandasWithState`` in every
micro-batch (the group's Arrow slice turned into pandas column by column, its state object, its
output frame turned back into Arrow, its state row and timeout in the JVM): ~3-4 ms of Python per
group and batch, measured (docs/benchmarks.md "Dedup"). Grouping by source
partition made that cost grow with the number of topics a link carries. A bucketed checkpoint
groups by **bucket** instead: a fixed number of buckets per state partition (the
Spark task that holds them; ``dedup/layouts/``), so a batch calls the stateful function a
fixed number of times per task whatever the fan-in, and the function splits its rows by source
partition itself, in numpy.

A bucket's state value is a container (this module, pure): per source partition, the detector's
own bytes (``PartitionDetector.to_bytes``) and the time of its last gap scan. Blobs are kept
as bytes and parsed only for partitions with input or a scan due, so a bucket with hundreds of
quiet partitions costs a copy of their bytes per batch, not a parse.

Container layout v1 (little-endian): ``KDBK`` + version byte ``1`` + entry count (u32), then per
entry, in (topic, partition) order: topic length (u16), partition (i32), last scan ms (i64), blob
length (u64), the topic (UTF-8), the blob.

Which layout a checkpoint uses is decided once, when it is created (``dedup/layouts/``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from common.errors import GapStateError

MAGIC: Final = b"KDBK\x01"
_COUNT: Final = struct.Struct("<I")
_ENTRY: Final = struct.Struct("<HiqQ")
#: A Kafka topic name is at most 249 characters; a longer one here means a corrupt container.
MAX_TOPIC_BYTES: Final = 249 * 4

#: The detectors of one bucket together stay below this (a Spark state value round-trips up to
#: ~256 MiB, measured): each gets ``min(MAX_STATE_BYTES, BUCKET_STATE_BYTES / its partitions)``.
BUCKET_STATE_BYTES: Final = 192 << 20
#: The least budget a detector gets (``MAX_STATE_BYTES``'s own minimum), however full its bucket.
MIN_STATE_BYTES: Final = 4096

#: Group key topic of a bucket: ``("", j)`` with ``j >= 0``. No Kafka topic has an empty name.
BUCKET_TOPIC: Final = ""

Key = tuple[str, int]


class DetectorSet:
    """The saved detectors of one bucket: ``(topic, partition) -> (blob, last scan ms)``."""

    def __init__(self, entries: dict[Key, tuple[bytes, int]] | None = None) -> None:
        self._entries: dict[Key, tuple[bytes, int]] = dict(entries or {})

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Key]:
        return iter(sorted(self._entries))

    def get(self, key: Key) -> tuple[bytes, int] | None:
        """The detector's bytes and last scan time, or None for a partition not seen yet."""
        return self._entries.get(key)

    def put(self, key: Key, blob: bytes, last_scan_ms: int) -> None:
        self._entries[key] = (blob, last_scan_ms)

    def budget(
        self, max_state_bytes: int, joining: int = 0, total: int = BUCKET_STATE_BYTES
    ) -> int:
        """Each detector's state budget once ``joining`` new partitions are in the bucket, the
        bucket's detectors sharing ``total`` bytes."""
        share = total // max(1, len(self._entries) + joining)
        return min(max_state_bytes, max(MIN_STATE_BYTES, share))

    def due(self, now_ms: int, interval_ms: int) -> list[Key]:
        """Partitions whose last scan is at least ``interval_ms`` old, in key order."""
        return sorted(k for k, (_, last) in self._entries.items() if now_ms - last >= interval_ms)

    def next_due_in(self, now_ms: int, interval_ms: int) -> int:
        """Milliseconds until the next partition's scan is due (at least 1; ``interval_ms`` for
        an empty bucket): the bucket's processing-time timeout."""
        if not self._entries:
            return interval_ms
        soonest = min(last for _, last in self._entries.values()) + interval_ms
        return max(1, soonest - now_ms)

    def to_bytes(self) -> bytes:
        """The container, entries in key order (a replayed batch saves the same bytes)."""
        parts = [MAGIC, _COUNT.pack(len(self._entries))]
        for key in sorted(self._entries):
            blob, last = self._entries[key]
            topic = key[0].encode("utf-8")
            parts += [_ENTRY.pack(len(topic), key[1], last, len(blob)), topic, blob]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> DetectorSet:
        """Parse a container.

        Raises:
            GapStateError: not a container of this version, or truncated.
        """
        view = memoryview(data)
        if bytes(view[: len(MAGIC)]) != MAGIC:
            raise GapStateError(
                "the dedup state of a bucket is not a bucket container of version 1 "
                f"(starts with {bytes(view[:5])!r}): a checkpoint written by a newer version, "
                "or a damaged one"
            )
        pos = len(MAGIC)
        entries: dict[Key, tuple[bytes, int]] = {}
        try:
            (count,) = _COUNT.unpack_from(view, pos)
            pos += _COUNT.size
            for _ in range(count):
                topic_len, partition, last, blob_len = _ENTRY.unpack_from(view, pos)
                pos += _ENTRY.size
                if topic_len > MAX_TOPIC_BYTES or pos + topic_len + blob_len > len(view):
                    raise GapStateError("the dedup state of a bucket is truncated")
                topic = bytes(view[pos : pos + topic_len]).decode("utf-8")
                pos += topic_len
                entries[(topic, partition)] = (bytes(view[pos : pos + blob_len]), last)
                pos += blob_len
        except (struct.error, UnicodeDecodeError) as exc:
            raise GapStateError(f"the dedup state of a bucket is damaged: {exc}") from exc
        if pos != len(view):
            raise GapStateError(
                f"the dedup state of a bucket has {len(view) - pos} bytes after its last entry"
            )
        return cls(entries)
