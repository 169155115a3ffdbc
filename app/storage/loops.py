"""Single-flight guards for the recovery loops, so duplicate beats do no harm.

A loop pass first *claims* its row in ``loop_runs`` with a conditional update: it succeeds only
if no other pass holds the row (or the holder is stale) and the previous pass started at least
``min_interval_ms`` ago. Two beats firing the same schedule 0.3 s apart therefore run one pass.
The rows are best-effort bookkeeping; losing them only allows one extra (idempotent) pass.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from app.storage.db import db_now, loop_runs, transaction


def claim(engine: Engine, name: str, owner: str, *, min_interval_ms: int, stale_ms: int) -> bool:
    """Take the loop for one pass; False when another pass runs or one ran too recently."""
    try:
        return _claim(engine, name, owner, min_interval_ms, stale_ms)
    except IntegrityError:
        return False  # another process created the row in the same instant: it holds this pass


def _claim(engine: Engine, name: str, owner: str, min_interval_ms: int, stale_ms: int) -> bool:
    with transaction(engine) as conn:
        now = db_now(conn)
        exists = conn.execute(select(loop_runs.c.name).where(loop_runs.c.name == name)).first()
        if exists is None:
            conn.execute(loop_runs.insert().values(name=name, started_at=now, finished_at=None, owner=owner))
            return True
        c = loop_runs.c
        idle = or_(
            c.finished_at.is_(None) & (c.started_at < now - timedelta(milliseconds=stale_ms)),
            c.finished_at >= c.started_at,
        )
        spaced = or_(c.started_at.is_(None), c.started_at <= now - timedelta(milliseconds=min_interval_ms))
        result = conn.execute(
            update(loop_runs)
            .where(c.name == name, and_(idle, spaced))
            .values(started_at=now, finished_at=None, owner=owner)
        )
        return result.rowcount == 1


def release(engine: Engine, name: str, owner: str) -> None:
    with transaction(engine) as conn:
        now = db_now(conn)
        conn.execute(
            update(loop_runs)
            .where(loop_runs.c.name == name, loop_runs.c.owner == owner)
            .values(finished_at=now)
        )
