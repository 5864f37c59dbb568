"""UDP glue: non-blocking datagram sockets driven by the event loop (uvloop or asyncio).

Guarantee: ``send`` returns ``SENT`` only when the kernel accepted the datagram (the ``sendto``
system call succeeded). That is the meaning of "handed to the socket" in the sender's delivery
order (docs/sender.md): offsets are committed only after every datagram that carries them got
``SENT``.

Why not ``loop.create_datagram_endpoint``: asyncio's datagram transports (and uvloop's) queue a
datagram in user space when the socket would block, without a bound, and report success either
way, so "handed to the socket" would be unknowable and memory unbounded. Here a full socket buffer
is reported as ``BLOCKED`` and the caller waits for writability (``wait_writable``, which uses the
loop's ``add_writer``), keeping the datagram in its own bounded queue.

Errors never stop the sender: a diode has no receiver feedback. ``ECONNREFUSED`` (an ICMP
port-unreachable, seen on loopback or a misconfigured target) is reported by Linux on the *next*
send of a connected socket and that send does not go out, so it is counted and the send retried
once. ``ENOBUFS`` and other ``OSError``s drop the datagram and are counted by kind; the loss will
show up downstream as a gap, which is how the system is designed to surface loss.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import socket
from collections.abc import Callable, Sequence

from common.errors import ConfigError


class SendResult(enum.Enum):
    """Outcome of one ``send`` call."""

    SENT = "sent"
    """The kernel accepted the datagram."""
    BLOCKED = "blocked"
    """The socket buffer is full; call again after ``wait_writable``."""
    DROPPED = "dropped"
    """An error that retrying will not fix soon; the datagram is lost and counted."""


def parse_address(key: str, text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` for IPv6); raise ``ConfigError`` naming ``key``."""
    text = text.strip()
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(key, f"{text!r} has an unclosed '['", "write [v6-address]:port")
        host, port_text = text[1:end], text[end + 1 :].removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    if not port_text:
        if default_port is None:
            raise ConfigError(key, f"{text!r} has no port", "write host:port")
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(key, f"{text!r} has a bad port", "write host:port") from None
    if not 0 <= port <= 65535 or (default_port is None and port == 0):
        raise ConfigError(key, f"port {port} is out of range", "use 1..65535")
    if not host:
        raise ConfigError(key, f"{text!r} has no host", "write host:port")
    return host, port


def resolve(key: str, host: str, port: int) -> tuple[int, tuple[str, int]]:
    """Resolve to ``(family, sockaddr)`` for UDP; raise ``ConfigError`` naming ``key``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(key, f"cannot resolve {host!r}: {exc}", "check the address") from exc
    family, _, _, _, sockaddr = infos[0]
    return family, (str(sockaddr[0]), int(sockaddr[1]))


class UdpSender:
    """Connected, non-blocking UDP sockets, one per target; the caller picks the target.

    Which target a datagram goes to is the send pipeline's decision (``SendPipeline``: one target
    per *message*, so the fragments and copies of a message stay on one receiver socket); this
    class only keeps the sockets and counts errors.
    """

    def __init__(
        self,
        targets: Sequence[tuple[str, int]],
        *,
        bind: tuple[str, int] | None = None,
        send_buffer: int = 0,
        key: str = "target",
    ) -> None:
        """Open one socket per target (resolving names now, at start-up).

        Raises:
            ConfigError: an address does not resolve, or binding fails (names ``key``/``bind``).
        """
        if not targets:
            raise ConfigError(key, "no target address given")
        self.errors: dict[str, int] = {}
        """Send errors by kind (``errno`` name), for metrics; never raised."""
        self.sent = 0
        """Datagrams the kernel accepted."""
        self._socks: list[socket.socket] = []
        self._sends: list[Callable[[bytes], int]] = []
        self._waiting: tuple[asyncio.AbstractEventLoop, int] | None = None
        try:
            for host, port in targets:
                family, sockaddr = resolve(key, host, port)
                sock = socket.socket(family, socket.SOCK_DGRAM)
                self._socks.append(sock)
                sock.setblocking(False)
                if send_buffer:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
                if bind is not None:
                    if len(targets) > 1 and bind[1]:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                    try:
                        sock.bind(bind)
                    except OSError as exc:
                        raise ConfigError("bind", f"cannot bind {bind}: {exc}") from exc
                sock.connect(sockaddr)
        except BaseException:
            self.close()
            raise
        self._sends = [s.send for s in self._socks]

    @property
    def target_count(self) -> int:
        """How many targets (sockets) there are; valid indexes are ``0 .. target_count - 1``."""
        return len(self._sends)

    @property
    def local_addresses(self) -> list[tuple[str, int]]:
        """The bound source address of each socket."""
        return [s.getsockname()[:2] for s in self._socks]

    def _count(self, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        self.errors[name] = self.errors.get(name, 0) + 1

    def send(self, data: bytes, target: int = 0) -> SendResult:
        """Hand one datagram to the socket of ``target``; never raises ``OSError``."""
        try:
            self._sends[target](data)
        except OSError as exc:
            return self._send_failed(target, data, exc)
        self.sent += 1
        return SendResult.SENT

    def _send_failed(self, index: int, data: bytes, exc: OSError) -> SendResult:
        # Kept out of ``send``: the common case is one call, one counter, no loop.
        if isinstance(exc, BlockingIOError):
            return SendResult.BLOCKED
        self._count(exc)
        result = SendResult.DROPPED
        if isinstance(exc, ConnectionRefusedError):
            # A pending ICMP error was reported instead of sending: counted, try once more.
            try:
                self._sends[index](data)
            except BlockingIOError:
                return SendResult.BLOCKED
            except OSError as again:
                self._count(again)
            else:
                self.sent += 1
                result = SendResult.SENT
        return result

    def wait_writable(
        self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None], target: int = 0
    ) -> None:
        """Call ``callback`` once, on the loop, when the socket of ``target`` can take one."""
        fd = self._socks[target].fileno()
        if self._waiting is not None:
            self._waiting[0].remove_writer(self._waiting[1])

        def ready() -> None:
            loop.remove_writer(fd)
            self._waiting = None
            callback()

        self._waiting = (loop, fd)
        loop.add_writer(fd, ready)

    def close(self) -> None:
        """Close every socket (idempotent)."""
        if self._waiting is not None:
            self._waiting[0].remove_writer(self._waiting[1])
            self._waiting = None
        for sock in self._socks:
            sock.close()
        self._socks.clear()
        self._sends = []
