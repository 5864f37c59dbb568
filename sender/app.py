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

What this module holds is wiring and lifecycle. The parts it wires: the send path
(``sender/send_path.py``: socket, encoder, ``SendPipeline``, keys), the Kafka source and the
loop that feeds the pipeline from it (``sender/source_feed.py``, the hot loop), the heartbeat's
content and schedule (``sender/heartbeat.py``, pure), the stall watchdog
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
from collections.abc import Callable
from types import TracebackType
from typing import Any

from common.wire import KeyRing
from common.wire.announce import KeyAnnouncer
from runtime import file_watch, link_key
from sender import heartbeat, stall_watch
from sender.config import SenderConfig, load_keyring
from sender.kafka_source import KafkaSource
from sender.key_announcer import announce_loop
from sender.metrics import SenderMetrics
from sender.record_filter import RecordFilter
from sender.send_path import backlog_bound, open_send_path
from sender.send_pipeline import SendPipeline
from sender.source_feed import SourceFeed
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
        self.feed = SourceFeed(config, record_filter=None, clock=clock)
        """Kafka batches into the pipeline; what was read (``records_read``, ``low_offsets``)."""
        self.heartbeats = 0
        self.commits = 0
        self.keyring: KeyRing | None = None
        """The ring the encoder uses (``None`` in cleartext); ``reload_keys`` swaps it in place."""
        self._key_watch: link_key.KeyFileWatch | None = None
        self._stalls: stall_watch.StallWatch | None = None
        self.announcer: KeyAnnouncer | None = None
        """Public-key mode: the session-key schedule (owns ``keyring``); None otherwise."""
        self._chain_counters = config.chain_counters()  # constant: parsed once, sent per beat
        self.record_filter: RecordFilter | None = None
        """The content filter in force (docs/sender.md, "Content filter"); None without one."""

    @property
    def records_read(self) -> int:
        """Records read and handed to the pipeline (sent or withheld)."""
        return self.feed.records_read

    @property
    def low_offsets(self) -> dict[tuple[str, int], int]:
        """Per partition, the lowest offset this process read (the heartbeats' low offsets)."""
        return self.feed.low_offsets

    @property
    def paused(self) -> bool:
        """True while backpressure pauses every partition."""
        return self.feed.paused

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
            self.record_filter = self.feed.record_filter = RecordFilter(cfg)
            self.metrics.enable_filter()
        # Taken before reading the file: a change meanwhile reloads.
        key_seen = file_watch.mtime(cfg.key_file) if cfg.key_file is not None else None
        shared = None
        if cfg.signing_key_file is None:  # shared-key (or cleartext) mode
            shared = self._keyring if self._keyring is not None else load_keyring(cfg)
        path = open_send_path(
            cfg,
            self.session_id,
            shared,
            loop=loop,
            clock=self._clock,
            on_pressure=self.feed.on_pressure,
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
        self._consume_task = self._spawn(self.feed.run(source, pipeline), "consume")
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
        self.feed.stop()
        clean = True
        try:
            if self._consume_task is not None:
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

    # -- heartbeats (what they say and when: sender/heartbeat.py) ------------------------------

    def counters(self) -> dict[str, int]:
        """The counters a heartbeat carries."""
        p = self.pipeline
        return {
            "records_read": self.records_read,
            "records_sent": p.records_sent if p else 0,
            "datagrams_sent": p.datagrams_sent if p else 0,
            "bytes_sent": p.bytes_sent if p else 0,
            "records_skipped": self.feed.errors.get("record_too_large", 0),
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
        self.feed.reopen_soon()
        self.sync_metrics()

    def all_errors(self) -> dict[str, int]:
        """Every error counter by kind: ours, the source's and the socket's."""
        out = dict(self.feed.errors)
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
            "records_read": self.feed.records_read,
            "bytes_read": self.feed.bytes_read,
            "heartbeats_sent": self.heartbeats,
            "records_other_chains": self.feed.records_other_chains,
            "commits": self.commits,
            "keyring_reloads": self.keyring_reloads,
            "paused": 1.0 if self.feed.paused else 0.0,
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
                send_calls=p.send_calls,
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
