"""The archiving pass: eligible streams go to the archive sink, tombstones stay in their place.

One page at a time (``RECEIPT_ARCHIVE_PAGE_SIZE`` streams):

1. select the page: eligible objectives with every job they own, then eligible jobs on their own
   (``app/retention/policy.py``), walking forward by (ended, key) so a pass visits each once;
2. read the page's receipts and check each chain (a stream whose chain does not hold stays);
3. write them as one segment, whole (``sink.write``), named by the page's streams and final hashes,
   so a pass that resumes after a crash writes the very same segment again;
4. in one transaction: open the guard, lock the page's projection rows and check no stream moved,
   write the tombstones, remove the receipts (the trigger allows it only for streams whose tombstone
   names this pass), the projection rows, deliveries, callback outbox and ledger rows, close the
   guard, commit.

A crash before step 4 commits leaves the database as it was (at most a segment that no
``archive_segments`` row names, which the next pass removes first); a crash after it leaves the
page archived. Either way the next
pass resumes with what is still eligible, and nothing is lost or archived twice.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, false, func, or_, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from app.jobs.ids import KEY_SEPARATOR, SYSTEM_ORGANIZATION, qualify
from app.jobs.reducer import Job
from app.jobs.vocab import JOB_STREAM_PREFIX, TERMINAL_STATUSES
from app.retention.policy import (
    TERMINAL_OBJECTIVE_STATUSES,
    Ended,
    Policy,
    job_eligible,
    objective_eligible,
    owning_objectives,
)
from app.retention.sink import ArchiveSink
from app.storage import tombstones
from app.storage.db import (
    archive_segments,
    archived_streams,
    as_utc,
    callback_outbox,
    db_now,
    deliveries,
    durable_activities,
    durable_workflows,
    is_sqlite,
    iso,
    jobs,
    lock_key,
    objective_tasks,
    objectives,
    receipts,
    transaction,
)
from app.storage.store import receipt_hash

log = logging.getLogger("receipt.retention")

OBJECTIVE_STREAM_PREFIX = "objectives/"  # app.factory.vocab's; a test compares
# Steps a test may fail at (``checkpoint``): every boundary where a crash could land.
STEPS = (
    "swept",
    "selected",
    "segment_written",
    "guarded",
    "tombstones_written",
    "receipts_removed",
    "rows_removed",
    "committed",
)


class PageMoved(Exception):
    """A stream of the page gained a receipt after it was read: the page is read again."""


@dataclass(frozen=True)
class Member:
    """One stream of a page: a job's or an objective's, with its head as selected."""

    kind: str  # job | objective
    key: str
    organization_id: str | None
    status: str
    ended_at: datetime
    last_seq: int
    last_hash: str
    summary: dict[str, Any]

    @property
    def stream(self) -> str:
        return (OBJECTIVE_STREAM_PREFIX if self.kind == "objective" else JOB_STREAM_PREFIX) + self.key


@dataclass
class Totals:
    """What a pass did."""

    pass_id: str
    pages: int = 0
    streams: int = 0
    jobs: int = 0
    objectives: int = 0
    receipts: int = 0
    bytes: int = 0
    segments: list[str] = field(default_factory=list)
    orphans_removed: int = 0
    skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "passId": self.pass_id,
            "pages": self.pages,
            "streams": self.streams,
            "jobs": self.jobs,
            "objectives": self.objectives,
            "receipts": self.receipts,
            "bytes": self.bytes,
            "segments": list(self.segments),
            "orphansRemoved": self.orphans_removed,
            "skipped": self.skipped,
        }


def _nothing(step: str) -> None:
    return None


# -- selection ------------------------------------------------------------------------------------


def _org(column: Any) -> ColumnElement[Any]:
    return func.coalesce(column, SYSTEM_ORGANIZATION)


def _old_enough(policy: Policy, now: datetime, org_col: Any, changed_col: Any) -> ColumnElement[bool]:
    """SQL for "ended before its organisation's cutoff": one clause per window of the policy."""
    clauses = []
    for days, orgs_in, orgs_out in policy.windows():
        where = [changed_col < now - timedelta(days=days)]
        if orgs_in is None:
            if orgs_out:
                where.append(_org(org_col).not_in(list(orgs_out)))
        else:
            where.append(_org(org_col).in_(list(orgs_in)))
        clauses.append(and_(*where))
    return or_(*clauses) if clauses else false()


def _job_summary(job: Job) -> dict[str, Any]:
    return {
        "agentId": job.agent_id,
        "kind": job.kind,
        "lane": job.lane,
        "attempt": job.attempt,
        "maxAttempts": job.max_attempts,
        "createdAt": job.created_at,
        "updatedAt": job.updated_at,
    }


def _job_member(r: Any) -> Member:
    job = Job.from_json(r.state)
    return Member(
        "job",
        r.id,
        r.organization_id,
        r.status,
        as_utc(r.status_changed_at),
        int(r.last_seq),
        r.last_hash,
        _job_summary(job),
    )


_JOB_COLUMNS = (
    jobs.c.id,
    jobs.c.organization_id,
    jobs.c.status,
    jobs.c.status_changed_at,
    jobs.c.last_seq,
    jobs.c.last_hash,
    jobs.c.state,
)


def _live_objectives(conn: Connection, keys: Iterable[str]) -> set[str]:
    wanted = list(dict.fromkeys(keys))
    if not wanted:
        return set()
    return {r[0] for r in conn.execute(select(objectives.c.id).where(objectives.c.id.in_(wanted)))}


def _payload_objective(member: Member, state: Any) -> str | None:
    payload = (state or {}).get("payload") or {}
    objective_id = payload.get("objectiveId")
    if not isinstance(objective_id, str) or not objective_id:
        return None
    if KEY_SEPARATOR in objective_id:
        return objective_id  # already a key (some of the Factory's own payloads carry one)
    return qualify(member.organization_id or SYSTEM_ORGANIZATION, objective_id)


@dataclass
class Cursor:
    """Where the pass's walk has reached: the last (ended, key) taken of each kind."""

    objectives: tuple[datetime, str] | None = None
    jobs: tuple[datetime, str] | None = None
    objectives_done: bool = False
    jobs_done: bool = False


