"""The resend engine: re-read listed offsets upstream and send them again (high side).

Guarantees (docs/resend.md):

- **The live sender is untouched.** Upstream is read by ``assign`` + seek with a throwaway group id
  and ``enable.auto.commit=false``; nothing is ever committed, so no consumer group moves.
- **Same wire path and pacing** as ``kafka-diode send``: the send path is built by the same
  function (``sender.send_path.open_send_path``), in a new sender session. A resend marker (phase
  ``start``) precedes the records and one (phase ``end``) follows them.
- **Every requested offset is accounted for**: sent, or reported unrecoverable (below the log start
  offset, beyond the log end, absent from the log, or larger than ``max_record_size``), separately.
  Reading is bounded: at most one consumer batch is added after the pipeline reports pressure.

``ResendJob.run`` returns the command's exit code (``EXIT_*``, documented in ``sender.resend_cli``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import bundle as bundle_format
from common.errors import (
    ConfigError,
    LocalProtocolError,
    RecordTooLarge,
    ServiceError,
)
from runtime import service
from sender.config import SenderConfig
from sender.key_announcer import announce_loop
from sender.record_filter import SEND, WITHHOLD, RecordFilter
from sender.resend import (
    DEFAULT_MAX_SKIP,
    PartitionOutcome,
    PartitionPlan,
    format_ranges,
    marker_ranges,
    plan_partition,
    time_range_offsets,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

    from common.wire import KeyRing
    from sender.send_pipeline import SendPipeline

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_UNRECOVERABLE = 3
EXIT_BAD_BUNDLE = 4


_PROGRESS_LOG_INTERVAL = 10.0


@dataclass(frozen=True, kw_only=True)
class ResendRequest:
    """What to resend, from the command line."""

    bundle: Path | None = None
    """Bundle file to resend."""
    topic: str = ""
    """Topic for a range resend."""
    partitions: tuple[int, ...] = ()
    """Partitions for a range resend (time ranges: empty means all partitions)."""
    from_offset: int | None = None
    """First offset (inclusive)."""
    to_offset: int | None = None
    """Last offset (inclusive)."""
    from_time_ms: int | None = None
    """Start of a time range (inclusive), ms since the epoch."""
    to_time_ms: int | None = None
    """End of a time range (inclusive), ms since the epoch; None: up to the end of the log."""


def _headers(raw: Any) -> list[tuple[str, bytes | None]] | None:
    """confluent-kafka gives a list of ``(name, value)``; values may be str for str input."""
    if not raw:
        return None
    items = raw.items() if isinstance(raw, dict) else raw
    return [(str(k), v.encode() if isinstance(v, str) else v) for k, v in items]


class _Reader:
    """The upstream consumer: every call runs on one executor thread (librdkafka blocks)."""

    def __init__(self, config: SenderConfig) -> None:

        from runtime import kafka  # noqa: PLC0415  as above

        props: dict[str, Any] = dict(config.consumer_properties())
        props.update(
            {
                # Throwaway group, never committed to: the live sender's offsets cannot move.
                "group.id": f"kafka-diode-resend-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A seek below the log start (retention racing us) lands on the log start; the
                # skipped offsets are then reported absent.
                "auto.offset.reset": "earliest",
                "client.id": f"kafka-diode-resend-{config.sender_id}",
            }
        )
        try:
            self.consumer: Consumer = kafka.consumer(props)
        except Exception as exc:  # KafkaException / ValueError from librdkafka's checks
            raise ConfigError(
                "kafka", f"the Kafka client refused the configuration: {exc}"
            ) from exc

    def partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic``; ServiceError when the broker does not answer."""
        from confluent_kafka import KafkaException  # noqa: PLC0415

        from runtime import kafka  # noqa: PLC0415

        try:
            meta = self.consumer.list_topics(topic, timeout=15.0).topics.get(topic)
        except KafkaException as exc:
            raise kafka.error(exc, "upstream Kafka did not answer") from exc
        if meta is None or meta.error is not None:
            raise ServiceError(f"topic {topic!r} does not exist upstream")
        return sorted(meta.partitions)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)``."""
        from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

        from runtime import kafka  # noqa: PLC0415

        try:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=15.0, cached=False
            )
        except KafkaException as exc:
            raise kafka.error(exc, f"cannot read the watermarks of {topic}:{partition}") from exc
        return int(low), int(high)

    def offsets_for_time(self, topic: str, partition: int, ts_ms: int) -> int | None:
        """The first offset with timestamp >= ``ts_ms``, or None."""
        from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

        from runtime import kafka  # noqa: PLC0415

        try:
            (tp,) = self.consumer.offsets_for_times([TopicPartition(topic, partition, ts_ms)], 15.0)
        except KafkaException as exc:
            raise kafka.error(exc, f"offsets_for_times on {topic}:{partition} failed") from exc
        return int(tp.offset) if tp.offset >= 0 else None

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``topic:partition`` from ``offset`` on (the only partition assigned)."""
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        self.consumer.assign([TopicPartition(topic, partition, offset)])

    def consume(self, n: int, timeout: float) -> list[Message]:
        """One batch."""
        return list(self.consumer.consume(n, timeout))

    def close(self) -> None:
        """Close without committing (nothing was ever stored)."""
        self.consumer.close()


