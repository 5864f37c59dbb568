"""Fixtures of the chaos suite: where scenario figures go (docs/chaos.md).

``chaos_results``: the JSON-lines file every scenario appends its figures to; the path comes from
``KAFKA_DIODE_CHAOS_RESULTS``, else ``chaos-results.jsonl`` under the session's pytest tmp dir
(printed at the end of the session). ``scripts/chaos_report.py`` turns it into the table.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RESULTS_ENV = "KAFKA_DIODE_CHAOS_RESULTS"


@pytest.fixture(scope="session")
def chaos_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results file of this session."""
    configured = os.environ.get(RESULTS_ENV)
    if configured:
        return Path(configured)
    return tmp_path_factory.getbasetemp() / "chaos-results.jsonl"
