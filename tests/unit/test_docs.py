"""Documentation that is generated from code must match the code."""

import dataclasses
import importlib
import re
from pathlib import Path

from common.settings import field_docs
from kafka_diode import cli_reference, docs_gen
from kafka_diode.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_matches_the_code() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == docs_gen.render(), (
        "docs/configuration.md is stale: run `make docs` (python -m kafka_diode.docs_gen)"
    )


def test_every_config_field_is_documented() -> None:
    for section in docs_gen.SECTIONS:
        cls = getattr(importlib.import_module(section.module), section.class_name)
        docs = field_docs(cls)
        undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not undocumented, f"{section.class_name} fields without a docstring: {undocumented}"


def test_every_option_of_every_command_is_in_the_reference() -> None:
    """Against each command's argparse parser: every flag and positional has a row."""
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found = cli_reference.command_parsers()
    titles = [title for title, _ in found]
    assert {f"kafka-diode {c}" for c in SUBCOMMANDS} <= set(titles)
    for must in ("gaps", "resend", "netem relay", "keygen", "local-kafka start", "dedup reset"):
        assert f"kafka-diode {must}" in titles
    missing = []
    for title, parser in found:
        section = committed.partition(f"\n### {title}\n")[2].partition("\n### ")[0]
        assert section, f"no section for {title}"
        for action in cli_reference.documented_actions(parser):
            for option in action.option_strings or [action.dest]:
                name = option if action.option_strings else cli_reference._argument(action)
                if f"`{name}`" not in section:
                    missing.append(f"{title} {name}")
    assert not missing, f"options missing from docs/configuration.md: {missing}"


def test_capture_runs_nothing_of_the_command(tmp_path: Path) -> None:
    """Finding keygen's parser writes no key file: the command stopped at parsing."""
    key = tmp_path / "link.key"
    parser = cli_reference.capture_parser("keygen", ["--out", str(key)])
    assert parser.prog == "kafka-diode keygen"
    assert not key.exists()


def test_every_table_row_of_the_reference_has_its_header_s_columns() -> None:
    """A ``|`` inside a cell (a Literal's choices, a docstring) must be escaped, or it splits the
    row and shifts every later cell of it."""
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    bars = re.compile(r"(?<!\\)\|")
    width = 0
    broken = []
    for line in committed.splitlines():
        if not line.startswith("|"):
            width = 0
            continue
        cells = len(bars.findall(line))
        if width == 0:
            width = cells  # a header row
        elif cells != width:
            broken.append(line[:80])
    assert not broken, broken
