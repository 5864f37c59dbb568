"""Shared by the Prometheus tests: the metric names our code defines, PromQL's names, promtool.

``defined_metric_names`` builds each component's real registry (sender, receiver, dedup and its
raw-position series) and lists every series name it exposes, so a rule or dashboard query that
names a metric we do not export is caught without a running pipeline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.metrics import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "packaging" / "prometheus" / "kafka-diode.rules.yml"
RULE_TESTS = ROOT / "packaging" / "prometheus" / "kafka-diode.rules.test.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "kafka-diode.json"
RUNBOOKS = ROOT / "docs" / "metrics.md"

_METRIC = re.compile(r"\b(kafka_diode_[a-z0-9_]+)")


def _names(registry: CollectorRegistry) -> set[str]:
    out: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            out.add(family.name + "_total")
        elif family.type == "histogram":
            out.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            out.add(family.name)
    return out


def defined_metric_names() -> set[str]:
    """Every series name the sender, receiver and dedup expose (the relay's two included)."""
    from dedup.metrics import DedupMetrics  # noqa: PLC0415
    from dedup.raw_position import RawPositionMetrics  # noqa: PLC0415
    from receiver.metrics import Gauges, ReceiverStats, make_registry  # noqa: PLC0415
    from sender.metrics import SenderMetrics  # noqa: PLC0415

    dedup = DedupMetrics()
    RawPositionMetrics(dedup.registry, ["raw"], clock=lambda: 0.0)
    names = _names(SenderMetrics().registry) | _names(dedup.registry)
    names |= _names(make_registry(ReceiverStats(), Gauges()))
    # the relay's collector needs a live relay; its two families are named in netem/relay.py
    names |= {"kafka_diode_netem_datagrams_total", "kafka_diode_netem_held_datagrams"}
    return names


def metric_names_in(expr: str) -> set[str]:
    """The kafka_diode_* series names a PromQL expression reads."""
    return set(_METRIC.findall(expr))


def rules() -> list[dict[str, object]]:
    """Every rule of the shipped rule file."""
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def promtool() -> str:
    """Path of promtool; skips outside CI when it is missing (CI must have it: `make tools`)."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: `make tools` installs Debian's prometheus")
        pytest.skip("promtool not installed (`make tools`, or apt-get install prometheus)")
    return path


def prometheus_binary() -> str:
    """Path of the prometheus server binary, with the same rule as :func:`promtool`."""
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is missing in CI: `make tools` installs Debian's prometheus")
        pytest.skip("prometheus not installed (`make tools`, or apt-get install prometheus)")
    return path


# Grafana's variables, replaced by what Grafana would send for a short dashboard range.
_GRAFANA_VARIABLES = {"$__rate_interval": "20s", "$__interval": "5s", "$__range": "5m"}


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard, with Grafana's variables substituted."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            expr = node.get("expr")
            if isinstance(expr, str) and expr.strip():
                found.append(expr)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    out = []
    for raw in found:
        expr = raw
        for name, value in _GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
        out.append(expr)
    return sorted(set(out))
