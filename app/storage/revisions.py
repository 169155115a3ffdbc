"""Which migrations this code ships and which one it ends at, read without importing Alembic.

Every process checks its schema at start (``app/ops/preflight.py``); importing Alembic and
loading its script directory for that cost about a tenth of a second of CPU per process, most
of a worker's start after its own imports. Each migration declares ``revision`` and
``down_revision`` as literals at the top level of its file, which is all the check needs;
``tests/unit/test_revisions.py`` holds the result equal to Alembic's own reading.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

VERSIONS = Path(__file__).parent / "migrations" / "versions"


def _declared(path: Path) -> tuple[str, tuple[str, ...]]:
    """A migration file's ``revision`` and the revisions it follows (none for the first)."""
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                raise ValueError(f"{path.name}: `{target.id}` is not a literal") from None
    revision, down = values.get("revision"), values.get("down_revision")
    if not isinstance(revision, str):
        raise ValueError(f'{path.name}: no literal `revision = "..."`')
    parents = () if down is None else (down,) if isinstance(down, str) else tuple(down)  # type: ignore[arg-type]
    return revision, parents


@cache
def chain() -> dict[str, tuple[str, ...]]:
    """Every revision this code ships, with the revisions each follows."""
    return dict(_declared(p) for p in sorted(VERSIONS.glob("*.py")) if not p.name.startswith("_"))


def head() -> str:
    """The revision the migrations end at: the schema this code needs."""
    followed = {parent for parents in chain().values() for parent in parents}
    heads = [revision for revision in chain() if revision not in followed]
    if len(heads) != 1:
        raise ValueError(f"the migrations must end at one head, not {sorted(heads)}")
    return heads[0]


def known(revision: str) -> bool:
    """True when ``revision`` is one of this code's migrations (not one a newer release wrote)."""
    return revision in chain()
