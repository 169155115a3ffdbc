"""When a schedule's ticks fall: cron with seconds, zones and their daylight-saving transitions,
intervals, start and end, jitter. Pure: no database, no clock. The cron engine's own rules, shared
with the watchdog, are tests/unit/test_cron_engine.py."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from app.schedules.ticks import (
    Timing,
    TimingError,
    check_cron,
    jitter_ms,
    next_tick,
    period_ms,
    ticks,
    zone_of,
)

PARIS = "Europe/Paris"  # the fixed test zone: CET (+01) / CEST (+02)
NEW_YORK = "America/New_York"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def local(zone: str, at: datetime) -> str:
    return at.astimezone(zone_of(zone)).strftime("%Y-%m-%d %H:%M %Z")


# -- daylight saving: every wall-clock tick fires once ---------------------------------------------


def test_a_daily_tick_inside_the_skipped_hour_fires_once_at_the_end_of_the_gap() -> None:
    # 2026-03-29 in Paris: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    daily = Timing(cron="0 30 2 * * *", zone=PARIS)
    got = [local(PARIS, t) for t in ticks(daily, utc(2026, 3, 27), utc(2026, 3, 31))]
    assert got == [
        "2026-03-27 02:30 CET",
        "2026-03-28 02:30 CET",
        "2026-03-29 03:00 CEST",  # once, as soon as the skipped hour is over
        "2026-03-30 02:30 CEST",
    ]


def test_a_daily_tick_inside_the_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    # 2026-10-25 in Paris: 03:00 CEST becomes 02:00 CET; 02:30 happens twice that day.
    daily = Timing(cron="0 30 2 * * *", zone=PARIS)
    got = list(ticks(daily, utc(2026, 10, 23), utc(2026, 10, 27)))
    assert [local(PARIS, t) for t in got] == [
        "2026-10-23 02:30 CEST",
        "2026-10-24 02:30 CEST",
        "2026-10-25 02:30 CEST",  # the first 02:30; the second (CET) fires nothing
        "2026-10-26 02:30 CET",
    ]
    assert got[2] == utc(2026, 10, 25, 0, 30)


def test_every_quarter_hour_across_the_skipped_hour_fires_the_gap_once() -> None:
    quarter = Timing(cron="*/15 * * * *", zone=PARIS)
    got = [local(PARIS, t) for t in ticks(quarter, utc(2026, 3, 29, 0, 20), utc(2026, 3, 29, 1, 50))]
    assert got == [
        "2026-03-29 01:30 CET",
        "2026-03-29 01:45 CET",
        # 02:00, 02:15, 02:30 and 02:45 do not exist: they and 03:00 are one instant, one fire.
        "2026-03-29 03:00 CEST",
        "2026-03-29 03:15 CEST",
        "2026-03-29 03:30 CEST",
        "2026-03-29 03:45 CEST",
    ]


def test_every_quarter_hour_across_the_repeated_hour_fires_each_wall_time_once() -> None:
    quarter = Timing(cron="*/15 * * * *", zone=PARIS)
    got = list(ticks(quarter, utc(2026, 10, 24, 23, 50), utc(2026, 10, 25, 2, 20)))
    assert [local(PARIS, t) for t in got] == [
        "2026-10-25 02:00 CEST",
        "2026-10-25 02:15 CEST",
        "2026-10-25 02:30 CEST",
        "2026-10-25 02:45 CEST",
        "2026-10-25 03:00 CET",  # 02:00 .. 02:45 CET (the repeat) fire nothing
        "2026-10-25 03:15 CET",
    ]
    # Strictly increasing instants: no tick twice, even looking from inside the repeated hour.
    assert got == sorted(set(got))
    inside_repeat = utc(2026, 10, 25, 1, 10)  # 02:10 CET, the second pass through 02:10
    assert local(PARIS, next_tick(quarter, inside_repeat)) == "2026-10-25 03:00 CET"  # type: ignore[arg-type]


def test_each_wall_time_maps_to_one_instant_across_a_whole_year() -> None:
    hourly = Timing(cron="0 * * * *", zone=NEW_YORK)
    got = list(ticks(hourly, utc(2026, 1, 1), utc(2027, 1, 1)))
    # 365 days of 24 wall-clock hours: the skipped hour's tick is the gap's end (the same instant as
    # 03:00, one fire), the repeated hour fires once.
    assert len(got) == 365 * 24 - 1
    assert got == sorted(set(got))
    assert all(b - a in (timedelta(hours=1), timedelta(hours=2)) for a, b in itertools.pairwise(got))


# -- cron, intervals, bounds -----------------------------------------------------------------------


def test_a_six_field_cron_has_its_seconds_first() -> None:
    every_ten = Timing(cron=check_cron("*/10 * * * * *"))
    assert list(ticks(every_ten, utc(2026, 1, 1, 0, 0, 1), utc(2026, 1, 1, 0, 0, 35))) == [
        utc(2026, 1, 1, 0, 0, 10),
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 30),
    ]
    assert period_ms(Timing(cron="* * * * * *"), utc(2026, 1, 1)) == 1000


@pytest.mark.parametrize("expr", ["", "* * * *", "* * * * * * *", "61 * * * *", "H * * * *", "0 0 30 2 *"])
def test_a_cron_croniter_cannot_run_or_that_never_fires_is_refused(expr: str) -> None:
    with pytest.raises(TimingError):
        check_cron(expr)


def test_aliases_and_spacing_are_normalised() -> None:
    assert check_cron("@Daily") == "@daily"
    assert check_cron(" 0   9 * *  1-5 ") == "0 9 * * 1-5"


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "Europe/Paris "])
def test_an_unknown_zone_is_refused(name: str) -> None:
    with pytest.raises(TimingError):
        zone_of(name)


def test_an_interval_is_aligned_to_the_epoch_in_utc_whatever_the_zone() -> None:
    five = Timing(interval_ms=300_000, zone=PARIS)
    assert next_tick(five, utc(2026, 3, 29, 0, 58, 59)) == utc(2026, 3, 29, 1, 0)
    assert next_tick(five, utc(2026, 3, 29, 1, 0)) == utc(2026, 3, 29, 1, 5)


def test_start_and_end_bound_the_ticks() -> None:
    bounded = Timing(cron="0 * * * *", start_at=utc(2026, 1, 1, 3), end_at=utc(2026, 1, 1, 5))
    assert list(ticks(bounded, utc(2026, 1, 1), utc(2026, 1, 2))) == [
        utc(2026, 1, 1, 3),  # a tick at exactly startAt fires
        utc(2026, 1, 1, 4),
        utc(2026, 1, 1, 5),
    ]
    assert next_tick(bounded, utc(2026, 1, 1, 5)) is None


def test_jitter_is_the_same_for_a_tick_every_time_and_spread_across_schedules() -> None:
    tick = utc(2026, 1, 1, 9)
    assert jitter_ms("acme/a", tick, 60_000) == jitter_ms("acme/a", tick, 60_000)
    spread = {jitter_ms(f"acme/s{n}", tick, 60_000) for n in range(200)}
    assert all(0 <= j <= 60_000 for j in spread) and len(spread) > 150
    assert jitter_ms("acme/a", tick, 0) == 0
