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

UDP GSO (``send_run``, Linux 4.18+): a run of datagrams of one size (the last may be shorter) goes
to the kernel in one ``sendmsg`` with the ``UDP_SEGMENT`` control message; the kernel (or the NIC)
cuts it into the same datagrams, byte for byte, that one ``send`` each would have produced. The
run's buffers go to the kernel as an I/O vector, so nothing is copied in Python. A run is all or
nothing: it is accepted, blocked or refused as a whole. Where the socket refuses GSO (no kernel
support at start-up, or ``EIO``/``EINVAL``/``EOPNOTSUPP`` on a route whose device cannot checksum
segments) the sender falls back to one datagram per call for good and counts ``gso_unsupported``.
On a real NIC a lost segment is one lost datagram; on a veth pair a dropped super-packet loses the
whole run (docs/FACTS: loss becomes bursts), which is why it can be switched off (``udp_gso``).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import socket
import struct
import sys
from collections.abc import Callable, Sequence

from common.errors import ConfigError

#: ``SOL_UDP`` and the Linux UDP socket options (include/uapi/linux/udp.h); Python 3.11's socket
#: module names neither.
SOL_UDP = 17
UDP_SEGMENT = 103
#: Most segments one GSO send may carry (the kernel's ``UDP_MAX_SEGMENTS``: 64 before Linux 6.9).
GSO_MAX_SEGMENTS = 64
#: Most payload bytes one GSO send may carry (an IPv4 UDP datagram: 65535 - 20 - 8).
GSO_MAX_BYTES = 65507
#: errnos that say this socket or route cannot segment: fall back to one datagram per call.
_GSO_REFUSED = frozenset((errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT))
_SEGMENT = struct.Struct("=H")


def gso_supported(sock: socket.socket) -> bool:
    """Whether the kernel takes ``UDP_SEGMENT`` on ``sock`` (setting it to 0 changes nothing)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
    except OSError:
        return False
    return True


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
        gso: bool = False,
    ) -> None:
        """Open one socket per target (resolving names now, at start-up).

        ``gso``: send runs of equal-sized datagrams with UDP GSO where every socket supports it
        (``max_segments`` says whether it is in use).

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
        self._sendmsgs: list[Callable[..., int]] = []
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
        self._sendmsgs = [s.sendmsg for s in self._socks]
        self.gso = gso and all(gso_supported(s) for s in self._socks)
        """Whether runs go out with UDP GSO (False: one datagram per call)."""
        self.gso_calls = 0
        """``sendmsg`` calls that carried a GSO run of two or more datagrams."""
        self._gso_datagrams = 0  # the datagrams those runs carried

    @property
    def target_count(self) -> int:
        """How many targets (sockets) there are; valid indexes are ``0 .. target_count - 1``."""
        return len(self._sends)

    @property
    def calls(self) -> int:
        """System calls that handed datagrams to a socket: one per datagram sent alone, one per
        GSO run."""
        return self.sent - self._gso_datagrams + self.gso_calls

    @property
    def max_segments(self) -> int:
        """Most datagrams one ``send_run`` call hands over at once (1 without GSO)."""
        return GSO_MAX_SEGMENTS if self.gso else 1

    @property
    def local_addresses(self) -> list[tuple[str, int]]:
        """The bound source address of each socket."""
        return [s.getsockname()[:2] for s in self._socks]

    def _count(self, exc: OSError) -> None:
        self._count_name(errno.errorcode.get(exc.errno or 0, type(exc).__name__))

    def _count_name(self, name: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1

    def send(self, data: bytes, target: int = 0) -> SendResult:
        """Hand one datagram to the socket of ``target``; never raises ``OSError``."""
        try:
            self._sends[target](data)
        except OSError as exc:
            return self._send_failed(target, data, exc)
        self.sent += 1
        return SendResult.SENT

    def send_run(self, run: Sequence[bytes], target: int = 0) -> tuple[int, SendResult]:
        """Hand the first datagrams of ``run`` to the socket of ``target``; never raises.

        ``run``: datagrams of one size, the last one possibly shorter, at most ``max_segments``
        of them and ``GSO_MAX_BYTES`` in all. Returns how many datagrams (from the first) the
        result applies to: all of them with GSO (a run is accepted, blocked or refused whole),
        else the first one only.
        """
        if len(run) == 1 or not self.gso:
            return 1, self.send(run[0], target)
        control = [(SOL_UDP, UDP_SEGMENT, _SEGMENT.pack(len(run[0])))]
        try:
            self._sendmsgs[target](run, control)
        except OSError as exc:
            return self._run_failed(target, run, control, exc)
        self.sent += len(run)
        self.gso_calls += 1
        self._gso_datagrams += len(run)
        return len(run), SendResult.SENT

    def _run_failed(
        self, index: int, run: Sequence[bytes], control: list[tuple[int, int, bytes]], exc: OSError
    ) -> tuple[int, SendResult]:
        if isinstance(exc, BlockingIOError):
            return len(run), SendResult.BLOCKED
        if exc.errno in _GSO_REFUSED:
            # This route cannot segment (docs above): one datagram per call from now on.
            self._count_name("gso_unsupported")
            self.gso = False
            return 1, self.send(run[0], index)
        self._count(exc)
        if isinstance(exc, ConnectionRefusedError):  # a pending ICMP error: once more
            try:
                self._sendmsgs[index](run, control)
            except BlockingIOError:
                return len(run), SendResult.BLOCKED
            except OSError as again:
                self._count(again)
            else:
                self.sent += len(run)
                self.gso_calls += 1
                self._gso_datagrams += len(run)
                return len(run), SendResult.SENT
        return len(run), SendResult.DROPPED

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
        self._sendmsgs = []
