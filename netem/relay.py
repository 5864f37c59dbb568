"""The userspace UDP impairment relay: receive, impair by a profile, forward.

Guarantee: every datagram the relay reads from its socket is submitted to the pure
:class:`~netem.impair.Impairer` in the order the kernel delivered it, so with the same seed and
the same arrival order a run forwards exactly the same datagrams (a failing chaos run repeats).
Datagrams the relay never read (kernel buffer overflow) are invisible to it; a large ``SO_RCVBUF``
(``SO_RCVBUFFORCE`` as root) and draining the socket on every readiness event keep those rare
(docs/design.md, "Receiver: sockets and buffering": the default ``DatagramProtocol`` loses
packets at high rates, ``recv_into`` in a loop does not). Send errors (nothing listening at the
far end, full send buffer) are counted, never raised.

Each datagram is submitted at the time the kernel stamped its arrival (``SO_TIMESTAMPNS``, where
the kernel has it), not the time the relay read it: datagrams that waited in the socket while the
relay was descheduled reach the impairer spread as they arrived, and what the modelled link sent
before each arrival leaves the queue first. A relay that stamped read times would turn its own
stalls into bursts and overflow a ``limit`` the real link never reaches.

Glue only: one reader callback drains the socket into the impairer, then sends what is due and
arms one ``loop.call_at`` timer at ``next_deadline()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.errors import ConfigError, ServiceError
from netem.impair import DEFAULT_MAX_HELD_BYTES, Impairer
from netem.kind_loss import KindLoss
from netem.profile import Profile
from runtime import service

log = logging.getLogger(__name__)

Address = tuple[str, int]

RCVBUF_BYTES = 32 * 1024 * 1024
SNDBUF_BYTES = 8 * 1024 * 1024
MAX_DATAGRAM = 65_535
#: Datagrams read per readiness event before timers get a turn (the reader fires again).
DRAIN_BATCH = 512


def parse_address(key: str, text: str) -> Address:
    """Parse ``HOST:PORT`` (``[v6]:PORT`` for IPv6) into a tuple.

    Raises:
        ConfigError: naming ``key`` when the text is not an address.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(key, f"{text!r} is not HOST:PORT", "write e.g. 127.0.0.1:9000")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104  an empty host means all interfaces, as in bind
    return host, int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# Python's socket module lacks the *BUFFORCE options; these are Linux's values (asm/socket.h).
_LINUX = sys.platform.startswith("linux")
SO_RCVBUFFORCE: int | None = getattr(socket, "SO_RCVBUFFORCE", 33 if _LINUX else None)
SO_SNDBUFFORCE: int | None = getattr(socket, "SO_SNDBUFFORCE", 32 if _LINUX else None)
#: The kernel stamps each datagram with the wall time it arrived (``SCM_TIMESTAMPNS`` is the
#: same number): a relay that reads late (its process descheduled, a burst of sends) still
#: submits each datagram at its arrival, so its stalls do not look like bursts on the link.
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if _LINUX else None)
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)


def _set_buffer(sock: socket.socket, size: int, *, receive: bool) -> int:
    """Ask for ``size`` bytes of buffer, forcing past ``rmem_max`` when privileged."""
    force = SO_RCVBUFFORCE if receive else SO_SNDBUFFORCE
    plain = socket.SO_RCVBUF if receive else socket.SO_SNDBUF
    if force is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, plain, size)
    else:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)
    return sock.getsockopt(socket.SOL_SOCKET, plain)


