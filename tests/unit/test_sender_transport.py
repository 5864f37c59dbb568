"""The UDP glue on real loopback sockets: targets by index, ICMP errors, blocking, bad addresses."""

import asyncio
import socket

import pytest
import uvloop

from common.errors import ConfigError
from sender.transport import SendResult, UdpSender, parse_address


def receiver() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5.0)
    return sock


def unused_port() -> int:
    sock = receiver()
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def test_each_datagram_goes_to_the_target_the_caller_names() -> None:
    a, b = receiver(), receiver()
    udp = UdpSender([("127.0.0.1", a.getsockname()[1]), ("127.0.0.1", b.getsockname()[1])])
    try:
        assert udp.target_count == 2
        for i, target in enumerate((0, 1, 1, 0)):
            assert udp.send(f"d{i}".encode(), target) is SendResult.SENT
        assert udp.send(b"d4") is SendResult.SENT  # default: the first target
        assert [a.recv(100), a.recv(100), a.recv(100)] == [b"d0", b"d3", b"d4"]
        assert [b.recv(100), b.recv(100)] == [b"d1", b"d2"]
        assert udp.sent == 5
    finally:
        udp.close()
        a.close()
        b.close()


def test_icmp_port_unreachable_is_counted_and_never_stops_sending() -> None:
    udp = UdpSender([("127.0.0.1", unused_port())])
    try:
        results = [udp.send(b"x" * 100) for _ in range(50)]
        # Every other send reports the previous ICMP error and is retried once.
        assert set(results) <= {SendResult.SENT, SendResult.DROPPED}
        assert udp.errors.get("ECONNREFUSED", 0) >= 1
        assert udp.sent >= 25
    finally:
        udp.close()


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_a_full_socket_buffer_blocks_then_resumes_on_the_loop(loop_name: str) -> None:
    rx = receiver()
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    udp = UdpSender([("127.0.0.1", rx.getsockname()[1])], send_buffer=4096)
    factory = uvloop.new_event_loop if loop_name == "uvloop" else asyncio.new_event_loop

    async def scenario() -> None:
        # Fill the send buffer; on loopback the kernel may deliver instantly, so BLOCKED is
        # possible but not guaranteed: either way a writer callback must fire.
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        udp.wait_writable(loop, ready.set)
        async with asyncio.timeout(5):
            await ready.wait()

    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(scenario())
    finally:
        udp.close()
        rx.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1:9000", ("10.0.0.1", 9000)),
        ("receiver.example:1", ("receiver.example", 1)),
        ("[::1]:9000", ("::1", 9000)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address("target", text) == expected


@pytest.mark.parametrize("text", ["10.0.0.1", "host:0", "host:99999", ":9000", "[::1", "h:x"])
def test_bad_addresses_name_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_address("target", text)
    assert info.value.key == "target"


def test_unresolvable_target_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        UdpSender([("no-such-host.invalid", 9000)])
    assert info.value.key == "target"


def test_bind_address_is_used() -> None:
    rx = receiver()
    udp = UdpSender([("127.0.0.1", rx.getsockname()[1])], bind=("127.0.0.1", 0))
    try:
        assert udp.send(b"hi") is SendResult.SENT
        data, source = rx.recvfrom(10)
        assert data == b"hi"
        assert source == udp.local_addresses[0]
    finally:
        udp.close()
        rx.close()
