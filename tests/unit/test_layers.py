"""The layer rules, checked on the source: ``app/`` never imports Flask or Celery, and the API's
wake-up imports no worker code."""

from __future__ import annotations

import ast
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


def test_the_wake_up_publisher_imports_no_worker_code() -> None:
    assert imported_roots(ROOT / "api" / "wake.py").isdisjoint({"tasks", "workers"})
