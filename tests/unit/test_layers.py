"""The layer rules import-linter cannot see, checked on the source.

The contracts between packages are in pyproject.toml (``lint-imports``, run by ``make lint``).
``celeryconfig`` is a top-level module, which import-linter cannot take as a root: every process
that publishes imports it, the web process included, so it may import only ``app`` and the
standard library (the strings it names modules by are checked in tests/unit/test_celeryconfig.py).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_roots(path: Path) -> set[str]:
    """The top-level package of every module ``path`` imports (absolute imports only)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted((ROOT / "app").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_app_imports_neither_flask_nor_celery(path: Path) -> None:
    assert imported_roots(path).isdisjoint(
        {"flask", "werkzeug", "celery", "kombu", "api", "tasks", "workers"}
    )


def test_celeryconfig_imports_the_core_and_the_standard_library_only() -> None:
    roots = imported_roots(ROOT / "celeryconfig.py")
    assert "app" in roots
    assert {r for r in roots if r not in sys.stdlib_module_names} == {"app"}
