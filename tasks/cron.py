"""A celery beat schedule over the cron engine (``app/cron.py``), so beat fires exactly the ticks a
cron loop's job is named after (``app.factory.watchdog.tick_at`` reads the same engine), and the
engine's leading seconds field is available to loops that tick on the clock's seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import BaseSchedule, schedstate

from app.cron import next_after


class CronSchedule(BaseSchedule):  # type: ignore[misc]
    """Due at every tick of a cron expression (UTC)."""

    def __init__(self, expr: str, app: Any = None) -> None:
        self.expr = expr
        super().__init__(app=app)

    def _now_utc(self) -> datetime:
        return datetime.now(UTC)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return next_after(self.expr, last_run_at) - self._now_utc()

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = self._now_utc()
        if next_after(self.expr, last_run_at) <= now:
            # Due; check again at the following tick (a missed run is not replayed: one per tick).
            return schedstate(True, (next_after(self.expr, now) - now).total_seconds())
        return schedstate(False, max(0.0, (next_after(self.expr, last_run_at) - now).total_seconds()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.expr,))

    def __repr__(self) -> str:
        return f"<cron {self.expr}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CronSchedule) and other.expr == self.expr

    def __hash__(self) -> int:
        return hash(self.expr)