def _after(cursor: tuple[datetime, str] | None, changed: Any, key: Any) -> ColumnElement[bool]:
    """Rows after ``cursor`` in (ended, key) order. The ``>=`` conjunct is implied by the rest; it
    is there so the index range starts at the cursor instead of at the oldest row."""
    if cursor is None:
        return and_(key.is_not(None))
    return and_(changed >= cursor[0], or_(changed > cursor[0], and_(changed == cursor[0], key > cursor[1])))


def owned_jobs(conn: Connection, objective_key: str) -> list[Any]:
    """Every job an objective owns: keyed under it, or named by its task rows."""
    by_prefix = select(*_JOB_COLUMNS).where(jobs.c.id.startswith(objective_key + ":", autoescape=True))
    by_task = select(*_JOB_COLUMNS).where(
        jobs.c.id.in_(
            select(objective_tasks.c.job_id).where(
                objective_tasks.c.objective_id == objective_key, objective_tasks.c.job_id.is_not(None)
            )
        )
    )
    rows = {r.id: r for r in conn.execute(by_prefix)}
    for r in conn.execute(by_task):
        rows.setdefault(r.id, r)
    return list(rows.values())


_OBJECTIVE_COLUMNS = (
    objectives.c.id,
    objectives.c.organization_id,
    objectives.c.status,
    objectives.c.status_changed_at,
    objectives.c.last_seq,
    objectives.c.last_hash,
    objectives.c.title,
    objectives.c.created_at,
    objectives.c.updated_at,
)


def _walk(
    conn: Connection,
    table: Any,
    columns: Sequence[Any],
    statuses: Iterable[str],
    old_enough: ColumnElement[bool],
    after: tuple[datetime, str] | None,
    batch: int,
) -> list[Any]:
    """The next ``batch`` ended rows after ``after`` in (ended, key) order. One query per status,
    merged here: each is a range of the (status, status_changed_at) index, where one query over
    every status would sort all the matching rows for each page."""
    changed, key = table.c.status_changed_at, table.c.id
    runs = [
        conn.execute(
            select(*columns)
            .where(table.c.status == status, old_enough, _after(after, changed, key))
            .order_by(changed, key)
            .limit(batch)
        ).all()
        for status in sorted(statuses)
    ]
    return list(heapq.merge(*runs, key=lambda r: (r.status_changed_at, r.id)))[:batch]


