"""Turn a chaos run's results (JSON lines, one per scenario) into the table of docs/chaos.md.

Usage: ``scripts/chaos_report.py RESULTS.jsonl [--machine TEXT] [--command TEXT]``. Reads the
lines ``tests/chaos`` appended (``KAFKA_DIODE_CHAOS_RESULTS``); when a scenario appears more than
once, the last line wins. Prints Markdown to stdout. Exit 1 if a line is not valid JSON or lacks a
field the table needs, naming the line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS: tuple[tuple[str, str], ...] = (
    ("scenario", "scenario"),
    ("impairment", "impairment"),
    ("records", "records"),
    ("delivered", "delivered before resend"),
    ("gaps_reported", "gaps reported"),
    ("missing_reported", "records in gaps"),
    ("false_gaps", "false gaps"),
    ("duplicates", "duplicates in clean"),
    ("missing_silent", "silently lost"),
    ("resend_passes", "resend passes needed"),
    ("final", "after resend"),
    ("seconds", "seconds"),
)
REQUIRED = ("scenario", "records", "delivered", "gaps_reported", "false_gaps", "duplicates")


def load(path: Path) -> list[dict[str, Any]]:
    """The results, one dict per scenario (last line wins), in first-seen order."""
    rows: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from exc
        missing = [key for key in REQUIRED if key not in row]
        if missing:
            raise ValueError(f"{path}:{number}: missing {', '.join(missing)}")
        rows[str(row["scenario"])] = row
    return list(rows.values())


def cell(row: dict[str, Any], key: str) -> str:
    """One table cell."""
    if key == "impairment":
        parts = [f"`{row['profile']}`" if row.get("profile") else ""]
        parts.append(str(row["fault"]) if row.get("fault") else "")
        return " + ".join(p for p in parts if p) or "none"
    if key == "final":
        if row.get("error"):
            return "ERROR"
        if row.get("ok"):
            return f"{row['final_delivered']}/{row['records']} once, 0 gaps"
        delivered, gaps = row.get("final_delivered", 0), row.get("final_open_gaps", 0)
        return f"{delivered}/{row['records']}, {gaps} gaps"
    return str(row.get(key, ""))


def render(rows: Sequence[dict[str, Any]], *, machine: str = "", command: str = "") -> str:
    """The Markdown table, with the run's machine and command above it when given."""
    lines = []
    if machine:
        lines.append(f"Machine: {machine}  ")
    if command:
        lines.append(f"Command: `{command}`")
    if lines:
        lines.append("")
    lines.append("| " + " | ".join(title for _, title in COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    lines.extend("| " + " | ".join(cell(row, key) for key, _ in COLUMNS) + " |" for row in rows)
    failed = [row for row in rows if row.get("error") or not row.get("ok")]
    lines.append("")
    lines.append(
        f"{len(rows) - len(failed)} of {len(rows)} scenarios ended with every record "
        "delivered exactly once and no gap open."
    )
    for row in failed:
        lines.append(f"- **{row['scenario']}**: {row.get('error') or 'not ok'}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table for a results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("results", type=Path, help="JSON-lines file written by the chaos suite")
    parser.add_argument("--machine", default="", help="machine description printed above the table")
    parser.add_argument("--command", default="", help="command that produced the results")
    args = parser.parse_args(argv)
    try:
        rows = load(args.results)
    except (OSError, ValueError) as exc:
        print(f"chaos_report: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(rows, machine=args.machine, command=args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
