"""What a schedule does at a moment: the pure decisions (``app.schedules.plan``) and the fold of the
receipts they produce (``app.schedules.reducer``). No database, no clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.jobs.errors import InvariantError, ValidationError
from app.jobs.reducer import Job, Receipt
from app.jobs.times import iso
from app.schedules import plan
from app.schedules.reducer import Schedule, fold, reduce
from app.schedules.spec import validate_create
from app.schedules.vocab import fire_client_id

ORG = "acme"
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
STREAM = "schedules/acme/every-minute"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def text(moment: datetime) -> str:
    out = iso(moment)
    assert out is not None
    return out


def declared(**body: Any) -> Any:
    base: dict[str, Any] = {
        "scheduleId": "every-minute",
        "cron": "* * * * *",
        "job": {"agentId": "factory", "payload": {"kind": "factory.run"}},
    }
    base.update(body)
    return validate_create(base, default_auth={"userId": "u", "organizationId": ORG})


class Stream:
    """A schedule's receipts, folded as the store would fold them."""

    def __init__(self, created_at: datetime, **body: Any) -> None:
        d = declared(**body)
        self.receipts: list[Receipt] = []
        self.state: Schedule | None = None
        self.append(
            "schedule.created",
            {
                "scheduleId": d.schedule_id,
                "organizationId": d.organization_id,
                "spec": d.spec.to_json(),
                "paused": d.paused,
                "cursor": text(created_at),
            },
            created_at,
        )

    def append(self, type_: str, body: dict[str, Any], moment: datetime) -> Schedule:
        r = Receipt(STREAM, len(self.receipts) + 1, type_, body, text(moment))
        self.receipts.append(r)
        self.state = reduce(self.state, r)
        assert self.state is not None
        return self.state

    def apply(self, p: plan.Plan, moment: datetime) -> Schedule:
        for type_, body in p.events:
            self.append(type_, body, moment)
        assert self.state is not None
        return self.state

    @property
    def s(self) -> Schedule:
        assert self.state is not None
        return self.state


def job(key: str, status: str = "queued") -> Job:
    return Job(
        id=key,
        agent_id="factory",
        lane="collect",
        payload={},
        session_key=None,
        singleton_mode="allow",
        max_attempts=2,
        organization_id=ORG,
        status=status,  # type: ignore[arg-type]
    )


def kinds(p: plan.Plan) -> list[tuple[str, str]]:
    return [
        (t.removeprefix("schedule."), str(b.get("tick") or b.get("lastTick"))[11:19]) for t, b in p.events
    ]


# -- the schedule's own ticks ----------------------------------------------------------------------


def test_each_due_tick_fires_once_under_its_deterministic_id() -> None:
    st = Stream(at(-30))  # created at 08:59:30: its first tick is 09:00
    assert plan.due(st.s, at(-1), None).empty
    p = plan.due(st.s, at(0.4), None)
    assert kinds(p) == [("fired", "09:00:00")]
    [fire] = p.fires
    assert fire.job_key == f"{ORG}/every-minute:20260501T090000Z"
    assert p.events[0][1] == {
        "tick": "2026-05-01T09:00:00.000000Z",
        "jobId": "every-minute:20260501T090000Z",
        "trigger": "schedule",
        "lateMs": 400,
    }
    s = st.apply(p, at(0.4))
    assert (s.cursor, s.last_job_id, s.counts.fired) == ("2026-05-01T09:00:00.000000Z", fire.job_key, 1)
    # Decided: the same moment again finds nothing due.
    assert plan.due(s, at(0.5), None).empty


def test_after_downtime_ticks_in_the_window_fire_in_order_and_older_ones_are_missed() -> None:
    st = Stream(at(-1), cron="* * * * * *", overlap="allow", catchupWindowMs=10_000)
    p = plan.due(st.s, at(25.5), None)  # 25 s without a pass; the window is the last 10 s
    assert kinds(p)[0] == ("missed", "09:00:15")
    missed = p.events[0][1]
    assert (missed["firstTick"], missed["lastTick"], missed["count"]) == (
        "2026-05-01T09:00:00.000000Z",
        "2026-05-01T09:00:15.000000Z",
        16,
    )
    assert len(missed["ticks"]) == 16 and missed["reason"] == "outside_catchup_window"
    fired = [b["tick"][17:19] for t, b in p.events if t == "schedule.fired"]
    assert fired == [f"{n:02d}" for n in range(16, 26)]  # 09:00:16 .. 09:00:25, each once
    s = st.apply(p, at(25.5))
    assert (s.counts.missed, s.counts.fired, s.cursor[11:19]) == (16, 10, "09:00:25")
    assert plan.due(s, at(25.9), None).empty


