"""The receiver's glue without sockets or Kafka: a ``Receiver`` whose sink notes what it is handed.

For tests of ``Receiver._on_datagram`` / ``_on_coalesced``: pure glue, so the raw-topic sink
stands in (no Kafka in a unit test); the loop only gives the clock, and the caller closes it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from common.wire import RecordBatch
from receiver import app as receiver_app
from receiver.config import ReceiverConfig


class Sink:
    """Stands in for the raw-topic sink: notes the records it was handed."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, int, bytes | None]] = []

    def write_batch(self, batch: RecordBatch, now: float | None = None) -> None:
        self.records += [(r.topic, r.partition, r.offset, r.value) for r in batch.records]

    def write_heartbeat(self, beat: Any, now: float | None = None) -> None:
        pass


def glue_receiver(key_file: Path) -> tuple[receiver_app.Receiver, Sink]:
    """A receiver with ``key_file``'s keys, an event loop of its own (close it) and a ``Sink``."""
    config = ReceiverConfig(
        bootstrap_servers="127.0.0.1:1", raw_topic="raw.{topic}", key_file=key_file
    )
    receiver = receiver_app.Receiver(config)
    receiver._loop = asyncio.new_event_loop()
    sink = Sink()
    receiver._sink = sink  # type: ignore[assignment]
    return receiver, sink
