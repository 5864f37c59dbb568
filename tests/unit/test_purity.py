"""common/ must stay pure (STYLE.md §1): no sockets, event loops, Kafka or Spark imports."""

import ast
from pathlib import Path

import pytest

BANNED = {"asyncio", "socket", "confluent_kafka", "pyspark", "uvloop", "selectors", "subprocess"}
COMMON = Path(__file__).resolve().parents[2] / "common"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    "path", sorted(COMMON.rglob("*.py")), ids=lambda p: str(p.relative_to(COMMON))
)
def test_common_module_imports_nothing_impure(path: Path) -> None:
    assert not (_imports(path) & BANNED), f"{path} imports {_imports(path) & BANNED}"


def test_the_purity_check_sees_common_modules() -> None:
    assert len(list(COMMON.rglob("*.py"))) >= 3