def test_a_long_outage_of_a_per_second_schedule_is_counted_then_skipped_over() -> None:
    st = Stream(at(-1), cron="* * * * * *", overlap="allow", catchupWindowMs=10_000)
    p = plan.due(st.s, at(86_400), None)  # a day down
    missed = p.events[0][1]
    assert missed["capped"] is True and missed["count"] == 10_000 and len(missed["ticks"]) == 100
    s = st.apply(p, at(86_400))
    assert s.counts.fired == 11  # the window's ticks: 86 390 .. 86 400
    assert plan.due(s, at(86_400), None).empty


def test_skip_records_ticks_while_the_previous_job_is_active() -> None:
    st = Stream(at(-1), overlap="skip")
    first = st.apply(plan.due(st.s, at(1), None), at(1))
    previous = job(first.last_job_id or "", "running")
    p = plan.due(first, at(61), previous)
    assert kinds(p) == [("skipped", "09:01:00")]
    assert (
        p.events[0][1]["reason"] == "overlap"
        and p.events[0][1]["activeJobId"] == "every-minute:20260501T090000Z"
    )
    s = st.apply(p, at(61))
    assert (s.counts.skipped, s.last_outcome and s.last_outcome.type) == (1, "skipped")
    # Once it ended, the next tick fires.
    assert kinds(plan.due(s, at(121), replace(previous, status="completed"))) == [("fired", "09:02:00")]


def test_catch_up_under_skip_fires_the_first_tick_and_skips_the_rest() -> None:
    st = Stream(at(-1), cron="* * * * * *", overlap="skip")
    p = plan.due(st.s, at(3), None)
    assert kinds(p) == [
        ("fired", "09:00:00"),
        ("skipped", "09:00:01"),
        ("skipped", "09:00:02"),
        ("skipped", "09:00:03"),
    ]


def test_buffer_one_keeps_one_tick_and_fires_it_once_the_previous_job_ends() -> None:
    st = Stream(at(-1), overlap="bufferOne")
    s = st.apply(plan.due(st.s, at(1), None), at(1))
    running = job(s.last_job_id or "", "running")
    s = st.apply(plan.due(s, at(61), running), at(61))
    assert s.buffered_tick == "2026-05-01T09:01:00.000000Z"
    p = plan.due(s, at(121), running)
    assert kinds(p) == [("skipped", "09:02:00")] and p.events[0][1]["reason"] == "buffer_full"
    s = st.apply(p, at(121))
    # The job ended: the buffered tick fires first (late), under its own tick's id.
    p = plan.due(s, at(130), replace(running, status="failed"))
    assert kinds(p) == [("fired", "09:01:00")]
    assert p.events[0][1]["trigger"] == "buffered" and p.fires[0].job_key.endswith(":20260501T090100Z")
    s = st.apply(p, at(130))
    assert s.buffered_tick is None and s.cursor[11:19] == "09:02:00"


def test_cancel_previous_cancels_the_active_job_and_fires_the_latest_tick() -> None:
    st = Stream(at(-1), cron="*/20 * * * * *", overlap="cancelPrevious")
    s = st.apply(plan.due(st.s, at(1), None), at(1))
    running = job(s.last_job_id or "", "running")
    p = plan.due(s, at(45), running)  # 09:00:20 and 09:00:40 both due
    assert p.cancel == running.id
    assert kinds(p) == [("skipped", "09:00:20"), ("fired", "09:00:40")]
    assert p.events[0][1]["reason"] == "superseded"


def test_allow_fires_whatever_is_running() -> None:
    st = Stream(at(-1), overlap="allow")
    s = st.apply(plan.due(st.s, at(1), None), at(1))
    assert kinds(plan.due(s, at(61), job(s.last_job_id or "", "running"))) == [("fired", "09:01:00")]


def test_jitter_delays_the_job_not_the_fire() -> None:
    st = Stream(at(-1), jitterMs=30_000)
    [fire] = plan.due(st.s, at(1), None).fires
    assert fire.available_at is not None and T0 <= fire.available_at <= at(30)
    assert plan.due(st.s, at(1), None).fires[0].available_at == fire.available_at  # the same every time


# -- ahead of the tick (RECEIPT_SCHEDULE_LEAD_MS) -----------------------------------------------------


