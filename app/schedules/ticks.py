"""When a schedule's ticks fall: cron (croniter, an optional seconds field) in an IANA zone (zoneinfo),
or a fixed interval; start and end; deterministic jitter. Pure: every time is passed in.

**The cron rule.** A cron expression names wall-clock times in the schedule's zone: five fields
(minute hour day-of-month month day-of-week), six with a *leading* seconds field (the Quartz and
Spring order: ``*/10 * * * * *`` is every ten seconds), or an alias (``@hourly``, ``@daily`` ...).
A tick is the instant its wall-clock time names, so ``0 9 * * 1-5`` in ``Europe/Paris`` fires at
09:00 Paris time whatever the offset that day.

**The daylight-saving rule: every wall-clock tick fires once.**

- *Skipped hour* (clocks go forward: 02:00 → 03:00). A tick whose wall time does not exist that
  day (02:30) fires once, at the first instant after the gap (03:00 local). Several such ticks
  (``*/15`` inside the gap) are one instant, so one fire; a tick of its own at 03:00 is that same
  instant, so it is that same fire.
- *Repeated hour* (clocks go back: 03:00 → 02:00). A tick whose wall time happens twice (02:30)
  fires once, at its first occurrence (the earlier offset). The second pass through that hour
  fires nothing.

So the instants are strictly increasing and each wall-clock tick maps to exactly one of them
(``tests/unit/test_schedule_ticks.py`` checks both transitions of a fixed zone). An interval
schedule has no wall clock: its ticks are ``epoch + k * interval`` in UTC, and the zone plays no
part.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadDateError, croniter

# Cron fields: five, or six with the seconds first.
CRON_FIELDS: Final = (5, 6)
CRON_ALIASES: Final = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
CRON_RULE: Final = (
    "must be a cron expression of 5 fields (minute hour day-of-month month day-of-week), 6 with a "
    "leading seconds field, or one of " + ", ".join(CRON_ALIASES)
)
DEFAULT_ZONE: Final = "UTC"
ZONE_RULE: Final = "is not an IANA time zone name (e.g. UTC, Europe/Paris, America/New_York)"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Wall-clock ticks looked at for one next tick: a repeated hour of a per-second cron is 3 600.
_SCAN_LIMIT: Final = 20_000
_SECOND: Final = timedelta(seconds=1)
_TINY: Final = timedelta(microseconds=1)


class TimingError(ValueError):
    """A cron expression, zone or interval that cannot be run (the message says why)."""


@dataclass(frozen=True)
class Timing:
    """When a schedule's ticks fall. Exactly one of ``cron`` and ``interval_ms``."""

    cron: str | None = None
    interval_ms: int | None = None
    zone: str = DEFAULT_ZONE
    start_at: datetime | None = None
    end_at: datetime | None = None


# -- checking --------------------------------------------------------------------------------------


def check_cron(expr: str) -> str:
    """The expression, whitespace-normalised, when croniter can run it and it ever fires."""
    text = " ".join(expr.split())
    if text.lower() in CRON_ALIASES:
        return text.lower()
    fields = text.split(" ")
    if len(fields) not in CRON_FIELDS or not croniter.is_valid(text, second_at_beginning=len(fields) == 6):
        raise TimingError(CRON_RULE)
    try:
        _wall_after(text, datetime(2000, 1, 1))
    except CroniterBadDateError:
        raise TimingError("never matches a date (e.g. the 30th of February)") from None
    return text


@functools.lru_cache(maxsize=1024)
def zone_of(name: str) -> ZoneInfo:
    """The IANA zone named (``Europe/Paris``, ``UTC``); ``TimingError`` for an unknown name."""
    if not name or name != name.strip() or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        raise TimingError("is not an IANA time zone name (e.g. UTC, Europe/Paris, America/New_York)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise TimingError(
            "is not an IANA time zone name (e.g. UTC, Europe/Paris, America/New_York)"
        ) from None


def known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


# -- the ticks -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65_536)
def _wall_after(expr: str, wall: datetime) -> datetime:
    """The first wall-clock time matching ``expr`` strictly after ``wall`` (both naive).

    croniter on naive datetimes is plain calendar arithmetic, free of any zone. Cached: schedules
    share expressions and, at a tick, the time they look from (10 000 minute crons are one call).
    """
    six = len(expr.split(" ")) == 6
    found: datetime = croniter(expr, wall, second_at_beginning=six).get_next(datetime)
    return found


def _local(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def instant_of(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant (UTC) a wall-clock tick fires at: its first occurrence when the wall time happens
    twice, the end of the gap when it does not happen at all (the module's daylight-saving rule)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if _local(first, zone) == wall:
        return first  # it exists; fold 0 is the first of two occurrences
    return _gap_end(wall, zone)


def _gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
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


def _next_cron(expr: str, zone: ZoneInfo, after: datetime) -> datetime:
    # Instants are non-decreasing in wall time, and the local time of ``after`` maps to ``after``
    # or earlier (inside a repeated hour): every tick after ``after`` is after that wall time.
    wall = _local(after, zone)
    for _ in range(_SCAN_LIMIT):
        wall = _wall_after(expr, wall)
        instant = instant_of(wall, zone)
        if instant > after:
            return instant
    raise TimingError(f"no tick of {expr!r} within {_SCAN_LIMIT} wall-clock ticks after {after}")


def _next_interval(interval_ms: int, after: datetime) -> datetime:
    elapsed = (after - _EPOCH) // timedelta(milliseconds=1)
    return _EPOCH + timedelta(milliseconds=(elapsed // interval_ms + 1) * interval_ms)


@functools.lru_cache(maxsize=65_536)
def next_tick(timing: Timing, after: datetime) -> datetime | None:
    """The first tick strictly after ``after`` (aware), within start and end; None past the end."""
    if timing.start_at is not None and after < timing.start_at:
        after = timing.start_at - _TINY  # a tick at exactly startAt fires
    if timing.cron is not None:
        tick = _next_cron(timing.cron, zone_of(timing.zone), after)
    elif timing.interval_ms is not None:
        tick = _next_interval(timing.interval_ms, after)
    else:
        raise TimingError("a schedule needs cron or intervalMs")
    if timing.end_at is not None and tick > timing.end_at:
        return None
    return tick


def ticks(timing: Timing, after: datetime, until: datetime) -> Iterator[datetime]:
    """Every tick in ``(after, until]``, in order."""
    tick = next_tick(timing, after)
    while tick is not None and tick <= until:
        yield tick
        tick = next_tick(timing, tick)


def period_ms(timing: Timing, after: datetime) -> int | None:
    """The gap between the two ticks after ``after`` (None when fewer than two remain)."""
    first = next_tick(timing, after)
    second = next_tick(timing, first) if first is not None else None
    if first is None or second is None:
        return None
    return int((second - first) / timedelta(milliseconds=1))


def jitter_ms(schedule_key: str, tick: datetime, max_ms: int) -> int:
    """A delay in ``0..max_ms`` that is the same every time for this schedule and tick (a retried
    pass enqueues the same job with the same delay), and spread evenly across schedules."""
    if max_ms <= 0:
        return 0
    digest = hashlib.sha256(f"{schedule_key}|{tick.astimezone(UTC).isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (max_ms + 1)
