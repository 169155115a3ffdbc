"""Many rows in one statement whose text never varies: a page of inserts or updates as column arrays.

On PostgreSQL a page is ``INSERT … SELECT * FROM unnest(:a, :b, …)`` or ``UPDATE … FROM unnest(…)``:
one array parameter per column, so the statement is the same text for one row or five hundred (no
per-row SQL to build and compile) and one round trip. SQLite (the embedded default, one writer at a
time, in-process) runs plain statements row by row. Used where a pass writes a page at once: the
schedules pass's new jobs, their receipts and its schedule rows.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    text,
)
from sqlalchemy import update as sql_update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection
from sqlalchemy.types import TypeEngine

from app.storage.db import is_sqlite

# The prefix of a matched (old) value's parameter, beside the new values' own names.
_MATCH = "m_"
_COMPACT = (",", ":")


def _postgres_type(column_type: TypeEngine[Any]) -> TypeEngine[Any]:
    variants: Mapping[str, TypeEngine[Any]] = getattr(column_type, "_variant_mapping", {})
    return variants.get("postgresql", column_type)


def _array_type(column_type: TypeEngine[Any]) -> str:
    """The PostgreSQL array type an array parameter of this column is cast to."""
    impl = _postgres_type(column_type)
    for kind, name in (
        (JSONB, "jsonb[]"),
        (JSON, "json[]"),
        (Boolean, "boolean[]"),
        (BigInteger, "bigint[]"),
        (Integer, "integer[]"),
        (String, "text[]"),
        (Text, "text[]"),
    ):
        if isinstance(impl, kind):
            return name
    if isinstance(impl, DateTime):
        return "timestamptz[]" if impl.timezone else "timestamp[]"
    raise TypeError(f"no array type for {column_type!r}")


def _column_values(table: Table, column: str, values: list[Any]) -> list[Any]:
    """JSON columns travel as JSON text (the array is cast to json[]/jsonb[] by the statement)."""
    if isinstance(_postgres_type(table.c[column].type), JSON):
        return [
            None if v is None else json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in values
        ]
    return values


def _cast(table: Table, param: str, column: str) -> str:
    return f"CAST(:{param} AS {_array_type(table.c[column].type)})"


@functools.lru_cache(maxsize=32)
def _insert_sql(table: Table, columns: tuple[str, ...]) -> Any:
    arrays = ", ".join(_cast(table, c, c) for c in columns)
    return text(f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest({arrays})")


def _update_text(table: Table, match: tuple[str, ...], columns: tuple[str, ...]) -> str:
    """``UPDATE`` of ``columns`` from one array parameter per column, where each row still has its
    ``match`` values (the matched values' parameters prefixed ``m_``)."""
    arrays = ", ".join(
        [*(_cast(table, _MATCH + c, c) for c in match), *(_cast(table, c, c) for c in columns)]
    )
    aliases = ", ".join([*(_MATCH + c for c in match), *columns])
    assignments = ", ".join(f"{c} = v.{c}" for c in columns)
    where = " AND ".join(f"{table.name}.{c} = v.{_MATCH}{c}" for c in match)
    return f"UPDATE {table.name} SET {assignments} FROM unnest({arrays}) AS v({aliases}) WHERE {where}"


@functools.lru_cache(maxsize=32)
def _update_sql(table: Table, match: tuple[str, ...], columns: tuple[str, ...]) -> Any:
    return text(_update_text(table, match, columns))


@functools.lru_cache(maxsize=8)
def _insert_absent_sql(table: Table, columns: tuple[str, ...], absent_on: str) -> Any:
    arrays = ", ".join(_cast(table, c, c) for c in columns)
    return text(
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest({arrays}) "
        f"AS v({', '.join(columns)}) WHERE NOT EXISTS "
        f"(SELECT 1 FROM {table.name} t WHERE t.{absent_on} = v.{absent_on}) RETURNING {absent_on}"
    )


def insert_absent(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], absent_on: str
) -> set[Any]:
    """PostgreSQL: insert, in one statement, each of ``rows`` whose ``absent_on`` value no row of the
    table holds yet; the ``absent_on`` values of the rows inserted. The caller serialises writers of
    one value (a lock taken in an earlier statement of its transaction)."""
    if not rows:
        return set()
    columns = tuple(rows[0])
    params = {c: _column_values(table, c, [row[c] for row in rows]) for c in columns}
    return {row[0] for row in conn.execute(_insert_absent_sql(table, columns, absent_on), params)}