def select_page(
    conn: Connection, policy: Policy, now: datetime, page_size: int, cursor: Cursor
) -> list[Member]:
    """The next page of eligible streams (objectives with their jobs first, then lone jobs)."""
    page: list[Member] = []
    batch = max(page_size, 1)
    while not cursor.objectives_done and len(page) < page_size:
        rows = _walk(
            conn,
            objectives,
            _OBJECTIVE_COLUMNS,
            TERMINAL_OBJECTIVE_STATUSES,
            _old_enough(policy, now, objectives.c.organization_id, objectives.c.status_changed_at),
            cursor.objectives,
            batch,
        )
        if not rows:
            cursor.objectives_done = True
            break
        for r in rows:
            cursor.objectives = (r.status_changed_at, r.id)
            owned = owned_jobs(conn, r.id)
            ended = Ended(r.organization_id, r.status, as_utc(r.status_changed_at))
            facts = [Ended(j.organization_id, j.status, as_utc(j.status_changed_at)) for j in owned]
            if not objective_eligible(policy, ended, facts, now):
                continue
            page.append(
                Member(
                    "objective",
                    r.id,
                    r.organization_id,
                    r.status,
                    ended.changed_at,
                    int(r.last_seq),
                    r.last_hash,
                    {
                        "title": r.title,
                        "createdAt": iso(as_utc(r.created_at)),
                        "updatedAt": iso(as_utc(r.updated_at)),
                        "jobs": len(owned),
                    },
                )
            )
            page.extend(_job_member(j) for j in owned)
            if len(page) >= page_size:
                return page
    while not cursor.jobs_done and len(page) < page_size:
        job_rows = _walk(
            conn,
            jobs,
            _JOB_COLUMNS,
            TERMINAL_STATUSES,
            _old_enough(policy, now, jobs.c.organization_id, jobs.c.status_changed_at),
            cursor.jobs,
            batch,
        )
        if not job_rows:
            cursor.jobs_done = True
            break
        members = [(_job_member(r), r) for r in job_rows]
        owners: dict[str, list[str]] = {}
        for m, row in members:
            candidates = list(owning_objectives(m.key))
            named = _payload_objective(m, row.state)
            if named is not None:
                candidates.append(named)
            owners[m.key] = candidates
        live = _live_objectives(conn, (k for ks in owners.values() for k in ks))
        for m, row in members:
            cursor.jobs = (row.status_changed_at, row.id)
            in_live = any(k in live for k in owners[m.key])
            ended = Ended(m.organization_id, m.status, m.ended_at)
            if job_eligible(policy, ended, now, in_live_objective=in_live):
                page.append(m)
                if len(page) >= page_size:
                    return page
    return page


# -- the segment ---------------------------------------------------------------------------------


PASS_SEGMENT_PREFIX = "seg-"


def segment_name(page: Sequence[Member], prefix: str = PASS_SEGMENT_PREFIX) -> str:
    """Named by what it holds: the same page always gives the same name. ``prefix`` keeps the
    segments of two writers apart (the pass's, a bulk archive's), so neither ever drops the
    other's when a page of its own moved."""
    digest = hashlib.sha256()
    for m in sorted(page, key=lambda m: m.stream):
        digest.update(f"{m.stream}\0{m.last_seq}\0{m.last_hash}\n".encode())
    return prefix + digest.hexdigest()[:32]


def read_page(conn: Connection, page: Sequence[Member]) -> tuple[list[dict[str, Any]], list[Member]]:
    """The page's receipts as segment lines, and the members whose chain holds and whose head is
    still the one selected (the rest stay in the database)."""
    streams = [m.stream for m in page]
    rows = conn.execute(
        select(receipts).where(receipts.c.stream.in_(streams)).order_by(receipts.c.stream, receipts.c.seq)
    ).all()
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        at = iso(as_utc(r.at))
        by_stream.setdefault(r.stream, []).append(
            {
                "stream": r.stream,
                "seq": int(r.seq),
                "type": r.type,
                "body": r.body,
                "at": at,
                "prevHash": r.prev_hash,
                "hash": r.hash,
            }
        )
    lines: list[dict[str, Any]] = []
    kept: list[Member] = []
    for m in sorted(page, key=lambda m: m.stream):
        chain = by_stream.get(m.stream, [])
        problem = chain_problem(m.stream, chain)
        if problem is None and (len(chain) != m.last_seq or chain[-1]["hash"] != m.last_hash):
            problem = "its head is not the projection's"
        if problem is not None:
            log.warning("retention: %s stays in the database: %s", m.stream, problem)
            continue
        lines.extend(chain)
        kept.append(m)
    return lines, kept


