"""What a schedule does now: which ticks fire, which are missed, skipped or buffered, and which job
is canceled. Pure: the state, the database clock and the schedule's last job are passed in; the
result is the receipts to append and the jobs to enqueue (``app/schedules/service.py`` writes both
in one transaction).

The rules, in the order a pass applies them:

1. A **buffered** tick (``bufferOne``) fires as soon as the job it waited for is no longer active.
2. Ticks older than the **catch-up window** (``now - catchupWindowMs``) are recorded missed, in one
   ``schedule.missed`` receipt (the first and last tick, how many, the first hundred listed).
3. Every other tick up to ``now`` is decided in order, by the **overlap policy**, while the
   previous job (the last one a tick fired, or one fired earlier in this same pass) is active:
   ``allow`` fires; ``skip`` records it skipped; ``bufferOne`` keeps it buffered (a second one is
   skipped, ``buffer_full``); ``cancelPrevious`` cancels that job and fires (of several ticks due at
   once only the latest fires: the earlier ones are skipped ``superseded``).
4. **Ahead**: an ``allow`` schedule's ticks up to ``lead`` after ``now`` fire too, each job waiting
   for its tick (``availableAt``); ``allow`` looks at nothing that its time could change, so deciding
   early decides the same. Pausing, changing or deleting the schedule before such a tick
   **withdraws** it (``withdrawable``): the service cancels its waiting job and the tick is decided
   again, under the schedule as it then is.

Each fire's job is ``<scheduleId>:<tick>`` in the schedule's organisation (``app.schedules.vocab``):
whoever decides the same tick again enqueues the same job, which the queue returns unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.jobs.errors import ValidationError
from app.jobs.ids import qualify
from app.jobs.reducer import Job
from app.jobs.times import iso, parse_iso
from app.jobs.vocab import ACTIVE_STATUSES
from app.schedules.reducer import OWN_TRIGGERS, Schedule
from app.schedules.ticks import jitter_ms, next_tick
from app.schedules.vocab import (
    BACKFILL_TICKS_MAX,
    FIRES_PER_PASS_MAX,
    MISSED_COUNT_MAX,
    MISSED_LISTED_MAX,
    fire_client_id,
    fire_job_key,
)

Event = tuple[str, dict[str, Any]]
_TINY = timedelta(microseconds=1)


@dataclass(frozen=True)
class Fire:
    """One job to enqueue: the tick's, under its deterministic key, not deliverable before
    ``available_at`` (the tick plus its jitter) when set."""

    tick: datetime
    job_key: str
    available_at: datetime | None = None


@dataclass
class Plan:
    """The receipts a schedule appends (in order) and the jobs and cancel they go with."""

    events: list[Event] = field(default_factory=list)
    fires: list[Fire] = field(default_factory=list)
    cancel: str | None = None  # the storage key of a job to cancel first (cancelPrevious)

    @property
    def empty(self) -> bool:
        return not self.events


def _text(at: datetime) -> str:
    text = iso(at)
    assert text is not None
    return text


def busy_job(s: Schedule, last_job: Job | None) -> str | None:
    """The key of the schedule's previous job when it is still active (what an overlap looks at)."""
    if last_job is None or s.last_job_id is None or last_job.id != s.last_job_id:
        return None
    return last_job.id if last_job.status in ACTIVE_STATUSES else None


def _ms(delta: timedelta) -> int:
    return max(0, int(delta / timedelta(milliseconds=1)))


class _Builder:
    def __init__(self, s: Schedule, now: datetime) -> None:
        self.s, self.now, self.plan = s, now, Plan()

    def fire(self, tick: datetime, trigger: str, *, jitter: bool = True) -> str:
        s = self.s
        # The schedule's own ticks only: a backfill or trigger of a withdrawn tick finds its first
        # (canceled) job under the plain id and leaves it, so neither can run a tick twice.
        revision = s.revision_for(tick) if trigger in OWN_TRIGGERS else None
        job_id = fire_client_id(s.client_id, tick, revision)
        key = qualify(s.organization_id, job_id)
        delay = jitter_ms(s.id, tick, s.spec.jitter_ms) if jitter else 0
        ahead = tick > self.now
        available = tick + timedelta(milliseconds=delay) if delay or ahead else None
        body: dict[str, Any] = {
            "tick": _text(tick),
            "jobId": job_id,
            "trigger": trigger,
            "lateMs": _ms(self.now - tick),
        }
        if ahead:
            body["aheadMs"] = _ms(tick - self.now)
        if available is not None:
            body["availableAt"] = _text(available)
        self.plan.events.append(("schedule.fired", body))
        self.plan.fires.append(Fire(tick, key, available))
        return key

    def skip(self, tick: datetime, reason: str, busy: str | None, trigger: str = "schedule") -> None:
        body: dict[str, Any] = {"tick": _text(tick), "reason": reason, "trigger": trigger}
        if busy is not None:
            body["activeJobId"] = busy.rpartition("/")[2]
        self.plan.events.append(("schedule.skipped", body))

    def buffer(self, tick: datetime, busy: str) -> None:
        body = {"tick": _text(tick), "activeJobId": busy.rpartition("/")[2]}
        self.plan.events.append(("schedule.buffered", body))


def horizon(s: Schedule, now: datetime, lead_ms: int) -> datetime:
    """The latest tick a pass at ``now`` decides for ``s``: ``now``, or ``lead_ms`` after it for an
    ``allow`` schedule (rule 4; ``storage.due`` selects the rows by the same rule)."""
    return now + timedelta(milliseconds=lead_ms) if lead_ms > 0 and s.spec.overlap == "allow" else now


