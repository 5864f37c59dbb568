"""The socket drain loop's pause after an empty read loses, reorders and over-reads nothing.

Real loopback sockets and a real event loop: bursts of datagrams arrive at drawn moments (before
the reader starts, while it reads, while it pauses), under any ``read_pause`` the config admits
and any ``max_datagrams_per_wakeup``, GRO on or off. Every datagram must be handed over once, in
the order sent; no wakeup may read more than its bound; a wakeup that read its bound must not
pause (the socket may hold more), and one that read less must (it found the socket empty).
"""

from __future__ import annotations

import asyncio
import socket

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receiver.config import MAX_READ_PAUSE
from receiver.transport import SocketDrainer, open_udp_socket

#: (milliseconds after the start, datagrams sent then); moment 0 is before the reader starts.
bursts = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 40)), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bursts,
    st.sampled_from([0.0, 0.0005, 0.002, 0.01, MAX_READ_PAUSE]),
    st.integers(1, 64),
    st.booleans(),
)
def test_every_datagram_is_handed_over_once_in_order_whatever_the_pause(
    plan: list[tuple[int, int]], pause: float, max_per_wakeup: int, gro: bool
) -> None:
    sock, _ = open_udp_socket("127.0.0.1", 0, reuse_port=False, rcvbuf=8 << 20, gro=gro)
    port = sock.getsockname()[1]
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    plan = sorted(plan)  # bursts in time order, so the order sent is the order on the wire
    total = sum(n for _, n in plan)
    got: list[bytes] = []
    sent: list[bytes] = []
    errors: list[OSError] = []
    done = asyncio.Event()
    wakeups: list[tuple[int, int]] = []  # (datagrams the wakeup read, pauses before it)

    def on_datagram(data: bytes) -> None:
        got.append(data)
        if len(got) == total:
            done.set()

    def wakeup_done() -> None:
        wakeups.append((len(got) - sum(n for n, _ in wakeups), drainer.pauses))

    drainer = SocketDrainer(
        sock,
        on_datagram,
        wakeup_done,
        max_per_wakeup=max_per_wakeup,
        pause=pause,
        on_error=errors.append,
    )

    def send(burst: int, count: int) -> None:
        for i in range(count):
            data = b"%d:%d:" % (burst, i) + bytes(i % 7 * 100)
            sent.append(data)
            tx.sendto(data, ("127.0.0.1", port))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for index, (at_ms, count) in enumerate(plan):
            if at_ms == 0:
                send(index, count)  # queued before the reader starts
            else:
                loop.call_later(at_ms / 1000, send, index, count)
        drainer.start(loop)
        async with asyncio.timeout(30):
            await done.wait()
        drainer.close()

    try:
        asyncio.run(main())
    finally:
        tx.close()
        sock.close()  # closed by drainer.close() unless main failed before it
    assert errors == []
    assert got == sent
    assert drainer.datagrams == len(sent)
    reads = [n for n, _ in wakeups]
    assert max(reads) <= max_per_wakeup
    # whether each wakeup paused: the pauses counted before the next one (or in all, for the last)
    after = [pauses for _, pauses in wakeups[1:]] + [drainer.pauses]
    paused = [a - b for (_, b), a in zip(wakeups, after, strict=True)]
    if pause > 0:
        assert paused == [int(n < max_per_wakeup) for n in reads], wakeups
    else:
        assert drainer.pauses == 0
