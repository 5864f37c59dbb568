"""The socket drain loop with real UDP sockets on loopback (no Kafka)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from receiver.transport import SocketDrainer, open_udp_socket, proc_udp_drops


def _sender() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


class Got(list[bytes]):
    """Collected datagrams; ``until(n)`` waits (with a deadline) for the n-th."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def append(self, item: bytes) -> None:
        super().append(item)
        self._changed.set()

    async def until(self, count: int, limit: float = 10.0) -> None:
        async with asyncio.timeout(limit):
            while len(self) < count:
                self._changed.clear()
                await self._changed.wait()


async def _drain_until(got: Got, count: int) -> None:
    await got.until(count)


def test_drains_every_datagram_in_bounded_bursts() -> None:
    sock, granted = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=4 * 1024 * 1024)
    assert granted >= 4096
    port = sock.getsockname()[1]
    got = Got()
    bursts: list[int] = []

    def on_burst() -> None:
        bursts.append(len(got))

    drainer = SocketDrainer(sock, got.append, on_burst, max_per_wakeup=7, on_error=lambda exc: None)
    payloads = [i.to_bytes(4, "big") * (1 + i % 50) for i in range(500)]
    tx = _sender()

    async def main() -> None:
        for p in payloads:  # queued in the kernel before the reader is registered
            tx.sendto(p, ("127.0.0.1", port))
        drainer.start(asyncio.get_running_loop())
        await _drain_until(got, len(payloads))
        drainer.close()

    asyncio.run(main())
    tx.close()
    assert got == payloads  # whole, in order, independent copies
    assert drainer.datagrams == len(payloads)
    assert drainer.port == port
    steps = [b - a for a, b in zip([0, *bursts], bursts, strict=False)]
    assert max(steps) <= 7  # bounded per wakeup: the loop gets its turn


def test_a_wakeup_that_empties_the_socket_pauses_and_what_came_meanwhile_is_read_at_once() -> None:
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=1 << 20)
    port = sock.getsockname()[1]
    got = Got()
    wakeups: list[tuple[float, int]] = []  # (loop time, datagrams so far) at each wakeup's end
    pause = 0.05
    drainer = SocketDrainer(
        sock,
        got.append,
        lambda: wakeups.append((asyncio.get_running_loop().time(), len(got))),
        max_per_wakeup=64,
        pause=pause,
        on_error=pytest.fail,
    )
    tx = _sender()

    async def main() -> None:
        drainer.start(asyncio.get_running_loop())
        tx.sendto(b"first", ("127.0.0.1", port))
        await got.until(1)
        for i in range(5):  # arrive while the reader pauses
            tx.sendto(b"next %d" % i, ("127.0.0.1", port))
        await got.until(6)
        drainer.close()

    asyncio.run(main())
    tx.close()
    assert got == [b"first"] + [b"next %d" % i for i in range(5)]
    assert [n for _, n in wakeups] == [1, 6]  # the five in one wakeup
    assert wakeups[1][0] - wakeups[0][0] >= pause  # read no sooner than the pause allows
    assert drainer.pauses == 2
    assert drainer._resume_at is None  # the pending resume cancelled by close


def test_a_full_wakeup_reads_on_without_a_pause() -> None:
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=1 << 20)
    port = sock.getsockname()[1]
    got = Got()
    # a pause longer than the deadline: a wakeup that paused while datagrams wait would time out
    drainer = SocketDrainer(
        sock, got.append, lambda: None, max_per_wakeup=4, pause=60.0, on_error=pytest.fail
    )
    tx = _sender()
    payloads = [b"%d" % i for i in range(10)]

    async def main() -> None:
        for p in payloads:
            tx.sendto(p, ("127.0.0.1", port))
        drainer.start(asyncio.get_running_loop())
        await got.until(len(payloads), limit=5.0)
        drainer.close()

    asyncio.run(main())
    tx.close()
    assert got == payloads
    assert drainer.pauses == 1  # after the third wakeup (2 of 4), which found the socket empty


def test_large_datagram_is_not_truncated() -> None:
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=1 << 20)
    port = sock.getsockname()[1]
    got = Got()
    drainer = SocketDrainer(sock, got.append, lambda: None, max_per_wakeup=8, on_error=print)
    tx = _sender()
    big = bytes(range(256)) * 255 + b"x" * 227  # 65507 bytes, the IPv4 maximum

    async def main() -> None:
        tx.sendto(big, ("127.0.0.1", port))
        drainer.start(asyncio.get_running_loop())
        await _drain_until(got, 1)
        drainer.close()

    asyncio.run(main())
    tx.close()
    assert got == [big]


def test_kernel_drops_are_read_from_ancillary_data_and_proc() -> None:
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=4096)
    port = sock.getsockname()[1]
    tx = _sender()
    for _ in range(200):  # far more than a 4 KiB buffer holds
        tx.sendto(b"y" * 1000, ("127.0.0.1", port))
    proc = proc_udp_drops(sock)
    if proc is None:
        pytest.skip("/proc/net/udp not readable here")
    assert proc > 0
    got = Got()
    drainer = SocketDrainer(sock, got.append, lambda: None, max_per_wakeup=1000, on_error=print)

    async def main() -> None:
        drainer.start(asyncio.get_running_loop())
        await _drain_until(got, 1)
        tx.sendto(b"after", ("127.0.0.1", port))
        await _drain_until(got, len(got) + 1)  # the next recvmsg carries SO_RXQ_OVFL
        drainer.stop()

    asyncio.run(main())
    tx.close()
    assert 0 < len(got) < 201
    assert drainer.kernel_drops == 200 - (len(got) - 1)
    assert drainer.refresh_kernel_drops() == drainer.kernel_drops
    drainer.close()


def test_reuse_port_binds_several_sockets() -> None:
    a, _ = open_udp_socket("127.0.0.1", 0, reuse_port=True, rcvbuf=65536)
    port = a.getsockname()[1]
    b, _ = open_udp_socket("127.0.0.1", port, reuse_port=True, rcvbuf=65536)
    assert b.getsockname()[1] == port
    with pytest.raises(OSError):
        open_udp_socket("127.0.0.1", port, reuse_port=False, rcvbuf=65536)
    a.close()
    b.close()