def due(s: Schedule, now: datetime, last_job: Job | None, lead_ms: int = 0) -> Plan:
    """What a pass does for ``s`` at ``now`` (database clock); ``last_job`` is its last fire's job;
    ``lead_ms`` how far ahead an ``allow`` schedule's ticks are decided (rule 4)."""
    b = _Builder(s, now)
    if not s.active:
        return b.plan
    spec, timing = s.spec, s.spec.timing
    busy = busy_job(s, last_job)
    buffered = s.buffered_tick is not None
    if s.buffered_tick is not None and busy is None:
        tick = parse_iso(s.buffered_tick)
        assert tick is not None
        busy, buffered = b.fire(tick, "buffered"), False
    cursor = parse_iso(s.cursor)
    assert cursor is not None
    window = now - timedelta(milliseconds=spec.catchup_window_ms)
    tick_or_none = next_tick(timing, cursor)
    if tick_or_none is not None and tick_or_none < window:
        tick_or_none = _missed(b, tick_or_none, window)
    ticks: list[datetime] = []
    until = horizon(s, now, lead_ms)
    while tick_or_none is not None and tick_or_none <= until and len(ticks) < FIRES_PER_PASS_MAX:
        ticks.append(tick_or_none)
        tick_or_none = next_tick(timing, tick_or_none)
    if spec.overlap == "cancelPrevious" and ticks:
        for tick in ticks[:-1]:
            b.skip(tick, "superseded", None)
        if busy is not None:
            b.plan.cancel = busy
        b.fire(ticks[-1], "schedule")
        return b.plan
    for tick in ticks:
        if busy is None or spec.overlap == "allow":
            busy = b.fire(tick, "schedule")
        elif spec.overlap == "bufferOne" and not buffered:
            b.buffer(tick, busy)
            buffered = True
        else:
            b.skip(tick, "buffer_full" if spec.overlap == "bufferOne" else "overlap", busy)
    return b.plan


def withdrawable(s: Schedule, now: datetime) -> list[tuple[datetime, str]]:
    """The schedule's own ticks decided ahead whose time has not come (after ``now``, up to its
    cursor), each with the storage key of the job it fired: what a pause, change or delete takes back.
    Only ahead fires put the cursor past the clock (a declaration, a resume and a timing change set
    it to their own time), so every own tick in that span was fired."""
    cursor = parse_iso(s.cursor)
    assert cursor is not None
    out: list[tuple[datetime, str]] = []
    tick = next_tick(s.spec.timing, now) if cursor > now else None
    while tick is not None and tick <= cursor:
        out.append((tick, fire_job_key(s.organization_id, s.client_id, tick, s.revision_for(tick))))
        tick = next_tick(s.spec.timing, tick)
    return out


def _missed(b: _Builder, first: datetime, window: datetime) -> datetime | None:
    """Record the ticks before ``window`` missed; return the first tick inside it (or None)."""
    timing = b.s.spec.timing
    listed: list[str] = []
    count, last = 0, first
    tick: datetime | None = first
    while tick is not None and tick < window and count < MISSED_COUNT_MAX:
        count, last = count + 1, tick
        if len(listed) < MISSED_LISTED_MAX:
            listed.append(_text(tick))
        tick = next_tick(timing, tick)
    capped = tick is not None and tick < window
    cursor = window - _TINY if capped else last
    body: dict[str, Any] = {
        "firstTick": _text(first),
        "lastTick": _text(last),
        "count": count,
        "ticks": listed,
        "reason": "outside_catchup_window",
        "cursor": _text(cursor),
    }
    if capped:
        # More than MISSED_COUNT_MAX: counted that far, then the rest up to the window skipped over.
        body["capped"] = True
    b.plan.events.append(("schedule.missed", body))
    return next_tick(timing, cursor) if capped else tick


def trigger(s: Schedule, now: datetime, last_job: Job | None, overlap: str | None = None) -> Plan:
    """An operator's "run now": a tick at ``now`` (to the millisecond), under the overlap policy
    (the schedule's, or ``overlap``): ``allow`` fires, ``cancelPrevious`` cancels the previous job
    and fires, ``skip`` and ``bufferOne`` record it skipped while the previous job is active (a
    trigger is never buffered). Its cursor does not move: the schedule's own ticks go on."""
    b = _Builder(s, now)
    tick = now.replace(microsecond=now.microsecond // 1000 * 1000)
    policy = overlap or s.spec.overlap
    busy = busy_job(s, last_job)
    if busy is not None and policy in ("skip", "bufferOne"):
        b.skip(tick, "overlap", busy, trigger="trigger")
        return b.plan
    if busy is not None and policy == "cancelPrevious":
        b.plan.cancel = busy
    b.fire(tick, "trigger", jitter=False)
    return b.plan


def backfill(s: Schedule, start: datetime, end: datetime, now: datetime) -> Plan:
    """Every tick of ``[start, end]`` fired once, whatever the overlap policy, under the same ids as
    the schedule's own: a tick whose job exists already (fired then, or by an earlier backfill) is
    left as it is, so repeating a backfill is a no-op. Only the past (``end`` at most ``now``)."""
    if end <= start:
        raise ValidationError("endAt", "must be after startAt")
    if end > now:
        raise ValidationError(
            "endAt", f"must not be after the server's time ({_text(now)}): a backfill fills the past"
        )
    b = _Builder(s, now)
    tick = next_tick(s.spec.timing, start - _TINY)
    while tick is not None and tick <= end:
        if len(b.plan.fires) >= BACKFILL_TICKS_MAX:
            raise ValidationError(
                "endAt", f"the range holds more than {BACKFILL_TICKS_MAX} ticks: backfill it in parts"
            )
        b.fire(tick, "backfill", jitter=False)
        tick = next_tick(s.spec.timing, tick)
    return b.plan
