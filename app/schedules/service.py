"""Schedule operations: declare, change, pause, resume, delete, trigger, backfill, read, and the pass.

Each operation is one queue transaction (``Queue.batch``): the schedule's row is locked, the pure
rules decide (``app/schedules/plan.py``), and its receipts, its row and the jobs its ticks enqueue
commit together. So a tick's ``schedule.fired`` receipt exists exactly when its job does, and a
pass that dies before its commit leaves nothing behind; and because a tick's job id is derived from
the tick (``<scheduleId>:<tick>``), whoever decides that tick again — a second beat, a retried pass,
a repeated backfill — finds the job there and enqueues nothing.

**The pass** (``run_pass``; the ``schedules`` recovery loop, ``app/ops/loop_registry.py``) is paged: it takes
the due schedules ``page_size`` at a time, soonest first, each page one transaction of a few
multi-row statements (the page's fires enqueued together, its receipts written together, its rows
updated by one statement), so 10 000 schedules cost one pass of twenty transactions, not 10 000.

With a **lead** (``RECEIPT_SCHEDULE_LEAD_MS``) the pass also decides an ``allow`` schedule's ticks
that far ahead (``plan`` rule 4): their jobs wait for their ticks as delayed jobs, and the passes
before a crowded tick spread its work. Such a pass stops taking pages of ticks still ahead once it
has run ``AHEAD_BUDGET_S`` (the next pass, a second later, goes on); overdue ticks are never left
for later. Pause, change and delete withdraw the ticks decided ahead whose time has not come: their
waiting jobs are canceled in the same transaction, and each is recorded ``schedule.withdrawn``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy.engine import Engine

from app import gc_pause
from app.jobs.delay import parse_run_at
from app.jobs.errors import ValidationError
from app.jobs.ids import client_id_of
from app.jobs.privilege import Enqueuer
from app.jobs.reducer import Job
from app.jobs.times import iso
from app.schedules import plan, storage
from app.schedules.reducer import Schedule
from app.schedules.spec import Declared, Spec, merged, validate_spec
from app.schedules.vocab import OVERLAPS, WithdrawReason
from app.storage import projection
from app.storage.db import db_now, is_sqlite, read_connection
from app.storage.queue import Batch, EnqueueResult, Queue

log = logging.getLogger("receipt.schedules")

PAGE_SIZE_DEFAULT: Final = 500
# Pages one pass takes at most (10 000 schedules at the default page are 20).
MAX_PAGES: Final = 1000
# Threads one pass runs its pages on (PostgreSQL): two, so that the database writes one page while
# this process decides the next; a third would only wait for its turn to write.
LANES: Final = 2
# How long a pass goes on taking pages of ticks still ahead of their time (a lead): the schedules
# loop runs every second, so what is left is decided a second later, well before its tick.
AHEAD_BUDGET_S: Final = 1.0


class ScheduleNotFound(Exception):
    """No schedule with that id in this organisation (another's of the same id is exactly as absent)."""


def _now_text(b: Batch) -> str:
    text = iso(b.now)
    assert text is not None
    return text


def _locked(b: Batch, key: str) -> storage.Loaded:
    loaded = storage.load(b.conn, key, for_update=True)
    if loaded is None or loaded.schedule.status == "deleted":
        raise ScheduleNotFound(key)
    return loaded


# -- reads ------------------------------------------------------------------------------------------


def find(engine: Engine, organization_id: str, schedule_id: str) -> Schedule | None:
    """The schedule its organisation knows as ``schedule_id`` (None when absent or deleted)."""
    key = storage.key_of(organization_id, schedule_id)
    if key is None:
        return None
    with read_connection(engine) as conn:
        loaded = storage.load(conn, key)
    if loaded is None or loaded.schedule.status == "deleted":
        return None
    return loaded.schedule


@dataclass(frozen=True)
class FireRecord:
    """One tick receipt of a schedule and, for a fire or a withdrawn tick, its job as it is now (None
    once gone)."""

    seq: int
    type: str
    at: str
    body: Mapping[str, Any]
    job: Job | None = None


# The tick receipts that name a job: a fire's, and a withdrawn tick's (canceled).
_WITH_JOBS: Final = ("schedule.fired", "schedule.withdrawn")


def fires(engine: Engine, key: str, *, before: int | None, limit: int) -> list[FireRecord]:
    """A page of the schedule's tick receipts, newest first, each fire with its job (one read)."""
    with read_connection(engine) as conn:
        receipts = storage.tick_receipts(conn, key, before=before, limit=limit)
        org = key.rpartition("/")[0]
        job_keys = [f"{org}/{r.body['jobId']}" for r in receipts if r.type in _WITH_JOBS]
        jobs = {j.id: j for j in projection.load_jobs(conn, job_keys)}
    out = []
    for r in receipts:
        job = jobs.get(f"{org}/{r.body['jobId']}") if r.type in _WITH_JOBS else None
        out.append(FireRecord(r.seq, r.type, r.at, r.body, job))
    return out


# -- declare, change, pause, resume, delete ---------------------------------------------------------


@dataclass(frozen=True)
class Created:
    schedule: Schedule
    created: bool


def create(queue: Queue, declared: Declared, *, enqueued_by: Enqueuer) -> Created:
    """Declare a schedule; an id its organisation already uses returns that schedule unchanged
    (the idempotency contract of jobs and objectives). A deleted one's id may be declared again."""
    key = storage.key_of(declared.organization_id, declared.schedule_id)
    assert key is not None

    def work(b: Batch) -> Created:
        loaded = storage.load(b.conn, key, for_update=True)
        if loaded is not None and loaded.schedule.status != "deleted":
            return Created(loaded.schedule, False)
        body: dict[str, Any] = {
            "scheduleId": declared.schedule_id,
            "organizationId": declared.organization_id,
            "spec": declared.spec.to_json(),
            "paused": declared.paused,
            "enqueuedBy": enqueued_by.to_json(),
            "cursor": _now_text(b),
        }
        done = storage.apply(b.conn, loaded, key, [("schedule.created", body)], at=b.now)
        return Created(done.schedule, True)

    return queue.batch(work)


def update(
    queue: Queue,
    key: str,
    patch: Any,
    *,
    enqueued_by: Enqueuer,
    default_auth: Mapping[str, Any] | None = None,
    replace_with: Spec | None = None,
    check: Callable[[Spec], None] | None = None,
) -> Schedule:
    """Change a schedule's declaration (``patch`` merged onto it, or the whole ``replace_with``).
    A change of when it ticks restarts its cursor at the change: ticks before it are not owed. The
    same declaration again writes nothing. ``check`` may refuse the new declaration (the caller's
    right to post its job template) before anything is written."""

    def work(b: Batch) -> Schedule:
        loaded = _locked(b, key)
        s = loaded.schedule
        spec = replace_with or validate_spec(
            merged(s.spec, patch), default_auth=default_auth, source=s.spec.source
        )
        org = spec.job.organization_id
        if org is not None and org != s.organization_id:
            raise ValidationError(
                "job.payload.authContext.organizationId",
                f"must be the schedule's own organisation ({s.organization_id})",
            )
        if spec.to_json() == s.spec.to_json():
            return s
        if check is not None:
            check(spec)
        body: dict[str, Any] = {"spec": spec.to_json(), "enqueuedBy": enqueued_by.to_json()}
        if spec.timing_changed(s.spec):
            body["cursor"] = _now_text(b)
        events = [*_withdraw(b, s, "updated"), ("schedule.updated", body)]
        return storage.apply(b.conn, loaded, key, events, at=b.now).schedule

    return queue.batch(work)


def _withdraw(b: Batch, s: Schedule, reason: WithdrawReason) -> list[tuple[str, dict[str, Any]]]:
    """Take back the ticks ``s`` decided ahead whose time has not come (``plan.withdrawable``): each
    job still waiting is canceled here, and each tick gets a ``schedule.withdrawn`` receipt (whose
    revision, this stream's next seq, names the tick's next job)."""
    ahead = plan.withdrawable(s, b.now)
    if not ahead:
        return []
    jobs = b.jobs([k for _t, k in ahead])
    events = []
    for tick, job_key in ahead:
        job = jobs.get(job_key)
        if job is not None and job.status == "queued":
            b.cancel(job_key, f"withdrawn: schedule {s.client_id} {reason} before the tick")
        body = {
            "tick": iso(tick),
            "jobId": client_id_of(job_key),
            "reason": reason,
            "revision": s.seq + 1,
        }
        events.append(("schedule.withdrawn", body))
    return events


def _one_event(
    queue: Queue, key: str, decide: Callable[[Schedule, Batch], list[tuple[str, dict[str, Any]]]]
) -> Schedule:
    def work(b: Batch) -> Schedule:
        loaded = _locked(b, key)
        events = decide(loaded.schedule, b)
        if not events:
            return loaded.schedule
        return storage.apply(b.conn, loaded, key, events, at=b.now).schedule

    return queue.batch(work)


def pause(queue: Queue, key: str, reason: str | None = None) -> Schedule:
    """Stop ticking (an already paused schedule is left as it is). A buffered tick stays buffered;
    ticks decided ahead are withdrawn."""
    return _one_event(
        queue,
        key,
        lambda s, b: (
            [*_withdraw(b, s, "paused"), ("schedule.paused", {"reason": reason})]
            if s.status == "active"
            else []
        ),
    )


def resume(queue: Queue, key: str) -> Schedule:
    """Tick again from now: the ticks that fell while it was paused are not owed (backfill them)."""
    return _one_event(
        queue,
        key,
        lambda s, b: [("schedule.resumed", {"cursor": _now_text(b)})] if s.status == "paused" else [],
    )


def delete(queue: Queue, key: str, reason: str | None = None) -> Schedule:
    """End the schedule: no more ticks; its receipts and the jobs it fired stay, but for those of
    ticks decided ahead, withdrawn."""
    return _one_event(
        queue, key, lambda s, b: [*_withdraw(b, s, "deleted"), ("schedule.deleted", {"reason": reason})]
    )


# -- trigger and backfill ---------------------------------------------------------------------------


def _enqueuer(s: Schedule) -> Enqueuer | None:
    return Enqueuer.from_json(s.enqueued_by)


def _fire(b: Batch, s: Schedule, p: plan.Plan, reason: str) -> list[EnqueueResult]:
    """Cancel, enqueue and mark, in the batch: the plan's fires become jobs; a fire whose job was
    there already says so (``existing``)."""
    if p.cancel is not None:
        b.cancel(p.cancel, reason)
    enqueuer = _enqueuer(s)
    results = b.enqueue_new([(s.spec.job.request(f.job_key, f.available_at), enqueuer) for f in p.fires])
    existing = {r.job.id for r in results if not r.created}
    fired = iter(p.fires)
    for type_, body in p.events:
        if type_ == "schedule.fired" and next(fired).job_key in existing:
            body["existing"] = True
    return results


@dataclass(frozen=True)
class Triggered:
    schedule: Schedule
    outcome: str  # fired | skipped
    job: Job | None


def trigger(queue: Queue, key: str, overlap: str | None = None) -> Triggered:
    """Fire a tick now (``plan.trigger``), whatever the schedule's status but deleted."""
    if overlap is not None and overlap not in OVERLAPS:
        raise ValidationError("overlap", "is not an overlap policy", allowed=OVERLAPS)

    def work(b: Batch) -> Triggered:
        loaded = _locked(b, key)
        s = loaded.schedule
        last = b.jobs([s.last_job_id]).get(s.last_job_id) if s.last_job_id else None
        p = plan.trigger(s, b.now, last, overlap)
        results = _fire(b, s, p, f"cancelPrevious: schedule {s.client_id} was triggered")
        done = storage.apply(b.conn, loaded, key, p.events, at=b.now).schedule
        job = results[0].job if results else None
        return Triggered(done, "fired" if job is not None else "skipped", job)

    return queue.batch(work)


@dataclass(frozen=True)
class Backfilled:
    schedule: Schedule
    created: list[Job]
    existing: list[Job]


def backfill(queue: Queue, key: str, start_at: Any, end_at: Any) -> Backfilled:
    """Fire every tick of ``[startAt, endAt]`` once (``plan.backfill``): only the ticks without a job
    get one, and a ``schedule.fired`` receipt; a repeated backfill writes nothing."""
    start, end = parse_run_at(start_at, "startAt"), parse_run_at(end_at, "endAt")

    def work(b: Batch) -> Backfilled:
        loaded = _locked(b, key)
        s = loaded.schedule
        p = plan.backfill(s, start, end, b.now)
        results = _fire(b, s, p, "backfill")
        created = {r.job.id for r in results if r.created}
        fired = iter(p.fires)
        events = [(t, body) for t, body in p.events if next(fired).job_key in created]
        if events:
            s = storage.apply(b.conn, loaded, key, events, at=b.now).schedule
        return Backfilled(s, [r.job for r in results if r.created], [r.job for r in results if not r.created])

    return queue.batch(work)


# -- the pass ---------------------------------------------------------------------------------------

Outcomes = Mapping[str, Counter[str]]


@dataclass
class PassTotals:
    schedules: int = 0
    pages: int = 0
    fired: int = 0
    created: int = 0
    missed: int = 0
    skipped: int = 0
    buffered: int = 0
    canceled: int = 0
    failed: list[str] = field(default_factory=list)
    # Per schedule key: fired / missed / skipped / buffered (the metrics' counter, by schedule).
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    # How late each new fire was (ms after its tick): the tick-to-enqueued latency.
    late_ms: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schedules": self.schedules,
            "pages": self.pages,
            "fired": self.fired,
            "created": self.created,
            "missed": self.missed,
            "skipped": self.skipped,
            "buffered": self.buffered,
            "canceled": self.canceled,
            "failed": self.failed,
            "lateMsMax": max(self.late_ms, default=0),
        }


