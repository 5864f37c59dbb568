"""Prometheus metrics: one naming scheme for every component.

Names are ``kafka_diode_<component>_<what>_<unit>``; counters end in ``_total``. Drop reasons are a
label (``reason``) whose values are the ``DropReason`` enum's values, documented in
``docs/operations.md``. Each process has its own ``CollectorRegistry`` so tests can run several
components in one interpreter.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CollectorRegistry", "Counter", "Gauge", "Histogram"]

NAMESPACE = "kafka_diode"
