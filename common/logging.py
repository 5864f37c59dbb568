"""Logging set-up shared by every command, and a rate limiter for hot-path warnings.

Libraries log through ``logging.getLogger(__name__)`` with lazy ``%`` arguments; only a CLI calls
``configure``. ``RateLimitedLog`` keeps a flood of hostile datagrams from turning
into a flood of log lines: it lets ``burst`` messages per key through per ``period`` seconds and
counts the rest, reporting the suppressed count with the next message that passes.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

_STD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        payload.update(
            (k, v) for k, v in vars(record).items() if k not in _STD_ATTRS and not k.startswith("_")
        )
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure(level: str = "INFO", *, json_format: bool = False) -> None:
    """Configure the root logger for a command-line process (stderr, one line per record)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # librdkafka and py4j are chatty at INFO; their warnings still come through.
    for noisy in ("py4j", "py4j.clientserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class RateLimitedLog:
    """Let at most ``burst`` messages per key through each ``period`` seconds."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        period: float = 10.0,
        burst: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._period = period
        self._burst = burst
        self._clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (start, passed, suppressed)

    def warning(self, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """Log ``msg % args`` at WARNING unless ``key`` is over its budget (with the traceback
        of the exception being handled when ``exc_info``)."""
        self.log(logging.WARNING, key, msg, *args, exc_info=exc_info)

    def info(self, key: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` at INFO unless ``key`` is over its budget."""
        self.log(logging.INFO, key, msg, *args)

    def log(self, level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """Log ``msg % args`` at ``level`` unless ``key`` is over its budget."""
        now = self._clock()
        start, passed, suppressed = self._windows.get(key, (now, 0, 0))
        if now - start >= self._period:
            start, passed = now, 0
        if passed < self._burst:
            if suppressed:
                msg = msg + " (%d similar messages suppressed)"
                args = (*args, suppressed)
            self._logger.log(level, msg, *args, exc_info=exc_info)
            self._windows[key] = (start, passed + 1, 0)
        else:
            if len(self._windows) > 1024 and key not in self._windows:
                return  # bounded: never grow without limit on attacker-chosen keys
            self._windows[key] = (start, passed, suppressed + 1)
