"""UDP sockets of the receiver and the loop that drains them (thin glue, no parsing).

Why not an asyncio ``DatagramProtocol``: one callback per datagram, each reading into a fresh
256 KiB buffer, loses most datagrams above a few tens of thousands per second on our machines
(docs/FACTS "UDP receive"). Instead every socket is registered with ``loop.add_reader`` and, on
each readiness event, read with ``recv_into`` into one reused 64 KiB buffer until the kernel
says ``EAGAIN`` or ``max_per_wakeup`` datagrams were read (then the loop gets its turn; the socket
is level-triggered, so the reader is called again at once). A read that finds the socket empty
takes the reader away for ``pause`` seconds: a paced sender's records arrive one GSO run at a
time, and a wakeup per run costs the receiver, and every process it preempts, more than reading
what came in the pause at once (docs/receiver.md, "Sockets and speed"). A full wakeup
(``max_per_wakeup`` read) never pauses: the socket has more.

Kernel drops: with ``SO_RXQ_OVFL`` set, a ``recvmsg`` returns the socket's cumulative drop counter
as ancillary data. The first read of each wakeup uses ``recvmsg_into`` to sample it; the rest use
the cheaper ``recv_into``. ``/proc/net/udp*`` (the ``drops`` column of the socket's inode) is the
fallback read once a second, so a counter is exported even when nothing arrives after a drop.

UDP GRO (``gro=True``, Linux 5.0+ where ``UDP_GRO`` is accepted): the kernel may hand over several
datagrams of one flow as one buffer, all of the size it reports in a ``UDP_GRO`` control message
(level ``SOL_UDP`` = 17, option 104) except the last, which may be shorter; on loopback that is
what a sender's GSO run becomes, on a NIC what the driver's GRO coalesced. A coalesced buffer goes
whole to ``on_coalesced`` (the receiver decodes the fragments of a large message in one call,
``Decoder.receive_coalesced``), consecutive reads of one segment size joined while the run may go
on (``SocketDrainer._join``: a message of more than one GSO run; with ``goes_on``, only while the
last datagram read is a fragment before its message's last), or, without ``on_coalesced``, is
split at that size into the datagrams the sender sent, each handed over on its own; a buffer of
one datagram is handed over as it is. ``max_per_wakeup`` counts datagrams either way.

Where the segment size comes from. Only a ``recvmsg_into`` returns the control message, and it
costs ~0.8-1.3 us more than a ``recv_into`` here (CPython builds the sender's address and the
ancillary list on every call), which a hostile flood of single datagrams, never coalesced, would
pay on every read. So the first read of a wakeup is a ``recvmsg_into`` (it samples the drop
counter too, as without GRO) and the others are ``recv_into`` calls whose segment size
``segment_of`` reads from the bytes: every datagram says its own length (``coalesced_segment``
in common/wire/envelope.py: the header, the payload's length, the payload), and a second
datagram's magic must follow it. A legitimate run splits exactly where the kernel's size would
have split it; bytes that do not frame so are one datagram, judged (and counted) once by the
decoder. A forged buffer that does frame as two datagrams is read as two, as if they had been
sent apart, which an attacker could do anyway. Without ``segment_of`` every read asks the kernel.

GRO is not switched with the traffic: the kernel reports a coalesced buffer's segment size only
if GRO is on when it is *read*, so a run coalesced just before a switch would be read as one
concatenated datagram and lost (tests/property/test_gso_gro.py pins the kernel's behaviour).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux asm-generic/socket.h
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RECV_BUFFER = 65536  # larger than any UDP payload (65507), so nothing is ever truncated
_CMSG_SPACE = socket.CMSG_SPACE(4)
#: ``SOL_UDP`` and ``UDP_GRO`` (include/uapi/linux/udp.h): Python 3.11 names neither.
SOL_UDP = 17
UDP_GRO = 104
#: Room for both control messages a GRO read may carry (drop counter, segment size).
_GRO_CMSG_SPACE = 2 * socket.CMSG_SPACE(4)
#: The most bytes of coalesced reads joined into one buffer for ``on_coalesced`` (``_join``): a
#: message of up to ~1 MB decoded in one call; beyond it the rest goes the one-by-one way.
MAX_JOINED_BYTES = 1 << 20
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")


def enable_gro(sock: socket.socket) -> bool:
    """Ask the kernel for coalesced reads on ``sock``; False where it has no UDP GRO."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def open_udp_socket(
    host: str, port: int, *, reuse_port: bool, rcvbuf: int, gro: bool = False
) -> tuple[socket.socket, int]:
    """Bind a non-blocking UDP socket; return it and the SO_RCVBUF the kernel granted.

    The kernel reports twice the usable size (it counts bookkeeping); we log what it reports.
    ``gro``: enable UDP GRO where the kernel has it (``gro_enabled`` tells; read such a socket
    with ``SocketDrainer(..., gro=True)``).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)  # root: beyond rmem_max
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        except OSError:
            log.debug("SO_RXQ_OVFL not supported; kernel drops read from /proc only")
        if gro and not enable_gro(sock):
            log.info("UDP GRO not supported here; one datagram per read")
        sock.bind(addr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    return sock, granted


def gro_enabled(sock: socket.socket) -> bool:
    """Whether UDP GRO is on for ``sock``."""
    try:
        return bool(sock.getsockopt(SOL_UDP, UDP_GRO))
    except OSError:
        return False


def log_rcvbuf(requested: int, granted: int) -> None:
    """Say what the kernel granted and, when short, how to raise the limit."""
    if granted < requested:
        log.warning(
            "SO_RCVBUF: requested %d bytes, kernel granted %d; bursts may be lost. Raise the "
            "limit with 'sysctl -w net.core.rmem_max=%d' (and persist it in /etc/sysctl.d/) or "
            "run with CAP_NET_ADMIN so SO_RCVBUFFORCE applies",
            requested,
            granted,
            requested,
        )
    else:
        log.info("SO_RCVBUF: requested %d bytes, kernel granted %d", requested, granted)


def proc_udp_drops(sock: socket.socket) -> int | None:
    """The ``drops`` column of ``sock``'s line in /proc/net/udp or udp6; None if unavailable."""
    try:
        inode = str(os.fstat(sock.fileno()).st_ino)
    except OSError:
        return None
    for name in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) >= 13 and cols[9] == inode:
                try:
                    return int(cols[-1])
                except ValueError:
                    return None
    return None


