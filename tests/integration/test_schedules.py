"""Schedules over both backends: declaring, the pass, overlap policies, pause, resume, trigger,
backfill, the file, and one job per tick however often a tick is decided.

Time: a schedule's cursor comes from its ``schedule.created`` receipt, so a test declares one "as
of" a moment in the past (``declare_as_of``) instead of waiting for ticks to come; every decision
still reads the database clock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.ids import qualify
from app.jobs.privilege import Enqueuer
from app.jobs.reducer import Job
from app.jobs.vocab import job_stream
from app.schedules import declared, service, storage
from app.schedules.reducer import Schedule, fold
from app.schedules.spec import Declared, validate_create
from app.schedules.vocab import WITHDRAW_REASONS, schedule_stream
from app.storage import store
from app.storage.db import db_now, iso, jobs, schedules, transaction
from app.storage.queue import Queue
from tests.support.databases import assert_projection_equals_fold

ORG = "acme"
OTHER = "globex"
WHO = Enqueuer("tok_test", (), False)


def declaration(schedule_id: str = "s", org: str = ORG, **body: Any) -> Declared:
    base: dict[str, Any] = {
        "scheduleId": schedule_id,
        "cron": "* * * * * *",
        "overlap": "allow",
        "job": {"agentId": "factory", "payload": {"kind": "factory.run", "note": "tick"}},
    }
    base.update(body)
    return validate_create(base, default_auth={"userId": "u", "organizationId": org})


def now_of(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return db_now(conn)


def declare_as_of(queue: Queue, d: Declared, seconds_ago: float) -> Schedule:
    """Declare ``d`` as if it had been declared ``seconds_ago`` (its cursor), written like the service."""
    key = qualify(d.organization_id, d.schedule_id)
    with transaction(queue.engine) as conn:
        now = db_now(conn)
        body = {
            "scheduleId": d.schedule_id,
            "organizationId": d.organization_id,
            "spec": d.spec.to_json(),
            "paused": d.paused,
            "enqueuedBy": WHO.to_json(),
            "cursor": iso(now - timedelta(seconds=seconds_ago)),
        }
        return storage.apply(conn, None, key, [("schedule.created", body)], at=now).schedule


def stream(engine: Engine, key: str) -> list[store.StoredReceipt]:
    with engine.connect() as conn:
        return store.read_stream(conn, schedule_stream(key))


def fired_ticks(engine: Engine, key: str) -> list[str]:
    return [r.body["tick"] for r in stream(engine, key) if r.type == "schedule.fired"]


def jobs_of(engine: Engine, org: str, schedule_id: str) -> list[Job]:
    prefix = qualify(org, schedule_id + ":")
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.state).where(jobs.c.id.startswith(prefix)).order_by(jobs.c.id)
        ).all()
    return [Job.from_json(r.state) for r in rows]


def assert_row_equals_fold(engine: Engine, key: str) -> None:
    """The schedule's row is the fold of its stream (and each job it fired, of its own)."""
    with engine.connect() as conn:
        receipts = store.read_stream(conn, schedule_stream(key))
        row = conn.execute(select(schedules).where(schedules.c.id == key)).first()
    folded = fold([r.to_receipt() for r in receipts])
    assert folded is not None and row is not None
    assert row.state == folded.to_json()
    assert (row.status, row.last_seq, row.last_hash) == (folded.status, receipts[-1].seq, receipts[-1].hash)
    assert row.buffered == (folded.buffered_tick is not None)
    expected = storage.next_fire_at(folded)
    assert (row.next_fire_at is None) == (expected is None)
    if expected is not None:
        assert iso(row.next_fire_at) == iso(expected)


@pytest.fixture
def q(engine: Engine) -> Queue:
    return queue_for(engine)


# -- declaring --------------------------------------------------------------------------------------


def test_a_declaration_is_a_receipt_and_a_row_and_redeclaring_returns_it_unchanged(
    q: Queue, engine: Engine
) -> None:
    first = service.create(q, declaration(cron="0 9 * * 1-5", timeZone="Europe/Paris"), enqueued_by=WHO)
    assert first.created and first.schedule.status == "active"
    again = service.create(q, declaration(cron="*/5 * * * *"), enqueued_by=WHO)
    assert not again.created and again.schedule.spec.cron == "0 9 * * 1-5"
    assert [r.type for r in stream(engine, qualify(ORG, "s"))] == ["schedule.created"]
    assert_row_equals_fold(engine, qualify(ORG, "s"))
    # The same id in another organisation is another schedule.
    other = service.create(q, declaration(org=OTHER), enqueued_by=WHO)
    assert other.created and other.schedule.id == qualify(OTHER, "s")
    assert service.find(engine, ORG, "s") != service.find(engine, OTHER, "s")


