"""Bulk actions on a filter: cancel or replay every job it selects, a page at a time.

An action is named by its caller's idempotency key and audited on the stream
``operations/<organizationId>/<key>``: ``operation.started`` (who, the action, the filter, how many
jobs matched) and one ``operation.page`` per page done (the cursor it started after, the one it
ended at, what it did). Every affected job gets its own receipt through the single-job paths
(``Queue.cancel``; ``Queue.replay_many``, whose ids derive from the key, so a replayed page names
the same new jobs). A page is at most ``BULK_PAGE_MAX`` jobs; the answer's ``nextCursor`` resumes.

Retrying a page (same key, same cursor) answers what its receipt recorded and writes nothing; the
same key with another action or filter is a conflict, never a second operation under one name.
A dry run writes nothing: the count, and a sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.jobs import replay
from app.jobs.errors import ConflictError, ReceiptError
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest
from app.jobs.vocab import OPERATION_STREAM_PREFIX
from app.storage import projection, search, store
from app.storage.db import jobs, transaction
from app.storage.queue import Queue
from app.storage.retry import optimistic

BULK_PAGE_MAX: Final = 1000
SAMPLE_SIZE: Final = 10
# The replay key of a bulk replay's jobs: the operation's key (a retried page names the same jobs).
REPLAY_KEY_PREFIX: Final = "op:"


def operation_stream(organization_id: str, key: str) -> str:
    return f"{OPERATION_STREAM_PREFIX}{organization_id}/{key}"


@dataclass(frozen=True)
class DryRun:
    count: int
    sample: list[Job]


@dataclass(frozen=True)
class Progress:
    """Where an operation stands after a page: totals over every page so far."""

    operation_id: str
    action: str
    matched: int
    processed: int
    affected: int
    skipped: int
    next_cursor: str | None
    replayed: bool  # this page was done before: its recorded answer, nothing written

    @property
    def done(self) -> bool:
        return self.next_cursor is None

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "action": self.action,
            "matched": self.matched,
            "processed": self.processed,
            "affected": self.affected,
            "skipped": self.skipped,
            "nextCursor": self.next_cursor,
            "done": self.done,
            "repeated": self.replayed,
        }


def dry_run(engine: Engine, scope: search.Scope, f: search.JobFilter, sample: int = SAMPLE_SIZE) -> DryRun:
    with engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(jobs).where(*search.conditions(conn, scope, f)))
        total = int(count.scalar_one())
        page = search.list_jobs(conn, scope, f, limit=sample)
    return DryRun(total, page.jobs)


# What a bulk replay calls to authorise each new job (an edited payload may not, but a replayed
# codex job runs a command: the caller must hold that right); raising refuses that job alone.
Authorize = Callable[[EnqueueRequest], None]


def run_page(
    queue: Queue,
    *,
    organization_id: str,
    key: str,
    action: str,
    f: search.JobFilter,
    by: Mapping[str, Any],
    cursor: str | None,
    limit: int,
    reason: str | None = None,
    authorize: Authorize | None = None,
) -> Progress:
    """Do the page of ``action`` after ``cursor`` (at most ``limit`` jobs), or answer it again."""
    engine = queue.engine
    stream = operation_stream(organization_id, key)
    scope = search.Scope(organization_id)
    filter_json = f.to_json()
    with engine.connect() as conn:
        receipts = store.read_stream(conn, stream)
    if receipts:
        started = receipts[0].body
        if started.get("action") != action or started.get("filter") != filter_json:
            raise ConflictError(
                f"idempotencyKey {key} names another operation ({started.get('action')} on another filter)"
            )
        for r in receipts[1:]:
            if r.body.get("after") == cursor:
                return _progress(key, receipts, upto=r.seq, replayed=True)
        matched = int(started.get("matched", 0))
    else:
        matched = dry_run(engine, scope, f, sample=0).count
    with engine.connect() as conn:
        page = search.list_jobs(conn, scope, f, limit=limit, cursor=cursor)
    affected, skipped = _apply(queue, action, key, page, reason, authorize)
    next_cursor = page.next_cursor
    events: list[tuple[str, dict[str, Any]]] = []
    if not receipts:
        events.append(
            (
                "operation.started",
                {"action": action, "filter": filter_json, "by": dict(by), "matched": matched},
            )
        )
    events.append(
        (
            "operation.page",
            {
                "after": cursor,
                "next": next_cursor,
                "processed": len(page.jobs),
                "affected": affected,
                "skipped": skipped,
            },
        )
    )

    def append() -> list[store.StoredReceipt]:
        with transaction(engine) as conn:
            head = store.head(conn, stream)
            return store.append_many(
                conn, stream, head.seq if head else 0, events, prev_hash=head.hash if head else None
            )

    optimistic(append, what="operation page")
    with engine.connect() as conn:
        receipts = store.read_stream(conn, stream)
    return _progress(key, receipts, upto=receipts[-1].seq, replayed=False)


def _apply(
    queue: Queue,
    action: str,
    key: str,
    page: search.JobPage,
    reason: str | None,
    authorize: Authorize | None,
) -> tuple[int, int]:
    """Each job's own receipt through the single-job path; (affected, skipped)."""
    selected = page.jobs
    affected = skipped = 0
    if action == "cancel":
        for job in selected:
            try:
                queue.cancel(job.id, reason)
                affected += 1
            except ConflictError:
                skipped += 1  # it ended meanwhile (or was already over)
        return affected, skipped
    if action != "replay":
        raise ValueError(f"unknown bulk action {action}")
    items: list[tuple[str, EnqueueRequest]] = []
    for job in selected:
        try:
            replay.refuse_unless_replayable(job)
            req = replay.replay_request(job, replay_key=REPLAY_KEY_PREFIX + key)
            if authorize is not None:
                authorize(req)
        except (ReceiptError, PermissionError):
            skipped += 1
            continue
        items.append((job.id, req))
    known = {job.id: projection.Loaded(job, *page.heads[job.id]) for job in selected if job.id in page.heads}
    for result in queue.replay_many(items, known=known):
        if isinstance(result, Exception):
            skipped += 1
        else:
            affected += 1
    return affected, skipped


def _progress(key: str, receipts: Sequence[store.StoredReceipt], *, upto: int, replayed: bool) -> Progress:
    started = receipts[0].body
    pages = [r.body for r in receipts[1:] if r.seq <= upto]
    return Progress(
        operation_id=key,
        action=str(started.get("action")),
        matched=int(started.get("matched", 0)),
        processed=sum(int(p.get("processed", 0)) for p in pages),
        affected=sum(int(p.get("affected", 0)) for p in pages),
        skipped=sum(int(p.get("skipped", 0)) for p in pages),
        next_cursor=pages[-1].get("next") if pages else None,
        replayed=replayed,
    )
