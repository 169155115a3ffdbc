"""Time as an input, end to end with real processes (gunicorn, the driver, a chat worker, beat) on
PostgreSQL and Redis: delayed jobs, and schedules fired by beat's ticks (or the local ticker).

Every count here comes from the receipts in the database: a tick is decided exactly once when its
stream holds exactly one ``schedule.fired`` / ``schedule.missed`` / ``schedule.skipped`` record of it,
and one job exists per fired tick (job ids ``<scheduleId>:<tick>``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from app.jobs.ids import qualify
from app.jobs.reducer import Job
from app.schedules.vocab import schedule_stream
from app.storage import store
from app.storage.db import db_now, jobs, parse_iso
from devharness import handlers
from tests.support.processes import Harness
from tests.support.stack import ORG, Stack, make_stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

SCAN_MS = 250  # FAST_TIMINGS' RECEIPT_RETRY_SCAN_INTERVAL_MS: the due-retries pass's period
# Beat publishes each tick on its own schedule (its loop sleeps up to the next entry), and this
# 2-core machine runs other suites beside: a delivery may start this much after the scan that found
# the job due, besides the scan's own period.
SCHEDULING_SLACK_S = 1.5


@pytest.fixture(scope="module")
def time_stack(
    module_harness: Harness, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """web, the driver (it runs the schedules pass's ticks), a chat worker and two beats, for this
    module's tests that neither stop a process nor configure their own (two beats: what the
    every-second test proves, and nothing the others prove depends on there being one)."""
    stack = make_stack(module_harness, module_database_url, tmp_path_factory.mktemp("time-home"))
    try:
        stack.start("web", "driver", "chat", "beat-1", "beat-2")
        yield stack
    finally:
        stack.close()
        module_harness.stop_all()


def db_time(stack: Stack) -> datetime:
    with stack.engine.connect() as conn:
        return db_now(conn)


def declare(stack: Stack, schedule_id: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "scheduleId": schedule_id,
        "cron": "* * * * * *",
        "overlap": "allow",
        "job": {"agentId": handlers.ECHO, "payload": {"kind": "factory.run", "message": schedule_id}},
    }
    body.update(extra)
    r = stack.http.post(stack.url("/schedules"), json=body, headers=stack.headers(), timeout=15)
    assert r.status_code == 201, r.text
    schedule: dict[str, Any] = r.json()["schedule"]
    return schedule


def call(stack: Stack, method: str, path: str, body: Any = None) -> dict[str, Any]:
    r = stack.http.request(method, stack.url(path), json=body, headers=stack.headers(), timeout=15)
    assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
    out: dict[str, Any] = r.json()
    return out


def tick_receipts(stack: Stack, schedule_id: str) -> list[store.StoredReceipt]:
    with stack.engine.connect() as conn:
        return [
            r
            for r in store.read_stream(conn, schedule_stream(qualify(ORG, schedule_id)))
            if r.type.startswith("schedule.") and r.type not in ("schedule.created", "schedule.updated")
        ]


def ticks_of(receipts: list[store.StoredReceipt], type_: str) -> list[datetime]:
    out = []
    for r in receipts:
        if r.type == type_:
            tick = parse_iso(r.body["tick"])
            assert tick is not None
            out.append(tick)
    return out


def missed_ticks(receipts: list[store.StoredReceipt]) -> list[datetime]:
    out: list[datetime] = []
    for r in receipts:
        if r.type == "schedule.missed":
            first, last = parse_iso(r.body["firstTick"]), parse_iso(r.body["lastTick"])
            assert first is not None and last is not None and not r.body.get("capped")
            seconds = int((last - first).total_seconds())
            assert r.body["count"] == seconds + 1  # a per-second cron: every second in between
            out += [first + timedelta(seconds=n) for n in range(seconds + 1)]
    return out


def jobs_of(stack: Stack, schedule_id: str) -> list[Job]:
    with stack.engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.state)
            .where(jobs.c.id.startswith(qualify(ORG, schedule_id + ":")))
            .order_by(jobs.c.id)
        ).all()
    return [Job.from_json(r.state) for r in rows]


def assert_contiguous_seconds(ticks: list[datetime]) -> None:
    ordered = sorted(ticks)
    assert len(ordered) == len(set(ordered)), "a tick was decided twice"
    gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b - a != timedelta(seconds=1)]
    assert not gaps, f"ticks skipped over: {gaps[:5]}"


# -- delayed jobs -----------------------------------------------------------------------------------


def test_a_delayed_job_is_not_delivered_early_and_is_delivered_within_one_scan_after(
    time_stack: Stack,
) -> None:
    stack = time_stack
    body: dict[str, Any] = {
        "payload": {
            "kind": "factory.run",
            "message": "later",
            "authContext": {"userId": "u", "organizationId": ORG},
        },
        "delayMs": 3000,
    }
    r = stack.http.post(
        stack.url(f"/agents/{handlers.ECHO}/jobs"), json=body, headers=stack.headers(), timeout=15
    )
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    available = parse_iso(job["availableAt"])
    created = parse_iso(job["createdAt"])
    assert available is not None and created is not None and (available - created).total_seconds() == 3
    done = stack.wait_terminal(job["id"], timeout=30)
    assert done.status == "completed" and done.result["echo"] == "later"
    [delivery] = stack.deliveries(job["id"])
    leased = next(r for r in stack.receipts(job["id"]) if r.type == "job.leased")
    started, leased_at = delivery.created_at, parse_iso(leased.at)
    assert leased_at is not None
    # Not early: the delivery began, and the worker leased, only after availableAt (database clock).
    assert started >= available and leased_at >= available
    # Within one scan: the due-retries pass that first ran after availableAt started it.
    assert (started - available).total_seconds() <= SCAN_MS / 1000 + SCHEDULING_SLACK_S, started - available


def test_a_past_run_at_runs_at_once(time_stack: Stack) -> None:
    stack = time_stack
    body: dict[str, Any] = {
        "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG}},
        "runAt": "2001-01-01T00:00:00Z",
    }
    r = stack.http.post(
        stack.url(f"/agents/{handlers.ECHO}/jobs"), json=body, headers=stack.headers(), timeout=15
    )
    job = r.json()["job"]
    assert job["availableAt"] == job["createdAt"]
    assert stack.wait_terminal(job["id"], timeout=30).status == "completed"


# -- schedules --------------------------------------------------------------------------------------


def test_an_every_second_schedule_fires_once_per_tick_for_30_s_with_two_beats(time_stack: Stack) -> None:
    stack = time_stack
    beats = ("beat-1", "beat-2")
    passes_before = {beat: stack.procs[beat].log_count("receipt.fire_schedules") for beat in beats}
    declare(stack, "every-second")
    started = db_time(stack)

    def thirty_seconds_of_ticks() -> bool:
        fired = ticks_of(tick_receipts(stack, "every-second"), "schedule.fired")
        return bool(fired) and max(fired) - min(fired) >= timedelta(seconds=30)

    wait_for(thirty_seconds_of_ticks, 60, interval=0.5, what="30 s of ticks", check=stack.harness.check_alive)
    call(stack, "POST", "/schedules/every-second/pause", {"reason": "enough"})
    receipts = tick_receipts(stack, "every-second")
    fired = ticks_of(receipts, "schedule.fired")
    assert len(fired) >= 31
    assert_contiguous_seconds(fired)
    assert [r.type for r in receipts if r.type != "schedule.fired"] == ["schedule.paused"]
    assert min(fired) - started < timedelta(seconds=2)  # from the first tick after it was declared
    made = jobs_of(stack, "every-second")
    assert sorted(j.client_id for j in made) == sorted(
        f"every-second:{t.strftime('%Y%m%dT%H%M%SZ')}" for t in fired
    )
    # Both beats ticked the loop; single flight made their duplicates no-ops (the job ids guard anyway).
    for beat in beats:
        assert stack.procs[beat].log_count("receipt.fire_schedules") - passes_before[beat] >= 10, beat
    # The jobs ran: one per tick, each completed by the worker.
    for j in made[:5]:
        assert stack.wait_terminal(j.id, timeout=30).status == "completed"


def test_with_beat_and_the_driver_down_for_20_s_the_catch_up_window_fires_each_missed_tick_once(
    stack: Stack,
) -> None:
    # The driver is the one process consuming receipt-maintenance here: its local ticker would run
    # the pass without beat, so both go down to make the 20 s a real outage of the pass.
    stack.start("web", "driver", "chat", "beat")
    declare(stack, "catch-up", catchupWindowMs=10_000)
    wait_for(
        lambda: len(ticks_of(tick_receipts(stack, "catch-up"), "schedule.fired")) >= 3,
        30,
        interval=0.3,
        what="the first fires",
    )
    stack.harness.kill(stack.procs.pop("beat"))
    stack.harness.kill(stack.procs.pop("driver"))
    down_from = db_time(stack)
    wait_for(lambda: db_time(stack) - down_from >= timedelta(seconds=20), 40, interval=0.5, what="20 s down")
    before = len(tick_receipts(stack, "catch-up"))
    up_at = db_time(stack)
    stack.start("driver", "beat")

    def caught_up() -> bool:
        fired = ticks_of(tick_receipts(stack, "catch-up"), "schedule.fired")
        return bool(fired) and max(fired) > up_at + timedelta(seconds=2)

    wait_for(caught_up, 60, interval=0.5, what="the pass to catch up", check=stack.harness.check_alive)
    call(stack, "POST", "/schedules/catch-up/pause")
    receipts = tick_receipts(stack, "catch-up")
    fired, missed = ticks_of(receipts, "schedule.fired"), missed_ticks(receipts)
    # Every second from the first tick on was decided exactly once: fired or recorded missed.
    assert_contiguous_seconds(fired + missed)
    # The ticks older than the window at the first pass after the restart were missed, in one
    # receipt; the downtime's last 10 s of ticks (the window) fired, late, each once, in order.
    [record] = [r for r in receipts[before:] if r.type == "schedule.missed"]
    # 20 s down, plus the restart's boot, minus the 10 s window.
    assert 8 <= record.body["count"] <= 40, record.body
    late = [r.body for r in receipts[before:] if r.type == "schedule.fired" and r.body["lateMs"] > 2000]
    assert len(late) >= 8 and [b["tick"] for b in late] == sorted(b["tick"] for b in late)
    assert all(b["lateMs"] <= 10_000 + 1000 for b in late)  # none older than the window (plus a pass)
    assert len(jobs_of(stack, "catch-up")) == len(fired)


def test_skip_and_cancel_previous_under_a_slow_job(time_stack: Stack) -> None:
    stack = time_stack
    # 3 s: longer than the 2 s between ticks, shorter than the e2e lease's 5 s execution timeout.
    slow = {"agentId": handlers.SLEEP, "payload": {"kind": "factory.run", "seconds": 3}}
    declare(stack, "slow-skip", cron="*/2 * * * * *", overlap="skip", job=slow)
    declare(stack, "slow-cancel", cron="*/2 * * * * *", overlap="cancelPrevious", job=slow)

    def enough() -> bool:
        return all(
            len(ticks_of(tick_receipts(stack, s), "schedule.fired")) >= 3
            for s in ("slow-skip", "slow-cancel")
        )

    wait_for(enough, 90, interval=0.5, what="three fires of each")
    for s in ("slow-skip", "slow-cancel"):
        call(stack, "POST", f"/schedules/{s}/pause")
    # skip: a tick while a 3 s job ran was skipped, naming it; no two of its jobs ever ran at once.
    receipts = tick_receipts(stack, "slow-skip")
    skipped = [r.body for r in receipts if r.type == "schedule.skipped"]
    assert skipped and all(
        b["reason"] == "overlap" and b["activeJobId"].startswith("slow-skip:") for b in skipped
    )
    runs = []
    for j in jobs_of(stack, "slow-skip"):
        done = stack.wait_terminal(j.id, timeout=30)
        types_at = {r.type: parse_iso(r.at) for r in stack.receipts(j.id)}
        assert done.status == "completed"
        runs.append((types_at["job.leased"], types_at["job.completed"]))
    runs.sort()
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(runs)), runs  # type: ignore[operator]
    # cancelPrevious: each new tick canceled the running job (its handler stopped on the abort).
    made = jobs_of(stack, "slow-cancel")
    ends = {j.id: stack.wait_terminal(j.id, timeout=30) for j in made}
    canceled = [j for j in ends.values() if j.status == "canceled"]
    assert len(canceled) >= len(made) - 1 >= 2
    assert all("cancelPrevious" in str(j.error) for j in canceled)


def test_with_a_lead_ticks_wait_ahead_run_at_their_time_and_a_pause_withdraws_the_rest(stack: Stack) -> None:
    stack.env_overrides["RECEIPT_SCHEDULE_LEAD_MS"] = "5000"
    stack.start("web", "driver", "chat", "beat")
    declare(stack, "ahead")

    def ahead_fires() -> list[store.StoredReceipt]:
        return [
            r for r in tick_receipts(stack, "ahead") if r.type == "schedule.fired" and "aheadMs" in r.body
        ]

    def three_ran() -> list[store.StoredReceipt] | None:
        done = [r for r in ahead_fires() if stack.status(r.body["jobId"]) == "completed"]
        return done if len(done) >= 3 else None

    ran = wait_for(three_ran, 45, what="three ticks decided ahead to run")
    for fire in ran:
        tick = parse_iso(fire.body["tick"])
        leased = next(r for r in stack.receipts(fire.body["jobId"]) if r.type == "job.leased")
        leased_at = parse_iso(leased.at)
        assert tick is not None and leased_at is not None
        # Enqueued ahead (the fire's receipt is older than its tick), run only once it came, and
        # within one due-retries scan of it.
        assert parse_iso(fire.at) < tick <= leased_at  # type: ignore[operator]
        assert (leased_at - tick).total_seconds() <= SCAN_MS / 1000 + SCHEDULING_SLACK_S, leased_at - tick
    call(stack, "POST", "/schedules/ahead/pause", {"reason": "hold"})
    withdrawn = [r for r in tick_receipts(stack, "ahead") if r.type == "schedule.withdrawn"]
    assert withdrawn and all(r.body["reason"] == "paused" for r in withdrawn)
    for r in withdrawn:
        assert parse_iso(r.body["tick"]) > parse_iso(r.at)  # type: ignore[operator]
        # Canceled while it waited: never leased, whatever the clock does now.
        job_id = r.body["jobId"]
        assert stack.status(job_id) == "canceled" and "job.leased" not in stack.types(job_id)
    fires = call(stack, "GET", "/schedules/ahead/fires?limit=200")["fires"]
    listed = [f for f in fires if f["type"] == "schedule.withdrawn"]
    assert {f["jobId"] for f in listed} == {r.body["jobId"] for r in withdrawn}
    assert all(f["jobStatus"] == "canceled" for f in listed)


def test_pause_and_resume(time_stack: Stack) -> None:
    stack = time_stack
    declare(stack, "pausable")
    wait_for(lambda: len(ticks_of(tick_receipts(stack, "pausable"), "schedule.fired")) >= 2, 30, what="fires")
    paused = call(stack, "POST", "/schedules/pausable/pause", {"reason": "hold"})["schedule"]
    assert paused["status"] == "paused" and paused["nextFireAt"] is None
    paused_at = db_time(stack)
    wait_for(lambda: db_time(stack) - paused_at >= timedelta(seconds=4), 10, interval=0.2, what="4 s paused")
    resumed = call(stack, "POST", "/schedules/pausable/resume")["schedule"]
    resumed_at = parse_iso(resumed["updatedAt"])
    assert resumed_at is not None
    wait_for(
        lambda: any(t > resumed_at for t in ticks_of(tick_receipts(stack, "pausable"), "schedule.fired")),
        30,
        what="a fire after the resume",
    )
    call(stack, "POST", "/schedules/pausable/pause")
    fired = ticks_of(tick_receipts(stack, "pausable"), "schedule.fired")
    # Nothing fired (or was recorded missed) for the ticks while it was paused.
    assert not [t for t in fired if paused_at + timedelta(seconds=1) < t <= resumed_at]
    assert not [r for r in tick_receipts(stack, "pausable") if r.type == "schedule.missed"]


def test_backfill_twice_gives_one_job_per_tick(time_stack: Stack) -> None:
    stack = time_stack
    declare(stack, "backfilled", cron="0 * * * *", paused=True)
    span = {"startAt": "2026-01-01T00:00:00Z", "endAt": "2026-01-01T05:30:00Z"}
    first = call(stack, "POST", "/schedules/backfilled/backfill", span)
    assert len(first["created"]) == 6 and first["existing"] == []
    second = call(stack, "POST", "/schedules/backfilled/backfill", span)
    assert second["created"] == [] and sorted(second["existing"]) == sorted(j["id"] for j in first["created"])
    made = jobs_of(stack, "backfilled")
    assert [j.client_id[-16:] for j in made] == [f"20260101T0{h}0000Z" for h in range(6)]
    for j in made:
        assert stack.wait_terminal(j.id, timeout=30).status == "completed"
    fires = call(stack, "GET", "/schedules/backfilled/fires")["fires"]
    assert [f["trigger"] for f in fires] == ["backfill"] * 6 and {f["jobStatus"] for f in fires} == {
        "completed"
    }


def test_the_schedules_loop_is_in_readyz(time_stack: Stack) -> None:
    # This stack runs no control worker, so /readyz rightly calls the Factory's outbox redrive
    # overdue (503): the schedules loop's own entry is what is read here.
    def entry() -> Any:
        r = time_stack.http.get(time_stack.url("/readyz"), headers=time_stack.headers(), timeout=10)
        body = r.json()
        runs = body["loopRuns"] if r.status_code == 200 else body["error"]["details"]["loopRuns"]
        return runs.get("schedules") if runs.get("schedules", {}).get("lastRun") else None

    schedules = wait_for(entry, 30, what="a schedules pass in /readyz")
    assert schedules["intervalMs"] == 1000 and schedules["overdue"] is False
