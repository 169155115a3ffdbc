"""One objective-watchdog pass (the ``factory.objective.watchdog`` job's work) and its tick enqueue.

The pass pages through active objectives oldest first (``status_changed_at``, which for an active
objective is its launch), ``scan_limit`` per page, until every active objective was seen or the
pass's timeout has passed. Each page costs three queries whatever its size — the headers, the
tasks that have a job, and those jobs — plus one for the control jobs still unsettled. For every
objective ``watchdog.assess`` flags, it writes a ``reconcile`` control request through the outbox
(``service.request``: the receipt, then the fast path enqueues control). It never decides anything
about the objective itself: objective control does.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select

from app.config import Settings
from app.factory import service, watchdog
from app.factory.reducer import Objective, Task
from app.jobs import kinds
from app.jobs.ids import SYSTEM_ORGANIZATION, qualify
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest
from app.jobs.vocab import ACTIVE_STATUSES
from app.storage.db import as_utc, db_now, jobs, objective_tasks, objectives
from app.storage.queue import EnqueueResult, Queue

log = logging.getLogger("receipt.factory")

# A watchdog job is a cheap, repeatable scan: one attempt; the next tick is the retry.
WATCHDOG_MAX_ATTEMPTS = 1


def _control_jobs(queue: Queue) -> dict[tuple[str | None, str], list[Job]]:
    """Every unsettled control job, by objective: its organisation and the id it knows it by (few at
    any time: control steps are short)."""
    out: dict[tuple[str | None, str], list[Job]] = defaultdict(list)
    with queue.engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.state).where(
                jobs.c.agent_id == kinds.CONTROL.agent,
                jobs.c.kind == kinds.CONTROL.name,
                jobs.c.status.in_(sorted(ACTIVE_STATUSES)),
            )
        )
        for row in rows:
            job = Job.from_json(row.state)
            objective_id = job.payload.get("objectiveId")
            if isinstance(objective_id, str):
                out[(job.organization_id, objective_id)].append(job)
    return out


def _page(
    queue: Queue, after: tuple[datetime, str] | None, limit: int
) -> tuple[list[Objective], dict[str, Job | None], datetime, tuple[datetime, str] | None]:
    """A page of active objectives with their job-holding tasks and those jobs, and the db clock."""
    with queue.engine.connect() as conn:
        now = db_now(conn)
        q = select(objectives.c.id, objectives.c.state, objectives.c.status_changed_at).where(
            objectives.c.status == "active"
        )
        if after is not None:
            at, last_id = after
            c = objectives.c
            q = q.where(or_(c.status_changed_at > at, and_(c.status_changed_at == at, c.id > last_id)))
        rows = conn.execute(q.order_by(objectives.c.status_changed_at, objectives.c.id).limit(limit)).all()
        if not rows:
            return [], {}, now, None
        ids = [r.id for r in rows]
        tasks: dict[str, dict[str, Task]] = defaultdict(dict)
        for t in conn.execute(
            select(objective_tasks.c.objective_id, objective_tasks.c.state).where(
                objective_tasks.c.objective_id.in_(ids), objective_tasks.c.status.in_(["queued", "running"])
            )
        ):
            task = Task.from_json(t.state)
            tasks[t.objective_id][task.id] = task
    page = [Objective.from_header(r.state, tasks.get(r.id, {})) for r in rows]
    job_ids = [t.job_id for o in page for t in o.tasks.values() if t.job_id]
    found = service.read_jobs(queue.engine, job_ids)
    last = rows[-1]
    return page, found, now, (as_utc(last.status_changed_at), last.id)


def watchdog_pass(
    queue: Queue, settings: Settings, *, clock: Callable[[], float] = time.monotonic
) -> dict[str, Any]:
    """Scan active objectives within the scan limit and timeout; reconcile each one flagged.

    The result lists every objective reconciled and why, how many were scanned, and whether the
    pass stopped at its timeout (``timedOut``; the next tick starts again from the oldest)."""
    limit = watchdog.scan_limit(settings)
    timeout = watchdog.timeout_ms(settings)
    started = clock()
    deadline = started + timeout / 1000
    scanned = pages = 0
    reconciled: list[dict[str, Any]] = []
    timed_out = False
    after: tuple[datetime, str] | None = None
    controls = _control_jobs(queue)
    while True:
        if clock() >= deadline:
            timed_out = True
            break
        page, found, now, after = _page(queue, after, limit)
        pages += 1
        for obj in page:
            finding = watchdog.assess(
                obj, found, controls.get((obj.organization_id, obj.client_id), ()), now, settings
            )
            if finding is None:
                continue
            if service.request(queue, obj.id, "reconcile", finding.to_json()):
                reconciled.append(finding.to_json())
                log.info("watchdog: reconcile %s (%s)", obj.id, finding.reason)
        scanned += len(page)
        if len(page) < limit or after is None:
            break
    elapsed_ms = round((clock() - started) * 1000)
    if timed_out:
        log.warning("watchdog: pass stopped at its %d ms timeout after %d objectives", timeout, scanned)
    return {
        "scanned": scanned,
        "pages": pages,
        "reconciled": reconciled,
        "timedOut": timed_out,
        "elapsedMs": elapsed_ms,
        "scanLimit": limit,
        "timeoutMs": timeout,
    }


def enqueue_tick(queue: Queue, settings: Settings, published: datetime | None = None) -> EnqueueResult:
    """Enqueue the watchdog job of the cron tick ``published`` (beat's publish time) belongs to.

    Deterministic job id per tick: two beats, or a repeated message, give one job."""
    expr = watchdog.cron_expression(settings)
    if published is None:
        with queue.engine.connect() as conn:
            published = db_now(conn)
    tick = watchdog.tick_at(expr, published)
    payload = {"kind": kinds.WATCHDOG.name, "tick": tick.isoformat()}
    req = EnqueueRequest(
        agent_id=kinds.WATCHDOG.agent,
        payload=payload,
        # The system's own job: out of every tenant's reach (a tenant's jobId is in its organisation).
        key=qualify(SYSTEM_ORGANIZATION, watchdog.tick_job_id(tick)),
        max_attempts=WATCHDOG_MAX_ATTEMPTS,
    )
    return queue.enqueue(req)
