"""The dedup's modules, as docs/dedup-internals.md "How it works" names them: no import circle,
one owner for the rows between the stateful step and the write tasks, pyspark where Spark is
wired, and a theory of operation wherever a module grows long."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEDUP = ROOT / "dedup"
#: Modules that may import pyspark at module level (the others load it lazily, inside a task):
#: the session's wiring, and the worker daemon Spark runs as a process of its own.
PYSPARK_MODULES = {"job.py", "classify_sql.py", "worker_daemon.py", "raw_ranges.py"}
#: Names of the row contract (dedup/rows.py) that no other module may define.
CONTRACT = {"KIND_RUN", "KIND_GAP", "KIND_STAT", "STAT_COLUMNS", "OUTPUT_COLUMNS", "OUTPUT_DDL"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _dedup_imports(path: Path) -> set[str]:
    """dedup modules ``path`` imports (anywhere, lazily too), by file name."""
    out: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "dedup":
                out |= {f"{a.name}.py" for a in node.names}
            elif node.module.startswith("dedup."):
                out.add(node.module.split(".")[1] + ".py")
    return out - {path.name}


def test_the_dedup_modules_import_no_circle() -> None:
    graph = {p.name: _dedup_imports(p) for p in DEDUP.glob("*.py")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = sorted(name for name in graph if reaches(name, name, {name}))
    assert circles == [], f"import circle through {circles}"


def test_the_row_contract_has_one_owner() -> None:
    for path in DEDUP.glob("*.py"):
        if path.name == "rows.py":
            continue
        for node in _tree(path).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            assert not names & CONTRACT, f"{path.name} defines {names & CONTRACT}: dedup/rows.py"


def test_pyspark_is_imported_at_module_level_only_where_spark_is_wired() -> None:
    for path in DEDUP.glob("*.py"):
        top = {
            (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name
            for n in _tree(path).body
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
        }
        if "pyspark" in top:
            assert path.name in PYSPARK_MODULES, path.name


def test_long_modules_carry_a_theory_of_operation() -> None:
    for path in DEDUP.glob("*.py"):
        lines = path.read_text().count("\n")
        if lines > 600:
            doc = ast.get_docstring(_tree(path)) or ""
            assert "Theory of operation" in doc, f"{path.name}: {lines} lines, no theory block"