# -- the pass ---------------------------------------------------------------------------------------


def test_the_pass_fires_each_due_tick_once_with_its_job_in_the_same_commit(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(catchupWindowMs=60_000), 5.5).id
    before = now_of(engine)
    totals = service.run_pass(q)
    ticks = fired_ticks(engine, key)
    assert len(ticks) in (5, 6) and totals.created == len(ticks)  # the ticks of the last 5.5 s
    made = jobs_of(engine, ORG, "s")
    assert [j.client_id for j in made] == [
        f"s:{t[:4]}{t[5:7]}{t[8:10]}T{t[11:13]}{t[14:16]}{t[17:19]}Z" for t in ticks
    ]
    assert all(j.status == "queued" and j.payload["note"] == "tick" for j in made)
    assert all(j.enqueued_by == WHO for j in made)  # posted with the declarer's rights
    # A second pass right after finds nothing left of what was due when the first began (a tick
    # that came since is the second's to fire).
    service.run_pass(q)
    due = str(iso(before))
    assert [t for t in fired_ticks(engine, key) if t <= due] == [t for t in ticks if t <= due]
    assert_row_equals_fold(engine, key)
    for j in made:
        assert_projection_equals_fold(engine, j.id)


def test_passes_at_once_give_one_job_per_tick(q: Queue, engine: Engine) -> None:
    for n in range(20):
        declare_as_of(q, declaration(f"p{n}"), 3)
    results: list[Any] = []

    def one() -> None:
        results.append(service.run_pass(queue_for(engine), page_size=7))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for n in range(20):
        key = qualify(ORG, f"p{n}")
        ticks = fired_ticks(engine, key)
        assert ticks and len(ticks) == len(set(ticks)), (key, ticks)  # each tick decided once
        assert len(jobs_of(engine, ORG, f"p{n}")) == len(ticks)
        assert_row_equals_fold(engine, key)
    assert sum(r.created for r in results) == sum(len(jobs_of(engine, ORG, f"p{n}")) for n in range(20))


def test_a_pass_s_lanes_split_its_pages_and_fire_every_schedule_once(
    q: Queue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(30):
        declare_as_of(q, declaration(f"l{n}", cron="*/5 * * * * *", catchupWindowMs=60_000), 5.5)
    lanes: set[str] = set()
    real = service._page

    def page(*args: Any, **kwargs: Any) -> Any:
        lanes.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "_page", page)
    before = now_of(engine)
    totals = service.run_pass(q, page_size=4, lanes=2)
    fired = {n: fired_ticks(engine, qualify(ORG, f"l{n}")) for n in range(30)}
    assert all(ticks and len(ticks) == len(set(ticks)) for ticks in fired.values()), fired
    assert totals.created == sum(len(t) for t in fired.values()) == totals.fired
    assert totals.schedules == 30 and totals.pages >= 8
    if engine.dialect.name == "postgresql":  # SQLite cannot skip a locked row: one lane
        assert lanes == {"schedules-lane-0", "schedules-lane-1"}
    else:
        assert len(lanes) == 1
    # A second pass finds nothing left of what was due when the first began (a tick that came
    # since is the second's to fire).
    service.run_pass(q, lanes=2)
    due = str(iso(before))
    for n in range(30):
        again = fired_ticks(engine, qualify(ORG, f"l{n}"))
        assert [t for t in again if t <= due] == [t for t in fired[n] if t <= due]


def test_a_lane_s_failure_reaches_the_pass_s_caller(q: Queue, engine: Engine) -> None:
    for n in range(6):
        declare_as_of(q, declaration(f"k{n}"), 2.5)
    renewals: list[int] = []

    def keep() -> None:  # the loop claim lost on the third page: the pass must not end quietly
        renewals.append(1)
        if len(renewals) == 3:
            raise RuntimeError("claim lost")

    with pytest.raises(RuntimeError, match="claim lost"):
        service.run_pass(q, page_size=1, lanes=2, keep=keep)