def _count(totals: PassTotals, key: str, events: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    counter = totals.outcomes.setdefault(key, Counter())
    for type_, body in events:
        if type_ == "schedule.fired":
            totals.fired += 1
            counter["fired"] += 1
            if not body.get("existing"):
                totals.created += 1
                totals.late_ms.append(int(body.get("lateMs", 0)))
        elif type_ == "schedule.missed":
            totals.missed += int(body["count"])
            counter["missed"] += int(body["count"])
        elif type_ == "schedule.skipped":
            totals.skipped += 1
            counter["skipped"] += 1
        elif type_ == "schedule.buffered":
            totals.buffered += 1
            counter["buffered"] += 1


@dataclass(frozen=True)
class _Written:
    """What one page's transaction wrote: counted only once it committed (a lost append race
    re-runs the page from scratch)."""

    schedules: int
    events: list[tuple[str, list[tuple[str, dict[str, Any]]]]]
    canceled: int
    # Every tick the page decided was ahead of its time (so the pass may leave the rest for later).
    ahead_only: bool = False


def _page(
    b: Batch,
    due: list[storage.Loaded],
    writing: AbstractContextManager[Any] = contextlib.nullcontext(),
    lead_ms: int = 0,
) -> _Written:
    """Decide and write one page of locked schedules in the batch's transaction; its statements run
    inside ``writing`` (the pass's lanes take turns there, see ``run_pass``)."""
    # The previous jobs an overlap policy (or a buffered tick) looks at; `allow` looks at none.
    last_keys = [
        x.schedule.last_job_id
        for x in due
        if x.schedule.last_job_id and (x.schedule.spec.overlap != "allow" or x.schedule.buffered_tick)
    ]
    jobs = b.jobs(last_keys) if last_keys else {}
    now = b.now  # read after the rows were locked: no receipt seen here is newer
    planned = []
    stale = []
    for x in due:
        s = x.schedule
        p = plan.due(s, now, jobs.get(s.last_job_id) if s.last_job_id else None, lead_ms)
        if not p.empty:
            planned.append((x, p))
        elif s.active:
            stale.append(x)
    enqueues: list[tuple[Any, Enqueuer | None]] = []
    for x, p in planned:
        s = x.schedule
        enqueuer = _enqueuer(s)
        enqueues.extend((s.spec.job.request(f.job_key, f.available_at), enqueuer) for f in p.fires)
    canceled = 0
    with writing:
        if stale:
            # Said due, yet nothing to decide: the row's next_fire_at is out of date (the zone
            # database changed under it). It is derived from the fold, so it is written again, and
            # the page moves on.
            storage.refresh_next_fire(b.conn, stale)
        for x, p in planned:
            if p.cancel is not None:
                b.cancel(p.cancel, f"cancelPrevious: a newer tick of schedule {x.schedule.client_id} fired")
                canceled += 1
        existing = {r.job.id for r in b.enqueue_new(enqueues) if not r.created} if enqueues else set()
        for _x, p in planned:
            fired = iter(p.fires)
            for type_, body in p.events:
                if type_ == "schedule.fired" and next(fired).job_key in existing:
                    body["existing"] = True
        if planned:
            storage.apply_many(b.conn, [(x, x.schedule.id, p.events) for x, p in planned], at=now)
    ahead_only = bool(planned) and all("aheadMs" in body for _x, p in planned for _t, body in p.events)
    return _Written(len(due), [(x.schedule.id, p.events) for x, p in planned], canceled, ahead_only)


def _record(totals: PassTotals, written: _Written) -> None:
    totals.schedules += written.schedules
    totals.canceled += written.canceled
    for key, events in written.events:
        _count(totals, key, events)


@dataclass
class _Pass:
    """One pass's shared state: its lanes take pages from it and record into it under ``lock``."""

    queue: Queue
    started: datetime
    page_size: int
    keep: Callable[[], None] | None
    lead_ms: int = 0
    began: float = field(default_factory=time.monotonic)
    totals: PassTotals = field(default_factory=PassTotals)
    failed: set[str] = field(default_factory=set)
    taken: int = 0  # pages begun
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The lanes' statements take turns: one lane's writes run while the other decides its page.
    writing: threading.Lock = field(default_factory=threading.Lock)


def run_pass(
    queue: Queue,
    *,
    page_size: int = PAGE_SIZE_DEFAULT,
    keep: Callable[[], None] | None = None,
    lanes: int = LANES,
    lead_ms: int = 0,
) -> PassTotals:
    """One pass over every due schedule, a page per transaction, soonest first (see the module doc).

    Due means due when the pass began: ticks falling due while it runs are the next pass's, so a pass
    always ends. A page that fails is retried one schedule at a time, and a schedule that still fails
    is left out of this pass (logged; the next pass tries again), so one bad schedule never holds the
    others back. ``keep`` runs before each page (the loop claim's renewal). ``lead_ms`` decides
    ``allow`` schedules' ticks that far ahead (the module doc).

    On PostgreSQL ``lanes`` threads take pages at once (``SKIP LOCKED`` keeps their rows apart), their
    write statements taking turns: while one lane's page is written, the next is read and decided,
    so the database's work and this process's overlap. SQLite, which cannot skip a locked row, runs
    one lane."""
    with queue.engine.connect() as conn:
        started = db_now(conn)
    with gc_pause.paused():  # thousands of rows, receipts and states, no cycles among them
        state = _Pass(queue, started, page_size, keep, lead_ms)
        return _run(state, 1 if is_sqlite(queue.engine) else max(1, lanes))


def _run(state: _Pass, n: int) -> PassTotals:
    if n == 1:
        _lane(state, contextlib.nullcontext())
        return state.totals
    errors: list[BaseException] = []

    def lane() -> None:
        try:
            _lane(state, state.writing)
        except BaseException as exc:  # raised below, in the pass's own thread; the other lanes stop
            with state.lock:
                state.done = True
                errors.append(exc)

    threads = [threading.Thread(target=lane, name=f"schedules-lane-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return state.totals


def _lane(state: _Pass, writing: AbstractContextManager[Any]) -> None:
    """Take pages until one is short (nothing due is left unlocked) or the pass is done."""
    while True:
        with state.lock:
            if state.done or state.taken >= MAX_PAGES:
                return
            page = state.taken
            state.taken += 1
            if state.keep is not None:
                state.keep()
        # The schedules holding a buffered tick are looked at once per pass, with the first page.
        buffered = page == 0

        def work(b: Batch, buffered: bool = buffered) -> _Written:
            rows = storage.due(b.conn, state.started, state.page_size, lead_ms=state.lead_ms)
            if buffered:
                seen = {x.schedule.id for x in rows}
                more = storage.due(b.conn, state.started, state.page_size, buffered=True)
                rows += [x for x in more if x.schedule.id not in seen]
            return _page(b, [x for x in rows if x.schedule.id not in state.failed], writing, state.lead_ms)

        try:
            written = state.queue.batch(work)
        except Exception:
            log.exception("schedules pass: a page failed; trying its schedules one at a time")
            with state.lock:
                written = _one_by_one(state, state.totals, state.failed)
        with state.lock:
            _record(state.totals, written)
            state.totals.pages += 1
            if written.ahead_only and time.monotonic() - state.began >= AHEAD_BUDGET_S:
                state.done = True  # only ticks still ahead are left: the next pass decides them
            if written.schedules and not written.events:
                # Rows said due and nothing was: their next_fire_at is stale (a zone database
                # updated under them). The next pass reads them again; this one must not loop on them.
                log.warning("schedules pass: %d due rows had nothing to decide", written.schedules)
                state.done = True
            if written.schedules < state.page_size:
                return


def _one_by_one(state: _Pass, totals: PassTotals, failed: set[str]) -> _Written:
    queue = state.queue
    with queue.engine.connect() as conn:
        due = storage.due(conn, state.started, state.page_size, lead_ms=state.lead_ms)
        keys = [x.schedule.id for x in due if x.schedule.id not in failed]
    done = _Written(0, [], 0)
    for key in keys:

        def work(b: Batch, key: str = key) -> _Written:
            loaded = storage.load(b.conn, key, for_update=True)
            return _page(b, [loaded] if loaded is not None else [], lead_ms=state.lead_ms)

        try:
            one = queue.batch(work)
        except Exception:
            log.exception("schedules pass: schedule %s failed; the next pass tries it again", key)
            failed.add(key)
            totals.failed.append(key)
            continue
        done = _Written(done.schedules + 1, done.events + one.events, done.canceled + one.canceled)
    return done
