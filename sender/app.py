"""The sender application: Kafka source -> SendPipeline -> UDP, with heartbeats and commits.

Delivery order (the guarantee, docs/sender.md):

1. a batch is consumed on the consumer thread and its records are added to the encoder on the loop;
2. datagrams are handed to the socket by the pipeline's pump, paced, every copy;
3. only then does ``SendPipeline.sent_high`` advance, and only ``sent_high + 1`` is ever committed
   (every ``commit_interval``, on revocation, and at shutdown).

So a crash at any point re-reads from the last commit: every record is sent at least once, and
duplicates are the dedup's job. Every heartbeat names, per partition it reports, the highest offset
sent and the lowest offset this process has read and handed to the encoder (``low_offsets``, kept
for the life of the process, across revocations), so the far side can report the loss of a
session's first records too (docs/protocol.md §5).

Keys: the key file is reloaded on SIGHUP (``reload_keys``) and when its mtime changes (checked
every ``key_check_interval``; the content filter's rules file likewise every
``filter_check_interval``: ``runtime.file_watch``); the encoder uses the ring's active key from its
next message on, in the same session (sequence numbers continue; docs/protocol.md §7.2 says why
that is safe). A file that fails to load leaves the previous ring in use.

What this module holds is wiring and lifecycle, plus the consume loop. The parts it wires: the
send path (``sender/send_path.py``: socket, encoder, ``SendPipeline``, keys), the Kafka source,
the heartbeat's content and schedule (``sender/heartbeat.py``, pure), the stall watchdog
(``sender/stall_watch.py``), the watched files (``runtime/file_watch.py``), the key announcer
(``sender/key_announcer.py``) and the metrics.

``stop()`` (SIGTERM) stops consuming, processes the batch in hand, flushes the encoder, sends
everything (bounded by ``shutdown_timeout``), sends a last heartbeat, commits, closes the
consumer and the sockets. ``stop()`` is idempotent; ``async with`` calls
``start()`` and ``stop()``. A background task that dies sets ``failure`` and wakes ``wait()``
instead of hanging the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, Message

from common.errors import LocalProtocolError
from common.logging import RateLimitedLog
from common.wire import KeyRing, RecordTooLarge
from common.wire.announce import KeyAnnouncer
from runtime import file_watch, link_key
from sender import heartbeat, stall_watch
from sender.config import SenderConfig, load_keyring
from sender.kafka_source import KafkaSource
from sender.key_announcer import announce_loop
from sender.metrics import SenderMetrics
from sender.record_filter import SEND, WITHHOLD, RecordFilter
from sender.send_path import backlog_bound, open_send_path
from sender.send_pipeline import SendPipeline
from sender.transport import UdpSender

log = logging.getLogger(__name__)

_METRICS_INTERVAL = 1.0


class SenderApp:
    """One running sender. Use ``async with SenderApp(config): await app.wait()``."""

    def __init__(
        self,
        config: SenderConfig,
        *,
        keyring: KeyRing | None = None,
        metrics: SenderMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``keyring`` overrides the one the configuration names (tests)."""
        self.config = config
        self._keyring = keyring
        self.metrics = metrics if metrics is not None else SenderMetrics()
        self._clock = clock
        self.session_id = os.urandom(16)
        self.started_at_ms = int(time.time() * 1000)
        self.source: KafkaSource | None = None
        self.pipeline: SendPipeline | None = None
        self._udp: UdpSender | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._consume_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._done = asyncio.Event()
        self.failure: BaseException | None = None
        """The exception that killed a background task, if any."""
        self._pressure: asyncio.Event | None = None
        self._pause_wanted = False
        self._paused = False
        self._ratelog = RateLimitedLog(log)
        self.records_read = 0
        self.bytes_read = 0
        self.heartbeats = 0
        self.commits = 0
        self.errors: dict[str, int] = {}
        """Errors by kind counted here (``record_too_large``, ``bad_record``, consume errors);
        see ``all_errors``."""
        self.low_offsets: dict[tuple[str, int], int] = {}
        """Per partition, the lowest offset read and handed to the encoder in this process (kept
        for the process's life, also after a revocation): the heartbeats' ``low_offsets``."""
        self.keyring: KeyRing | None = None
        """The ring the encoder uses (``None`` in cleartext); ``reload_keys`` swaps it in place."""
        self._key_watch: link_key.KeyFileWatch | None = None
        self._stalls: stall_watch.StallWatch | None = None
        self._reopen_wanted = False
        self.announcer: KeyAnnouncer | None = None
        """Public-key mode: the session-key schedule (owns ``keyring``); None otherwise."""
        self._chain_share = config.chain_share()
        self._chain_counters = config.chain_counters()  # constant: parsed once, sent per beat
        self.records_other_chains = 0
        """Records read and left to the other chains (``chain_mode = share``)."""
        self.record_filter: RecordFilter | None = None
        """The content filter in force (docs/sender.md, "Content filter"); None without one."""

    @property
    def keyring_reloads(self) -> int:
        """Key file reloads that took effect."""
        return self._key_watch.reloads if self._key_watch is not None else 0

    @property
    def stalled(self) -> bool:
        """True while the stall check finds the consumer lagging with nothing read or sent."""
        return self._stalls is not None and self._stalls.stalled

    @property
    def stalls(self) -> int:
        """Stalls found so far (each re-created the consumer)."""
        return self._stalls.stalls if self._stalls is not None else 0

    @property
    def max_backlog_bytes(self) -> int:
        """The backlog bound in force: ``max_backlog_bytes``, raised to 3 s of the byte rate.

        Resuming paused partitions takes librdkafka 0.5-1 s here (the fetch restarts), so the
        low-water mark (half the bound) must hold more than that at the paced rate, or the link
        idles while Kafka wakes up (measured: docs/sender.md, "Backpressure").
        """
        return backlog_bound(self.config)

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> SenderApp:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open sockets, load keys, create the consumer and start the background tasks.

        Raises:
            ConfigError: key file, target or bind address, or Kafka properties are unusable.
        """
        loop = asyncio.get_running_loop()
        cfg = self.config
        if cfg.filtering:
            self.record_filter = RecordFilter(cfg)
            self.metrics.enable_filter()
        # Taken before reading the file: a change meanwhile reloads.
        key_seen = file_watch.mtime(cfg.key_file) if cfg.key_file is not None else None
        shared = None
        if cfg.signing_key_file is None:  # shared-key (or cleartext) mode
            shared = self._keyring if self._keyring is not None else load_keyring(cfg)
        self._pressure = asyncio.Event()
        path = open_send_path(
            cfg,
            self.session_id,
            shared,
            loop=loop,
            clock=self._clock,
            on_pressure=self._on_pressure,
        )
        keyring, announcer = path.keyring, path.announcer
        self.keyring, self.announcer, self._udp = keyring, announcer, path.udp
        if cfg.key_file is not None and keyring is not None:
            self._key_watch = link_key.KeyFileWatch(cfg.key_file, keyring, seen=key_seen)
        self.pipeline = pipeline = path.pipeline
        self.source = source = KafkaSource(
            cfg, loop=loop, committable=lambda: dict(pipeline.sent_high)
        )
        try:
            await source.start()
        except BaseException:
            await self._close_resources()
            raise
        log.info(
            "sender %s session %s -> %s (copies=%d, rate=%s B/s, %s datagrams/s)",
            cfg.sender_id,
            self.session_id.hex(),
            ", ".join(f"{h}:{p}" for h, p in cfg.targets()),
            cfg.copies,
            cfg.rate_bytes or "unlimited",
            cfg.rate_datagrams or "unlimited",
        )
        self._consume_task = self._spawn(self._consume_loop(), "consume")
        self._spawn(self._heartbeat_loop(), "heartbeat")
        self._spawn(self._commit_loop(), "commit")
        if cfg.stall_timeout > 0:
            self._stalls = stall_watch.StallWatch(cfg.stall_timeout, self._clock())
            self._spawn(
                stall_watch.watch(
                    self._stalls,
                    progress=self._progress,
                    lag=lambda: source.lag(fresh=True),
                    on_stall=self._on_stall,
                    clock=self._clock,
                ),
                "stall-check",
            )
        if announcer is not None:
            self._spawn(announce_loop(announcer, pipeline, self._clock), "announce")
        if self._key_watch is not None and cfg.key_check_interval > 0:
            self._spawn(
                file_watch.poll(self._key_watch, cfg.key_check_interval, "key file changed"),
                "key-check",
            )
        if self.record_filter is not None and cfg.filter_check_interval > 0 and cfg.filter_file:
            self._spawn(
                file_watch.poll(
                    self.record_filter.file, cfg.filter_check_interval, "filter file changed"
                ),
                "filter-check",
            )

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self.failure is None:
            log.error("sender task %s failed", task.get_name(), exc_info=exc)
            self.failure = exc
            self._done.set()

    async def wait(self) -> None:
        """Return when the sender stopped or a background task failed (see ``failure``)."""
        await self._done.wait()

    async def stop(self) -> bool:
        """Stop gracefully: drain, send, commit, close. Idempotent.

        Returns:
            True when everything consumed was sent and committed before ``shutdown_timeout``.
        """
        if self._stopping:
            await self._stopped.wait()
            return True
        self._stopping = True
        clean = True
        try:
            if self._consume_task is not None:
                if self._pressure is not None:
                    self._pressure.set()  # wake a consume loop that waits for resume
                with contextlib.suppress(Exception):
                    await self._consume_task
            for task in self._tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.pipeline is not None and self.failure is None:
                clean = await self.pipeline.drain(self.config.shutdown_timeout)
                self._send_heartbeat()
                clean = await self.pipeline.drain(5.0) and clean
                if not clean:
                    log.error(
                        "shutdown: datagrams still unsent after %.0f s; not committing them",
                        self.config.shutdown_timeout,
                    )
                clean = await self._commit() and clean
            self.sync_metrics()
        finally:
            try:
                await self._close_resources()
            finally:
                # Always released, so a second stop() (or wait()) never hangs on a failed first.
                self._stopped.set()
                self._done.set()
        return clean

    async def _close_resources(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
        if self.source is not None:
            await self.source.close()
        if self._udp is not None:
            self._udp.close()

    # -- consuming ------------------------------------------------------------------------------

    def _on_pressure(self, congested: bool) -> None:
        self._pause_wanted = congested
        if self._pressure is not None:
            self._pressure.set()

    async def _apply_pressure(self) -> None:
        assert self.source is not None
        if self._pause_wanted and not self._paused:
            await self.source.pause_all()
            self._paused = True
        elif not self._pause_wanted and self._paused:
            await self.source.resume_all()
            self._paused = False

    async def _consume_loop(self) -> None:
        source, pipeline = self.source, self.pipeline
        assert source is not None
        assert pipeline is not None
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
                await self._apply_pressure()
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

    # -- heartbeats (what they say and when: sender/heartbeat.py) ------------------------------

    def counters(self) -> dict[str, int]:
        """The counters a heartbeat carries."""
        p = self.pipeline
        return {
            "records_read": self.records_read,
            "records_sent": p.records_sent if p else 0,
            "datagrams_sent": p.datagrams_sent if p else 0,
            "bytes_sent": p.bytes_sent if p else 0,
            "records_skipped": self.errors.get("record_too_large", 0),
            "records_withheld": self.record_filter.withheld_total if self.record_filter else 0,
            **self._chain_counters,
            "send_errors": p.datagrams_dropped if p else 0,
        }

    def _send_heartbeat(self) -> None:
        pipeline = self.pipeline
        if pipeline is None:
            return
        pipeline.heartbeat(
            heartbeat.assemble(
                sender_id=self.config.sender_id,
                started_at_ms=self.started_at_ms,
                sent_at_ms=int(time.time() * 1000),
                sent_high=pipeline.sent_high,
                low_offsets=self.low_offsets,
                assigned=self.source.assignment() if self.source is not None else set(),
                final=self._stopping,
                counters=self.counters(),
            )
        )
        self.heartbeats += 1

    async def _heartbeat_loop(self) -> None:
        schedule = heartbeat.HeartbeatSchedule(self.config.heartbeat_interval)
        while True:
            pipeline = self.pipeline
            if schedule.tick(
                self._clock(), control_pending=pipeline.control_pending if pipeline else 0
            ):
                self._send_heartbeat()
            await asyncio.sleep(schedule.delay(self._clock()))

    # -- keys and the rules file (SIGHUP; the periodic checks are runtime.file_watch.poll) ------

    def reload_keys(self, why: str = "SIGHUP") -> bool:
        """Re-read the key file and swap the ring in place; keep the old ring on failure.

        The encoder reads the ring's active key per message, so datagrams built from now on use
        the new active key; datagrams already queued keep theirs. The session (and its sequence
        numbers) continues: nonces are per (key, session) and sequences never repeat in a session.

        Returns:
            True when a new ring is in use.
        """
        watch = self._key_watch
        if watch is None:
            log.info("%s: no key file configured, nothing to reload", why)
            return False
        return watch.reload(why)

    def reload(self, why: str = "SIGHUP") -> None:
        """SIGHUP: re-read the key file and the content filter's rules file (each when set)."""
        if self._key_watch is not None or self.record_filter is None:
            self.reload_keys(why)
        if self.record_filter is not None:
            self.record_filter.reload(why)

    # -- commits and metrics ----------------------------------------------------------------------

    async def _commit(self) -> bool:
        if self.source is None or self.pipeline is None:
            return True
        offsets = {tp: o + 1 for tp, o in self.pipeline.sent_high.items()}
        ok = await self.source.commit(offsets)
        if ok and offsets:
            self.commits += 1
        return ok

    async def _commit_loop(self) -> None:
        last_metrics = 0.0
        while True:
            await asyncio.sleep(min(self.config.commit_interval, _METRICS_INTERVAL))
            now = self._clock()
            await self._commit()
            if now - last_metrics >= _METRICS_INTERVAL:
                last_metrics = now
                if self.source is not None:
                    self.metrics.set_lag(await self.source.lag())
                self.sync_metrics()

    # -- the stall watchdog's hooks ------------------------------------------------------------

    def _progress(self) -> tuple[int, int] | None:
        if self.pipeline is None or self.source is None:
            return None
        return (self.records_read, self.pipeline.records_sent)

    def _on_stall(self, _stall: stall_watch.Stall) -> None:
        """Re-create the Kafka consumer (the consume loop does it between batches)."""
        self._reopen_wanted = True
        if self._pressure is not None:
            self._pressure.set()
        self.sync_metrics()

    def all_errors(self) -> dict[str, int]:
        """Every error counter by kind: ours, the source's and the socket's."""
        out = dict(self.errors)
        if self._key_watch is not None and self._key_watch.reload_errors:
            out["keyring_reload"] = self._key_watch.reload_errors
        if self.source is not None:
            for kind, n in self.source.errors.items():
                out[kind] = out.get(kind, 0) + n
        if self._udp is not None:
            for name, n in self._udp.errors.items():
                out[f"send_{name.lower()}"] = n
        return out

    def sync_metrics(self) -> None:
        """Copy the running totals into the Prometheus registry."""
        p = self.pipeline
        totals: dict[str, float] = {
            "records_read": self.records_read,
            "bytes_read": self.bytes_read,
            "heartbeats_sent": self.heartbeats,
            "records_other_chains": self.records_other_chains,
            "commits": self.commits,
            "keyring_reloads": self.keyring_reloads,
            "paused": 1.0 if self._paused else 0.0,
            "stalled": 1.0 if self.stalled else 0.0,
            "stalls": self.stalls,
        }
        if self.announcer is not None:
            totals["announcements_sent"] = self.announcer.announcements
            totals["session_keys"] = self.announcer.keys_made
        if p is not None:
            totals.update(
                records_sent=p.records_sent,
                bytes_sent=p.bytes_sent,
                datagrams_sent=p.datagrams_sent,
                copies_sent=p.copies_sent,
                fec_blocks=p.fec.blocks if p.fec is not None else 0,
                fec_repairs=p.fec.repairs if p.fec is not None else 0,
                pacing_delay=p.pacing_delay,
                backlog_bytes=p.backlog_bytes,
            )
        self.metrics.sync(totals, self.all_errors())
        rf = self.record_filter
        if rf is not None:
            self.metrics.sync_filter(rf.withheld, rf.reloads, rf.reload_errors)
