"""Bulk actions on a filter: cancel, replay or archive every job it selects, a page at a time.

An action is named by its caller's idempotency key and audited on the stream
``operations/<organizationId>/<key>``: ``operation.started`` (who, the action, the filter, how many
jobs matched) and one ``operation.page`` per page done (the cursor it started after, the one it
ended at, what it did). Every affected job gets its own receipt through the single-job paths:
``Queue.cancel``; ``Queue.replay_many``, whose ids derive from the key, so a replayed page names
the same new jobs; for an archive, ``job.archived`` (``transitions.archive_record``) before the
retention pass's own archiving of a chosen page (``app.retention.archive.archive_jobs``: the
segment, the tombstones, the guarded removal). A page is at most ``BULK_PAGE_MAX`` jobs; the
answer's ``nextCursor`` resumes.

Retrying a page (same key, same cursor) answers what its receipt recorded and writes nothing; the
same key with another action or filter is a conflict, never a second operation under one name.
A dry run writes nothing: the count, and a sample. A job the action does not apply to (a cancel of
an ended job, a replay of an objective's job, an archive of a job that has not ended or that a live
objective owns) is skipped and counted, never an error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.jobs import replay, transitions
from app.jobs.errors import ConflictError, ReceiptError
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest
from app.jobs.vocab import OPERATION_STREAM_PREFIX
from app.retention import archive
from app.retention.sink import ArchiveSink
from app.storage import projection, search, store
from app.storage.db import jobs, parse_iso, transaction
from app.storage.queue import Queue
from app.storage.retry import optimistic

BULK_PAGE_MAX: Final = 1000
SAMPLE_SIZE: Final = 10
# The replay key of a bulk replay's jobs: the operation's key (a retried page names the same jobs).
REPLAY_KEY_PREFIX: Final = "op:"
# A bulk archive's segments, beside the archiving pass's ``seg-`` ones.
ARCHIVE_SEGMENT_PREFIX: Final = "op-"


def operation_stream(organization_id: str, key: str) -> str:
    return f"{OPERATION_STREAM_PREFIX}{organization_id}/{key}"


def archive_pass_id(organization_id: str, key: str) -> str:
    """The pass id a bulk archive's tombstones record: one per operation (a key is unique within its
    organisation only), within the tombstones' 64 characters."""
    return (
        ARCHIVE_SEGMENT_PREFIX
        + hashlib.sha256(operation_stream(organization_id, key).encode()).hexdigest()[:32]
    )


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
    filter: Mapping[str, Any] = field(default_factory=dict)
    by: Mapping[str, Any] = field(default_factory=dict)
    pages: int = 0
    started_at: datetime | None = None
    updated_at: datetime | None = None

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
        page = search.list_jobs(conn, scope, f, limit=sample) if sample else search.JobPage([], None)
    return DryRun(total, page.jobs)


# What a bulk replay calls to authorise each new job (an edited payload may not, but a replayed
# codex job runs a command: the caller must hold that right); raising refuses that job alone.
Authorize = Callable[[EnqueueRequest], None]


@dataclass(frozen=True)
class Applied:
    """What one page did: jobs affected and skipped, and what its audit receipt adds (an archive's
    segment and pass)."""

    affected: int
    skipped: int
    extra: Mapping[str, Any] = field(default_factory=dict)


def status(engine: Engine, organization_id: str, key: str) -> Progress | None:
    """The operation named ``key`` as its audit stream records it (None: no such operation)."""
    with engine.connect() as conn:
        receipts = store.read_stream(conn, operation_stream(organization_id, key))
    if not receipts:
        return None
    return _progress(key, receipts, upto=receipts[-1].seq, replayed=False)


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
    sink: ArchiveSink | None = None,
) -> Progress:
    """Do the page of ``action`` after ``cursor`` (at most ``limit`` jobs), or answer it again.
    ``sink``: where an archive's segments go (required for ``archive``)."""
    engine = queue.engine
    stream = operation_stream(organization_id, key)
    scope = search.Scope(organization_id)
    filter_json = f.to_json()
    with engine.connect() as conn:
        receipts = store.read_stream(conn, stream)
    if receipts:
        _check_same(receipts[0], key, action, filter_json)
        done = _page_after(key, receipts, cursor)
        if done is not None:
            return done
        matched = int(receipts[0].body.get("matched", 0))
    else:
        matched = dry_run(engine, scope, f, sample=0).count
    with engine.connect() as conn:
        page = search.list_jobs(conn, scope, f, limit=limit, cursor=cursor)
    applied = _apply(queue, action, key, page, reason, authorize, sink=sink, organization_id=organization_id)
    started = {"action": action, "filter": filter_json, "by": dict(by), "matched": matched}
    page_body = {
        "after": cursor,
        "next": page.next_cursor,
        "processed": len(page.jobs),
        "affected": applied.affected,
        "skipped": applied.skipped,
        **applied.extra,
    }

    def append() -> Progress:
        with transaction(engine) as conn:
            # Read again in the transaction that appends: a concurrent request for the same page
            # (a double submit) did the same idempotent work; only one of the two records it.
            now = store.read_stream(conn, stream)
            if now:
                _check_same(now[0], key, action, filter_json)
                again = _page_after(key, now, cursor)
                if again is not None:
                    return again
            events = (
                [("operation.page", page_body)]
                if now
                else [("operation.started", started), ("operation.page", page_body)]
            )
            head = now[-1] if now else None
            written = store.append_many(
                conn, stream, head.seq if head else 0, events, prev_hash=head.hash if head else None
            )
        everything = [*now, *written]
        return _progress(key, everything, upto=everything[-1].seq, replayed=False)

    result: Progress = optimistic(append, what="operation page")
    return result