def chain_problem(stream: str, chain: Sequence[dict[str, Any]]) -> str | None:
    """Why these receipts are not one whole chain from seq 1 (None: they are)."""
    if not chain:
        return "no receipts"
    prev: str | None = None
    for n, r in enumerate(chain, start=1):
        if r.get("stream") != stream:
            return f"seq {r.get('seq')} names stream {r.get('stream')!r}"
        if r.get("seq") != n:
            return f"seq {r.get('seq')} follows seq {n - 1}"
        if r.get("prevHash") != prev:
            return f"seq {n}: prevHash does not match the previous receipt's hash"
        expected = receipt_hash(stream, n, r["type"], r["body"], r["at"], prev)
        if expected != r.get("hash"):
            return f"seq {n}: hash does not match the receipt's contents"
        prev = r["hash"]
    return None


# -- the removal -----------------------------------------------------------------------------------


def _lock_heads(conn: Connection, page: Sequence[Member]) -> None:
    """Lock the page's projection rows and check each is still at the head the segment holds."""
    job_keys = [m.key for m in page if m.kind == "job"]
    objective_keys = [m.key for m in page if m.kind == "objective"]
    seen: dict[tuple[str, str], tuple[int, str]] = {}
    for kind, table, keys in (("job", jobs, job_keys), ("objective", objectives, objective_keys)):
        if not keys:
            continue
        q = select(table.c.id, table.c.last_seq, table.c.last_hash).where(table.c.id.in_(keys))
        if not is_sqlite(conn):
            q = q.with_for_update()
        for r in conn.execute(q):
            seen[(kind, r.id)] = (int(r.last_seq), r.last_hash)
    for m in page:
        if seen.get((m.kind, m.key)) != (m.last_seq, m.last_hash):
            raise PageMoved(m.stream)


def remove(
    conn: Connection,
    page: Sequence[Member],
    *,
    pass_id: str,
    segment: str,
    segment_bytes: int,
    now: datetime,
    checkpoint: Callable[[str], None] = _nothing,
) -> int:
    """Step 4 inside the caller's transaction: tombstones, then the guarded removal. Returns the
    receipts removed."""
    tombstones.set_guard(conn, pass_id)
    checkpoint("guarded")
    _lock_heads(conn, page)
    conn.execute(
        archived_streams.insert(),
        [
            {
                "stream": m.stream,
                "kind": m.kind,
                "key": m.key,
                "organization_id": m.organization_id,
                "status": m.status,
                "receipt_count": m.last_seq,
                "final_hash": m.last_hash,
                "ended_at": m.ended_at,
                "segment": segment,
                "pass_id": pass_id,
                "archived_at": now,
                "summary": m.summary,
            }
            for m in page
        ],
    )
    conn.execute(
        archive_segments.insert().values(
            segment=segment,
            pass_id=pass_id,
            streams=len(page),
            receipts=sum(m.last_seq for m in page),
            bytes=segment_bytes,
            written_at=now,
        )
    )
    checkpoint("tombstones_written")
    streams = [m.stream for m in page]
    removed = conn.execute(delete(receipts).where(receipts.c.stream.in_(streams))).rowcount
    expected = sum(m.last_seq for m in page)
    if removed != expected:
        raise PageMoved(f"removed {removed} receipts, the tombstones count {expected}")
    checkpoint("receipts_removed")
    job_keys = [m.key for m in page if m.kind == "job"]
    objective_keys = [m.key for m in page if m.kind == "objective"]
    if job_keys:
        conn.execute(delete(deliveries).where(deliveries.c.job_id.in_(job_keys)))
        conn.execute(delete(callback_outbox).where(callback_outbox.c.job_id.in_(job_keys)))
        conn.execute(delete(durable_activities).where(durable_activities.c.job_id.in_(job_keys)))
        conn.execute(delete(durable_workflows).where(durable_workflows.c.job_id.in_(job_keys)))
        conn.execute(delete(jobs).where(jobs.c.id.in_(job_keys)))
    if objective_keys:
        conn.execute(delete(durable_workflows).where(durable_workflows.c.objective_id.in_(objective_keys)))
        conn.execute(delete(durable_activities).where(durable_activities.c.objective_id.in_(objective_keys)))
        conn.execute(delete(objective_tasks).where(objective_tasks.c.objective_id.in_(objective_keys)))
        conn.execute(delete(objectives).where(objectives.c.id.in_(objective_keys)))
    tombstones.clear_guard(conn, pass_id)
    checkpoint("rows_removed")
    return int(removed)


# -- the pass ----------------------------------------------------------------------------------------


