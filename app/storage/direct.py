"""Hot statements run straight on the driver's cursor (docs/design.md, "Per-job cost").

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
  (``hide_parameters``).
- **Observers see every statement.** When anything listens for cursor executions (a bench's
  statement counter, a test), the statement runs through SQLAlchemy so the listener sees it.
- **SQLite** (the embedded default) runs every statement through SQLAlchemy as before: only
  psycopg2 connections take the direct path.

Result rows are tuples (SQLAlchemy rows on the fallback), so callers read columns by position.
psycopg2 decodes JSON, JSONB and timestamps itself; SQLAlchemy adds no result processing for
them on this driver, so the values are the same on both paths (tested).

**Prepared statements** (``RECEIPT_DB_PREPARED_STATEMENTS=enabled``; ``db.make_engine`` marks each
new connection): a statement is prepared on the server the first time a connection runs it
(``PREPARE``, its parameters typed from the Core statement's binds) and executed by name after
that, so the server parses and plans it once per connection instead of on every job. psycopg2 has
no protocol-level preparation, so this is SQL-level ``PREPARE``, which lives in one server
session: it must stay off behind a transaction-mode pooler (PgBouncer ``pool_mode=transaction``),
where the next statement may run on another server connection. A statement the server no longer
has (``DEALLOCATE``, or a plan a migration made stale) is prepared again under a new name: at once
on an autocommit connection, else by the caller's transient-error retry (``retry.is_transient``).
A statement with an array parameter is never prepared (``_Compiled.preparable``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, bindparam
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Executable

DIRECT_DRIVER = "psycopg2"
# A connection's ``info`` key, set when prepared statements are on: {PREPARE text: EXECUTE text}.
PREPARED = "receipt_prepared"
# Beyond this many per connection, statements run unprepared (multi-row shapes are bounded anyway).
PREPARED_PER_CONNECTION = 256
_names = itertools.count(1)
_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s|%%")


@dataclass(frozen=True)
class _Compiled:
    sql: str
    keys: frozenset[str]  # the parameter names it was compiled for (an INSERT's or UPDATE's columns)
    literals: Mapping[str, Any]  # values bound when the statement was built (``state == 'pending'``)
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]
    prepare: str  # "(types) AS <the statement, its parameters numbered>", for PREPARE <name>
    arguments: str  # "(%(a)s, %(b)s, ...)": the EXECUTE arguments, in the numbered order
    # An array parameter (``id = ANY(:ids)``, the claim's batch reads) is never prepared: the
    # generic plan the server settles on cannot know the array's length, and one made while the
    # table was small scans it (measured: the claim went 0.8 -> 1.5 ms over 4 000 jobs).
    preparable: bool


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
    prepare, arguments = _positional(compiled.string, compiled.binds, dialect)
    preparable = not any(_is_array(bind.type) for bind in compiled.binds.values())
    return _Compiled(
        compiled.string, frozenset(params), literals, tuple(processors), prepare, arguments, preparable
    )


def _is_array(type_: Any) -> bool:
    return getattr(type_, "_is_array", False) or getattr(type_, "__visit_name__", "") == "ARRAY"


def _positional(sql: str, binds: Mapping[str, Any], dialect: Any) -> tuple[str, str]:
    """The statement with ``$n`` parameters and their types, and the EXECUTE arguments that bind them."""
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:  # ``%%``: a literal percent sign, escaped for the driver's interpolation
            return "%"
        return f"${order.setdefault(name, len(order) + 1)}"

    body = _PLACEHOLDER.sub(number, sql)
    types = [_type_name(binds[name].type, dialect) if name in binds else "unknown" for name in order]
    prepare = (f"({', '.join(types)}) " if types else "") + f"AS {body}"
    arguments = "(" + ", ".join(f"%({name})s" for name in order) + ")" if order else ""
    return prepare, arguments


def _type_name(type_: Any, dialect: Any) -> str:
    """A parameter's PostgreSQL type, from its Core type; ``unknown`` lets the server infer it."""
    if type_._isnull:
        return "unknown"
    return str(dialect.type_compiler_instance.process(type_))


def _run(conn: Connection, compiled: _Compiled, params: Mapping[str, Any]) -> Any:
    values = {**compiled.literals, **params}
    for name, process in compiled.processors:
        if name in values:
            values[name] = process(values[name])
    fairy = conn.connection
    dbapi = fairy.dbapi_connection
    prepared: dict[str, str] | None = fairy.info.get(PREPARED) if compiled.preparable else None
    cursor = dbapi.cursor()  # type: ignore[union-attr]
    try:
        if prepared is None:
            cursor.execute(compiled.sql, values)
        else:
            try:
                _execute_prepared(cursor, prepared, compiled, values)
            except Exception as exc:
                if not _lost_prepared(exc, prepared, compiled) or not dbapi.autocommit:  # type: ignore[union-attr]
                    raise
                _execute_prepared(cursor, prepared, compiled, values)  # prepared again, new name
    except Exception as exc:
        cursor.close()
        # SQLAlchemy's own handler: wraps the error, invalidates a dropped connection, hides
        # parameters. Private, but the one path that does all three as a statement would.
        conn._handle_dbapi_exception(exc, compiled.sql, values, None, None)
    return cursor


def _execute_prepared(cursor: Any, prepared: dict[str, str], compiled: _Compiled, values: Any) -> None:
    # Keyed by the typed text: two statements alike but for a parameter's type are two statements.
    execute = prepared.get(compiled.prepare)
    if execute is None:
        if len(prepared) >= PREPARED_PER_CONNECTION:
            cursor.execute(compiled.sql, values)
            return
        name = f"receipt_{next(_names)}"
        cursor.execute(f"PREPARE {name} {compiled.prepare}")
        execute = prepared[compiled.prepare] = f"EXECUTE {name} {compiled.arguments}"
    cursor.execute(execute, values)


def lost_preparation(exc: BaseException | None) -> bool:
    """Whether a driver error says the server lost a statement's preparation: it has no such
    statement (26000), or its plan no longer matches the tables' row types (0A000, "cached plan
    must not change result type", after a migration)."""
    code = getattr(exc, "pgcode", None)
    return code == "26000" or (code == "0A000" and "cached plan" in str(exc))


def _lost_prepared(exc: Exception, prepared: dict[str, str], compiled: _Compiled) -> bool:
    """``lost_preparation``, and if so the statement is forgotten here, so the next run prepares
    it again under a new name (the old one may still exist)."""
    if not lost_preparation(exc):
        return False
    prepared.pop(compiled.prepare, None)
    return True


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