def test_an_allow_schedule_fires_its_ticks_within_the_lead_as_jobs_waiting_for_them() -> None:
    st = Stream(at(-1), overlap="allow")
    assert plan.due(st.s, at(-40), None, lead_ms=30_000).empty  # 09:00 is 40 s away: not yet
    p = plan.due(st.s, at(-25), None, lead_ms=30_000)
    assert kinds(p) == [("fired", "09:00:00")]
    [fire] = p.fires
    # The job is the tick's, under its usual id, and waits for the tick (a delayed job).
    assert fire.job_key == f"{ORG}/every-minute:20260501T090000Z" and fire.available_at == T0
    assert p.events[0][1]["aheadMs"] == 25_000 and p.events[0][1]["lateMs"] == 0
    s = st.apply(p, at(-25))
    assert s.cursor == text(T0) and plan.due(s, at(-20), None, lead_ms=30_000).empty
    # A lead of 0, the default, decides each tick at its time.
    assert plan.due(Stream(at(-1), overlap="allow").s, at(-25), None).empty


@pytest.mark.parametrize("overlap", ["skip", "bufferOne", "cancelPrevious"])
def test_only_allow_is_decided_ahead_since_the_others_look_at_the_previous_job(overlap: str) -> None:
    st = Stream(at(-40), overlap=overlap)
    assert plan.due(st.s, at(-25), None, lead_ms=30_000).empty
    assert plan.horizon(st.s, at(-25), 30_000) == at(-25)
    assert kinds(plan.due(st.s, at(0.2), None, lead_ms=30_000)) == [("fired", "09:00:00")]


def test_a_pause_withdraws_the_ticks_decided_ahead_and_a_resume_decides_them_again() -> None:
    st = Stream(at(-1), cron="*/10 * * * * *", overlap="allow")  # every 10 s
    s = st.apply(plan.due(st.s, at(5), None, lead_ms=30_000), at(5))
    assert s.cursor == text(at(30))  # 09:00:00 .. 09:00:30 decided
    ahead = plan.withdrawable(s, at(12))
    assert [t for t, _k in ahead] == [at(20), at(30)]  # 09:00:10 has come: it stays as it is
    assert ahead[0][1] == f"{ORG}/every-minute:20260501T090020Z"
    for tick, key in ahead:
        body = {"tick": text(tick), "jobId": key.rpartition("/")[2], "reason": "paused", "revision": 7}
        st.append("schedule.withdrawn", body, at(12))
    s = st.append("schedule.paused", {"reason": None}, at(12))
    assert s.cursor == text(at(12)) and plan.withdrawable(s, at(12)) == []
    s = st.append("schedule.resumed", {"cursor": text(at(15))}, at(15))
    p = plan.due(s, at(15), None, lead_ms=30_000)
    # Decided again, under the schedule as it is now; the first jobs keep their (canceled) ids.
    assert [f.job_key.rpartition("/")[2] for f in p.fires] == [
        "every-minute:20260501T090020Z-7",
        "every-minute:20260501T090030Z-7",
        "every-minute:20260501T090040Z",
    ]


def test_a_withdrawal_moves_the_cursor_back_to_its_own_time_and_no_further() -> None:
    st = Stream(at(-1), overlap="allow")
    s = st.apply(plan.due(st.s, at(-10), None, lead_ms=30_000), at(-10))
    body = {"tick": text(T0), "jobId": "every-minute:20260501T090000Z", "reason": "updated", "revision": 3}
    s = st.append("schedule.withdrawn", body, at(-5))
    assert s.cursor == text(at(-5)) and (s.revision, s.revision_until) == (3, text(T0))
    # A tick past the one withdrawn fires under its plain id.
    assert s.revision_for(at(60)) is None and s.revision_for(T0) == 3
    assert plan.due(s, at(1), None).fires[0].job_key == f"{ORG}/every-minute:20260501T090000Z-3"
    # A backfill of that tick finds its first (canceled) job under the plain id: it never runs twice.
    [backfilled] = plan.backfill(s, at(-1), at(1), at(2)).fires
    assert backfilled.job_key == f"{ORG}/every-minute:20260501T090000Z"


def test_a_timing_change_that_withdraws_ticks_counts_the_new_timing_from_the_change() -> None:
    st = Stream(at(-1), cron="*/10 * * * * *", overlap="allow")
    s = st.apply(plan.due(st.s, at(1), None, lead_ms=30_000), at(1))  # 09:00:00 .. 09:00:30 decided
    for tick, key in plan.withdrawable(s, at(3)):
        body = {"tick": text(tick), "jobId": key.rpartition("/")[2], "reason": "updated", "revision": 9}
        st.append("schedule.withdrawn", body, at(3))
    spec = {**st.s.spec.to_json(), "cron": "*/2 * * * * *"}
    s = st.append("schedule.updated", {"spec": spec, "cursor": text(at(3))}, at(3))
    # Every 2 s from the change: 09:00:04 is the first, not the first withdrawn tick (09:00:10).
    assert kinds(plan.due(s, at(5), None))[0] == ("fired", "09:00:04")