# Held by the sweep, and by a bulk archive from before it writes its segment until its tombstones
# commit: a segment written but not yet committed is one the sweep would take for a crashed pass's.
# (The pass itself needs no more than the loop's claim: it sweeps before it writes.)
SEGMENTS_LOCK = "archive:segments"


def sweep(engine: Engine, sink: ArchiveSink) -> int:
    """Remove segments whose commit never happened (no ``archive_segments`` row, written with their
    tombstones): what a pass that crashed before its commit wrote. Runs at the start of a pass,
    which holds the loop's claim (no other pass is writing one), under ``SEGMENTS_LOCK`` (no bulk
    archive is between its segment and its commit)."""
    with transaction(engine) as conn:
        lock_key(conn, SEGMENTS_LOCK)
        named = tombstones.committed_segments(conn)
        orphans = [n for n in sink.names() if n not in named]
        for name in orphans:
            sink.remove(name)
        sink.clear_unfinished()
    if orphans:
        log.info("retention: removed %d segment(s) a stopped pass left: %s", len(orphans), ", ".join(orphans))
    return len(orphans)


MAX_PAGE_RETRIES = 3


def run_pass(
    engine: Engine,
    sink: ArchiveSink,
    policy: Policy,
    *,
    page_size: int,
    keep: Callable[[], None] = lambda: None,
    checkpoint: Callable[[str], None] = _nothing,
    max_pages: int | None = None,
    pass_id: str | None = None,
    clock: Callable[[Connection], datetime] = db_now,
    duty_percent: int = 100,
    rest: Callable[[float], None] = time.sleep,
) -> Totals:
    """Archive every eligible stream, page by page (``keep`` between pages renews the claim).

    ``clock``: the time eligibility is judged at (the database clock; a test moves it forward).
    ``checkpoint(step)`` is called at each of ``STEPS`` (a test fails there to crash the pass).
    ``duty_percent``: after each page the pass ``rest``s (seconds) for ``rest_after`` of its work."""
    totals = Totals(pass_id or uuid.uuid4().hex[:16])
    if not policy.enabled:
        return totals
    totals.orphans_removed = sweep(engine, sink)
    checkpoint("swept")
    cursor = Cursor()
    retries = 0
    worked_from: float | None = None
    while max_pages is None or totals.pages < max_pages:
        if worked_from is not None:
            pause = rest_after(time.monotonic() - worked_from, duty_percent)
            if pause > 0:
                rest(pause)
        keep()
        worked_from = time.monotonic()
        before = (cursor.objectives, cursor.jobs, cursor.objectives_done, cursor.jobs_done)
        with engine.connect() as conn:
            now = clock(conn)
            page = select_page(conn, policy, now, max(1, page_size), cursor)
            if not page:
                break
            lines, kept = read_page(conn, page)
        totals.skipped += len(page) - len(kept)
        checkpoint("selected")
        if not kept:
            continue
        name = segment_name(kept)
        written = sink.write(name, lines)
        checkpoint("segment_written")
        try:
            with transaction(engine) as conn:
                removed = remove(
                    conn,
                    kept,
                    pass_id=totals.pass_id,
                    segment=name,
                    segment_bytes=written.bytes,
                    now=db_now(conn),
                    checkpoint=checkpoint,
                )
        except PageMoved as exc:
            sink.remove(name)  # this pass's own, never committed: no tombstone names it
            retries += 1
            if retries > MAX_PAGE_RETRIES:
                raise
            log.info("retention: a stream moved while its page was archived (%s); reading it again", exc)
            cursor.objectives, cursor.jobs, cursor.objectives_done, cursor.jobs_done = before
            continue
        retries = 0
        checkpoint("committed")
        totals.pages += 1
        totals.streams += len(kept)
        totals.jobs += sum(1 for m in kept if m.kind == "job")
        totals.objectives += sum(1 for m in kept if m.kind == "objective")
        totals.receipts += removed
        totals.bytes += written.bytes
        totals.segments.append(name)
    return totals


# -- a chosen set of jobs (a bulk archive's page) --------------------------------------------------


