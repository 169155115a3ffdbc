"""When a schedule's ticks fall: cron in an IANA zone (zoneinfo), or a fixed interval; start and end;
deterministic jitter. Pure: every time is passed in.

A cron schedule's ticks are the cron engine's (``app/cron.py``): five fields, six with a *leading*
seconds field (``*/10 * * * * *`` is every ten seconds), or an alias, read on the wall clock of the
schedule's zone, with its daylight-saving rule (every wall-clock tick fires once: a tick in a skipped
hour at the end of the gap, one in a repeated hour at its first occurrence). An interval schedule has
no wall clock: its ticks are ``epoch + k * interval`` in UTC, and the zone plays no part.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from app import cron

DEFAULT_ZONE: Final = "UTC"
ZONE_RULE: Final = "is not an IANA time zone name (e.g. UTC, Europe/Paris, America/New_York)"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
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
    """The expression, whitespace-normalised, when croniter can run it and it ever fires
    (``app.cron.check``; its messages are the API's)."""
    try:
        return cron.check(expr)
    except cron.CronError as exc:
        raise TimingError(str(exc)) from None


@functools.lru_cache(maxsize=1024)
def zone_of(name: str) -> ZoneInfo:
    """The IANA zone named (``Europe/Paris``, ``UTC``); ``TimingError`` for an unknown name."""
    if not name or name != name.strip() or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        raise TimingError(ZONE_RULE)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise TimingError(ZONE_RULE) from None


def known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


# -- the ticks -------------------------------------------------------------------------------------


def _next_interval(interval_ms: int, after: datetime) -> datetime:
    elapsed = (after - _EPOCH) // timedelta(milliseconds=1)
    return _EPOCH + timedelta(milliseconds=(elapsed // interval_ms + 1) * interval_ms)


@functools.lru_cache(maxsize=65_536)
def next_tick(timing: Timing, after: datetime) -> datetime | None:
    """The first tick strictly after ``after`` (aware), within start and end; None past the end."""
    if timing.start_at is not None and after < timing.start_at:
        after = timing.start_at - _TINY  # a tick at exactly startAt fires
    if timing.cron is not None:
        try:
            tick = cron.next_after(timing.cron, after, zone_of(timing.zone))
        except cron.CronError as exc:
            raise TimingError(str(exc)) from None
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
