"""common/ does no I/O (docs/design.md, "A sans-IO core"): no sockets, threads, files, event loops,
processes, Kafka or Spark.

Two checks over every module of ``common``, both by reading its syntax tree:

- imports: nothing from ``BANNED`` (the I/O and concurrency modules, the clients and engines);
- calls: no ``open()``, no ``Path.read_*``/``write_*`` and kin, no file-system calls of ``os``, no
  file-like ``.open(...)`` (``encoding=``/``mode=`` or a literal mode), no HTTP server starters.

``impure_uses`` is the checker; ``test_the_checker_flags_a_planted_*`` feed it planted snippets,
so a checker that quietly stopped seeing something fails too. ``KNOWN`` lists the few uses that
remain, each with its reason; a new one fails, and so does an entry that is no longer needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

#: Imports that mean I/O or concurrency (or a client/engine that does it), by top-level module,
#: or by dotted name where the top level is harmless (``http.server`` but not ``http.HTTPStatus``).
BANNED = frozenset(
    {
        "asyncio",
        "socket",
        "socketserver",
        "ssl",
        "selectors",
        "select",
        "subprocess",
        "multiprocessing",
        "threading",
        "_thread",
        "concurrent",
        "tempfile",
        "shutil",
        "glob",
        "mmap",
        "fcntl",
        "confluent_kafka",
        "pyspark",
        "uvloop",
        "urllib.request",
        "http.server",
        "http.client",
        "wsgiref",
    }
)
#: Path methods that touch the file system.
PATH_IO = frozenset(
    {
        "read_text",
        "read_bytes",
        "write_text",
        "write_bytes",
        "touch",
        "unlink",
        "mkdir",
        "rmdir",
        "iterdir",
        "glob",
        "rglob",
        "symlink_to",
        "hardlink_to",
        "chmod",
        "exists",
        "is_file",
        "is_dir",
    }
)
#: ``os`` (and ``os.path``) functions that touch files, directories or processes.
OS_IO = frozenset(
    {
        "open",
        "fdopen",
        "read",
        "write",
        "close",
        "stat",
        "lstat",
        "fstat",
        "remove",
        "unlink",
        "rename",
        "replace",
        "fsync",
        "chmod",
        "fchmod",
        "chown",
        "fchown",
        "mkdir",
        "makedirs",
        "rmdir",
        "listdir",
        "scandir",
        "walk",
        "truncate",
        "link",
        "symlink",
        "utime",
        "pipe",
        "fork",
        "kill",
        "system",
        "popen",
        "exists",
        "isfile",
        "isdir",
        "getsize",
        "getmtime",
    }
)
#: Starters of a server thread (prometheus_client's and the standard library's).
SERVERS = frozenset({"start_http_server", "start_wsgi_server", "serve_forever"})
#: Keyword arguments that make ``x.open(...)`` a file open (AES-GCM's ``open`` takes none).
FILE_OPEN_KEYWORDS = frozenset({"mode", "encoding", "errors", "newline", "buffering"})

COMMON = Path(__file__).resolve().parents[2] / "common"

#: What remains, and why: ``(module, finding)`` -> reason. Shrink only.
KNOWN: dict[tuple[str, str], str] = {
    ("wire/envelope.py", "Path.read_text()"): (
        "reads its own Avro schemas (package data in common/schema/, a resource: from a zip too)"
        " once, at import"
    ),
}


def _imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports of ``path`` (what the architecture test uses)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _banned(module: str) -> bool:
    parts = module.split(".")
    return any(".".join(parts[: i + 1]) in BANNED for i in range(len(parts)))


def _dotted(node: ast.expr) -> str:
    """``os.path.exists`` for the function of a call, or "" when it is not a plain name chain."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _is_file_open(call: ast.Call) -> bool:
    if any(kw.arg in FILE_OPEN_KEYWORDS for kw in call.keywords):
        return True
    first = call.args[0] if call.args else None
    return not call.args or (isinstance(first, ast.Constant) and isinstance(first.value, str))


