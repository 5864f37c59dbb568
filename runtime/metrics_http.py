"""The ``/metrics`` endpoint: a Prometheus registry served over HTTP from a daemon thread.

The metrics themselves are defined in ``common.metrics`` (names) and each component's
``metrics`` module (what it counts); serving them is I/O, so it lives here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> None:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread (port 0: off)."""
    if port:
        start_http_server(port, addr=addr, registry=registry)