class ResendJob:
    """One resend run: plan, read, send, report."""

    def __init__(
        self,
        config: SenderConfig,
        keyring: KeyRing | None,
        *,
        request: ResendRequest,
        bundle: bundle_format.Bundle | None,
        max_skip: int = DEFAULT_MAX_SKIP,
        read_timeout: float = 60.0,
        progress: bool = True,
        out: Callable[[str], None] = print,
    ) -> None:
        self.config = config
        self.keyring = keyring
        self.request = request
        self.bundle = bundle
        self.max_skip = max_skip
        self.read_timeout = read_timeout
        self.progress = progress
        self.out = out
        self.plans: list[PartitionPlan] = []
        self.outcomes: list[PartitionOutcome] = []
        self.session_id = os.urandom(16)
        self.bundle_id = (
            bundle.bundle_id if bundle is not None else f"range-{uuid.uuid4().hex[:16]}"
        )
        self.interrupted = False
        self.complete = False
        self.pipeline: SendPipeline | None = None
        #: The live sender's content filter, so a resend withholds exactly what it would.
        self.record_filter = RecordFilter(config) if config.filtering else None

    # -- planning -----------------------------------------------------------------------------

    def wanted_ranges(self, reader: _Reader) -> list[tuple[str, int, list[tuple[int, int]]]]:
        """``(topic, partition, ranges)`` requested, before clipping to the log."""
        req = self.request
        if self.bundle is not None:
            # A bundle names the far side's topics: read them upstream under their source names
            # (``rename``); the encoder renames them again on the wire.
            source = {far: src for src, far in self.config.topic_map().items()}
            return [
                (source.get(p.topic, p.topic), p.partition, list(p.ranges))
                for p in self.bundle.partitions
            ]
        existing = reader.partitions(req.topic)
        partitions = list(req.partitions) or existing
        missing = [p for p in partitions if p not in existing]
        if missing:
            raise ConfigError("--partition", f"{req.topic} has no partition {missing[0]}")
        if req.from_offset is not None and req.to_offset is not None:
            return [(req.topic, p, [(req.from_offset, req.to_offset)]) for p in partitions]
        assert req.from_time_ms is not None
        out = []
        for p in partitions:
            low, high = reader.watermarks(req.topic, p)
            start = reader.offsets_for_time(req.topic, p, req.from_time_ms)
            end = (
                reader.offsets_for_time(req.topic, p, req.to_time_ms + 1)
                if req.to_time_ms is not None
                else None
            )
            rng = time_range_offsets(start, end, low=low, high=high)
            out.append((req.topic, p, [rng] if rng else []))
        return out

    def plan(self, reader: _Reader) -> None:
        """Clip every requested range to the log as it is now."""
        for topic, partition, ranges in self.wanted_ranges(reader):
            if not ranges:
                continue
            low, high = reader.watermarks(topic, partition)
            plan = plan_partition(
                topic, partition, ranges, low=low, high=high, max_skip=self.max_skip
            )
            self.plans.append(plan)
            self.outcomes.append(PartitionOutcome(plan))
            if plan.expired or plan.beyond_end:
                log.warning(
                    "%s:%d: %d offsets unrecoverable (log is %d..%d): below the log start %s;"
                    " beyond the end %s",
                    topic, partition, plan.unrecoverable_planned, low, high - 1,
                    format_ranges(plan.expired), format_ranges(plan.beyond_end),
                )  # fmt: skip

    @property
    def total_to_read(self) -> int:
        """Offsets inside the log that were asked for."""
        return sum(p.records_to_read for p in self.plans)

    # -- running ------------------------------------------------------------------------------

    def run(self) -> int:
        """Plan, send and report; returns the exit code."""
        service.run(self._run, self.config.loop)
        self.report()
        if self.interrupted or not self.complete:
            return EXIT_FAILED
        if any(o.unrecoverable for o in self.outcomes):
            return EXIT_UNRECOVERABLE
        return EXIT_OK

    async def _run(self) -> None:
        from sender.send_path import open_send_path  # noqa: PLC0415  loaded when running only
        from sender.transport import UdpSender  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        cfg = self.config
        executor = ThreadPoolExecutor(1, thread_name_prefix="resend-reader")
        reader = await loop.run_in_executor(executor, _Reader, cfg)
        udp: UdpSender | None = None
        released = asyncio.Event()
        released.set()

        def on_pressure(congested: bool) -> None:
            if congested:
                released.clear()
            else:
                released.set()

        stop = asyncio.Event()
        signals = contextlib.ExitStack()
        signals.enter_context(service.loop_signals(service.StopRequests(lambda _sig: stop.set())))
        try:
            await loop.run_in_executor(executor, self.plan, reader)
            if self.total_to_read == 0:
                self.complete = True
                return
            path = open_send_path(
                cfg,
                self.session_id,
                self.keyring,
                loop=loop,
                clock=time.monotonic,
                on_pressure=on_pressure,
            )
            udp, announcer = path.udp, path.announcer
            self.pipeline = pipeline = path.pipeline
            log.info(
                "resend %s session %s: %d records from %d partitions -> %s",
                self.bundle_id, self.session_id.hex(), self.total_to_read, len(self.plans),
                ", ".join(f"{h}:{p}" for h, p in cfg.targets()),
            )  # fmt: skip
            self._marker(pipeline, "start", 0)
            announcing = (
                asyncio.ensure_future(announce_loop(announcer, pipeline, time.monotonic))
                if announcer is not None
                else None
            )
            with self._progress_display() as tick:
                ticker = asyncio.ensure_future(self._tick(tick))
                try:
                    reading = asyncio.ensure_future(
                        self._read_all(reader, executor, pipeline, released)
                    )
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({reading, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if stop.is_set() and not reading.done():
                        self.interrupted = True
                        log.warning("interrupted: sending what was read, then stopping")
                        reading.cancel()
                    stopper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reading  # re-raises a reading failure
                    timeout = cfg.shutdown_timeout if self.interrupted else 7 * 24 * 3600.0
                    drained = await pipeline.drain(timeout)
                    self._marker(pipeline, "end", pipeline.records_sent)
                    drained = await pipeline.drain(cfg.shutdown_timeout) and drained
                    self.complete = drained and not self.interrupted
                    if not drained:
                        log.error("datagrams still unsent after the timeout")
                finally:
                    ticker.cancel()
                    if announcing is not None:
                        announcing.cancel()
                    tick()
        finally:
            signals.close()
            if self.pipeline is not None:
                self.pipeline.close()
            if udp is not None:
                udp.close()
            await loop.run_in_executor(executor, reader.close)
            executor.shutdown(wait=False)

    def _marker(self, pipeline: SendPipeline, phase: str, records_sent: int) -> None:
        pipeline.resend_marker(
            bundle_id=self.bundle_id,
            phase=phase,
            ranges=marker_ranges(self.plans),
            records_sent=records_sent,
            sent_at_ms=int(time.time() * 1000),
        )

    async def _read_all(
        self,
        reader: _Reader,
        executor: ThreadPoolExecutor,
        pipeline: SendPipeline,
        released: asyncio.Event,
    ) -> None:
        loop = asyncio.get_running_loop()
        batch_size = self.config.batch_size
        for outcome in self.outcomes:
            plan = outcome.plan
            for first, last in plan.spans:
                await loop.run_in_executor(executor, reader.seek, plan.topic, plan.partition, first)
                position = first
                idle_since = time.monotonic()
                while position <= last:
                    await released.wait()  # backpressure: the pipeline's backlog is bounded
                    batch = await loop.run_in_executor(executor, reader.consume, batch_size, 0.5)
                    if not batch:
                        if time.monotonic() - idle_since > self.read_timeout:
                            raise ServiceError(
                                f"upstream Kafka returned nothing for {self.read_timeout:.0f} s"
                                f" while reading {plan.topic}:{plan.partition} at {position}"
                            )
                        continue
                    idle_since = time.monotonic()
                    pipeline.begin()
                    try:
                        position = self._add_batch(batch, outcome, last, position, pipeline)
                    finally:
                        pipeline.settle()
                    await asyncio.sleep(0)  # let the pump's timers run

    def _add_batch(
        self,
        batch: list[Message],
        outcome: PartitionOutcome,
        last: int,
        position: int,
        pipeline: SendPipeline,
    ) -> int:
        """Add the wanted records of ``batch`` (one burst of the pipeline's entrance, the same
        as live sending); returns the next position to read."""
        from confluent_kafka import KafkaError  # noqa: PLC0415

        plan = outcome.plan
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if msg.partition() != plan.partition or msg.topic() != plan.topic:
                        continue
                    return last + 1  # the end of the log: nothing more in this span
                raise ServiceError(f"reading {plan.topic}:{plan.partition}: {err.str()}")
            if msg.topic() != plan.topic or msg.partition() != plan.partition:
                continue  # left over from an earlier assignment
            offset = msg.offset()
            if offset is None or offset < position:
                continue  # stale message from before the seek
            position = offset + 1
            if offset > last:
                return position
            if not plan.wanted(offset):
                continue
            ts_type, ts = msg.timestamp()
            headers = _headers(msg.headers())
            rf = self.record_filter
            verdict = (
                SEND
                if rf is None
                else rf.decide(plan.topic, plan.partition, offset, msg.key(), msg.value(), headers)
            )
            if verdict == WITHHOLD:
                pipeline.withhold(plan.topic, plan.partition, offset)
                outcome.record_withheld(offset)
                continue
            if verdict != SEND:
                outcome.record_filter_error(offset)
                continue
            try:
                pipeline.record(
                    plan.topic, plan.partition, offset, ts, ts_type,
                    msg.key(), msg.value(), headers,
                )  # fmt: skip
            except (RecordTooLarge, LocalProtocolError) as exc:
                outcome.record_too_large(offset)
                log.error(  # noqa: TRY400  the reason is the message; no traceback wanted
                    "%s:%d@%d not resent: %s", plan.topic, plan.partition, offset, exc
                )
                continue
            outcome.record_sent(offset)
        return position

    # -- progress and report -------------------------------------------------------------------

    @contextlib.contextmanager
    def _progress_display(self) -> Any:
        total = self.total_to_read
        if not self.progress:
            state = {"last": 0.0}

            def log_tick() -> None:
                now = time.monotonic()
                if now - state["last"] >= _PROGRESS_LOG_INTERVAL:
                    state["last"] = now
                    done = self.pipeline.records_sent if self.pipeline else 0
                    log.info("resend progress: %d/%d records sent", done, total)

            yield log_tick
            return
        from rich.console import Console  # noqa: PLC0415  only for the interactive bar
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        started = time.monotonic()
        with Progress(
            TextColumn("resend"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} rec/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            task = bar.add_task("resend", total=total, rate="-")

            def bar_tick() -> None:
                done = self.pipeline.records_sent if self.pipeline else 0
                elapsed = max(time.monotonic() - started, 1e-6)
                bar.update(task, completed=min(done, total), rate=f"{done / elapsed:,.0f}")

            yield bar_tick

    async def _tick(self, tick: Callable[[], None]) -> None:
        while True:
            tick()
            await asyncio.sleep(0.2)

    def report(self) -> None:
        """The final summary: what was sent, then every unrecoverable offset, separately."""
        sent = sum(o.records_sent for o in self.outcomes)
        out = self.out
        out(f"resend {self.bundle_id}: {sent} records sent from {len(self.outcomes)} partitions")
        if self.pipeline is not None:
            p = self.pipeline
            out(
                f"  {p.datagrams_sent} datagrams, {p.bytes_sent} bytes"
                f" (copies={self.config.copies}), {p.datagrams_dropped} refused by the kernel"
            )
        rows = []
        for o in self.outcomes:
            plan = o.plan
            absent = o.absent()
            requested = sum(b - a + 1 for a, b in plan.requested)
            withheld = f"  withheld {o.records_withheld}" if o.withheld else ""
            rows.append(
                f"  {plan.topic}:{plan.partition}  requested {requested}"
                f"  sent {o.records_sent}{withheld}  unrecoverable {o.unrecoverable}"
            )
            if o.unrecoverable:
                if plan.expired:
                    rows.append(
                        f"    deleted upstream (below log start {plan.low}):"
                        f" {format_ranges(plan.expired)}"
                    )
                if plan.beyond_end:
                    rows.append(
                        f"    beyond the log end ({plan.high}): {format_ranges(plan.beyond_end)}"
                    )
                if absent:
                    rows.append(
                        "    not in the log (compacted, transaction markers or deleted meanwhile):"
                        f" {format_ranges(absent)}"
                    )
                if o.too_large:
                    rows.append(f"    over max_record_size: {format_ranges(o.too_large)}")
                if o.filter_errors:
                    rows.append(
                        "    content filter failed or timed out (fix the rule, resend again):"
                        f" {format_ranges(o.filter_errors)}"
                    )
        for row in rows:
            out(row)
        lost = sum(o.unrecoverable for o in self.outcomes)
        if self.interrupted:
            out("INTERRUPTED: not everything was sent; run the same resend again")
        elif not self.complete:
            out("INCOMPLETE: some datagrams were not handed to the socket; run it again")
        if lost:
            out(
                f"UNRECOVERABLE: {lost} offsets cannot be resent (listed above); they stay open"
                " gaps downstream until an operator closes them (docs/resend.md)"
            )
        elif self.complete and not self.interrupted:
            out("all requested records were sent")
