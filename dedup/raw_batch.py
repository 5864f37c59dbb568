"""A direct task's input: raw records of one raw partition as Python lists (executors).

The librdkafka reader (``dedup/range_reader.py``) builds these from its messages as they come;
Spark's Kafka source (``DIRECT_READER=spark``) gives Arrow batches, converted once at the task's
door (:meth:`RawBatch.from_arrow`). The classifier reads Python objects either way, so an Arrow
batch between the consumer and the classifier only cost two copies of every payload (into Arrow,
out of it) and its headers built as structs and taken apart again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from common.errors import ServiceError

#: One Kafka header: name, value (None: a header without a value).
Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class RawBatch:
    """Consecutive raw records of one raw partition (a column per field, in offset order)."""

    topic: str
    """The raw topic."""
    partition: int
    """The raw partition."""
    offsets: list[int]
    """Each record's offset."""
    keys: list[bytes | None]
    """Each record's key."""
    values: list[bytes | None]
    """Each record's value (a run of source records, a control record, a v1 record)."""
    headers: list[Sequence[Header]]
    """Each record's headers, in order."""

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def from_arrow(cls, batch: pa.RecordBatch) -> RawBatch:
        """The rows Spark's Kafka source gave (``key``, ``value``, ``topic``, ``partition``,
        ``offset``, ``headers``).

        Raises:
            ServiceError: rows of several raw partitions in one Arrow batch (Spark's source was
                told to split or merge partitions: ``KAFKA_SOURCE_MINPARTITIONS`` and the like,
                which the configuration refuses); nothing is written.
        """
        topic, partition = source_of(batch)
        return cls(
            topic,
            partition,
            batch.column("offset").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            arrow_headers(batch),
        )

    def after(self, offset: int) -> RawBatch:
        """The records past ``offset`` (a committed part of the batch ends there)."""
        keep = [i for i, at in enumerate(self.offsets) if at > offset]
        if len(keep) == len(self.offsets):
            return self
        return RawBatch(
            self.topic,
            self.partition,
            [self.offsets[i] for i in keep],
            [self.keys[i] for i in keep],
            [self.values[i] for i in keep],
            [self.headers[i] for i in keep],
        )


def arrow_headers(batch: pa.RecordBatch) -> list[Sequence[Header]]:
    """Each row's headers as ``Header`` tuples, from the ``headers`` column of Spark's source
    (a list of ``key``/``value`` structs, null for none)."""
    headers: list[Any] = batch.column("headers").to_pylist()
    return [[(h["key"], h["value"]) for h in found] if found else () for found in headers]


def source_of(batch: pa.RecordBatch) -> tuple[str, int]:
    """The one raw topic-partition of an Arrow batch of Spark's Kafka source.

    Raises:
        ServiceError: rows of several raw partitions (:meth:`RawBatch.from_arrow`).
    """
    topics = pc.unique(batch.column("topic"))
    partitions = pc.unique(batch.column("partition"))
    if len(topics) != 1 or len(partitions) != 1:
        raise ServiceError(
            "a direct task got rows of several raw partitions "
            f"({topics.to_pylist()} / {partitions.to_pylist()}): Spark's Kafka source must make "
            "each raw partition's rows in one task (unset KAFKA_SOURCE_MINPARTITIONS and "
            "KAFKA_SOURCE_MAXRECORDSPERPARTITION)"
        )
    return str(topics[0].as_py()), int(partitions[0].as_py())