def impure_uses(source: str) -> set[str]:
    """Every file, socket, thread or process use in ``source``, one finding per kind."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(f"import {a.name}" for a in node.names if _banned(a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _banned(node.module):
                found.add(f"import {node.module}")
            found.update(f"import {a.name}" for a in node.names if a.name in SERVERS)
            found.update(
                f"import {node.module}.{a.name}"
                for a in node.names
                if _banned(f"{node.module}.{a.name}")
            )
        elif isinstance(node, ast.Call):
            func = node.func
            name = _dotted(func)
            if isinstance(func, ast.Name) and func.id in {"open", *SERVERS}:
                found.add(f"{func.id}()")
            elif name.startswith(("os.", "os.path.")) and name.rsplit(".", 1)[1] in OS_IO:
                found.add(f"{name}()")
            elif isinstance(func, ast.Attribute):
                if func.attr in PATH_IO:
                    found.add(f"Path.{func.attr}()")
                elif func.attr in SERVERS:
                    found.add(f"{func.attr}()")
                elif func.attr == "open" and _is_file_open(node):
                    found.add("file .open()")
    return found


def _common_modules() -> list[Path]:
    return sorted(COMMON.rglob("*.py"))


def _findings(path: Path) -> set[tuple[str, str]]:
    where = str(path.relative_to(COMMON))
    return {(where, f) for f in impure_uses(path.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("path", _common_modules(), ids=lambda p: str(p.relative_to(COMMON)))
def test_common_module_does_no_io(path: Path) -> None:
    new = {f for f in _findings(path) if f not in KNOWN}
    assert not new, (
        f"common/{path.relative_to(COMMON)} does I/O: {sorted(new)} (move it to runtime/)"
    )


def test_every_known_exception_is_still_needed() -> None:
    found = {f for path in _common_modules() for f in _findings(path)}
    stale = set(KNOWN) - found
    assert not stale, f"no longer found, delete from KNOWN: {sorted(stale)}"


def test_the_purity_check_sees_common_modules() -> None:
    assert len(_common_modules()) >= 3


PLANTED = {
    "import socket": "import socket\n",
    "import threading": "import threading\n",
    "import http.server": "from http.server import HTTPServer\n",
    "import http.server.HTTPServer": "from http import server\n",
    "import tempfile": "import tempfile as t\n",
    "import start_http_server": "from prometheus_client import start_http_server\n",
    "start_http_server()": "import prometheus_client\nprometheus_client.start_http_server(9)\n",
    "open()": "def f(p):\n    with open(p, 'rb') as fh:\n        return fh.read()\n",
    "Path.read_text()": "from pathlib import Path\nx = Path('k.json').read_text()\n",
    "Path.write_bytes()": "def f(p, b):\n    p.write_bytes(b)\n",
    "Path.exists()": "def f(p):\n    return p.exists()\n",
    "os.stat()": "import os\nos.stat('k')\n",
    "os.replace()": "import os\nos.replace('a', 'b')\n",
    "os.path.exists()": "import os\nos.path.exists('k')\n",
    "file .open()": "def f(p):\n    return p.open(encoding='utf-8')\n",
}


@pytest.mark.parametrize("finding", sorted(PLANTED))
def test_the_checker_flags_a_planted_violation(finding: str) -> None:
    found = impure_uses(PLANTED[finding])
    if finding == "import http.server.HTTPServer":  # ``from http import server``
        assert "import http.server" in found
    else:
        assert finding in found


def test_the_checker_flags_a_planted_module_under_common(tmp_path: Path) -> None:
    """The whole path a real module takes: a file under a ``common`` tree, its findings, KNOWN."""
    planted = tmp_path / "common" / "wire" / "sneaky.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        '"""A key reader that should live in runtime/."""\n'
        "import json\n"
        "from pathlib import Path\n\n\n"
        "def load(path: Path) -> object:\n"
        "    return json.loads(Path(path).read_text(encoding='utf-8'))\n",
        encoding="utf-8",
    )
    found = impure_uses(planted.read_text(encoding="utf-8"))
    assert found == {"Path.read_text()"}
    assert ("wire/sneaky.py", "Path.read_text()") not in KNOWN


def test_the_checker_leaves_pure_code_alone() -> None:
    """What common really does: AES-GCM ``open``, ``str.replace``, ``os.urandom``, ``io``."""
    source = (
        "import io, os, json\n"
        "from http import HTTPStatus\n"
        "def f(cipher, seq, data, aad, s):\n"
        "    buf = io.BytesIO(data)\n"
        "    return cipher.open(seq, data, aad), s.replace('a', 'b'), os.urandom(16), buf\n"
    )
    assert impure_uses(source) == set()