class SocketDrainer:
    """Read every datagram a socket has on each readiness event and hand it to ``on_datagram``.

    ``on_datagram(data)`` receives an independent ``bytes`` copy; ``on_wakeup_done()`` runs after
    each burst (the caller decodes, produces, polls). Read errors are counted, never raised.
    """

    def __init__(
        self,
        sock: socket.socket,
        on_datagram: Callable[[bytes], None],
        on_wakeup_done: Callable[[], None],
        *,
        max_per_wakeup: int,
        pause: float = 0.0,
        on_error: Callable[[OSError], None],
        gro: bool | None = None,
        on_coalesced: Callable[[bytes, int], None] | None = None,
        segment_of: Callable[[memoryview, int], int] | None = None,
        goes_on: Callable[[bytes, int], bool] | None = None,
    ) -> None:
        """``gro``: read coalesced buffers (None: whether the socket has UDP GRO on);
        ``on_coalesced(data, segment)``, if given, takes such a buffer whole (its datagrams are
        ``segment`` bytes each but the last) instead of ``on_datagram`` per datagram;
        ``segment_of(buffer, nbytes)``, if given, says the segment size of a read from what it
        holds (0: one datagram; ``common.wire.coalesced_segment``), so that a GRO socket's reads
        after the first of a wakeup are plain ``recv_into`` calls (see the module docstring);
        ``goes_on(data, segment)``, if given, says whether the message a coalesced read ends in
        goes on in the next read (``common.wire.message_goes_on``); a read that ends its
        messages is handed over at once, not joined with the next (without it, every read that
        ends on a whole segment may be followed by more of its message)."""
        self._sock = sock
        self._on_datagram = on_datagram
        self._on_coalesced = on_coalesced
        self._on_wakeup_done = on_wakeup_done
        self._on_error = on_error
        self._max = max_per_wakeup
        self._pause = pause
        self._resume_at: asyncio.TimerHandle | None = None
        self.pauses = 0
        """Wakeups after which the reader paused (the socket was empty)."""
        self._buf = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.kernel_drops = 0
        """Cumulative kernel drop counter of this socket (SO_RXQ_OVFL or /proc)."""
        self.datagrams = 0
        """Datagrams read from this socket (per-socket metrics: which port carries what)."""
        self.port = int(sock.getsockname()[1])
        """The local port this socket is bound to."""
        self.gro = gro_enabled(sock) if gro is None else gro
        """Whether reads may return coalesced datagrams (UDP GRO), split here."""
        self.coalesced = 0
        """Reads that returned two or more datagrams at once (UDP GRO)."""
        self._segment_of = segment_of
        self._goes_on = goes_on
        self._held: list[bytes] = []  # coalesced reads joined into one run (``_join``)
        self._held_segment = 0
        self._held_bytes = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Register with ``loop``; reading starts at the next loop iteration."""
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._drain)

    def stop(self) -> None:
        """Stop reading (idempotent). The socket stays open; datagrams queue in the kernel."""
        if self._resume_at is not None:
            self._resume_at.cancel()
            self._resume_at = None
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop = None

    def _after_read(self, read: int) -> None:
        """End of a wakeup: the caller's turn, then a pause if the socket was found empty."""
        self.datagrams += read
        self._on_wakeup_done()
        loop = self._loop
        if self._pause > 0 and read < self._max and loop is not None:
            loop.remove_reader(self._sock.fileno())
            self._resume_at = loop.call_later(self._pause, self._resume, loop)
            self.pauses += 1

    def _resume(self, loop: asyncio.AbstractEventLoop) -> None:
        self._resume_at = None
        if self._loop is loop:  # not stopped meanwhile
            loop.add_reader(self._sock.fileno(), self._drain)

    def close(self) -> None:
        """Stop and close the socket (idempotent)."""
        self.stop()
        self._sock.close()

    def refresh_kernel_drops(self) -> int:
        """Re-read the kernel drop counter from /proc (cheap; call about once a second)."""
        value = proc_udp_drops(self._sock)
        if value is not None and value > self.kernel_drops:
            self.kernel_drops = value
        return self.kernel_drops

    def _drain(self) -> None:
        if self.gro:
            self._drain_gro()
            return
        sock, view, deliver = self._sock, self._view, self._on_datagram
        read = 0
        try:
            # First read of the burst samples the kernel drop counter (SO_RXQ_OVFL).
            nbytes, ancdata, _, _ = sock.recvmsg_into([self._buf], _CMSG_SPACE)
            for level, kind, data in ancdata:
                if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
                    drops = _U32.unpack_from(data)[0]
                    self.kernel_drops = max(self.kernel_drops, drops)
            read = 1
            deliver(bytes(view[:nbytes]))
            recv_into = sock.recv_into
            for _ in range(self._max - 1):
                nbytes = recv_into(view)
                read += 1
                deliver(bytes(view[:nbytes]))
        except BlockingIOError:
            pass
        except InterruptedError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._on_error(exc)
        self._after_read(read)

    def _drain_gro(self) -> None:
        """``_drain`` for a GRO socket: every read says the segment size of what it returned."""
        sock, view, deliver = self._sock, self._view, self._on_datagram
        recvmsg_into, bufs, limit = sock.recvmsg_into, [self._buf], self._max
        recv_into, segment_of = sock.recv_into, self._segment_of
        joined = self._on_coalesced is not None
        held = self._held  # the run ``_join`` keeps (emptied in place by ``_flush``)
        read = 0
        ask_kernel = True  # the first read of a wakeup samples the drop counter
        try:
            while read < limit:
                if ask_kernel:
                    nbytes, ancdata, _, _ = recvmsg_into(bufs, _GRO_CMSG_SPACE)
                    segment = 0
                    for level, kind, data in ancdata:
                        if level == SOL_UDP and kind == UDP_GRO and len(data) >= 4:
                            segment = _I32.unpack_from(data)[0]
                        elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
                            drops = _U32.unpack_from(data)[0]
                            self.kernel_drops = max(self.kernel_drops, drops)
                    ask_kernel = segment_of is None
                else:
                    nbytes = recv_into(view)
                    segment = segment_of(view, nbytes)  # type: ignore[misc]  # ask_kernel if None
                if 0 < segment < nbytes:
                    self.coalesced += 1
                    read += -(-nbytes // segment)
                    if joined:
                        self._join(bytes(view[:nbytes]), segment)
                        continue
                    for start in range(0, nbytes, segment):
                        deliver(bytes(view[start : min(start + segment, nbytes)]))
                else:
                    read += 1
                    if held:
                        if nbytes <= self._held_segment:
                            self._join(bytes(view[:nbytes]), self._held_segment)
                            continue
                        self._flush()
                    deliver(bytes(view[:nbytes]))
        except BlockingIOError:
            pass
        except InterruptedError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._on_error(exc)
        self._flush()
        self._after_read(read)

    def _join(self, data: bytes, segment: int) -> None:
        """Keep a run read coalesced until it is known to end, then hand it to ``on_coalesced``.

        A GSO run is at most 64 datagrams and 64 KB, so a message of more fragments (a 100 KB
        record: 72) comes in several reads; joined while each read ends on a whole segment and
        the next one has the same segment size (or is a datagram alone no larger), the reads
        give ``on_coalesced`` the whole message. The datagrams and their order do not change:
        this only decides where one buffer ends.
        """
        if self._held and segment != self._held_segment:
            self._flush()
        self._held.append(data)
        self._held_segment = segment
        self._held_bytes += len(data)
        if (
            len(data) % segment
            or self._held_bytes >= MAX_JOINED_BYTES
            or (self._goes_on is not None and not self._goes_on(data, segment))
        ):
            # A shorter last datagram ends the run, or the last one ends its message (reads of
            # whole one-datagram messages: a 1 KB record each), or the bound is reached.
            # Joining them anyway cost a copy into a fresh buffer of up to 1 MB per read.
            self._flush()

    def _flush(self) -> None:
        """Hand over the run kept by ``_join`` (if any)."""
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        segment = self._held_segment
        self._held.clear()
        self._held_bytes = 0
        if len(data) > segment:
            assert self._on_coalesced is not None  # _join is only called with it
            self._on_coalesced(data, segment)
        else:
            self._on_datagram(data)
