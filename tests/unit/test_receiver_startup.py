"""Start-up order of the receiver process: ``/metrics`` answers only once the sockets are bound.

A supervisor (or a test) that waits for ``/metrics`` may start sending at once: any datagram sent
then must be read, not refused by a port nobody listens on yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import pytest

from common.wire import ResendMarker
from receiver import app as receiver_app
from receiver.config import ReceiverConfig


def test_metrics_are_served_only_after_the_sockets_are_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = ReceiverConfig(
        bootstrap_servers="127.0.0.1:1",  # no broker needed: nothing decodes into records
        raw_topic="raw.{topic}",  # a template: one start-up metadata request, bounded below
        metadata_timeout=1.0,  # no broker: that request fails after this, then the sockets open
        listen_host="127.0.0.1",
        listen_port=0,
        allow_cleartext=True,
        metrics_port=1,  # never opened: serve is replaced below
        shutdown_timeout=0,
        event_loop="asyncio",
    )
    receiver = receiver_app.Receiver(config)
    bound_at_serve: list[list[tuple[str, int]]] = []

    def serve(_registry: Any, _port: int, _addr: str) -> None:
        bound_at_serve.append(list(receiver.addresses))
        # what a client that saw /metrics answer would do: send at once
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"not a diode datagram", receiver.addresses[0])

    monkeypatch.setattr(receiver_app.metrics_http, "serve", serve)

    async def main() -> None:
        stop = asyncio.Event()
        read = asyncio.Event()
        on_datagram = receiver._on_datagram

        def counted(data: bytes) -> None:
            on_datagram(data)
            read.set()

        receiver._on_datagram = counted  # type: ignore[method-assign]

        async def stop_once_read() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(read.wait(), 10)
            stop.set()

        waiter = asyncio.get_running_loop().create_task(stop_once_read())
        await receiver.run(stop)
        await waiter

    asyncio.run(main())
    assert bound_at_serve == [receiver.addresses]
    assert receiver.addresses[0][1] != 0
    assert receiver.stats.datagrams == 1  # read, and dropped as bad_magic


def _idle_receiver() -> receiver_app.Receiver:
    config = ReceiverConfig(
        bootstrap_servers="127.0.0.1:1", raw_topic="raw.{topic}", allow_cleartext=True
    )
    receiver = receiver_app.Receiver(config)
    receiver._loop = asyncio.new_event_loop()
    return receiver


def test_internal_errors_log_a_traceback_at_warning_rate_limited(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = _idle_receiver()

    def broken(_data: bytes, _now: float) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(receiver._decoder, "receive_datagram", broken)
    try:
        with caplog.at_level(logging.WARNING, logger="receiver.app"):
            for _ in range(50):
                receiver._on_datagram(b"x")
    finally:
        assert receiver._loop is not None
        receiver._loop.close()
    assert receiver.stats.snapshot()["drops"] == {"internal_error": 50}
    lines = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert 1 <= len(lines) <= 5  # operations.md: 5 lines per reason per 10 s
    assert all(r.levelno == logging.WARNING and r.exc_info for r in lines)
    assert "RuntimeError: a bug" in caplog.text


def test_resend_markers_are_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    receiver = _idle_receiver()
    marker = ResendMarker(bytes(16), 0, "b", "end", (("t", 0, 0, 9),), 10, 1)
    events = [marker] * 200

    class Stub:
        def next_event(self) -> Any:
            return events.pop() if events else None

    receiver._decoder = Stub()  # type: ignore[assignment]
    receiver._sink = object()  # type: ignore[assignment]  not used for markers
    try:
        with caplog.at_level(logging.INFO, logger="receiver.app"):
            receiver._drain_events(0.0)
    finally:
        assert receiver._loop is not None
        receiver._loop.close()
    assert receiver.stats.resend_markers == 200
    assert 1 <= len([r for r in caplog.records if "resend b end" in r.getMessage()]) <= 5
