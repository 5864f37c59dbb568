"""The shipped alert rules: valid, promtool unit-tested, on real metric names, with runbooks."""

from __future__ import annotations

import re
import subprocess

from tests.prometheus_support import (
    RULE_TESTS,
    RULES,
    RUNBOOKS,
    dashboard_queries,
    defined_metric_names,
    metric_names_in,
    promtool,
    rules,
)


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        check=False,
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested() -> None:
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert {str(r["alert"]) for r in rules()} <= tested


def test_rules_read_only_metrics_our_code_exports() -> None:
    defined = defined_metric_names()
    used = set().union(*(metric_names_in(str(r["expr"])) for r in rules()))
    assert used, "the rules name no kafka_diode metric at all"
    assert used <= defined, f"unknown metric names: {sorted(used - defined)}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_alert_has_a_runbook_entry_in_metrics_md() -> None:
    anchors = {
        _anchor(line.lstrip("#"))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in rules():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        runbook = str(annotations["runbook"])
        page, _, anchor = runbook.partition("#")
        assert page == "docs/metrics.md", runbook
        assert anchor == str(rule["alert"]).lower(), runbook
        assert anchor in anchors, f"{rule['alert']}: no heading for #{anchor} in metrics.md"
        assert {"summary", "description"} <= set(annotations), rule["alert"]
        labels = rule["labels"]
        assert isinstance(labels, dict)
        assert labels["severity"] in {"warning", "critical"}, rule["alert"]


def test_dashboard_queries_name_only_exported_metrics() -> None:
    """Offline twin of tests/integration/test_prometheus.py: the names exist in our code."""
    queries = dashboard_queries()
    used = set().union(*(metric_names_in(q) for q in queries))
    assert len(used) > 20, "the dashboard lost its queries"
    defined = defined_metric_names()
    assert used <= defined, f"unknown metric names: {sorted(used - defined)}"