class _StatsCollector(Collector):
    """Prometheus view of a relay's counters, read at scrape time (no per-datagram cost)."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def collect(self) -> Iterator[Metric]:
        counters = CounterMetricFamily(
            "kafka_diode_netem_datagrams",
            "Datagrams by what the relay did to them",
            labels=["event"],
        )
        for event, value in self._relay.summary_counts().items():
            counters.add_metric([event], value)
        yield counters
        held = GaugeMetricFamily("kafka_diode_netem_held_datagrams", "Datagrams held right now")
        held.add_metric([], self._relay.impairer.held)
        yield held


class Relay:
    """Receive on ``listen``, impair with ``profile``, forward to ``forward``.

    Use ``async with Relay(...) as relay`` or ``await start()`` / ``await stop()`` on a running
    loop (asyncio or uvloop). ``listen_address`` gives the bound address (port 0: the kernel's).
    """

    def __init__(
        self,
        listen: Address,
        forward: Address,
        profile: Profile,
        seed: int | None = None,
        *,
        registry: CollectorRegistry | None = None,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
        rcvbuf: int = RCVBUF_BYTES,
        kind_loss: KindLoss | None = None,
    ) -> None:
        self.listen = listen
        self.kind_loss = kind_loss
        """Loss aimed at one datagram kind before the profile applies (netem/kind_loss.py)."""
        self.forward = forward
        self.profile = profile
        self.impairer = Impairer(profile, seed, max_held_bytes=max_held_bytes)
        self.send_errors = 0
        """Datagrams the kernel refused to send (e.g. ICMP port unreachable, full buffer)."""
        self.rcvbuf = 0
        """The receive buffer the kernel granted, bytes."""
        self._rcvbuf_wanted = rcvbuf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rsock: socket.socket | None = None
        self._ssock: socket.socket | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._bound: Address | None = None
        self._buffer = bytearray(MAX_DATAGRAM)
        self._view = memoryview(self._buffer)
        self._stamped = False
        """Whether the kernel stamps arrivals (``SO_TIMESTAMPNS``) on the listening socket."""
        self._last_arrival = float("-inf")
        if registry is not None:
            registry.register(_StatsCollector(self))

    @property
    def seed(self) -> int:
        """The seed in use (repeat a run with ``--seed``)."""
        return self.impairer.seed

    @property
    def stats(self) -> dict[str, int]:
        """Counters: the impairer's plus ``send_errors`` and ``held``."""
        return self.summary_counts()

    def summary_counts(self) -> dict[str, int]:
        """All counters in one flat dict."""
        counts = self.impairer.stats.as_dict()
        counts["send_errors"] = self.send_errors
        counts["held"] = self.impairer.held
        if self.kind_loss is not None:
            counts["dropped_kind"] = self.kind_loss.dropped
        return counts

    def summary(self) -> dict[str, object]:
        """JSON-ready summary: addresses, profile, seed and counters."""
        host, port = self._bound or self.listen
        return {
            "listen": f"{host}:{port}",
            "forward": f"{self.forward[0]}:{self.forward[1]}",
            "profile": self.profile.to_netem_words() or "clean",
            "seed": self.seed,
            **self.summary_counts(),
        }

    @property
    def listen_address(self) -> Address:
        """The address the relay receives on (after ``start``)."""
        if self._bound is None:
            raise ServiceError("the relay is not started")
        return self._bound

    async def start(self) -> None:
        """Bind, connect the forwarding socket and start relaying on the running loop."""
        if self._rsock is not None:
            return
        loop = asyncio.get_running_loop()
        rsock = socket.socket(_family(self.listen[0]), socket.SOCK_DGRAM)
        ssock = socket.socket(_family(self.forward[0]), socket.SOCK_DGRAM)
        try:
            self.rcvbuf = _set_buffer(rsock, self._rcvbuf_wanted, receive=True)
            _set_buffer(ssock, SNDBUF_BYTES, receive=False)
            rsock.bind(self.listen)
            ssock.connect(self.forward)
        except OSError as exc:
            rsock.close()
            ssock.close()
            raise ServiceError(f"netem relay cannot bind/connect: {exc}") from exc
        rsock.setblocking(False)
        ssock.setblocking(False)
        self._stamped = _stamp_arrivals(rsock)
        self._loop, self._rsock, self._ssock = loop, rsock, ssock
        host, port = rsock.getsockname()[:2]
        self._bound = (str(host), int(port))
        loop.add_reader(rsock.fileno(), self._on_readable)
        log.info(
            "netem relay %s -> %s profile %r seed %d rcvbuf %d",
            self.listen_address,
            self.forward,
            self.profile.to_netem_words() or "clean",
            self.seed,
            self.rcvbuf,
        )

    async def stop(self) -> None:
        """Stop relaying (idempotent); datagrams still held are dropped, not sent."""
        if self._rsock is None or self._loop is None:
            return
        self._loop.remove_reader(self._rsock.fileno())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._rsock.close()
        if self._ssock is not None:
            self._ssock.close()
        self._rsock = self._ssock = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- callbacks ----------------------------------------------------------------------------

    def _on_readable(self) -> None:
        rsock, loop = self._rsock, self._loop
        if rsock is None or loop is None:
            return
        now, wall = loop.time(), time.time()
        submit = self.impairer.submit
        view = self._view
        kind_loss = self.kind_loss
        stamped = self._stamped
        buffers = [view]
        arrival = now
        for _ in range(DRAIN_BATCH):
            try:
                if stamped:
                    n, ancillary, _flags, _address = rsock.recvmsg_into(buffers, _ANCILLARY_BYTES)
                else:
                    n = rsock.recv_into(self._buffer)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # e.g. ICMP errors queued on the socket; keep going
                log.debug("netem relay recv error: %s", exc)
                continue
            data = bytes(view[:n])
            if kind_loss is not None and kind_loss.drops(data):
                continue
            if stamped:
                arrival = self._arrival(ancillary, now, wall)
                # what the link released before this datagram arrived has left its queue
                self._send(self.impairer.due(arrival))
            submit(data, arrival)
        self._release()

    def _arrival(self, ancillary: list[tuple[int, int, bytes]], now: float, wall: float) -> float:
        """The loop time a datagram arrived at, from its kernel stamp: never after ``now`` nor
        before the previous arrival (a wall-clock step moves no datagram out of order)."""
        arrival = now
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                arrival = now - max(0.0, wall - (seconds + nanoseconds * 1e-9))
        arrival = max(arrival, self._last_arrival)
        self._last_arrival = arrival
        return arrival

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._release()

    def _release(self) -> None:
        loop, ssock = self._loop, self._ssock
        if loop is None or ssock is None:
            return
        self._send(self.impairer.due(loop.time()))
        deadline = self.impairer.next_deadline()
        if deadline is None or deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = loop.call_at(deadline, self._on_timer)

    def _send(self, datagrams: list[bytes]) -> None:
        ssock = self._ssock
        if ssock is None:
            return
        for datagram in datagrams:
            try:
                ssock.send(datagram)
            except OSError:  # refused, unreachable, buffer full: a lossy link, not a crash
                self.send_errors += 1


def _stamp_arrivals(sock: socket.socket) -> bool:
    """Ask the kernel to stamp arrivals on ``sock``; False where it cannot."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class RelayThread:
    """A :class:`Relay` on its own event loop in a daemon thread, for synchronous callers."""

    def __init__(
        self,
        listen: Address,
        forward: Address,
        profile: Profile,
        seed: int | None = None,
        *,
        use_uvloop: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.relay = Relay(listen, forward, profile, seed, registry=registry)
        self._use_uvloop = use_uvloop
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="netem-relay", daemon=True)

    @property
    def listen_address(self) -> Address:
        """The bound address of the relay."""
        return self.relay.listen_address

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot of the relay's counters (read from another thread: approximate)."""
        return dict(self.relay.summary_counts())

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread and wait until the relay listens.

        Raises:
            ServiceError: when the relay cannot start within ``timeout``.
        """
        self._thread.start()
        if not self._started.wait(timeout):
            raise ServiceError("netem relay thread did not start in time")
        if self._error is not None:
            raise ServiceError(f"netem relay failed to start: {self._error}") from self._error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the relay and join the thread (idempotent)."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already closed between the checks
                loop.call_soon_threadsafe(stopped.set)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = service.new_loop("uvloop" if self._use_uvloop else "asyncio")
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        try:
            await self.relay.start()
        except (ServiceError, OSError) as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            await self._stopped.wait()
        finally:
            await self.relay.stop()
