"""Rate limiters held across every process: GCRA, one ``dispatch_marks`` row per limiter.

A limiter of ``rate`` dispatches per second has an emission interval ``T = 1/rate`` and admits a
burst of ``burst(rate)`` (a tenth of a second's worth, at least one). Its state is one time, the
theoretical arrival time ``tat``: ``n`` dispatches fit now while ``max(tat, now) + n·T ≤ now + B·T``,
and spending them moves ``tat`` to ``max(tat, now) + n·T``. Only the dispatch pass spends, and the
passes of a worker queue are serialised, so the limit holds whatever number of processes dispatch.

The rows are best-effort (docs/dispatch.md): a lost row is a limiter that has been idle, which admits
one burst. The math is pure (``allowance``, ``advanced``, ``admits_at``); ``read``/``spend`` store it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.engine import Connection

from app.storage.db import as_utc, dispatch_marks, put_marks

MARK_PREFIX = "rate:"
# A burst of a tenth of a second's worth: a pass every 100 ms keeps a limiter at its rate.
BURST_S = 0.1


def burst(rate: float) -> int:
    return max(1, math.floor(rate * BURST_S))


def allowance(rate: float, tat: datetime | None, now: datetime) -> int:
    """How many dispatches the limiter admits at ``now``."""
    if tat is None or tat <= now:
        return burst(rate)
    ahead = (tat - now).total_seconds() * rate  # in emission intervals
    return max(0, math.floor(burst(rate) - ahead + 1e-9))


def advanced(rate: float, tat: datetime | None, now: datetime, spent: int) -> datetime:
    base = now if tat is None or tat < now else tat
    return base + timedelta(seconds=spent / rate)


def admits_at(rate: float, tat: datetime | None, now: datetime) -> datetime:
    """The earliest time the limiter admits one dispatch."""
    if tat is None:
        return now
    return max(now, tat - timedelta(seconds=(burst(rate) - 1) / rate))


def read(conn: Connection, limiters: Iterable[str]) -> dict[str, datetime]:
    names = sorted({MARK_PREFIX + name for name in limiters})
    if not names:
        return {}
    rows = conn.execute(
        select(dispatch_marks.c.key, dispatch_marks.c.at).where(dispatch_marks.c.key.in_(names))
    )
    return {r.key[len(MARK_PREFIX) :]: as_utc(r.at) for r in rows}


def spend(
    conn: Connection,
    rates: Mapping[str, float],
    tats: Mapping[str, datetime],
    spent: Mapping[str, int],
    now: datetime,
) -> None:
    """Advance each limiter that admitted dispatches in this pass."""
    put_marks(
        conn,
        {
            MARK_PREFIX + name: advanced(rates[name], tats.get(name), now, n)
            for name, n in spent.items()
            if n > 0 and name in rates
        },
    )