# -- pause, resume, update, delete -----------------------------------------------------------------


def test_a_paused_schedule_decides_nothing_and_resumes_from_the_resume_time() -> None:
    st = Stream(at(-1))
    st.append("schedule.paused", {"reason": "maintenance"}, at(10))
    assert plan.due(st.s, at(300), None).empty
    s = st.append("schedule.resumed", {"cursor": text(at(301))}, at(301))
    assert kinds(plan.due(s, at(361), None)) == [("fired", "09:06:00")]  # 09:01..09:05 are not owed


def test_a_timing_change_moves_the_cursor_and_a_template_change_does_not() -> None:
    st = Stream(at(-1))
    s = st.append("schedule.updated", {"spec": {**st.s.spec.to_json(), "overlap": "allow"}}, at(30))
    assert s.cursor == text(at(-1)) and s.spec.overlap == "allow"
    spec = {**st.s.spec.to_json(), "cron": "*/5 * * * *"}
    s = st.append("schedule.updated", {"spec": spec, "cursor": text(at(30))}, at(30))
    assert s.cursor == text(at(30)) and kinds(plan.due(s, at(301), None)) == [("fired", "09:05:00")]


def test_a_deleted_schedule_absorbs_everything_but_a_new_declaration() -> None:
    st = Stream(at(-1))
    st.append("schedule.deleted", {}, at(5))
    s = st.append("schedule.fired", {"tick": text(T0), "jobId": "x", "trigger": "schedule"}, at(6))
    assert s.status == "deleted" and s.counts.fired == 0
    assert plan.due(s, at(600), None).empty
    s = st.append(
        "schedule.created",
        {
            "scheduleId": "every-minute",
            "organizationId": ORG,
            "spec": s.spec.to_json(),
            "cursor": text(at(700)),
        },
        at(700),
    )
    assert s.status == "active" and s.cursor == text(at(700))


def test_an_event_for_a_schedule_that_was_never_declared_breaks_the_fold() -> None:
    with pytest.raises(InvariantError, match="no schedule for acme/every-minute"):
        fold([Receipt(STREAM, 1, "schedule.paused", {}, text(T0))])


# -- trigger and backfill --------------------------------------------------------------------------


def test_a_trigger_fires_now_to_the_millisecond_and_does_not_move_the_cursor() -> None:
    st = Stream(at(-1))
    p = plan.trigger(st.s, at(12.3456), None)
    assert p.fires[0].job_key == f"{ORG}/{fire_client_id('every-minute', at(12.345))}"
    assert p.fires[0].job_key.endswith(":20260501T090012.345Z")
    s = st.apply(p, at(12.3456))
    assert s.cursor == text(at(-1)) and s.last_job_id == p.fires[0].job_key


def test_a_trigger_under_skip_is_skipped_while_the_previous_job_runs_but_allow_overrides() -> None:
    st = Stream(at(-1))
    s = st.apply(plan.due(st.s, at(1), None), at(1))
    running = job(s.last_job_id or "", "running")
    assert kinds(plan.trigger(s, at(5), running)) == [("skipped", "09:00:05")]
    assert kinds(plan.trigger(s, at(5), running, "allow")) == [("fired", "09:00:05")]
    assert plan.trigger(s, at(5), running, "cancelPrevious").cancel == running.id


def test_a_backfill_fires_every_tick_of_the_range_and_is_bounded() -> None:
    st = Stream(at(-1))
    p = plan.backfill(st.s, at(-3600), at(-3600 + 180), T0)
    assert [f.job_key[-16:] for f in p.fires] == [
        "20260501T080000Z",
        "20260501T080100Z",
        "20260501T080200Z",
        "20260501T080300Z",
    ]
    s = st.apply(p, T0)
    assert s.cursor == text(at(-1)) and s.last_job_id is None  # beside the schedule's own sequence
    with pytest.raises(ValidationError, match="more than 1000 ticks"):
        plan.backfill(st.s, at(-86_400), at(-1), T0)
    with pytest.raises(ValidationError, match="fills the past"):
        plan.backfill(st.s, at(-60), at(60), T0)
