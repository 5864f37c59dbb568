"""The map of docs/design.md ("Parts and arrows"), enforced: who may import whom.

``common`` is pure (tests/unit/test_purity.py); ``runtime`` is the one I/O layer (Kafka clients,
their errors, signals, key files, Spark's jars); the sides and the dedup sit on both and never on
each other; ``kafka_diode`` is the glue above everything, and nothing imports it (a component's
``python -m`` runs its own CLI). A new arrow is a design change: draw it in docs/design.md first,
then widen ``MAY_IMPORT`` here.

Also enforced (issue #26): one entrance into the send pipeline (only ``sender/send_path.py``
builds the wire ``Encoder``, only ``sender/send_pipeline.py`` uses it), one place that watches
files (``runtime/file_watch.py``) and one that reads and writes key files
(``runtime/key_files.py``), module names that say one thing each, and comments that cite only
files that exist.
"""

from __future__ import annotations

import ast
import re
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
    # creating topics and waiting for their leaders: runtime.kafka.create_missing_topics
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


def _source(where: str) -> str:
    return (ROOT / where).read_text(encoding="utf-8")


def _names(tree: ast.AST) -> set[str]:
    """Every name and attribute a module mentions (imports included)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            out.update(a.asname or a.name for a in node.names)
    return out


#: name -> the modules that may mention it (in code, not in docstrings).
OWNERS: dict[str, frozenset[str]] = {
    # The send pipeline owns the session's encoder: the app and the resend feed the pipeline.
    "Encoder": frozenset({"sender/send_path.py", "sender/send_pipeline.py"}),
    "_encoder": frozenset({"sender/send_pipeline.py"}),
    # One file-watch rule: modification times are read in one place.
    "st_mtime_ns": frozenset({"runtime/file_watch.py"}),
    "st_mtime": frozenset(),
    # Key documents become files, and files key documents, in one place.
    "from_dict": frozenset({"runtime/key_files.py"}),
    "public_keys_from_document": frozenset({"runtime/key_files.py"}),
    "receiver_keys_from_document": frozenset({"runtime/key_files.py"}),
    "signing_key_from_document": frozenset({"runtime/key_files.py"}),
    "write_json_atomically": frozenset({"runtime/key_files.py"}),
    # Serving /metrics is I/O: runtime's.
    "start_http_server": frozenset({"runtime/metrics_http.py"}),
}
#: Where the parts keep code that is not theirs to own (none may use the names above).
SIDES = ("sender", "receiver", "dedup", "netem", "kafka_diode", "runtime")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_owned_names_are_used_only_by_their_owners(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    if _part(path) not in SIDES:
        return  # common defines them; its own purity is test_purity's
    used = _names(ast.parse(path.read_text(encoding="utf-8")))
    for name, owners in OWNERS.items():
        if name == "from_dict" and _part(path) == "dedup":
            continue  # KeyRing.from_dict is not the only from_dict (the dedup's own records)
        assert name not in used or where in owners, (
            f"{where} uses {name}: only {sorted(owners) or 'common'} may (docs/design.md)"
        )


def test_the_owned_names_exist_where_they_are_owned() -> None:
    """A rename that leaves OWNERS behind must not make the rules above vacuous."""
    for name, owners in OWNERS.items():
        for where in owners:
            assert name in _names(ast.parse(_source(where))), f"{where} no longer uses {name}"


#: A module name per concept; these role names repeat once per component on purpose.
ROLE_NAMES = frozenset(
    {"__init__.py", "__main__.py", "app.py", "cli.py", "config.py", "metrics.py", "transport.py"}
)


def test_module_names_say_one_thing() -> None:
    """No two modules share a name (four ``pubkey.py`` and two ``pipeline.py`` did), and no
    module name is the other's with a synonym (``content_filter`` beside ``record_filter``)."""
    seen: dict[str, list[str]] = {}
    for path in _modules():
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    for folder in ("bench", "scripts"):
        for path in (ROOT / folder).glob("*.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: places for name, places in seen.items() if len(places) > 1}
    assert set(twice) <= ROLE_NAMES, {n: p for n, p in twice.items() if n not in ROLE_NAMES}
    assert not (ROOT / "sender" / "content_filter.py").exists()


def test_a_component_runs_as_a_module_without_the_dispatcher() -> None:
    for part in ("sender", "receiver", "dedup", "netem"):
        main = ROOT / part / "__main__.py"
        assert "kafka_diode" not in _imports(main)
        assert f"from {part}.cli import main" in main.read_text(encoding="utf-8")


#: A path a comment or docstring cites, and the design files that are not in the repository.
_CITED = re.compile(
    r"(?<![\w/.])((?:docs|common|runtime|sender|receiver|dedup|netem|kafka_diode|tests|bench|"
    r"scripts|packaging)/[\w./-]*\w\.(?:md|py|avsc|toml|ya?ml|json|service))"
)
_BARE_DOC = re.compile(r"(?<![\w/])([A-Z][A-Z_]+\.md)\b")
#: Left to the issue that rewrites the dedup (it may not be edited here); shrink only.
CITES_PENDING: set[tuple[str, str]] = set()


def _dead_citations() -> set[tuple[str, str]]:
    dead: set[tuple[str, str]] = set()
    for path in _modules():
        where = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        dead.update((where, m) for m in _CITED.findall(text) if not (ROOT / m).exists())
        dead.update((where, m) for m in _BARE_DOC.findall(text) if not (ROOT / m).exists())
    return dead


def test_comments_cite_only_files_that_exist() -> None:
    dead = _dead_citations()
    assert dead <= CITES_PENDING, sorted(dead - CITES_PENDING)
    assert dead >= CITES_PENDING, f"fixed, delete from CITES_PENDING: {CITES_PENDING - dead}"


def test_the_citation_check_sees_a_planted_dead_reference() -> None:
    planted = "# as DESIGN.md §4 and docs/nowhere.md say; docs/design.md exists\n"
    assert _BARE_DOC.findall(planted) == ["DESIGN.md"]
    cited = _CITED.findall(planted)
    assert cited == ["docs/nowhere.md", "docs/design.md"]
    assert [c for c in cited if not (ROOT / c).exists()] == ["docs/nowhere.md"]


#: The layout names (``dedup.layouts.Layout``, and the retired one) and the names that hold one.
LAYOUT_NAMES = frozenset({"buckets", "direct", "partitions"})
LAYOUT_HOLDERS = frozenset({"Layout", "state_layout", "new_state_layout"})


def _holds_layout(node: ast.AST) -> bool:
    """``Layout``, ``x.state_layout``, ``x.new_state_layout`` or ``<...layout>.kind``."""
    if isinstance(node, ast.Name):
        return node.id in LAYOUT_HOLDERS
    if isinstance(node, ast.Attribute):
        if node.attr in LAYOUT_HOLDERS:
            return True
        base = node.value
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        return node.attr == "kind" and name.lower().endswith("layout")
    return False


def _layout_branches(tree: ast.AST) -> list[int]:
    """Lines that compare with a layout: a layout name, ``Layout.X``, or a value that holds one
    (``config.state_layout``, ``layout.kind``), in a comparison or a ``match``."""

    def names_layout(node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and sub.value in LAYOUT_NAMES:
                return True
            if _holds_layout(sub):
                return True
        return False

    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and names_layout(node)) or (
            isinstance(node, ast.Match) and names_layout(node.subject)
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_layout_modules_branch_on_a_layout() -> None:
    """The state layout is a named seam (``dedup/layouts/``): each layout's module says how it
    plans the query, runs a task, where ticks go and where a reset points, and no other module
    compares with a layout (issue #46: nine did, and ``runner.py`` with the bare ``"direct"``)."""
    layouts = ROOT / "dedup" / "layouts"
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "dedup").rglob("*.py"))
        if not path.is_relative_to(layouts)
        and (lines := _layout_branches(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}


@pytest.mark.parametrize(
    "planted",
    [
        'if config.new_state_layout == "direct":\n    pass',
        "x = layout.kind is Layout.BUCKETS",
        'ok = name in ("buckets", "partitions")',
        "match config.state_layout:\n    case _:\n        pass",
    ],
)
def test_the_layout_check_sees_a_planted_branch(planted: str) -> None:
    assert _layout_branches(ast.parse(planted)) == [1]


def test_the_sender_starts_without_the_decoders_imports() -> None:
    """A sender only encodes: the wire decoder (and numpy, which its batch decoder needs) stays
    out of its start-up (common/wire/__init__.py imports ``Decoder`` on first use)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    probe = (
        "import sys, sender.app, sender.cli; "
        "print(sorted(m for m in ('numpy', 'common.wire.decoder') if m in sys.modules)); "
        "from common.wire import Decoder; print(Decoder.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()  # fmt: skip
    assert out == ["[]", "common.wire.decoder"]
