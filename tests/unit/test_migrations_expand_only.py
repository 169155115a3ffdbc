"""Every migration after the recorded baseline is expand-only (docs/design.md, "Releases are
compatible both ways"): its ``upgrade()`` never drops or renames a table or column, never tightens
a column, never adds a NOT NULL column without a server default, and runs no raw SQL that does.
The previous release keeps serving on the new schema until its processes are replaced; removing
something it reads comes one release later, as its own migration, after a new baseline.

Read statically from the migration files' syntax trees (Alembic is not run).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

VERSIONS = Path(__file__).resolve().parents[2] / "app" / "storage" / "migrations" / "versions"
# The last migration written before the rule (0004 replaced a table). To contract a schema on
# purpose, ship the expand step in one release, then the contraction in the next with its own
# revision here, and say so in CHANGELOG.md.
EXPAND_ONLY_AFTER = "0004"

DROPS = frozenset({"drop_table", "drop_column", "drop_constraint", "rename_table", "drop_table_comment"})
RAW_CONTRACTION = re.compile(
    r"\b(DROP\s+(TABLE|COLUMN|CONSTRAINT)|RENAME\s+(TO|COLUMN)|SET\s+NOT\s+NULL|ALTER\s+COLUMN\s+\S+\s+TYPE)\b",
    re.IGNORECASE,
)


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def contractions(source: str) -> list[str]:
    """What ``upgrade()`` in ``source`` does that the previous release could not run beside."""
    found: list[str] = []
    for fn in ast.parse(source).body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "upgrade"):
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, line = node.func.attr, node.lineno
            if name in DROPS:
                found.append(f"line {line}: {name}")
            elif name == "alter_column":
                for arg in ("new_column_name", "type_"):
                    if _keyword(node, arg) is not None:
                        found.append(f"line {line}: alter_column({arg}=...)")
                if _is_false(_keyword(node, "nullable")):
                    found.append(f"line {line}: alter_column(nullable=False)")
            elif name == "add_column":
                for col in node.args[1:]:
                    if (
                        isinstance(col, ast.Call)
                        and _is_false(_keyword(col, "nullable"))
                        and _keyword(col, "server_default") is None
                    ):
                        found.append(f"line {line}: add_column of a NOT NULL column without a server_default")
            elif name == "execute":
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Constant)
                        and isinstance(sub.value, str)
                        and RAW_CONTRACTION.search(sub.value)
                    ):
                        found.append(f"line {line}: execute({sub.value.strip()[:60]!r})")
    return found


def _after_baseline() -> list[Path]:
    return sorted(p for p in VERSIONS.glob("[0-9]*.py") if p.name[:4] > EXPAND_ONLY_AFTER)


def test_the_baseline_names_a_migration_and_later_ones_exist() -> None:
    assert any(p.name.startswith(EXPAND_ONLY_AFTER) for p in VERSIONS.glob("*.py"))
    assert _after_baseline(), "no migration after the baseline: the check below checks nothing"


@pytest.mark.parametrize("path", _after_baseline(), ids=lambda p: p.name)
def test_every_migration_after_the_baseline_is_expand_only(path: Path) -> None:
    assert contractions(path.read_text()) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('op.drop_column("jobs", "state")', "drop_column"),
        ('with op.batch_alter_table("jobs") as b:\n        b.drop_column("state")', "drop_column"),
        ('op.rename_table("jobs", "jobs2")', "rename_table"),
        ('op.alter_column("jobs", "state", new_column_name="body")', "new_column_name"),
        ('op.alter_column("jobs", "agent_id", nullable=False)', "nullable=False"),
        ('op.add_column("jobs", sa.Column("x", sa.Integer, nullable=False))', "NOT NULL column"),
        ('op.execute("ALTER TABLE jobs DROP COLUMN state")', "execute"),
    ],
)
def test_the_check_sees_each_kind_of_contraction(body: str, expected: str) -> None:
    source = f"def upgrade() -> None:\n    {body}\n\n\ndef downgrade() -> None:\n    op.drop_table('jobs')\n"
    found = contractions(source)
    assert len(found) == 1 and expected in found[0], found


def test_expanding_and_downgrading_are_allowed() -> None:
    source = (
        "def upgrade() -> None:\n"
        '    op.create_table("t", sa.Column("id", sa.Integer, primary_key=True))\n'
        '    op.add_column("jobs", sa.Column("x", sa.Integer, nullable=True))\n'
        '    op.add_column("jobs", sa.Column("y", sa.Integer, nullable=False, server_default="0"))\n'
        '    op.create_index("ix", "t", ["id"])\n'
        "def downgrade() -> None:\n"
        '    op.drop_table("t")\n'
    )
    assert contractions(source) == []
