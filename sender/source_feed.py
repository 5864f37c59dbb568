"""Kafka source -> the send pipeline's entrance: the consume loop and the hot loop (glue).

Theory of operation::

    KafkaSource.consume() (consumer thread) --batch--> SourceFeed._process --one burst-->
        SendPipeline: begin, record / withhold per record, settle

- **Prefetch**: while one batch is encoded, the consumer thread fetches the next; at most two
  batches (the one in hand, the prefetched one) are added after the pipeline reports pressure,
  so memory stays bounded whatever the input rate.
- **Backpressure** (``on_pressure``): above the backlog bound every assigned partition is paused,
  below half of it resumed, between two batches.
- **Every batch taken from the consumer is sent** (then committed by the app): ``stop`` ends the
  loop after the batch in hand and the prefetched one; ``reopen_soon`` (the stall watchdog)
  re-creates the consumer between two batches, after adding the prefetched one.
- **The hot loop** (docs/benchmarks.md, "Sender"): per record only what must be per record
  (the content filter's verdict, the chain share, the per-partition lowest offset read for the
  heartbeats, counts); records that cannot be sent (too large, bad) are counted and logged and
  become gaps downstream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message

from common.errors import LocalProtocolError, ServiceError
from common.logging import RateLimitedLog
from common.wire import RecordTooLarge
from sender.record_filter import SEND, WITHHOLD

if TYPE_CHECKING:
    from sender.config import SenderConfig
    from sender.kafka_source import KafkaSource
    from sender.record_filter import RecordFilter
    from sender.send_pipeline import SendPipeline

log = logging.getLogger(__name__)


class SourceFeed:
    """Reads the Kafka source into the pipeline and counts what it read."""

    def __init__(
        self,
        config: SenderConfig,
        *,
        record_filter: RecordFilter | None,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.record_filter = record_filter
        self._clock = clock
        self._chain_share = config.chain_share()
        self._stopping = False
        self._pause_wanted = False
        self._paused = False
        self._reopen_wanted = False
        self._ratelog = RateLimitedLog(log)
        self.records_read = 0
        """Records read and handed to the pipeline (sent or withheld)."""
        self.bytes_read = 0
        """Key and value bytes of those records."""
        self.records_other_chains = 0
        """Records read and left to the other chains (``chain_mode = share``)."""
        self.errors: dict[str, int] = {}
        """Errors by kind (``record_too_large``, ``bad_record``, ``broker``, ``consume``)."""
        self.low_offsets: dict[tuple[str, int], int] = {}
        """Per partition, the lowest offset read and handed to the encoder in this process (kept
        for the process's life, also after a revocation): the heartbeats' ``low_offsets``."""

    @property
    def paused(self) -> bool:
        """True while every partition is paused by backpressure."""
        return self._paused

    def on_pressure(self, congested: bool) -> None:
        """The pipeline's backpressure report: pause (True) or resume (False) reading."""
        self._pause_wanted = congested

    def reopen_soon(self) -> None:
        """Re-create the Kafka consumer between two batches (the stall watchdog's remedy)."""
        self._reopen_wanted = True

    def stop(self) -> None:
        """Stop after the batch in hand and the prefetched one (``run`` returns)."""
        self._stopping = True

    async def _apply_pressure(self, source: KafkaSource) -> None:
        if self._pause_wanted and not self._paused:
            await source.pause_all()
            self._paused = True
        elif not self._pause_wanted and self._paused:
            await source.resume_all()
            self._paused = False

    async def run(self, source: KafkaSource, pipeline: SendPipeline) -> None:
        """Consume until ``stop``; every batch taken from the consumer is sent."""
        backoff = 0.5
        while not self._stopping and not await source.refresh_topics():
            await asyncio.sleep(backoff)  # broker down at start: retry, never crash
            backoff = min(backoff * 2, self.config.retry_backoff_max)
        next_refresh = self._clock() + 30.0
        pending: asyncio.Future[list[Message]] | None = None
        while not self._stopping:
            if pending is None:
                pending = asyncio.ensure_future(source.consume())
            batch = await pending
            pending = None
            if self._pause_wanted != self._paused:
                await self._apply_pressure(source)
            if not self._stopping and not self._pause_wanted:
                # Prefetch: the consumer thread fetches the next batch while this one encodes.
                pending = asyncio.ensure_future(source.consume())
            if batch:
                self._process(batch, pipeline)
            await asyncio.sleep(0)  # let the pump's timers and the other tasks run
            if self._reopen_wanted:
                if pending is not None:
                    batch = await pending
                    pending = None
                    if batch:
                        self._process(batch, pipeline)
                self._reopen_wanted = False
                await source.reopen()
            if source.needs_metadata and self._clock() >= next_refresh:
                next_refresh = self._clock() + 30.0
                await source.refresh_topics()
        if pending is not None:
            # Records of a batch already taken from the consumer are sent too (then committed).
            batch = await pending
            if batch:
                self._process(batch, pipeline)

    def _process(self, batch: Sequence[Any], pipeline: SendPipeline) -> None:
        # The hot loop (docs/benchmarks.md, "Sender"): one burst of the pipeline's entrance per
        # consumer batch (``begin``, ``record``/``withhold`` per record, ``settle``), so the
        # clock is read once per emitted datagram and the pipeline sends in bursts.
        record = pipeline.record
        withhold = pipeline.withhold
        decide = self.record_filter.decide if self.record_filter is not None else None
        share = self._chain_share
        low = self.low_offsets
        nbytes = 0
        good = 0
        run_topic: str | None = None
        run_partition = -1
        pipeline.begin()
        try:
            for msg in batch:
                if msg.error() is not None:
                    self._message_error(msg)
                    continue
                value = msg.value()
                key = msg.key()
                ts_type, ts = msg.timestamp()
                topic = msg.topic()
                partition = msg.partition()
                offset = msg.offset()
                if partition != run_partition or topic != run_topic:
                    # A consumed batch holds runs of one partition in increasing offset order, so
                    # the first record of each run is enough to keep the per-partition minimum.
                    # Skipped records (too large, bad) count too: their offsets become gaps.
                    run_topic, run_partition = topic, partition
                    known = low.get((topic, partition))
                    if offset >= 0 and (known is None or offset < known):
                        low[topic, partition] = offset
                if share is not None and offset % share[1] != share[0]:
                    self.records_other_chains += 1  # another chain carries it (chain share)
                    continue
                headers = msg.headers()
                try:
                    verdict = (
                        SEND
                        if decide is None
                        else decide(topic, partition, offset, key, value, headers)
                    )
                    if verdict == SEND:
                        record(topic, partition, offset, ts, ts_type, key, value, headers)
                    elif verdict == WITHHOLD:
                        withhold(topic, partition, offset)
                    else:
                        continue  # a filter error: counted and logged, becomes a gap
                except RecordTooLarge as exc:
                    self._record_too_large(msg, exc)
                    continue
                except LocalProtocolError as exc:
                    self._bad_record(msg, exc)
                    continue
                good += 1
                if value is not None:
                    nbytes += len(value)
                if key is not None:
                    nbytes += len(key)
        finally:
            pipeline.settle()
            self.records_read += good
            self.bytes_read += nbytes

    def _message_error(self, msg: Any) -> None:
        err: KafkaError = msg.error()
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.code() == KafkaError._FATAL:
            # A consumer's only fatal error: another member joined with its group.instance.id
            # (static membership). It can neither read nor commit again, and re-joining would
            # fence the other one in turn: stop, and let the supervisor say so.
            member = self.config.group_consumer_properties().get("group.instance.id")
            raise ServiceError(
                f"the Kafka consumer was fenced ({err.str()}): another consumer joined group "
                f"{self.config.group_id!r} as static member {member!r}; give each sender of "
                "that group its own sender_id, or set static_membership = false"
            )
        kind = (
            "broker"
            if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
            else "consume"
        )
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self._ratelog.warning(f"msg:{err.code()}", "Kafka consume error: %s", err.str())

    def _bad_record(self, msg: Any, exc: Exception) -> None:
        self.errors["bad_record"] = self.errors.get("bad_record", 0) + 1
        self._ratelog.warning(
            "bad_record",
            "skipping record %s/%d@%d: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc,
        )

    def _record_too_large(self, msg: Any, exc: Exception) -> None:
        self.errors["record_too_large"] = self.errors.get("record_too_large", 0) + 1
        log.error(
            "skipping record %s/%d@%d: %s (it will be reported as a gap downstream)",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc,
        )
