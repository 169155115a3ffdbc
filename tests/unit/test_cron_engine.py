"""The one cron engine (``app/cron.py``), whose rules every cron in Receipt follows: the user-facing
schedules (in their zone), the objective watchdog's tick and beat's cron entries (in UTC).

- "``next_after`` is the first tick strictly after an instant; ``latest_at_or_before`` the last tick
  at or before one (a tick at exactly that instant counts)."
- "Five fields ..., six with a *leading* seconds field (``*/10 * * * * *`` is every ten seconds),
  or an alias." One order for six fields everywhere.
- "Every wall-clock tick fires once": a tick in a skipped hour at the end of the gap, one in a
  repeated hour at its first occurrence; the watchdog and beat read UTC, which has no transition.
Pure: no database, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app import cron
from app.config import Settings
from app.factory import watchdog
from app.schedules.ticks import Timing, TimingError, check_cron, next_tick
from tasks.cron import CronSchedule

PARIS = ZoneInfo("Europe/Paris")  # CET (+01) / CEST (+02); 2026-03-29 forward, 2026-10-25 back


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def paris(at: datetime) -> str:
    return at.astimezone(PARIS).strftime("%Y-%m-%d %H:%M:%S %Z")


# -- checking: one rule, its text the schedules API's ------------------------------------------------


def test_check_normalises_spacing_and_aliases() -> None:
    assert cron.check(" 0   9 * *  1-5 ") == "0 9 * * 1-5"
    assert cron.check("@Daily") == "@daily"
    assert cron.check("*/10 * * * * *") == "*/10 * * * * *"


@pytest.mark.parametrize("expr", ["", "* * * *", "* * * * * * *", "61 * * * *", "H * * * *", "every minute"])
def test_an_expression_croniter_cannot_run_is_refused_with_the_rule(expr: str) -> None:
    with pytest.raises(cron.CronError) as refused:
        cron.check(expr)
    assert str(refused.value) == (
        "must be a cron expression of 5 fields (minute hour day-of-month month day-of-week), 6 with a "
        "leading seconds field, or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
    )


def test_an_expression_that_never_fires_is_refused() -> None:
    with pytest.raises(cron.CronError, match=r"^never matches a date \(e\.g\. the 30th of February\)$"):
        cron.check("0 0 30 2 *")


@pytest.mark.parametrize("expr", ["61 * * * *", "0 0 30 2 *"])
def test_the_schedules_api_refuses_with_the_engines_text(expr: str) -> None:
    with pytest.raises(cron.CronError) as engine:
        cron.check(expr)
    with pytest.raises(TimingError) as api:
        check_cron(expr)
    assert str(api.value) == str(engine.value)


# -- the ticks: next strictly after, latest at or before --------------------------------------------


def test_next_is_strictly_after_and_latest_is_at_or_before() -> None:
    on_tick = utc(2026, 1, 1, 12, 5)
    assert cron.next_after("* * * * *", on_tick) == utc(2026, 1, 1, 12, 6)  # not the tick itself
    assert cron.latest_at_or_before("* * * * *", on_tick) == on_tick  # the tick itself
    just_before = on_tick - timedelta(microseconds=1)
    assert cron.next_after("* * * * *", just_before) == on_tick
    assert cron.latest_at_or_before("* * * * *", just_before) == utc(2026, 1, 1, 12, 4)


def test_a_six_field_expression_has_its_seconds_first() -> None:
    at = datetime(2026, 1, 1, 12, 0, 3, 500_000, tzinfo=UTC)
    assert cron.next_after("*/2 * * * * *", at) == utc(2026, 1, 1, 12, 0, 4)
    assert cron.latest_at_or_before("*/2 * * * * *", at) == utc(2026, 1, 1, 12, 0, 2)
    # Seconds first: "30 * * * * *" is second 30 of every minute, not minute 30 of every hour.
    assert cron.next_after("30 * * * * *", utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 0, 30)
    assert cron.next_after("0 30 9 * * *", utc(2026, 1, 1)) == utc(2026, 1, 1, 9, 30)


def test_a_naive_instant_is_read_as_utc() -> None:
    assert cron.next_after("0 * * * *", datetime(2026, 1, 1, 12, 30)) == utc(2026, 1, 1, 13)
    assert cron.latest_at_or_before("0 * * * *", datetime(2026, 1, 1, 12, 30)) == utc(2026, 1, 1, 12)


def test_an_expression_that_never_fires_raises_rather_than_loops() -> None:
    with pytest.raises(cron.CronError, match="never matches a date"):
        cron.next_after("0 0 30 2 *", utc(2026, 1, 1))
    with pytest.raises(cron.CronError, match="never matches a date"):
        cron.latest_at_or_before("0 0 30 2 *", utc(2026, 1, 1))


# -- daylight saving: every wall-clock tick fires once, both ways round -----------------------------


def test_a_tick_in_the_skipped_hour_is_the_end_of_the_gap_both_ways() -> None:
    # 2026-03-29 in Paris: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 does not exist.
    daily = "0 30 2 * * *"
    gap_end = utc(2026, 3, 29, 1, 0)
    assert cron.next_after(daily, utc(2026, 3, 28, 12), PARIS) == gap_end
    assert paris(gap_end) == "2026-03-29 03:00:00 CEST"
    assert cron.latest_at_or_before(daily, gap_end, PARIS) == gap_end
    before = gap_end - timedelta(seconds=1)
    assert paris(cron.latest_at_or_before(daily, before, PARIS)) == "2026-03-28 02:30:00 CET"
    # Every quarter inside the gap, and 03:00 itself, are that one instant: one tick.
    quarter = "*/15 * * * *"
    assert cron.next_after(quarter, utc(2026, 3, 29, 0, 45), PARIS) == gap_end
    assert paris(cron.next_after(quarter, gap_end, PARIS)) == "2026-03-29 03:15:00 CEST"


def test_a_tick_in_the_repeated_hour_is_its_first_occurrence_both_ways() -> None:
    # 2026-10-25 in Paris: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:00..02:59 happen twice.
    quarter = "*/15 * * * *"
    inside_repeat = utc(2026, 10, 25, 1, 10)  # 02:10 CET, the second pass through 02:10
    # The second pass fires nothing: the next tick is 03:00 CET, the last one 02:45 CEST.
    assert paris(cron.next_after(quarter, inside_repeat, PARIS)) == "2026-10-25 03:00:00 CET"
    assert paris(cron.latest_at_or_before(quarter, inside_repeat, PARIS)) == "2026-10-25 02:45:00 CEST"
    daily = "0 30 2 * * *"
    first = utc(2026, 10, 25, 0, 30)  # 02:30 CEST
    assert cron.next_after(daily, utc(2026, 10, 24, 12), PARIS) == first
    assert cron.latest_at_or_before(daily, utc(2026, 10, 25, 1, 30), PARIS) == first  # 02:30 CET


def test_latest_and_next_agree_tick_by_tick_across_both_transitions() -> None:
    for expr in ("*/15 * * * *", "0 30 2 * * *", "*/20 * * * * *"):
        for start, end in (
            (utc(2026, 3, 28, 23), utc(2026, 3, 29, 2)),
            (utc(2026, 10, 24, 23), utc(2026, 10, 25, 2)),
        ):
            tick = cron.next_after(expr, start, PARIS)
            while tick <= end:
                following = cron.next_after(expr, tick, PARIS)
                assert following > tick
                assert cron.latest_at_or_before(expr, tick, PARIS) == tick
                assert cron.latest_at_or_before(expr, following - timedelta(microseconds=1), PARIS) == tick
                tick = following


def test_the_gap_end_is_found_to_the_second() -> None:
    # Lord Howe Island moves by 30 minutes: 02:00 -> 02:30 on 2026-10-04.
    zone = ZoneInfo("Australia/Lord_Howe")
    missing = datetime(2026, 10, 4, 2, 10)
    assert cron.instant_of(missing, zone).astimezone(zone).strftime("%H:%M:%S") == "02:30:00"


# -- one engine: the schedules, the watchdog and beat read the same ticks ---------------------------


def test_the_watchdog_and_beat_read_the_engine_in_utc() -> None:
    expr = watchdog.cron_expression(Settings(objective_watchdog_cron="0 2 * * *"))
    # 02:00 UTC whatever Paris does that night: UTC has no transition.
    at = utc(2026, 3, 29, 1, 59, 59)
    assert cron.next_after(expr, at) == utc(2026, 3, 29, 2)
    assert watchdog.tick_at(expr, utc(2026, 3, 29, 2, 0, 30)) == utc(2026, 3, 29, 2)
    assert CronSchedule(expr).remaining_estimate(utc(2999, 1, 1)) > timedelta(0)


def test_the_watchdogs_test_tick_is_six_fields_seconds_first() -> None:
    expr = watchdog.cron_expression(Settings(objective_watchdog_test_tick_s=5))
    assert expr == "*/5 * * * * *"
    assert cron.check(expr) == expr
    assert cron.next_after(expr, utc(2026, 1, 1, 12, 0, 7)) == utc(2026, 1, 1, 12, 0, 10)


def test_a_schedule_in_utc_and_the_engine_give_the_same_ticks() -> None:
    for expr in ("* * * * *", "*/10 * * * * *", "@hourly", "0 9 * * 1-5"):
        at = utc(2026, 1, 2, 8, 59, 55)
        assert next_tick(Timing(cron=expr), at) == cron.next_after(expr, at)
