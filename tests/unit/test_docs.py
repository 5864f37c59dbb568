"""Documentation that is generated from code must match the code."""

import dataclasses
import importlib
from pathlib import Path

from common.settings import field_docs
from kafka_diode import docs_gen

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_matches_the_code() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == docs_gen.render(), (
        "docs/configuration.md is stale: run `make docs` (python -m kafka_diode.docs_gen)"
    )


def test_every_config_field_is_documented() -> None:
    for _, module, name, _, _ in docs_gen.SECTIONS:
        cls = getattr(importlib.import_module(module), name)
        docs = field_docs(cls)
        undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not undocumented, f"{name} fields without a docstring: {undocumented}"
