"""Migrations produce exactly the declared schema, on every backend, and migrating is idempotent."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Index, Integer, MetaData, inspect
from sqlalchemy.engine import Engine

from app.ops import cli
from app.storage.db import make_engine, metadata
from app.storage.migrate import alembic_config, current, upgrade


def schema_diff(engine: Engine, target: MetaData) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff: list[Any] = compare_metadata(context, target)
    return diff


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def test_migrated_schema_equals_the_declared_metadata(engine: Engine) -> None:
    assert schema_diff(engine, metadata) == []
    assert current(engine) == head_revision()


def test_the_schema_comparison_would_see_a_difference(engine: Engine) -> None:
    """Control: the diff above is empty because the schemas agree, not because nothing is compared."""
    changed = MetaData()
    for table in metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["jobs"].append_column(Column("extra", Integer, nullable=True))
    Index("ix_receipts_type", changed.tables["receipts"].c.type)
    diff = schema_diff(engine, changed)
    kinds = sorted(d[0] if isinstance(d, tuple) else d[0][0] for d in diff)
    assert kinds == ["add_column", "add_index"]


def test_receipt_migrate_is_idempotent(
    database_url: str, backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`receipt migrate` on an already-migrated database changes nothing and succeeds."""
    engine = make_engine(database_url)
    try:
        before = {t: inspect(engine).get_columns(t) for t in sorted(metadata.tables)}
        monkeypatch.setenv("DATABASE_URL", database_url)
        for _ in range(2):
            assert cli.main(["migrate"]) == 0
        assert f"database at revision {head_revision()}" in capsys.readouterr().err
        after = {t: inspect(engine).get_columns(t) for t in sorted(metadata.tables)}
        assert repr(after) == repr(before)
        assert schema_diff(engine, metadata) == []
    finally:
        engine.dispose()


def test_migrate_creates_the_embedded_sqlite_under_receipt_home(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECEIPT_HOME", str(tmp_path / "home"))
    assert cli.main(["migrate"]) == 0
    assert cli.main(["migrate"]) == 0
    db = tmp_path / "home" / "receipt.db"
    assert db.exists()
    engine = make_engine(f"sqlite:///{db}")
    try:
        assert schema_diff(engine, metadata) == []
        assert current(engine) == head_revision()
    finally:
        engine.dispose()


def test_upgrade_of_a_fresh_postgres_database(pg_admin: Engine) -> None:
    """Not from the template: a brand-new empty database migrates to exactly the metadata."""
    from tests.support.databases import new_database

    with new_database(pg_admin, "receipt_mig") as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            upgrade(engine)
            assert schema_diff(engine, metadata) == []
        finally:
            engine.dispose()
