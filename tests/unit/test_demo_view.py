"""The demo's live table: the final one shows each stage's average rate, never an empty column."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from kafka_diode import demo

ROOT = Path(__file__).resolve().parents[2]


def _render(table: Any) -> str:
    console = Console(width=120, record=True)
    console.print(table)
    return console.export_text()


def _view(produced: list[int]) -> demo.LiveView:
    pipeline = SimpleNamespace(ep=SimpleNamespace(metrics={}))
    view = demo.LiveView(pipeline, lambda: produced[0])  # type: ignore[arg-type]
    view.started = 0.0
    return view


def test_final_table_shows_each_stages_peak_rate() -> None:
    produced = [0]
    view = _view(produced)
    # refreshes at t = 1, 2, 2.2 (too soon: ignored), 4, 9: 1,000/s, then 3,000/s, then 500/s, 0
    for now, count in ((1.0, 1000), (2.0, 4000), (2.2, 4100), (4.0, 5000), (9.0, 5000)):
        produced[0] = count
        view._track("produced", float(count), now)
    assert view._peak("produced", 9.0) == "3,000"
    text = _render(view.table(final=True))
    assert "per second (peak)" in text
    row = next(line for line in text.splitlines() if "produced upstream" in line)
    assert "5,000" in row
    assert "3,000" in row


def test_every_row_of_the_final_table_has_a_rate() -> None:
    view = _view([0])
    for now in (1.0, 2.0):
        view._track("duplicates dropped", 0.0, now)
        view._track("gaps open", 3.0, now)
    assert view._peak("duplicates dropped", 2.0) == "0"
    assert view._peak("gaps open", 2.0) == "-"  # a level has no rate
    assert view._peak("never seen", 2.0) == "0"


def test_demo_paces_its_sender_like_the_compose_demo() -> None:
    compose = tomllib.loads((ROOT / "packaging" / "compose" / "sender.toml").read_text())
    assert compose["rate_bytes"] == demo.DEMO_RATE_BYTES > 0
    args = demo._parser("kafka-diode demo").parse_args([])
    assert args.rate_bytes == demo.DEMO_RATE_BYTES
