"""The direct layout's state record: one raw partition's detectors and the batch they follow.

The direct layout (``dedup/direct_task.py``) keeps no Spark state: the task of raw partition ``p``
writes, in the same Kafka transaction as its clean and gap records, one record to partition ``p``
of ``STATE_TOPIC`` (compacted) that holds the detectors of every source partition it has seen
(``dedup/detector_set.py``'s container) and the micro-batch it completes. The next attempt of that
raw partition, after fencing every older one, reads the last committed record back: it is both
the marker of the effectively-once argument and the state (docs/dedup.md "The direct layout").

Record:

- key ``<query id>:<raw topic>:<raw partition>`` (UTF-8);
- value ``MAGIC``, a 4-byte big-endian length, that many bytes of JSON (``batch_id``,
  ``raw_topic``, ``raw_partition``, ``records``, ``gaps``, ``committed_at_ms``), then the
  container's bytes.

A **part** of a batch (a task that commits its share of a long batch in several transactions,
``dedup/direct_task.py``) is the same record with ``through_offset`` in the header, the raw offset
of the last input row the part covers, and ``PART_MAGIC`` in front: a version that knows no parts
then refuses the record instead of taking the batch as complete and skipping the rest of it.

Pure: bytes in, values out.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Final

from common.errors import GapStateError
from dedup.detector_set import DetectorSet

MAGIC: Final = b"KDDS1"
#: A part's record: only a version that resumes a batch after its part may read it.
PART_MAGIC: Final = b"KDDS2"
_LENGTH: Final = struct.Struct(">I")
#: The JSON header's bound: it holds a few numbers and two names.
MAX_HEADER_BYTES: Final = 64 * 1024
#: The detectors of one raw partition share this much (each gets ``min(MAX_STATE_BYTES, this /
#: its partitions)``): the record must fit ``STATE_RECORD_LIMIT`` with room for the header.
DIRECT_STATE_BYTES: Final = 48 << 20
#: ``max.message.bytes`` of the state topic and the least ``message.max.bytes`` of the writer
#: (a record of the whole container, below Kafka's default 100 MiB request limit).
STATE_RECORD_LIMIT: Final = 64 << 20


def state_key(query_id: str, raw_topic: str, raw_partition: int) -> bytes:
    """The state record's key of one raw partition under one checkpoint (query id)."""
    return f"{query_id}:{raw_topic}:{raw_partition}".encode()


@dataclass(frozen=True, slots=True)
class StateRecord:
    """One committed state record: the batch it completes and the detectors after it."""

    batch_id: int
    raw_topic: str
    raw_partition: int
    detectors: DetectorSet
    records: int = 0
    gaps: int = 0
    committed_at_ms: int = 0
    #: a part of ``batch_id``: the raw offset of the last input row it covers (-1: the whole
    #: batch is committed)
    through_offset: int = -1

    @property
    def complete(self) -> bool:
        """Whether the record ends its batch (not a part of it)."""
        return self.through_offset < 0

    def encode(self) -> bytes:
        fields = {
            "batch_id": self.batch_id,
            "raw_topic": self.raw_topic,
            "raw_partition": self.raw_partition,
            "records": self.records,
            "gaps": self.gaps,
            "committed_at_ms": self.committed_at_ms,
        }
        magic = MAGIC
        if not self.complete:
            fields["through_offset"] = self.through_offset
            magic = PART_MAGIC
        header = json.dumps(fields, separators=(",", ":")).encode()
        return b"".join((magic, _LENGTH.pack(len(header)), header, self.detectors.to_bytes()))

    @classmethod
    def decode(cls, value: bytes) -> StateRecord:
        """Parse a state record's value.

        Raises:
            GapStateError: not a state record of this version, truncated or inconsistent.
        """
        start = len(MAGIC) + _LENGTH.size
        magic = value[: len(MAGIC)]
        if magic not in {MAGIC, PART_MAGIC} or len(value) < start:
            raise GapStateError(
                f"a record of the dedup's state topic is not a state record of version 1 or 2 "
                f"(starts with {value[:6]!r}): written by a newer version, or not by the dedup"
            )
        (length,) = _LENGTH.unpack_from(value, len(MAGIC))
        if length > MAX_HEADER_BYTES or start + length > len(value):
            raise GapStateError(f"a state record's header is truncated ({length} bytes announced)")
        try:
            fields = json.loads(value[start : start + length])
        except (ValueError, RecursionError) as exc:
            raise GapStateError(f"a state record's header is not JSON: {exc}") from exc
        if not isinstance(fields, dict):
            raise GapStateError("a state record's header is not a JSON object")
        numbers = {
            name: fields.get(name, 0)
            for name in ("batch_id", "raw_partition", "records", "gaps", "committed_at_ms")
        }
        numbers["through_offset"] = fields.get("through_offset", -1)
        bad = [n for n, v in numbers.items() if type(v) is not int]  # bool and float are not
        if bad or "batch_id" not in fields or not isinstance(fields.get("raw_topic"), str):
            raise GapStateError(
                f"a state record's header lacks or mistypes {bad or ['batch_id', 'raw_topic']}"
            )
        if (magic == PART_MAGIC) != (numbers["through_offset"] >= 0):
            raise GapStateError(
                f"a state record's header says through_offset {numbers['through_offset']} "
                f"under {magic!r}: a part has both, a whole batch neither"
            )
        return cls(
            batch_id=numbers["batch_id"],
            raw_topic=fields["raw_topic"],
            raw_partition=numbers["raw_partition"],
            detectors=DetectorSet.from_bytes(value[start + length :]),
            records=numbers["records"],
            gaps=numbers["gaps"],
            committed_at_ms=numbers["committed_at_ms"],
            through_offset=numbers["through_offset"],
        )