def _check_same(started: store.StoredReceipt, key: str, action: str, filter_json: Mapping[str, Any]) -> None:
    body = started.body
    if body.get("action") != action or body.get("filter") != filter_json:
        raise ConflictError(
            f"idempotencyKey {key} names another operation ({body.get('action')} on another filter)"
        )


def _page_after(key: str, receipts: Sequence[store.StoredReceipt], cursor: str | None) -> Progress | None:
    """The recorded answer of the page that started after ``cursor``, if it was done."""
    for r in receipts[1:]:
        if r.body.get("after") == cursor:
            return _progress(key, receipts, upto=r.seq, replayed=True)
    return None


def _apply(
    queue: Queue,
    action: str,
    key: str,
    page: search.JobPage,
    reason: str | None,
    authorize: Authorize | None,
    *,
    sink: ArchiveSink | None = None,
    organization_id: str | None = None,
) -> Applied:
    """Each job's own receipt through the single-job path."""
    selected = page.jobs
    if action == "cancel":
        affected = skipped = 0
        for job in selected:
            try:
                queue.cancel(job.id, reason)
                affected += 1
            except ConflictError:
                skipped += 1  # it ended meanwhile (or was already over)
        return Applied(affected, skipped)
    if action == "archive":
        if sink is None or organization_id is None:
            raise ValueError("a bulk archive needs the archive sink and its organisation")
        return _archive(queue, sink, organization_id, key, selected)
    if action != "replay":
        raise ValueError(f"unknown bulk action {action}")
    affected = skipped = 0
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
    return Applied(affected, skipped)


def _archive(
    queue: Queue, sink: ArchiveSink, organization_id: str, key: str, selected: Sequence[Job]
) -> Applied:
    """Each ended job a live objective does not own: its ``job.archived`` receipt, then the page's
    streams into one segment with their tombstones (``archive.archive_jobs``). The receipt comes
    first so the archived chain ends with it; a page done again after a crash between the two
    finds it already written (``archive_record`` adds nothing) and archives what is still there."""
    with queue.engine.connect() as conn:
        lone, _left = archive.lone_ended(conn, [job.id for job in selected])
    eligible = {row.id for row in lone}

    def record(job: Job, _now: datetime) -> list[transitions.Event]:
        return transitions.archive_record(job, key)

    items = [(job.id, record) for job in selected if job.id in eligible]
    recorded = [
        job_id
        for (job_id, _), outcome in zip(items, queue.mutate_many(items) if items else [], strict=True)
        if not isinstance(outcome, Exception) and outcome.job.archived_by == key
    ]
    moved = archive.archive_jobs(
        queue.engine,
        sink,
        recorded,
        pass_id=archive_pass_id(organization_id, key),
        segment_prefix=ARCHIVE_SEGMENT_PREFIX,
    )
    extra: dict[str, Any] = {"segment": moved.segment} if moved.segment else {}
    return Applied(len(moved.archived), len(selected) - len(moved.archived), extra)


def _progress(key: str, receipts: Sequence[store.StoredReceipt], *, upto: int, replayed: bool) -> Progress:
    started = receipts[0]
    pages = [r for r in receipts[1:] if r.seq <= upto]
    bodies = [p.body for p in pages]
    return Progress(
        operation_id=key,
        action=str(started.body.get("action")),
        matched=int(started.body.get("matched", 0)),
        processed=sum(int(p.get("processed", 0)) for p in bodies),
        affected=sum(int(p.get("affected", 0)) for p in bodies),
        skipped=sum(int(p.get("skipped", 0)) for p in bodies),
        next_cursor=bodies[-1].get("next") if bodies else None,
        replayed=replayed,
        filter=dict(started.body.get("filter") or {}),
        by=dict(started.body.get("by") or {}),
        pages=len(pages),
        started_at=_at(started),
        updated_at=_at(pages[-1]) if pages else _at(started),
    )


def _at(receipt: store.StoredReceipt) -> datetime | None:
    return parse_iso(receipt.at)
