"""``kafka-diode receive``: UDP datagrams in, raw topic records out (thin asyncio glue).

Theory of operation (one process, one event loop, one decoder)::

    socket(s) --readable--> SocketDrainer: recv until EAGAIN (bounded per wakeup)
        --bytes--> Decoder.receive_datagram(data, now) --events-->
            RecordBatch -> RawTopicSink.write_batch   (records join their partition's open run;
                           finished runs: produce, or backlog, or overflow)
            Heartbeat   -> RawTopicSink.write_heartbeat (the partition's open runs first)
            Withheld    -> RawTopicSink.write_withheld (offsets a content filter held back)
            Dropped     -> drops[reason] += 1, rate-limited log
        after each burst: RawTopicSink.service (producer.poll(0) at most every 5 ms, lingered
            runs produced, finished metadata lookups applied, backlog drain), re-arm the timer
    timer: the earliest of the reassembly deadlines and the oldest open run's linger (run_linger)
    every 50 ms: RawTopicSink.service (delivery reports while idle)
    every 1 s:   metadata lookup starts and refreshes, loss reports, kernel drop counters,
                 key file mtime

Nothing on this path blocks: the decoder is pure, ``produce()`` raises ``BufferError`` instead of
waiting, metadata lookups run on a thread. Untrusted input never raises out of the decoder; an
unexpected exception while handling one datagram is logged (rate-limited), counted as
``internal_error`` and the loop goes on, so hostile traffic cannot stop the process.

Shutdown (SIGTERM, SIGINT): stop reading and close the sockets, flush the producer for at most
``shutdown_timeout`` seconds, report anything left as lost ranges, print a JSON summary, exit 0. A
second SIGINT exits at once. SIGHUP reloads the key ring (as does a change of the key file's
modification time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from common.errors import ConfigError
from common.logging import RateLimitedLog
from common.wire import (
    Dropped,
    DropReason,
    Heartbeat,
    KeyRing,
    RecordBatch,
    ResendMarker,
    Withheld,
    coalesced_segment,
    message_goes_on,
)
from common.wire.decoder import Decoder
from common.wire.fec import REPAIR_KIND_BYTE, FecDecoder, FecLimits, is_repair
from common.wire.pubkey_decoder import KeyLearned, KeyRetired
from receiver.config import ReceiverConfig
from receiver.kafka_sink import RawTopicSink
from receiver.metrics import (
    MAX_SESSION_LABELS,
    SOCKET_ERROR,
    Gauges,
    ReceiverStats,
    make_registry,
)
from receiver.pubkey_glue import PublicKeyGlue
from receiver.singles import decode_singles
from receiver.topic_check import check_template, ensure_raw_topic, raw_topic_problem
from receiver.transport import SocketDrainer, log_rcvbuf, open_udp_socket
from runtime import file_watch, key_files, link_key, metrics_http, service

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal_error"
_SERVICE_INTERVAL = 0.05
_TICK_INTERVAL = 1.0
#: Per drop reason: its metric label and its rate-limited log key, computed once (formatting an
#: enum per dropped datagram was a measurable part of a hostile flood's cost).
_DROP_LABELS: dict[DropReason, tuple[str, str]] = {r: (str(r), f"drop:{r}") for r in DropReason}


class Receiver:
    """One receiver process: sockets, decoder, producer, metrics. Use :meth:`run`."""

    def __init__(
        self, config: ReceiverConfig, *, reuse_port: bool | None = None, worker: int | None = None
    ) -> None:
        self.config = config
        self.stats = ReceiverStats()
        self._reuse_port = config.sockets > 1 if reuse_port is None else reuse_port
        self._worker = worker
        self._rlog = RateLimitedLog(log)
        self._keyring: KeyRing | None = None
        self._key_watch: link_key.KeyFileWatch | None = None
        if config.key_file is not None:
            seen = file_watch.mtime(config.key_file)  # before reading: a change meanwhile reloads
            self._keyring = key_files.read_keyring(config.key_file)
            self._key_watch = link_key.KeyFileWatch(config.key_file, self._keyring, seen=seen)
        wire = config.wire_config()
        self._pk: PublicKeyGlue | None = None
        if config.receiver_key_file is not None:  # public-key mode (receiver/pubkey_glue.py)
            self._pk = PublicKeyGlue(config, wire)
        self._decoder = self._pk.decoder if self._pk else Decoder(wire, self._keyring)
        # FEC needs no setting: repairs say everything on the wire (docs/receiver.md, "Forward
        # error correction").
        # It shares the decoder's key ring: in public-key mode that ring learns the announced
        # session keys in place, so repairs under them authenticate too.
        self.fec = FecDecoder(
            FecLimits(
                replay_window=wire.replay_window,
                max_sessions=wire.max_sessions,
                allow_cleartext=wire.allow_cleartext,
            ),
            self._decoder.keyring,
        )
        self._sink: RawTopicSink | None = None
        self._drainers: list[SocketDrainer] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._service_handle: asyncio.TimerHandle | None = None
        self._last_tick = 0.0
        self._next_key_check = 0.0
        self._rcvbuf = 0
        self.addresses: list[tuple[str, int]] = []
        """Bound (host, port) of every socket, known once :meth:`run` has started reading."""

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(
        self, stop: asyncio.Event, *, on_ready: Callable[[Receiver], None] | None = None
    ) -> dict[str, object]:
        """Receive until ``stop`` is set; flush; return the exit summary."""
        loop = self._loop = asyncio.get_running_loop()
        sink = self._sink = RawTopicSink(
            self.config,
            self.stats,
            topic_check=raw_topic_problem,
            topic_ensure=ensure_raw_topic if self.config.create_raw_topic else None,
        )
        gauges = Gauges(
            reassemblies_in_flight=lambda: self._decoder.reassemblies_in_flight,
            producer_queue=lambda: sink.queued,
            backlog_records=lambda: sink.backlog_records,
            rcvbuf_bytes=lambda: self._rcvbuf,
            held_datagrams=lambda: self._pk.decoder.held if self._pk else 0,
            sockets=lambda: [
                (d.port, d.datagrams, d.kernel_drops, d.coalesced) for d in self._drainers
            ],
            fec=self._fec_counters,
            fec_margin=lambda: (list(self.fec.margin_used), self.fec.margin_used_sum),
            coalesced_messages=lambda: self._decoder.coalesced_messages,
        )
        if "{topic}" not in self.config.raw_topic:
            raw = self.config.raw_topic
            try:  # before the sink's first lookup, which a broker may answer by auto-creating it
                await loop.run_in_executor(None, ensure_raw_topic, self.config, raw)
            except ConfigError:
                await sink.close(0)
                raise
            sink.checked_elsewhere.add(raw)  # below, where a problem stops the start-up
            if not await sink.wait_metadata(raw, self.config.metadata_timeout):
                sink.checked_elsewhere.discard(raw)  # checked when it appears
                log.warning(
                    "raw topic %s not reachable at %s yet; records wait in the backlog (up to "
                    "%d) until it is",
                    raw,
                    self.config.bootstrap_servers,
                    self.config.backlog_max_records,
                )
            else:
                problem = await loop.run_in_executor(None, raw_topic_problem, self.config, raw)
                if problem is not None:
                    await sink.close(0)
                    raise ConfigError(f"raw topic {raw}", problem)
        else:
            # a {topic} template: each raw topic is made when its first record arrives
            # (receiver/kafka_sink.py); a replication the cluster cannot give, or an existing
            # topic it names that is too narrow, stops us now
            try:
                found = await loop.run_in_executor(None, check_template, self.config)
            except ConfigError:
                await sink.close(0)
                raise
            sink.checked_elsewhere.update(found)
        try:
            self._open_sockets()
            for drainer in self._drainers:
                drainer.start(loop)
            # Only now: a /metrics that answers means the sockets are bound and read (a
            # supervisor or test that waits for it may start sending at once).
            metrics_http.serve(
                make_registry(self.stats, gauges),
                self.config.metrics_port,
                self.config.metrics_addr,
            )
            self._service_handle = loop.call_later(_SERVICE_INTERVAL, self._service)
            log.info(
                "%sreceiving on %s -> %s (raw topic %s)",
                "" if self._worker is None else f"worker {self._worker}: ",
                ", ".join(f"{h}:{p}" for h, p in self.addresses),
                self.config.bootstrap_servers,
                self.config.raw_topic,
            )
            if on_ready is not None:
                on_ready(self)
            await stop.wait()
        finally:
            for drainer in self._drainers:
                drainer.close()
            if self._timer is not None:
                self._timer.cancel()
            if self._service_handle is not None:
                self._service_handle.cancel()
        lost = await sink.close(self.config.shutdown_timeout)
        summary = {
            **self.stats.snapshot(),
            "fec": self._fec_counters(),
            "lost_at_shutdown": lost,
        }
        log.info("receiver stopped: %s", json.dumps(summary))
        return summary

    def _fec_counters(self) -> dict[str, int]:
        fec = self.fec
        return {
            "blocks_complete": fec.blocks_complete,
            "blocks_recovered": fec.blocks_recovered,
            "datagrams_reconstructed": fec.datagrams_reconstructed,
            "blocks_unrecoverable": fec.blocks_unrecoverable,
            "repairs_received": fec.repairs_received,
            "repairs_unused": fec.repairs_unused,
        }

    def _open_sockets(self) -> None:
        cfg = self.config
        for wanted in cfg.ports():
            bound = wanted  # port 0: the sockets after the first share the port it was given
            for _ in range(cfg.sockets):
                self._open_socket(bound)
                bound = self.addresses[-1][1]

    def _open_socket(self, port: int) -> None:
        cfg = self.config
        sock, granted = open_udp_socket(
            cfg.listen_host,
            port,
            reuse_port=self._reuse_port,
            rcvbuf=cfg.rcvbuf_bytes,
            gro=cfg.udp_gro,
        )
        if not self.addresses:
            self._rcvbuf = granted
            log_rcvbuf(cfg.rcvbuf_bytes, granted)
        host, port = sock.getsockname()[:2]
        self.addresses.append((host, port))
        self._drainers.append(
            SocketDrainer(
                sock,
                self._on_datagram,
                self._after_burst,
                max_per_wakeup=cfg.max_datagrams_per_wakeup,
                pause=cfg.read_pause,
                on_error=self._on_socket_error,
                on_coalesced=self._on_coalesced,
                segment_of=coalesced_segment,
                goes_on=message_goes_on,
            )
        )

    # -- hot path -----------------------------------------------------------------------------

    def _on_datagram(self, data: bytes) -> None:
        stats = self.stats
        stats.datagrams += 1
        stats.bytes += len(data)
        decoder = self._decoder
        assert self._loop is not None
        try:
            now = self._loop.time()
            if data[5:6] == REPAIR_KIND_BYTE and is_repair(data):
                self._decode_rebuilt(self.fec.receive_repair(data, now), now)
            else:
                authenticated = decoder.authenticated
                decoder.receive_datagram(data, now)
                if decoder.authenticated != authenticated:  # only authentic sources join blocks
                    rebuilt = self.fec.add_source(data, now)
                    if rebuilt:
                        self._decode_rebuilt(rebuilt, now)
            self._drain_events(now)
        except Exception:  # noqa: BLE001  hostile input must never stop the receiver (logged)
            self._on_internal_error()

    def _on_coalesced(self, data: bytes, segment: int) -> None:
        """A UDP GRO read of several datagrams: each fragmented message whole in one call
        (``Decoder.receive_coalesced``), every other datagram as ``_on_datagram`` takes it.

        While an FEC block waits for a source, every datagram goes one by one: a source can
        then rebuild others, and their decode comes right after it, as without GRO."""
        stop = len(data)
        start = 0
        if not self.fec.awaiting_sources:
            decoder, stats, fec = self._decoder, self.stats, self.fec
            assert self._loop is not None
            now = self._loop.time()
            while start < stop:
                try:
                    used = decoder.receive_coalesced(data, start, segment, now)
                    if used:
                        stats.datagrams += -(-used // segment)
                        stats.bytes += used
                        rebuilt = fec.add_sources(data, start, start + used, segment, now)
                        if rebuilt:
                            self._decode_rebuilt(rebuilt, now)
                        self._drain_events(now)
                except Exception:  # noqa: BLE001  as in _on_datagram: never stop the receiver
                    self._on_internal_error()
                    used = 0
                if not used:
                    break
                start += used
            if start < stop:
                start = self._on_singles(data, start, segment)
        for at in range(start, stop, segment):
            self._on_datagram(data[at : at + segment])

    def _on_singles(self, data: bytes, start: int, segment: int) -> int:
        """The datagrams of a GRO read from ``start`` on, each decoded as ``_on_datagram``
        decodes it, up to the first repair (``receiver.singles.decode_singles``), with the
        clock, counters and event drain once per read; returns where it stopped (the caller
        hands the rest to ``_on_datagram`` one by one). Only while no FEC block waits for a
        source: the caller checked."""
        stats = self.stats
        assert self._loop is not None
        now = self._loop.time()
        at = decode_singles(
            self._decoder, self.fec, data, start, segment, now, self._on_internal_error
        )
        stats.datagrams += -(-(at - start) // segment)
        stats.bytes += at - start
        try:
            self._drain_events(now)
        except Exception:  # noqa: BLE001  as in _on_datagram: never stop the receiver
            self._on_internal_error()
        return at

    def _on_internal_error(self) -> None:
        """An exception while handling input (a bug): counted, logged (rate-limited)."""
        self.stats.drop(INTERNAL_ERROR)
        self._rlog.warning(
            "internal", "internal error while handling a datagram (a bug)", exc_info=True
        )

    def _decode_rebuilt(self, rebuilt: list[bytes], now: float) -> None:
        """Reconstructed datagrams take the normal path (GCM, replay window) like any other."""
        for datagram in rebuilt:
            self._decoder.receive_datagram(datagram, now)
        for reason, detail in self.fec.pop_drops():
            self.stats.drop(str(reason))
            self._rlog.warning(f"drop:{reason}", "dropped repair: %s: %s", reason, detail)

    def _drain_events(self, now: float) -> None:
        decoder, sink, stats = self._decoder, self._sink, self.stats
        assert sink is not None
        while (event := decoder.next_event()) is not None:
            kind = type(event)
            if kind is RecordBatch:
                assert isinstance(event, RecordBatch)
                stats.records += event.count  # not len(records): builds no Records
                sink.write_batch(event, now)
            elif kind is Dropped:
                assert isinstance(event, Dropped)
                self._on_dropped(event)
            elif kind is Heartbeat:
                assert isinstance(event, Heartbeat)
                stats.heartbeats += 1
                sink.write_heartbeat(event, now)
            elif kind is ResendMarker:
                assert isinstance(event, ResendMarker)
                stats.resend_markers += 1
                # rate-limited: markers come from the wire (a sender repeats them, and so
                # can anybody who holds the key)
                self._rlog.info(
                    "resend-marker",
                    "resend %s %s from session %s (%d ranges, %d records sent)",
                    event.bundle_id,
                    event.phase,
                    event.session_id.hex(),
                    len(event.ranges),
                    event.records_sent,
                )
            elif kind is Withheld:
                assert isinstance(event, Withheld)
                stats.withheld_ranges += len(event.ranges)
                sink.write_withheld(event)
            elif isinstance(event, KeyLearned | KeyRetired):  # public-key mode only
                assert self._pk is not None
                self._pk.on_event(event)
                self.stats.session_keys_learned = self._pk.keys_learned

    def _on_dropped(self, event: Dropped) -> None:
        reason = event.reason
        label, log_key = _DROP_LABELS[reason]
        drops = self.stats.drops
        drops[label] = drops.get(label, 0) + 1
        if reason is DropReason.DUPLICATE:
            return  # redundant copies are expected, not worth a line
        self._rlog.warning(
            log_key,
            "dropped %s: %s (session %s)",
            label,
            event.detail,
            event.session_id.hex() if event.session_id else "-",
        )

    def _after_burst(self) -> None:
        try:
            assert self._sink is not None
            assert self._loop is not None
            self._sink.service(self._loop.time())
            self._arm_timer()
        except Exception:  # never let a bug in the glue unregister the reader
            self.stats.drop(INTERNAL_ERROR)
            log.exception("internal error after a burst")

    def _on_socket_error(self, exc: OSError) -> None:
        self.stats.drop(SOCKET_ERROR)
        self._rlog.warning("socket", "socket read failed: %s", exc)

    # -- timers -------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        assert self._sink is not None
        deadlines = [
            d
            for d in (
                self._decoder.next_deadline(),
                self.fec.next_deadline(),
                self._sink.next_deadline(),  # run_linger: a run is written without more traffic
            )
            if d is not None
        ]
        if not deadlines:
            return
        deadline = min(deadlines)
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        assert self._loop is not None
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        assert self._loop is not None
        try:
            now = self._loop.time()
            self._decoder.handle_timer(now)
            self.fec.handle_timer(now)
            self._decode_rebuilt([], now)
            self._drain_events(now)
            assert self._sink is not None
            self._sink.flush_runs(now)
            self._arm_timer()
        except Exception:
            self.stats.drop(INTERNAL_ERROR)
            log.exception("internal error in the reassembly timer")

    def _service(self) -> None:
        assert self._loop is not None
        assert self._sink is not None
        now = self._loop.time()
        try:
            self._sink.service(now)
            if now - self._last_tick >= _TICK_INTERVAL:
                self._last_tick = now
                self._tick(now)
        except Exception:
            self.stats.drop(INTERNAL_ERROR)
            log.exception("internal error in the service timer")
        self._service_handle = self._loop.call_later(_SERVICE_INTERVAL, self._service)

    def _tick(self, now: float) -> None:
        assert self._sink is not None
        self._sink.tick(now)
        self.stats.kernel_drops = sum(d.refresh_kernel_drops() for d in self._drainers)
        sequences = self._decoder.last_sequence
        if sequences:
            items = list(sequences.items())[-MAX_SESSION_LABELS:]
            self.stats.last_sequence = {sid.hex(): seq for sid, seq in items}
        interval = self.config.key_check_interval
        if self._pk is not None:
            check = interval > 0 and now >= self._next_key_check
            if check:
                self._next_key_check = now + interval
            self._pk.tick(time.time() * 1000.0, now, check_files=check)
        if self._key_watch is not None and interval > 0 and now >= self._next_key_check:
            self._next_key_check = now + interval
            if self._key_watch.changed():
                self.reload_keys("key file changed")

    def reload_keys(self, why: str) -> None:
        """Re-read the key file and swap the ring in place; keep the old ring on failure."""
        if self._pk is not None:
            self._pk.reload(why)
            return
        if self._key_watch is None:
            log.info("%s: no key file configured, nothing to reload", why)
            return
        if self._key_watch.reload(why):
            self.stats.keyring_reloads += 1
        else:
            self.stats.keyring_reload_errors += 1


def run(
    config: ReceiverConfig, *, reuse_port: bool | None = None, worker: int | None = None
) -> int:
    """Run one receiver in this process until SIGTERM/SIGINT; the process exit code."""
    receiver = Receiver(config, reuse_port=reuse_port, worker=worker)

    async def main() -> dict[str, object]:
        stop = asyncio.Event()

        def on_stop(signame: str) -> None:
            log.info("%s: stopping (flushing for at most %.0f s)", signame, config.shutdown_timeout)
            stop.set()

        requests = service.StopRequests(on_stop, again="exiting without flushing")
        with service.loop_signals(requests, reload=receiver.reload_keys):
            return await receiver.run(stop)

    try:
        summary = service.run(main, config.event_loop)
    except ConfigError as exc:  # found at start-up, before any socket was opened
        log.error("configuration error: %s", exc)  # noqa: TRY400  the message says it all
        print(f"kafka-diode receive: configuration error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"receiver_summary": summary, "worker": worker}), flush=True)
    return 0


def run_workers(config: ReceiverConfig) -> int:
    """One process per socket (``worker_processes``); SIGTERM/SIGINT/SIGHUP are forwarded."""
    import multiprocessing  # noqa: PLC0415  only this mode needs it

    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(config.for_worker(i), i),
            name=f"receiver-worker-{i}",
        )
        for i in range(config.socket_count())
    ]
    for proc in procs:
        proc.start()

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    codes = []
    for proc in procs:
        proc.join()
        codes.append(proc.exitcode or 0)
    return max(codes, default=0)


def _worker_main(config: ReceiverConfig, index: int) -> None:
    from common import logging as common_logging  # noqa: PLC0415  fresh interpreter (spawn)

    common_logging.configure(config.log_level, json_format=config.log_json)
    sys.exit(run(config, reuse_port=True, worker=index))
