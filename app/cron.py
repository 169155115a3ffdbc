"""The cron engine: which instants a cron expression names, in a time zone. Every cron in Receipt is
read here: the user-facing schedules (``app.schedules.ticks``, in the schedule's zone), the objective
watchdog's tick and job id (``app.factory.watchdog``, UTC) and beat's cron entries (``tasks/cron.py``
through ``app.ops.loop_registry``, UTC). One reader, so an expression names the same instants
wherever it is written, and beat fires exactly the ticks a job is named after. Pure: every time is
passed in.

**The expression.** Five fields (minute hour day-of-month month day-of-week), six with a *leading*
seconds field (the Quartz and Spring order: ``*/10 * * * * *`` is every ten seconds), or an alias
(``@hourly``, ``@daily`` ...). One order for six fields everywhere: the schedules API documents the
seconds first, and the watchdog's test tick and beat's on-the-second loops are written the same way.

**The tick.** A tick is the instant its wall-clock time names in the zone, so ``0 9 * * 1-5`` in
``Europe/Paris`` fires at 09:00 Paris time whatever the offset that day. ``next_after`` is the first
tick strictly after an instant; ``latest_at_or_before`` the last tick at or before one (a tick at
exactly that instant counts). A naive instant is read as UTC.

**The daylight-saving rule: every wall-clock tick fires once.**

- *Skipped hour* (clocks go forward: 02:00 → 03:00). A tick whose wall time does not exist that
  day (02:30) fires once, at the first instant after the gap (03:00 local). Several such ticks
  (``*/15`` inside the gap) are one instant, so one fire; a tick of its own at 03:00 is that same
  instant, so it is that same fire.
- *Repeated hour* (clocks go back: 03:00 → 02:00). A tick whose wall time happens twice (02:30)
  fires once, at its first occurrence (the earlier offset). The second pass through that hour
  fires nothing.

So the instants are strictly increasing and each wall-clock tick maps to exactly one of them
(``tests/unit/test_cron_engine.py`` and ``tests/unit/test_schedule_ticks.py`` check both transitions
of a fixed zone). In UTC there is no transition and a tick is its wall-clock time.

**Why croniter.** It parses the expression and does the calendar arithmetic on naive datetimes,
seconds field and aliases included; the zone rule above is kept out of it (``instant_of``), because
croniter's own zone handling has had bugs around transitions and a rule we state is one we can test.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Final

from croniter import CroniterBadDateError, croniter

# Cron fields: five, or six with the seconds first.
FIELDS: Final = (5, 6)
ALIASES: Final = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
RULE: Final = (
    "must be a cron expression of 5 fields (minute hour day-of-month month day-of-week), 6 with a "
    "leading seconds field, or one of " + ", ".join(ALIASES)
)
NEVER: Final = "never matches a date (e.g. the 30th of February)"
# Wall-clock ticks looked at for one tick: a repeated hour of a per-second cron is 3 600.
_SCAN_LIMIT: Final = 20_000
_SECOND: Final = timedelta(seconds=1)
_TINY: Final = timedelta(microseconds=1)


class CronError(ValueError):
    """A cron expression that cannot be run (the message says why)."""


def check(expr: str) -> str:
    """The expression, whitespace-normalised (an alias lower-cased), when croniter can run it and it
    ever fires; ``CronError`` with ``RULE`` or ``NEVER`` otherwise."""
    text = " ".join(expr.split())
    if text.lower() in ALIASES:
        return text.lower()
    fields = text.split(" ")
    if len(fields) not in FIELDS or not croniter.is_valid(text, second_at_beginning=len(fields) == 6):
        raise CronError(RULE)
    try:
        _wall_after(text, datetime(2000, 1, 1))
    except CroniterBadDateError:
        raise CronError(NEVER) from None
    return text


def field_count(expr: str) -> int:
    """How many fields ``expr`` has (an alias is one)."""
    return len(expr.split())


# -- wall-clock ticks (naive, no zone) --------------------------------------------------------------


def _seconds_first(expr: str) -> bool:
    return field_count(expr) == 6


@functools.lru_cache(maxsize=65_536)
def _wall_after(expr: str, wall: datetime) -> datetime:
    """The first wall-clock time matching ``expr`` strictly after ``wall`` (both naive).

    croniter on naive datetimes is plain calendar arithmetic, free of any zone. Cached: schedules
    share expressions and, at a tick, the time they look from (10 000 minute crons are one call).
    """
    found: datetime = croniter(expr, wall, second_at_beginning=_seconds_first(expr)).get_next(datetime)
    return found


def _wall_at_or_before(expr: str, wall: datetime) -> datetime:
    """The last wall-clock time matching ``expr`` at or before ``wall`` (both naive)."""
    found: datetime = croniter(expr, wall + _TINY, second_at_beginning=_seconds_first(expr)).get_prev(
        datetime
    )
    return found


# -- from wall clock to instant ----------------------------------------------------------------------


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _local(instant: datetime, zone: tzinfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def instant_of(wall: datetime, zone: tzinfo) -> datetime:
    """The instant (UTC) a wall-clock tick fires at: its first occurrence when the wall time happens
    twice, the end of the gap when it does not happen at all (the module's daylight-saving rule)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if _local(first, zone) == wall:
        return first  # it exists; fold 0 is the first of two occurrences
    return _gap_end(wall, zone)


def _gap_end(wall: datetime, zone: tzinfo) -> datetime:
    """The first instant after the gap that swallows ``wall``: the transition, to the second."""
    a = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    b = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    # The two readings of a missing wall time fall on either side of the transition.
    lo, hi = (a, b) if a < b else (b, a)
    lo, hi = lo.replace(microsecond=0), hi.replace(microsecond=0)
    before = lo.astimezone(zone).utcoffset()
    while hi - lo > _SECOND:  # lo keeps the old offset, hi has the new one
        mid = (lo + (hi - lo) / 2).replace(microsecond=0)
        if mid.astimezone(zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi


# -- ticks ------------------------------------------------------------------------------------------


def next_after(expr: str, after: datetime, zone: tzinfo = UTC) -> datetime:
    """The first tick of ``expr`` in ``zone`` strictly after ``after`` (UTC, aware)."""
    after = _aware(after)
    # Instants are non-decreasing in wall time, and the local time of ``after`` maps to ``after``
    # or earlier (inside a repeated hour): every tick after ``after`` is after that wall time.
    wall = _local(after, zone)
    try:
        for _ in range(_SCAN_LIMIT):
            wall = _wall_after(expr, wall)
            instant = instant_of(wall, zone)
            if instant > after:
                return instant
    except CroniterBadDateError:
        raise CronError(NEVER) from None
    raise CronError(f"no tick of {expr!r} within {_SCAN_LIMIT} wall-clock ticks after {after}")


def latest_at_or_before(expr: str, at: datetime, zone: tzinfo = UTC) -> datetime:
    """The last tick of ``expr`` in ``zone`` at or before ``at`` (UTC, aware)."""
    at = _aware(at)
    try:
        wall = _wall_at_or_before(expr, _local(at, zone))
    except CroniterBadDateError:
        raise CronError(NEVER) from None
    # That wall time's instant is at or before ``at``; inside a repeated hour, ticks whose wall time
    # is later than ``at``'s already fired (at their first occurrence), so step forward over them.
    tick = instant_of(wall, zone)
    for _ in range(_SCAN_LIMIT):
        following = next_after(expr, tick, zone)
        if following > at:
            return tick
        tick = following
    raise CronError(f"no tick of {expr!r} within {_SCAN_LIMIT} wall-clock ticks before {at}")