def lone_ended(conn: Connection, job_keys: Sequence[str]) -> tuple[list[Any], list[str]]:
    """The rows among ``job_keys`` that may leave on their own -- ended, and owned by no objective
    still in the database (retention's rule, without its window: an objective's jobs leave with it,
    never before) -- and the keys that may not (not ended, an objective's, or no longer there)."""
    wanted = list(dict.fromkeys(job_keys))
    rows = conn.execute(select(*_JOB_COLUMNS).where(jobs.c.id.in_(wanted))).all() if wanted else []
    ended = [r for r in rows if r.status in TERMINAL_STATUSES]
    owners: dict[str, list[str]] = {}
    for r in ended:
        candidates = list(owning_objectives(r.id))
        named = _payload_objective(_job_member(r), r.state)
        if named is not None:
            candidates.append(named)
        owners[r.id] = candidates
    live = _live_objectives(conn, (k for ks in owners.values() for k in ks))
    lone = [r for r in ended if not any(k in live for k in owners[r.id])]
    taken = {r.id for r in lone}
    return lone, [k for k in wanted if k not in taken]


@dataclass(frozen=True)
class Moved:
    """What archiving a chosen set of jobs did: the keys now archived (their tombstones committed),
    the keys left in the database (``lone_ended`` refused them, or their chain did not hold), the
    segment written and the receipts it took."""

    archived: list[str]
    left: list[str]
    segment: str | None
    receipts: int


def archive_jobs(
    engine: Engine,
    sink: ArchiveSink,
    job_keys: Sequence[str],
    *,
    pass_id: str,
    segment_prefix: str,
    checkpoint: Callable[[str], None] = _nothing,
) -> Moved:
    """Archive these jobs now, whatever the retention window, as one segment: the pass's steps 2-4
    for a page someone chose (a bulk archive on a filter). Only jobs ``lone_ended`` allows leave;
    a page that moved meanwhile is read again (``MAX_PAGE_RETRIES``)."""
    for _attempt in range(MAX_PAGE_RETRIES + 1):
        with engine.connect() as conn:
            rows, left = lone_ended(conn, job_keys)
            lines, kept = read_page(conn, [_job_member(r) for r in rows])
        taken = {m.key for m in kept}
        left += [r.id for r in rows if r.id not in taken]
        if not kept:
            return Moved([], left, None, 0)
        name = segment_name(kept, segment_prefix)
        try:
            with transaction(engine) as conn:
                # From the segment's write to the commit of the tombstones naming it: see SEGMENTS_LOCK.
                lock_key(conn, SEGMENTS_LOCK)
                written = sink.write(name, lines)
                checkpoint("segment_written")
                removed = remove(
                    conn,
                    kept,
                    pass_id=pass_id,
                    segment=name,
                    segment_bytes=written.bytes,
                    now=db_now(conn),
                    checkpoint=checkpoint,
                )
        except PageMoved as exc:
            sink.remove(name)  # its own, never committed: no tombstone names it
            log.info("bulk archive: a stream moved while its page was archived (%s); reading it again", exc)
            continue
        checkpoint("committed")
        return Moved([m.key for m in kept], left, name, removed)
    raise PageMoved(f"the page of {len(job_keys)} jobs kept moving")


def rest_after(worked_s: float, duty_percent: int) -> float:
    """How long to rest after ``worked_s`` of work so that work is ``duty_percent`` of the time.

    Each page's deletes leave dead rows and index entries on pages the hot queries read (the first
    reader after a delete prunes them) and churn the buffer cache; at full speed on two cores that
    doubled a dispatch claim at a million jobs (``bench/README.md``, "retention_bench.py")."""
    return max(0.0, worked_s) * (100 - duty_percent) / duty_percent


def oldest_live_terminal(conn: Connection) -> datetime | None:
    """When the longest-ended job still in the database ended (what retention has yet to take)."""
    found = [
        conn.execute(select(func.min(jobs.c.status_changed_at)).where(jobs.c.status == status)).scalar()
        for status in sorted(TERMINAL_STATUSES)
    ]
    present = [as_utc(v) for v in found if v is not None]
    return min(present) if present else None


def tombstone_count(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(archived_streams)).scalar_one())


@dataclass(frozen=True)
class PassRecord:
    """One archiving pass as its segments recorded it."""

    pass_id: str
    finished_at: datetime
    segments: int
    streams: int
    receipts: int
    bytes: int


def recent_passes(conn: Connection, limit: int = 5) -> list[PassRecord]:
    """The latest passes that archived anything, newest first."""
    s = archive_segments.c
    rows = conn.execute(
        select(
            s.pass_id,
            func.max(s.written_at).label("finished"),
            func.count(),
            func.sum(s.streams),
            func.sum(s.receipts),
            func.sum(s.bytes),
        )
        .group_by(s.pass_id)
        .order_by(func.max(s.written_at).desc())
        .limit(limit)
    ).all()
    return [PassRecord(r[0], as_utc(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows]
