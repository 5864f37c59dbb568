"""The map of docs/design.md ("Parts and arrows"), enforced: who may import whom.

``common`` is pure (tests/unit/test_purity.py); ``runtime`` is the one I/O layer (Kafka clients,
their errors, signals, key files, Spark's jars); the sides and the dedup sit on both and never on
each other; ``kafka_diode`` is the glue above everything. A new arrow is a design change: draw it
in docs/design.md first, then widen ``MAY_IMPORT`` here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_purity import _imports

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("common", "runtime", "sender", "receiver", "dedup", "netem", "kafka_diode")
MAY_IMPORT: dict[str, frozenset[str]] = {
    "common": frozenset({"common"}),
    "runtime": frozenset({"common", "runtime"}),
    "sender": frozenset({"common", "runtime", "sender"}),
    "receiver": frozenset({"common", "runtime", "receiver"}),
    "dedup": frozenset({"common", "runtime", "dedup"}),
    "netem": frozenset({"common", "runtime", "netem"}),
    "kafka_diode": frozenset(PARTS),
}
# Third-party imports that belong to one part only.
ONLY_IN: dict[str, frozenset[str]] = {
    "pyspark": frozenset({"dedup", "runtime"}),
    "confluent_kafka": frozenset({"runtime", "sender", "receiver", "dedup", "kafka_diode"}),
    "uvloop": frozenset({"runtime"}),
}
# The one module that may construct a Kafka client, and the one that installs signal handlers.
CLIENT_CLASSES = frozenset({"Producer", "Consumer", "AdminClient"})


def _modules() -> list[Path]:
    return sorted(p for part in PARTS for p in (ROOT / part).rglob("*.py"))


def _part(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_what_its_part_may(path: Path) -> None:
    part = _part(path)
    roots = _imports(path)
    if path.name == "__main__.py":
        # `python -m sender` is the dispatcher under another name.
        roots.discard("kafka_diode")
    wrong = {r for r in roots if r in PARTS and r not in MAY_IMPORT[part]}
    assert not wrong, f"{part} may not import {sorted(wrong)} (docs/design.md, Parts and arrows)"
    misplaced = {r for r in roots if r in ONLY_IN and part not in ONLY_IN[r]}
    assert not misplaced, (
        f"{sorted(misplaced)} belongs in {[sorted(ONLY_IN[m]) for m in misplaced]}"
    )


def _calls(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
            # a class handed to something that calls it (``executor(Consumer, props)``)
            names.update(arg.id for arg in node.args if isinstance(arg, ast.Name))
    return names


#: Who may do what only one module does: build a Kafka client, create a topic, install a
#: signal handler.
ONE_PLACE = {
    **dict.fromkeys(CLIENT_CLASSES, "runtime/kafka.py"),
    # creating topics and waiting for their leaders: runtime.kafka.ensure_topics
    "NewTopic": "runtime/kafka.py",
    "add_signal_handler": "runtime/service.py",
}
#: Not a service's stop policy: the receiver's worker parent forwards signals to its children;
#: the demo, a foreground tool, turns SIGTERM into Ctrl+C so it stops what it started.
SIGNAL_EXCEPTIONS = {"receiver/app.py", "kafka_diode/demo.py"}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_kafka_clients_and_signal_handlers_have_one_home(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    calls = _calls(ast.parse(path.read_text(encoding="utf-8")))
    for name, home in ONE_PLACE.items():
        assert name not in calls or where == home, f"{where} calls {name}: only {home} may"
    if "signal" in calls and where not in SIGNAL_EXCEPTIONS:
        assert where == "runtime/service.py", (
            f"{where} installs signal handlers: use runtime.service"
        )
