"""runtime.service: one stop/reload policy for every long-running command, with real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

from runtime import service


def test_the_first_stop_asks_and_a_repeated_sigterm_changes_nothing() -> None:
    seen: list[str] = []
    requests = service.StopRequests(seen.append)
    requests("SIGTERM")
    requests("SIGTERM")  # a service manager repeating itself: no exit
    assert seen == ["SIGTERM"]
    assert requests.requested


def test_a_command_can_define_what_a_second_signal_does() -> None:
    first: list[str] = []
    again: list[str] = []
    requests = service.StopRequests(first.append, on_again=again.append)
    requests("SIGINT")
    requests("SIGTERM")
    assert (first, again) == (["SIGINT"], ["SIGTERM"])


def test_signals_on_the_loop_stop_and_reload_and_are_removed_after() -> None:
    async def main() -> tuple[list[str], list[str]]:
        stopped = asyncio.Event()
        stops: list[str] = []
        reloads: list[str] = []

        def on_stop(name: str) -> None:
            stops.append(name)
            stopped.set()

        with service.loop_signals(service.StopRequests(on_stop), reload=reloads.append):
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stopped.wait(), 10)
        return stops, reloads

    stops, reloads = service.run(main, "asyncio")
    assert stops == ["SIGTERM"]
    assert reloads == ["SIGHUP"]


def test_a_second_interrupt_exits_at_once_with_130() -> None:
    code = textwrap.dedent(
        """
        import asyncio, os, signal, sys
        from runtime import service

        async def main():
            requests = service.StopRequests(lambda name: print("stopping", flush=True))
            with service.loop_signals(requests):
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.wait_for(asyncio.Event().wait(), 30)  # never set: only exit ends it

        service.run(main, sys.argv[1])
        """
    )
    for loop in ("asyncio", "uvloop"):
        done = subprocess.run(
            [sys.executable, "-c", code, loop],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == service.EXIT_INTERRUPTED, (loop, done.stderr)
        assert "stopping" in done.stdout
        assert "second interrupt" in done.stderr


def test_thread_signals_restore_the_previous_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stops: list[str] = []
    with service.thread_signals(service.StopRequests(stops.append)):
        signal.raise_signal(signal.SIGTERM)
    assert stops == ["SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) == before
