"""How every long-running command meets its operator: event loop, stop signals, reload signal.

One policy for ``send``, ``receive``, ``resend`` and ``dedup``:
the first SIGTERM or SIGINT asks for a graceful stop (drain, flush, commit); a second SIGINT, an
operator pressing Ctrl+C again, ends the process at once with exit code 130 (or runs the
command's own "stop now", such as the dedup's query stop); SIGHUP re-reads key files where the
command has any. :class:`StopRequests` is that policy without I/O; :func:`loop_signals` installs
it on a running asyncio loop, :func:`thread_signals` with :mod:`signal` for commands that block
a thread instead (the dedup waits on Spark).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
EventLoop = Literal["uvloop", "asyncio"]
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
T = TypeVar("T")


class StopRequests:
    """Counts stop signals: the first calls ``on_stop``, a repeated one calls ``on_again``.

    ``on_again`` defaults to leaving the process at once (exit 130) on a second SIGINT; a
    repeated SIGTERM (a service manager repeating itself) changes nothing.
    """

    def __init__(
        self,
        on_stop: Callable[[str], None],
        *,
        on_again: Callable[[str], None] | None = None,
        again: str = "exiting without draining",
    ) -> None:
        self._on_stop = on_stop
        self._on_again = on_again
        self._again = again
        self.count = 0

    def __call__(self, signame: str) -> None:
        """Handle one stop signal by its name (``SIGTERM``, ``SIGINT``)."""
        self.count += 1
        if self.count == 1:
            self._on_stop(signame)
        elif self._on_again is not None:
            log.warning("second signal: %s", self._again)
            self._on_again(signame)
        elif signame == "SIGINT":
            log.warning("second interrupt: %s", self._again)
            os._exit(EXIT_INTERRUPTED)

    @property
    def requested(self) -> bool:
        """A stop was asked for."""
        return self.count > 0


@contextlib.contextmanager
def loop_signals(
    requests: StopRequests, *, reload: Callable[[str], object] | None = None
) -> Iterator[None]:
    """Install ``requests`` (and ``reload`` on SIGHUP) on the running loop for the ``with`` body."""
    loop = asyncio.get_running_loop()
    installed = [*_STOP_SIGNALS, *([signal.SIGHUP] if reload is not None else [])]
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, requests, sig.name)
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, reload, "SIGHUP")
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@contextlib.contextmanager
def thread_signals(requests: StopRequests) -> Iterator[None]:
    """Install ``requests`` with :func:`signal.signal` (main thread) for the ``with`` body."""

    def handler(signum: int, _frame: object) -> None:
        requests(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _factory(event_loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if event_loop == "uvloop":
        import uvloop  # noqa: PLC0415  optional at import time (not on every platform)

        return uvloop.new_event_loop
    return None


def new_loop(event_loop: EventLoop) -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind, for a thread that runs its own (the netem relay's)."""
    factory = _factory(event_loop)
    return factory() if factory is not None else asyncio.new_event_loop()


def run(main: Callable[[], Coroutine[Any, Any, T]], event_loop: EventLoop) -> T:
    """Run ``main()`` to completion on a new loop of the chosen kind (uvloop: the fast one)."""
    with asyncio.Runner(loop_factory=_factory(event_loop)) as runner:
        return runner.run(main())
