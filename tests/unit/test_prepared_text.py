"""The PREPARE/EXECUTE text ``app/storage/direct.py`` derives from a compiled statement (pure)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, column, literal_column, select, table, text
from sqlalchemy.dialects.postgresql import psycopg2
from sqlalchemy.types import JSON, Integer, String

from app.storage.direct import _positional

DIALECT: Any = psycopg2.dialect()  # type: ignore[no-untyped-call]


def _compiled(statement: object) -> tuple[str, dict[str, object]]:
    compiled = statement.compile(dialect=DIALECT)  # type: ignore[attr-defined]
    return compiled.string, compiled.binds


def test_parameters_are_numbered_once_each_and_typed_from_their_binds() -> None:
    t = table("t", column("a", String(10)), column("b", JSON), column("n", Integer))
    stmt = select(t.c.a).where(
        t.c.a == bindparam("x", type_=String(10)),
        t.c.n > bindparam("n", type_=Integer),
        t.c.a != bindparam("x", type_=String(10)),  # the same parameter again: the same $1
    )
    sql, binds = _compiled(stmt)
    prepare, arguments = _positional(sql, binds, DIALECT)
    assert prepare.startswith("(VARCHAR(10), INTEGER) AS SELECT")
    assert prepare.count("$1") == 2 and prepare.count("$2") == 1 and "%(" not in prepare
    assert arguments == "(%(x)s, %(n)s)"


def test_a_literal_percent_is_unescaped_and_an_untyped_parameter_is_left_to_the_server() -> None:
    stmt = text("SELECT 'a%' || :v").bindparams(bindparam("v"))
    sql, binds = _compiled(stmt)
    assert "%%" in sql  # escaped for the driver's own interpolation
    prepare, arguments = _positional(sql, binds, DIALECT)
    assert prepare == "(unknown) AS SELECT 'a%' || $1"
    assert arguments == "(%(v)s)"


def test_a_statement_without_parameters_prepares_and_executes_without_arguments() -> None:
    sql, binds = _compiled(select(literal_column("1")))
    assert _positional(sql, binds, DIALECT) == ("AS SELECT 1", "")
