"""Prometheus metrics: one naming scheme for every component.

Names are ``kafka_diode_<component>_<what>_<unit>``; counters end in ``_total``. Drop reasons are a
label (``reason``) whose values are the ``DropReason`` enum's values, documented in
``docs/operations.md``. Each process has its own ``CollectorRegistry`` so tests can run several
components in one interpreter.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["CollectorRegistry", "Counter", "Gauge", "Histogram", "serve"]

NAMESPACE = "kafka_diode"


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> None:
    """Deprecated: use ``runtime.metrics_http.serve`` (serving is I/O, and ``common`` does none).

    Kept only for ``dedup/runner.py`` until the dedup imports the runtime one
    (``tests/unit/test_purity.py`` lists it as the one known exception of its kind).
    """
    if port:
        start_http_server(port, addr=addr, registry=registry)
