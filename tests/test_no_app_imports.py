"""Everything under ``workers/`` runs on worker computers, installed without
Flask: no module there may import the master (``app``) or Flask (DESIGN §3,
STYLE practice 10).

Each module is imported in a fresh interpreter, so one module's imports
cannot hide or cause another's; a second check reads the source, which also
catches imports made lazily inside functions.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("app", "flask")

_PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
bad = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(",".join(bad))
"""


def worker_modules() -> list[str]:
    """Every module under workers/, found from the files (a directory without
    ``__init__.py`` is a namespace package that pkgutil's walk would miss)."""
    names = set()
    for path in (ROOT / "workers").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__main__":  # importing it would run the program
            continue
        if parts[-1] == "__init__":
            parts.pop()
        names.add(".".join(parts))
    return sorted(names)


def test_the_walk_finds_the_sdk():
    assert {"workers.sdk", "workers.sdk._queue", "workers.wire.protocol"} <= set(worker_modules())


@pytest.mark.parametrize("module", worker_modules())
def test_importing_does_not_load_app_or_flask(module):
    probe = _PROBE.format(forbidden=set(FORBIDDEN))
    done = subprocess.run([sys.executable, "-c", probe, module], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"importing {module} failed:\n{done.stderr}"
    assert done.stdout.strip() == "", f"{module} loads {done.stdout.strip()}"


def _imported_roots(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


@pytest.mark.parametrize("path", sorted((ROOT / "workers").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_source_never_imports_app_or_flask(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [f"line {line}: {root}" for line, root in _imported_roots(tree) if root in FORBIDDEN]
    assert bad == [], f"{path.relative_to(ROOT)} imports {bad}"