def test_a_pass_that_dies_before_its_commit_leaves_nothing_and_the_next_fires_once(
    q: Queue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = declare_as_of(q, declaration(), 2.5).id
    real = storage.apply_many

    def die(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise RuntimeError("the process died here")

    monkeypatch.setattr(storage, "apply_many", die)
    totals = service.run_pass(q)
    assert totals.failed == [key] and totals.fired == 0
    assert jobs_of(engine, ORG, "s") == [] and [r.type for r in stream(engine, key)] == ["schedule.created"]
    monkeypatch.undo()
    service.run_pass(q)
    ticks = fired_ticks(engine, key)
    assert ticks and len(jobs_of(engine, ORG, "s")) == len(ticks) == len(set(ticks))


def test_a_tick_whose_job_exists_is_recorded_fired_without_a_second_job(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(), 3).id
    now = now_of(engine)
    tick = (now - timedelta(seconds=2)).replace(microsecond=0)
    # The same tick's job, made first by a backfill (or a pass that committed and was not seen).
    made = service.backfill(q, key, iso(tick), iso(tick + timedelta(milliseconds=500)))
    assert [j.client_id for j in made.created] == [f"s:{tick.strftime('%Y%m%dT%H%M%SZ')}"]
    service.run_pass(q)
    fires = [
        r.body for r in stream(engine, key) if r.type == "schedule.fired" and r.body["tick"] == iso(tick)
    ]
    assert [(f["trigger"], f.get("existing", False)) for f in fires] == [
        ("backfill", False),
        ("schedule", True),
    ]
    assert len([j for j in jobs_of(engine, ORG, "s") if j.client_id.endswith(tick.strftime("%H%M%SZ"))]) == 1


def test_missed_ticks_outside_the_catch_up_window_are_recorded_and_the_rest_fire(
    q: Queue, engine: Engine
) -> None:
    key = declare_as_of(q, declaration(catchupWindowMs=10_000), 30).id
    totals = service.run_pass(q)
    [missed] = [r.body for r in stream(engine, key) if r.type == "schedule.missed"]
    assert missed["reason"] == "outside_catchup_window" and 19 <= missed["count"] <= 21
    assert 9 <= totals.created <= 11
    s = service.find(engine, ORG, "s")
    assert s is not None and (s.counts.missed, s.counts.fired) == (missed["count"], totals.created)
    assert totals.outcomes[key] == {"missed": missed["count"], "fired": totals.created}


# -- overlap policies against real jobs -------------------------------------------------------------

# The database's clock drives the ticks, so each test waits out two or three real ones: a second
# apart. A tick falling while the test acts is harmless: the policies decide from the job's state
# (a second buffered tick is skipped, ``buffer_full``; the buffered one fires first).
EVERY_SECOND = "* * * * * *"


def test_skip_while_the_previous_job_is_queued_then_fires_once_it_ended(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(cron=EVERY_SECOND, overlap="skip"), 0).id
    first = _wait_for_fire(q, engine, key)
    _wait_for_outcome(q, engine, key, "skipped")  # the queued job overlaps the next tick
    q.cancel(first.id, "done with it")
    later = _wait_for_fire(q, engine, key, after=first.id)
    assert later.id != first.id
    assert_row_equals_fold(engine, key)


def test_cancel_previous_cancels_the_queued_job_and_fires(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(cron=EVERY_SECOND, overlap="cancelPrevious"), 0).id
    first = _wait_for_fire(q, engine, key)
    second = _wait_for_fire(q, engine, key, after=first.id)
    canceled = q.get(first.id)
    assert canceled is not None and canceled.status == "canceled"
    assert "cancelPrevious" in str(canceled.error)
    assert q.get(second.id).status == "queued"  # type: ignore[union-attr]


def test_buffer_one_fires_the_buffered_tick_when_the_job_ends(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(cron=EVERY_SECOND, overlap="bufferOne"), 0).id
    first = _wait_for_fire(q, engine, key)
    _wait_for_outcome(q, engine, key, "buffered")
    s = service.find(engine, ORG, "s")
    assert s is not None and s.buffered_tick is not None
    q.cancel(first.id)
    released = _wait_for_fire(q, engine, key, after=first.id)
    assert released.client_id.endswith(
        ":" + s.buffered_tick[:10].replace("-", "") + "T" + s.buffered_tick[11:19].replace(":", "") + "Z"
    )
    assert [r.body["trigger"] for r in stream(engine, key) if r.type == "schedule.fired"][-1] == "buffered"


def _wait_for_outcome(q: Queue, engine: Engine, key: str, outcome: str) -> None:
    from tests.support.waiting import wait_for

    def seen() -> bool:
        service.run_pass(q)
        return any(r.type == f"schedule.{outcome}" for r in stream(engine, key))

    wait_for(seen, 15, interval=0.2, what=f"a {outcome} tick of {key}")


def _wait_for_fire(q: Queue, engine: Engine, key: str, after: str | None = None) -> Job:
    from tests.support.waiting import wait_for

    def fired() -> Job | None:
        service.run_pass(q)
        s = service.find(engine, ORG, key.rpartition("/")[2])
        if s is None or s.last_job_id is None or s.last_job_id == after:
            return None
        return q.get(s.last_job_id)

    found: Job = wait_for(fired, 15, interval=0.2, what=f"a fire of {key}")
    return found


# -- pause, resume, update, delete, trigger, backfill -----------------------------------------------


def test_pause_stops_the_ticks_and_resume_restarts_from_now(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(), 3).id
    paused = service.pause(q, key, "maintenance")
    assert (paused.status, paused.paused_reason) == ("paused", "maintenance")
    assert service.pause(q, key).seq == paused.seq  # already paused: nothing written
    assert service.run_pass(q).fired == 0 and fired_ticks(engine, key) == []
    resumed = service.resume(q, key)
    assert resumed.status == "active" and resumed.cursor > paused.cursor
    with engine.connect() as conn:
        row = conn.execute(select(schedules.c.next_fire_at).where(schedules.c.id == key)).scalar_one()
    assert str(iso(row)) > resumed.cursor  # the first tick after the resume, not the paused ones
    assert_row_equals_fold(engine, key)


def test_a_timing_change_restarts_the_cursor_and_the_same_change_writes_nothing(
    q: Queue, engine: Engine
) -> None:
    key = declare_as_of(q, declaration(), 60).id
    changed = service.update(q, key, {"cron": None, "intervalMs": 5000}, enqueued_by=WHO)
    assert changed.spec.interval_ms == 5000 and changed.spec.cron is None
    assert changed.cursor > str(iso(now_of(engine) - timedelta(seconds=5)))
    again = service.update(q, key, {"intervalMs": 5000}, enqueued_by=WHO)
    assert again.seq == changed.seq
    with pytest.raises(Exception, match="organizationId"):
        service.update(
            q,
            key,
            {
                "job": {
                    "agentId": "factory",
                    "payload": {
                        "kind": "factory.run",
                        "authContext": {"userId": "u", "organizationId": OTHER},
                    },
                }
            },
            enqueued_by=WHO,
        )


def test_delete_ends_the_schedule_and_a_deleted_id_can_be_declared_again(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(), 2).id
    service.delete(q, key)
    assert service.find(engine, ORG, "s") is None
    assert service.run_pass(q).fired == 0
    with pytest.raises(service.ScheduleNotFound):
        service.trigger(q, key)
    again = service.create(q, declaration(cron="0 0 * * *"), enqueued_by=WHO)
    assert again.created and again.schedule.spec.cron == "0 0 * * *"
    assert [r.type for r in stream(engine, key)] == [
        "schedule.created",
        "schedule.deleted",
        "schedule.created",
    ]


def test_trigger_fires_now_and_a_paused_schedule_can_be_triggered(q: Queue, engine: Engine) -> None:
    key = service.create(q, declaration(cron="0 0 1 1 *", overlap="skip"), enqueued_by=WHO).schedule.id
    service.pause(q, key)
    out = service.trigger(q, key)
    assert out.outcome == "fired" and out.job is not None and out.job.status == "queued"
    skipped = service.trigger(q, key)  # the first is still queued: skip
    assert skipped.outcome == "skipped" and skipped.job is None
    forced = service.trigger(q, key, "allow")
    assert forced.outcome == "fired" and forced.job is not None and forced.job.id != out.job.id


def test_backfill_twice_gives_one_job_per_tick(q: Queue, engine: Engine) -> None:
    key = service.create(q, declaration(cron="*/10 * * * *"), enqueued_by=WHO).schedule.id
    first = service.backfill(q, key, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")
    assert len(first.created) == 7 and first.existing == []
    seq = service.find(engine, ORG, "s").seq  # type: ignore[union-attr]
    second = service.backfill(q, key, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")
    assert second.created == [] and sorted(j.id for j in second.existing) == sorted(
        j.id for j in first.created
    )
    assert service.find(engine, ORG, "s").seq == seq  # type: ignore[union-attr]  # nothing written
    with engine.connect() as conn:
        n = conn.execute(
            select(func.count()).select_from(jobs).where(jobs.c.id.startswith(qualify(ORG, "s:")))
        ).scalar()
    assert n == 7


def test_fires_read_back_with_their_jobs(q: Queue, engine: Engine) -> None:
    key = service.create(q, declaration(cron="0 * * * *"), enqueued_by=WHO).schedule.id
    service.backfill(q, key, "2026-01-01T00:00:00Z", "2026-01-01T02:00:00Z")
    page = service.fires(engine, key, before=None, limit=2)
    assert [f.body["tick"][11:13] for f in page] == ["02", "01"]
    assert all(f.job is not None and f.job.status == "queued" for f in page)
    older = service.fires(engine, key, before=page[-1].seq, limit=10)
    assert [f.body["tick"][11:13] for f in older] == ["00"]


def test_rebuild_gives_back_the_same_rows(q: Queue, engine: Engine) -> None:
    declare_as_of(q, declaration("a"), 3)
    service.create(q, declaration("b", cron="0 0 * * *", paused=True), enqueued_by=WHO)
    service.run_pass(q)
    with engine.connect() as conn:
        before = sorted(tuple(r) for r in conn.execute(select(schedules)).all())
    with transaction(engine) as conn:
        assert storage.rebuild(conn) == 2
    with engine.connect() as conn:
        after = sorted(tuple(r) for r in conn.execute(select(schedules)).all())
    assert after == before


# -- the schedules file -----------------------------------------------------------------------------

FILE = """
[[schedules]]
scheduleId = "nightly"
organizationId = "acme"
cron = "0 30 2 * * *"
timeZone = "Europe/Paris"
job = { agentId = "factory", payload = { kind = "factory.run", goal = "report" } }

[[schedules]]
scheduleId = "heartbeat"
organizationId = "globex"
intervalMs = 60000
paused = true
job = { agentId = "factory", payload = { kind = "factory.run" } }
"""


@pytest.fixture
def schedules_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    yield path


def test_the_file_is_reconciled_idempotently(q: Queue, engine: Engine, schedules_file: Path) -> None:
    first = declared.reconcile_file(q, schedules_file)
    assert sorted(first.created) == ["acme/nightly", "globex/heartbeat"]
    heartbeat = service.find(engine, "globex", "heartbeat")
    assert heartbeat is not None and heartbeat.status == "paused" and heartbeat.spec.source == "file"
    receipts = _receipt_count(engine)
    second = declared.reconcile_file(q, schedules_file)
    assert not second.changed and sorted(second.unchanged) == ["acme/nightly", "globex/heartbeat"]
    assert _receipt_count(engine) == receipts  # the same file twice changes nothing
    # Edit the file: one changed, one removed; a schedule the API declared is never touched.
    service.create(q, declaration("api-made", cron="0 0 * * *"), enqueued_by=WHO)
    schedules_file.write_text(
        FILE.split('[[schedules]]\nscheduleId = "heartbeat"')[0].replace("0 30 2", "0 45 2")
    )
    third = declared.reconcile_file(q, schedules_file)
    assert (third.updated, third.deleted) == (["acme/nightly"], ["globex/heartbeat"])
    assert service.find(engine, ORG, "api-made") is not None
    assert service.find(engine, "globex", "heartbeat") is None


def test_a_bad_file_is_refused_naming_the_entry_and_field(tmp_path: Path) -> None:
    path = tmp_path / "schedules.json"
    entry = {
        "scheduleId": "x",
        "organizationId": "acme",
        "cron": "0 99 * * *",
        "job": {"agentId": "factory", "payload": {"kind": "factory.run"}},
    }
    path.write_text(json.dumps({"schedules": [entry]}))
    with pytest.raises(declared.ScheduleFileError, match=r"schedule 1: cron: must be a cron expression"):
        declared.load(path)


def _receipt_count(engine: Engine) -> int:
    from app.storage.db import receipts

    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(receipts)).scalar_one())


def test_each_fire_is_on_its_own_job_stream(q: Queue, engine: Engine) -> None:
    key = declare_as_of(q, declaration(), 1.5).id
    service.run_pass(q)
    for tick in fired_ticks(engine, key):
        job_key = qualify(ORG, "s:" + tick[:19].replace("-", "").replace(":", "") + "Z")
        with engine.connect() as conn:
            assert [r.type for r in store.read_stream(conn, job_stream(job_key))] == ["job.enqueued"]


def test_a_page_written_after_its_rows_moved_conflicts_and_writes_nothing(q: Queue, engine: Engine) -> None:
    key = service.create(q, declaration(cron="0 0 1 1 *"), enqueued_by=WHO).schedule.id
    with engine.connect() as conn:
        stale = storage.load(conn, key)
    assert stale is not None
    service.pause(q, key)  # the row moves on after it was read
    from app.jobs.errors import AppendConflict

    at = now_of(engine)
    with pytest.raises(AppendConflict), transaction(engine) as conn:
        storage.apply_many(conn, [(stale, key, [("schedule.paused", {"reason": "late"})])], at=at)
    assert [r.type for r in stream(engine, key)] == ["schedule.created", "schedule.paused"]
    assert_row_equals_fold(engine, key)


def test_processes_starting_together_reconcile_the_file_once(
    q: Queue, engine: Engine, schedules_file: Path
) -> None:
    first = declared.reconcile_once(q, str(schedules_file))
    assert sorted(first["created"]) == ["acme/nightly", "globex/heartbeat"]
    # A second process starting within the spacing finds the claim just used: it skips.
    assert declared.reconcile_once(q, str(schedules_file)) == {"skipped": True}
    assert declared.reconcile_once(q, None) == {"skipped": True}


def test_a_row_due_by_a_stale_next_fire_at_is_refreshed_not_fired(q: Queue, engine: Engine) -> None:
    key = service.create(q, declaration(cron="0 0 1 1 *"), enqueued_by=WHO).schedule.id
    with transaction(engine) as conn:  # as if the zone database moved the row's derived column
        conn.execute(schedules.update().where(schedules.c.id == key).values(next_fire_at=db_now(conn)))
    totals = service.run_pass(q)
    assert (totals.schedules, totals.fired) == (1, 0)
    assert [r.type for r in stream(engine, key)] == ["schedule.created"]
    assert_row_equals_fold(engine, key)  # next_fire_at is the fold's again: next New Year
    assert service.run_pass(q).schedules == 0


# -- ahead of the tick (RECEIPT_SCHEDULE_LEAD_MS) -----------------------------------------------------

LEAD_MS = 30_000


def test_a_lead_fires_allow_ticks_ahead_as_jobs_waiting_for_them_and_others_at_their_time(
    q: Queue, engine: Engine
) -> None:
    ahead = declare_as_of(q, declaration("a", cron="*/10 * * * * *"), 0).id
    skip = declare_as_of(q, declaration("k", cron="*/10 * * * * *", overlap="skip"), 0).id
    service.run_pass(q, lead_ms=LEAD_MS)
    after = now_of(engine)
    fires = [r.body for r in stream(engine, ahead) if r.type == "schedule.fired"]
    early = [b for b in fires if "aheadMs" in b]
    # Every tick of the next 30 s (three, or four when the clock was on a tick as the pass began).
    assert len(early) == 3 and len(fires) in (3, 4)
    made = {j.client_id: j for j in jobs_of(engine, ORG, "a")}
    for body in early:
        job = made[body["jobId"]]
        assert body["aheadMs"] > 0 and body["lateMs"] == 0 and body["tick"] > str(iso(after))
        assert job.status == "queued" and job.available_at == body["tick"] == body["availableAt"]
    # A policy that looks at the previous job decides each tick at its time: none is ahead.
    assert all(t <= str(iso(after)) for t in fired_ticks(engine, skip))
    # Decided: the next pass, a moment later, finds nothing new within the lead.
    assert service.run_pass(q, lead_ms=LEAD_MS).fired == 0
    assert_row_equals_fold(engine, ahead)
    assert_row_equals_fold(engine, skip)


@pytest.mark.parametrize("change", WITHDRAW_REASONS)
def test_a_change_withdraws_the_ticks_decided_ahead_and_cancels_their_waiting_jobs(
    q: Queue, engine: Engine, change: str
) -> None:
    key = declare_as_of(q, declaration(cron="*/10 * * * * *"), 0.5).id
    service.run_pass(q, lead_ms=LEAD_MS)
    first = {j.client_id for j in jobs_of(engine, ORG, "s")}
    fired = [r.body for r in stream(engine, key) if r.type == "schedule.fired"]
    if change == "paused":
        service.pause(q, key, "maintenance")
    elif change == "updated":
        job = {"agentId": "factory", "payload": {"kind": "factory.run", "note": "new"}}
        service.update(
            q, key, {"job": job}, enqueued_by=WHO, default_auth={"userId": "u", "organizationId": ORG}
        )
    else:
        service.delete(q, key)
    receipts = stream(engine, key)
    withdrawn = [r.body for r in receipts if r.type == "schedule.withdrawn"]
    canceled = {j.client_id: j for j in jobs_of(engine, ORG, "s")}
    # Every tick still ahead at the change is withdrawn and its job canceled in the same commit.
    still_ahead = {b["jobId"] for b in fired if b["tick"] > receipts[-1].at}
    assert still_ahead and {b["jobId"] for b in withdrawn} == still_ahead
    assert all(b["reason"] == change for b in withdrawn)
    assert all(canceled[b["jobId"]].status == "canceled" for b in withdrawn)
    assert_row_equals_fold(engine, key)
    if change == "deleted":
        return
    owed = still_ahead
    if change == "paused":
        service.resume(q, key)
        resumed_at = stream(engine, key)[-1].at
        # Ticks that came while it was paused are not owed (as without a lead).
        owed = {b["jobId"] for b in withdrawn if b["tick"] > resumed_at}
    service.run_pass(q, lead_ms=LEAD_MS)
    # Decided again, each tick one waiting job, under the schedule as it is now.
    waiting = [j for j in jobs_of(engine, ORG, "s") if j.status == "queued"]
    revision = withdrawn[0]["revision"]
    again = [j for j in waiting if j.client_id.endswith(f"Z-{revision}")]
    assert {j.client_id.removesuffix(f"-{revision}") for j in again} == owed
    ticks = [j.client_id.split(":")[1].split("-")[0] for j in waiting]
    assert len(ticks) == len(set(ticks))
    if change == "updated":
        # A tick that came before the change keeps its job; every one decided after it is the new one's.
        assert all(j.payload["note"] == "new" for j in waiting if j.client_id not in first)
    assert_row_equals_fold(engine, key)


def test_a_pass_leaves_ticks_still_ahead_to_the_next_once_over_budget_but_never_overdue_ones(
    q: Queue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "AHEAD_BUDGET_S", 0.0)
    for name in ("due1", "due2"):
        declare_as_of(q, declaration(name, cron="* * * * * *", overlap="skip", catchupWindowMs=60_000), 2.5)
    for name in ("ahead1", "ahead2", "ahead3"):
        declare_as_of(q, declaration(name, cron="0 0 0 1 1 *", overlap="allow"), 0)
    # A yearly tick is not within the lead; a per-minute one from a schedule declared now may be.
    declare_as_of(q, declaration("soon1", cron="*/10 * * * * *"), 0)
    declare_as_of(q, declaration("soon2", cron="*/10 * * * * *"), 0)
    totals = service.run_pass(q, page_size=1, lanes=1, lead_ms=LEAD_MS)
    # Both overdue schedules fired although the budget was spent from the start...
    assert all(fired_ticks(engine, qualify(ORG, n)) for n in ("due1", "due2"))
    # ...and of the two ahead, one page was taken and the other left to the next pass.
    fired_soon = [n for n in ("soon1", "soon2") if fired_ticks(engine, qualify(ORG, n))]
    assert len(fired_soon) == 1 and totals.pages == 3
    service.run_pass(q, page_size=1, lanes=1, lead_ms=LEAD_MS)
    assert all(fired_ticks(engine, qualify(ORG, n)) for n in ("soon1", "soon2"))
