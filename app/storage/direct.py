"""Hot statements run straight on the driver's cursor (issue 12, "per-job cost").

A job's four transactions (enqueue, claim, lease, settle) are a handful of small statements each,
and SQLAlchemy's per-execution machinery -- an execution context, parameter processing, result
wrapping -- was about half of each transaction's client CPU (``py-spy --gil`` on the worker and
in-process: ``bench/README.md``, "Per-job levers"). ``Direct`` keeps the statement written once,
in SQLAlchemy Core, next to its table; it is compiled once per process to its SQL text, its bound
literals and its bind processors (JSON encoding), and then executed on the DBAPI cursor of the
caller's own connection, inside the caller's transaction.

What does not change:

- **The transaction is SQLAlchemy's.** The statement runs on the connection SQLAlchemy checked
  out and began; it commits or rolls back with everything else on it.
- **Errors are SQLAlchemy's.** A driver error goes through the connection's own handler, so a
  unique violation is still ``sqlalchemy.exc.IntegrityError`` (an append conflict), a dropped
  connection still invalidates the pooled connection, and parameters stay hidden from messages
  (``hide_parameters``, issue 8).
- **Observers see every statement.** When anything listens for cursor executions (a bench's
  statement counter, a test), the statement runs through SQLAlchemy so the listener sees it.
- **SQLite** (the embedded default) runs every statement through SQLAlchemy as before: only
  psycopg2 connections take the direct path.

Result rows are tuples (SQLAlchemy rows on the fallback), so callers read columns by position.
psycopg2 decodes JSON, JSONB and timestamps itself; SQLAlchemy adds no result processing for
them on this driver, so the values are the same on both paths (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, bindparam
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Executable

DIRECT_DRIVER = "psycopg2"


@dataclass(frozen=True)
class _Compiled:
    sql: str
    keys: frozenset[str]  # the parameter names it was compiled for (an INSERT's or UPDATE's columns)
    literals: Mapping[str, Any]  # values bound when the statement was built (``state == 'pending'``)
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]


class Direct:
    """One statement built once; on psycopg2 it runs on the driver's cursor (module docstring)."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._compiled: _Compiled | None = None

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        """Every row the statement returns."""
        compiled = self._direct(conn, params)
        if compiled is None:
            return conn.execute(self.statement, dict(params)).all()
        cursor = _run(conn, compiled, params)
        try:
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows
        finally:
            cursor.close()

    def count(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """The number of rows the statement changed."""
        compiled = self._direct(conn, params)
        if compiled is None:
            return int(conn.execute(self.statement, dict(params)).rowcount)
        cursor = _run(conn, compiled, params)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    @staticmethod
    def available(conn: Connection) -> bool:
        """Whether statements on ``conn`` take the direct path (psycopg2, nobody observing)."""
        if conn.dialect.driver != DIRECT_DRIVER:
            return False
        events = conn.dispatch
        return not (events.before_cursor_execute or events.after_cursor_execute)

    def _direct(self, conn: Connection, params: Mapping[str, Any]) -> _Compiled | None:
        if not self.available(conn):
            return None
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = _compile(self.statement, conn, params)
        elif compiled.keys != params.keys():
            # An INSERT or UPDATE sets the columns it was compiled for: a caller passing others
            # is a bug here, not something to run differently.
            raise ValueError(f"parameters {sorted(params)} differ from the compiled {sorted(compiled.keys)}")
        return compiled


def _compile(statement: Executable, conn: Connection, params: Mapping[str, Any]) -> _Compiled:
    dialect = conn.dialect
    # Compiled for these parameter names, as SQLAlchemy compiles per set of keys: an INSERT or
    # UPDATE without explicit values sets exactly the columns passed.
    compiled = statement.compile(dialect=dialect, column_keys=list(params))  # type: ignore[attr-defined]
    literals: dict[str, Any] = {}
    processors: list[tuple[str, Callable[[Any], Any]]] = []
    for name, bind in compiled.binds.items():
        if bind.expanding:
            raise ValueError(f"Direct cannot run an expanding parameter ({name}); use SQLAlchemy")
        if not bind.required:
            literals[name] = bind.effective_value
        process = bind.type.bind_processor(dialect)
        if process is not None:
            processors.append((name, process))
    return _Compiled(compiled.string, frozenset(params), literals, tuple(processors))


def _run(conn: Connection, compiled: _Compiled, params: Mapping[str, Any]) -> Any:
    values = {**compiled.literals, **params}
    for name, process in compiled.processors:
        if name in values:
            values[name] = process(values[name])
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(compiled.sql, values)
    except Exception as exc:
        cursor.close()
        # SQLAlchemy's own handler: wraps the error, invalidates a dropped connection, hides
        # parameters. Private, but the one path that does all three as a statement would.
        conn._handle_dbapi_exception(exc, compiled.sql, values, None, None)
    return cursor


def multi_row_values(columns: Iterable[Column[Any]], n: int) -> list[dict[str, Any]]:
    """The VALUES of an ``n``-row INSERT of ``columns``: parameter ``<column>_<i>`` for row ``i``,
    each typed as its column (SQLAlchemy types only the first row's otherwise)."""
    cols = list(columns)
    return [{c.key: bindparam(f"{c.key}_{i}", type_=c.type) for c in cols} for i in range(n)]


def multi_row_params(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of ``rows`` for a statement built with ``multi_row_values``."""
    return {f"{name}_{i}": value for i, row in enumerate(rows) for name, value in row.items()}


class DirectMany:
    """``Direct`` for a statement whose shape depends on a row count (a multi-row INSERT):
    ``build(n)`` writes it once per ``n`` (up to ``limit`` shapes are kept)."""

    def __init__(self, build: Callable[[int], Executable], limit: int = 32) -> None:
        self._build = build
        self._limit = limit
        self._by_count: dict[int, Direct] = {}

    def for_rows(self, n: int) -> Direct:
        found = self._by_count.get(n)
        if found is None:
            found = Direct(self._build(n))
            if len(self._by_count) < self._limit:
                self._by_count[n] = found
        return found
