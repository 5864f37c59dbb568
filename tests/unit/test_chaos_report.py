"""scripts/chaos_report.py: results lines become the docs/chaos.md table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos_report.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_report", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROW = {
    "scenario": "loss-5",
    "profile": "lossy-5",
    "fault": None,
    "records": 3000,
    "delivered": 2850,
    "gaps_reported": 31,
    "missing_reported": 150,
    "false_gaps": 0,
    "duplicates": 0,
    "missing_silent": 0,
    "resend_passes": 1,
    "final_delivered": 3000,
    "final_open_gaps": 0,
    "ok": True,
    "seconds": 41.2,
    "error": "",
}


def test_table_has_one_row_per_scenario_last_line_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    broken = {**ROW, "scenario": "dedup-sigkill", "profile": None, "fault": "dedup-sigkill"}
    broken |= {"ok": False, "final_delivered": 2990, "final_open_gaps": 2}
    lines = [json.dumps({**ROW, "delivered": 1}), json.dumps(ROW), json.dumps(broken)]
    results.write_text("\n".join(lines) + "\n")
    assert _module().main([str(results), "--machine", "2 vCPU", "--command", "make chaos"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # header + two scenarios
    assert "| loss-5 | `lossy-5` | 3000 | 2850 | 31 | 150 | 0 | 0 | 0 | 1 | 3000/3000 once" in out
    assert "| dedup-sigkill | dedup-sigkill |" in out
    assert "2990/3000, 2 gaps" in out
    assert "1 of 2 scenarios" in out
    assert "Command: `make chaos`" in out


def test_bad_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps(ROW) + "\n{not json\n")
    assert _module().main([str(results)]) == 1
    assert "r.jsonl:2" in capsys.readouterr().err