def insert(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each with the same columns) in one statement."""
    if not rows:
        return
    if is_sqlite(conn):
        conn.execute(table.insert(), list(rows))
        return
    columns = tuple(rows[0])
    params = {c: _column_values(table, c, [row[c] for row in rows]) for c in columns}
    conn.execute(_insert_sql(table, columns), params)


def update(
    conn: Connection,
    table: Table,
    match: Sequence[str],
    rows: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
) -> int:
    """Update many rows in one statement. Each item is (the values of the ``match`` columns the row
    must still have — an id and the seq it was read at —, its new column values). Returns how many
    rows matched: fewer than ``len(rows)`` means some moved meanwhile."""
    if not rows:
        return 0
    matched_on = tuple(match)
    columns = tuple(rows[0][1])
    if is_sqlite(conn):
        where = and_(*(table.c[c] == bindparam(_MATCH + c) for c in matched_on))
        count = 0
        for old, new in rows:
            statement = sql_update(table).where(where).values(dict(new))
            count += conn.execute(
                statement, {_MATCH + c: v for c, v in zip(matched_on, old, strict=True)}
            ).rowcount
        return count
    params: dict[str, Any] = {}
    for i, c in enumerate(matched_on):
        params[_MATCH + c] = [old[i] for old, _new in rows]
    for c in columns:
        params[c] = _column_values(table, c, [new[c] for _old, new in rows])
    return int(conn.execute(_update_sql(table, matched_on, columns), params).rowcount)


@functools.lru_cache(maxsize=16)
def _update_with_children_sql(
    table: Table,
    match: tuple[str, ...],
    columns: tuple[str, ...],
    child: Table,
    child_columns: tuple[str, ...],
) -> Any:
    key = match[0]
    child_arrays = ", ".join(
        [*(_cast(child, _CHILD + c, c) for c in child_columns), _cast(table, _CHILD + _OWNER, key)]
    )
    child_aliases = ", ".join([*child_columns, _OWNER])
    picked = ", ".join(f"c.{c}" for c in child_columns)
    return text(
        f"WITH moved AS ({_update_text(table, match, columns)} RETURNING {table.name}.{key}), "
        f"appended AS (INSERT INTO {child.name} ({', '.join(child_columns)}) SELECT {picked} "
        f"FROM unnest({child_arrays}) AS c({child_aliases}) "
        f"WHERE c.{_OWNER} IN (SELECT {key} FROM moved) RETURNING 1) "
        f"SELECT {key} FROM moved"
    )


_CHILD = "c_"
_OWNER = "owner"


def update_with_children(
    conn: Connection,
    table: Table,
    match: Sequence[str],
    rows: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    child: Table,
    children: Sequence[tuple[Any, Mapping[str, Any]]],
) -> set[Any]:
    """PostgreSQL: ``update``'s rows and, in the same statement, the ``children`` rows (each given
    with the first match value of the row it belongs to) of only the rows that matched, so a row
    that moved meanwhile gets neither. One statement, one round trip, whatever the numbers; alone on
    an autocommit connection, its own transaction. Returns the first match values of the rows
    written."""
    if not rows:
        return set()
    matched_on = tuple(match)
    columns = tuple(rows[0][1])
    child_columns = tuple(children[0][1])
    params: dict[str, Any] = {}
    for i, c in enumerate(matched_on):
        params[_MATCH + c] = [old[i] for old, _new in rows]
    for c in columns:
        params[c] = _column_values(table, c, [new[c] for _old, new in rows])
    for c in child_columns:
        params[_CHILD + c] = _column_values(child, c, [row[c] for _owner, row in children])
    params[_CHILD + _OWNER] = [owner for owner, _row in children]
    statement = _update_with_children_sql(table, matched_on, columns, child, child_columns)
    return {row[0] for row in conn.execute(statement, params)}
