"""One dispatch pass over one worker queue's waiting line, in one transaction (docs/dispatch.md).

A pass runs on every freed place, so its statements are few and written once: on PostgreSQL,
lock + clock, the counts, the heads, then the claim's (``delivery.begin_many``).

1. Passes of one queue are serialised (an advisory lock on PostgreSQL, taken with the clock's
   reading in one round trip; SQLite has one writer).
2. Capacity: the slots of the queue's live worker processes (``worker_liveness``), plus the lead.
3. In flight: the queue's leased jobs, and its queued jobs with a live pending delivery (sent, not
   yet leased), per organisation and per concurrency key. Counted from rows, never kept.
4. Places = capacity - in flight. None free: the pass ends here.
5. The head of each organisation's line (priority, then age; ready, not in flight, its key not
   known full), at most ``places`` per organisation, with their rows (the claim reads no more).
6. The choice (``app.dispatch.choice``), then the chosen jobs' deliveries are recorded
   (``delivery.begin_many``) and the limiters and turns advanced, all before the commit. The caller
   sends the worker messages after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    and_,
    func,
    literal,
    null,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import Connection

from app.config import Settings
from app.dispatch import limits, policies, rates
from app.dispatch.choice import Candidate, Choice, Line, Waiting, choose
from app.jobs.errors import DeliveryGenerationsExceeded
from app.jobs.reducer import Job
from app.jobs.timing import timing_for
from app.jobs.vocab import LEASED_STATUSES
from app.storage import delivery
from app.storage.db import (
    as_utc,
    deliveries,
    dispatch_marks,
    is_sqlite,
    jobs,
    lock_keys,
    lock_keys_then_now,
    parse_iso,
    put_marks,
    worker_liveness,
)
from app.storage.direct import Direct

TURN_PREFIX: Final = "turn:"
# Heads read per organisation beyond the free places: room to step past heads whose key is full.
HEAD_SLACK: Final = 8


@dataclass(frozen=True)
class Capacity:
    """A queue's live offers: their slots, how many processes, and the lead they add (per process
    ``RECEIPT_DISPATCH_LEAD``, at most that process's own slots)."""

    slots: int
    processes: int
    lead: int = 0

    @property
    def places(self) -> int:
        """The most attempts that may be in flight: the slots plus the lead."""
        return self.slots + self.lead


@dataclass(frozen=True)
class PassResult:
    queue: str
    now: datetime
    capacity: Capacity
    in_flight: int
    places: int
    claimed: list[tuple[Job, delivery.StartDecision | DeliveryGenerationsExceeded]] = field(
        default_factory=list
    )
    # Heads read and left in the line, by reason; and when a rate limiter next admits one of them.
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    retry_at: datetime | None = None
    # No place was free, and jobs wait in the line (the line itself was not read).
    blocked: bool = False

    @property
    def line_waiting(self) -> bool:
        """Jobs wait in the line that this pass could not send."""
        return self.blocked or bool(self.waiting)

    def again_in_s(self, tick_s: float) -> float | None:
        """When this queue's line may move without a wake-up, in seconds from the pass: a rate
        limiter's next admission; ``tick_s`` while no place was free (the line was not read: a
        process may come, a lost wake-up may leave it) or heads were left; else never (None)."""
        if self.retry_at is not None:
            return max(0.0, (self.retry_at - self.now).total_seconds())
        if self.blocked or self.waiting:
            return tick_s
        return None


def queues_field(queues: Sequence[str]) -> str:
    """How a liveness row lists its queues: space-separated and space-framed, so a ``LIKE`` on
    ``% name %`` matches whole names only."""
    return " " + " ".join(sorted(set(queues))) + " "


def _live_pending(now: datetime, epoch: str | None) -> Any:
    d = deliveries.c
    live = [d.state == "pending", d.deadline_at > now]
    if epoch is not None:
        live.append(or_(d.broker_epoch.is_(None), d.broker_epoch == epoch))
    return and_(*live)


_IN_FLIGHT_STATUSES = ", ".join(f"'{status}'" for status in sorted(LEASED_STATUSES))
# The counts on PostgreSQL, written once (the pass runs on every freed place). The sent part is
# driven by the few live pending deliveries, each job then read by its key alone, in a lookup fenced
# by OFFSET 0 (never flattened, nothing else pushed into it). A join the planner is free to turn
# around would walk the whole line instead; and with the status beside the key, the line's partial
# index (which holds the key as its last column) qualified too. Just after a burst (statistics not
# yet analysed, the line estimated empty) the planner took either, walking the line once per
# pending delivery (64 deliveries over a 3 000-job line: 1.48 ms, against 0.2 fenced).
_COUNTS_PG = text(
    f"""
SELECT 'leased' AS part, organization_id, concurrency_key, count(*) AS n, 0 AS processes, 0 AS lead
FROM jobs WHERE status IN ({_IN_FLIGHT_STATUSES}) AND worker_queue = :queue
GROUP BY organization_id, concurrency_key
UNION ALL
SELECT 'sent', q.organization_id, q.concurrency_key, count(*), NULL, NULL
FROM (SELECT DISTINCT d.job_id FROM deliveries d
      WHERE d.state = 'pending' AND d.deadline_at > :now
        AND (CAST(:epoch AS text) IS NULL OR d.broker_epoch IS NULL OR d.broker_epoch = :epoch)) p
CROSS JOIN LATERAL (
    SELECT organization_id, concurrency_key FROM (
        SELECT organization_id, concurrency_key, status, worker_queue FROM jobs j
        WHERE j.id = p.job_id OFFSET 0) k
    WHERE k.status = 'queued' AND k.worker_queue = :queue) q
GROUP BY q.organization_id, q.concurrency_key
UNION ALL
SELECT 'offers', NULL, NULL, coalesce(sum(slots), 0), count(*),
       coalesce(sum(LEAST(slots, CAST(:lead AS integer))), 0) FROM worker_liveness
WHERE dead_at IS NULL AND renewed_at > :fresh AND slots IS NOT NULL AND queues LIKE :like
"""
)


# Prepared once per connection where prepared statements are on (``app/storage/direct.py``): the
# server spent longer planning these two than running them (0.3 and 0.6 ms of planning against
# 0.05-0.2 ms of execution, a line of 1 or 3 000 jobs), once per pass.
_COUNTS = Direct(_COUNTS_PG)


def _counts_sqlite(
    conn: Connection, queue: str, fresh: datetime, now: datetime, epoch: str | None, lead: int
) -> Any:
    j = jobs.c
    leased = select(
        literal("leased").label("part"),
        j.organization_id,
        j.concurrency_key,
        func.count().label("n"),
        literal(0),
        literal(0),
    ).where(j.status.in_(sorted(LEASED_STATUSES)), j.worker_queue == queue)
    pending = select(deliveries.c.job_id).where(_live_pending(now, epoch)).distinct().subquery("pending")
    queued_here = (
        select(j.id, j.organization_id, j.concurrency_key)
        .where(j.status == "queued", j.worker_queue == queue)
        .subquery("queued_here")
    )
    q = queued_here.c
    sent = (
        select(literal("sent"), q.organization_id, q.concurrency_key, func.count(), null(), null())
        .select_from(pending.join(queued_here, q.id == pending.c.job_id))
        .group_by(q.organization_id, q.concurrency_key)
    )
    w = worker_liveness.c
    offers = select(
        literal("offers"),
        null(),
        null(),
        func.coalesce(func.sum(w.slots), 0),
        func.count(),
        # SQLite's two-argument min() is PostgreSQL's LEAST.
        func.coalesce(func.sum(func.min(w.slots, lead)), 0),
    ).where(w.dead_at.is_(None), w.renewed_at > fresh, w.slots.is_not(None), w.queues.like(f"% {queue} %"))
    return conn.execute(union_all(leased.group_by(j.organization_id, j.concurrency_key), sent, offers))


def _counts(
    conn: Connection, queue: str, settings: Settings | None, now: datetime, epoch: str | None
) -> tuple[Capacity, dict[str, int], dict[tuple[str, str], int]]:
    """In one statement: the queue's capacity (with ``settings``; else none) and its attempts in
    flight per organisation and per (organisation, key). Rows of the three parts are told apart by
    their first column. Capacity counts the processes renewed within the self-fence that offer
    slots for ``queue``, and the lead they add: ``RECEIPT_DISPATCH_LEAD`` each, but never more
    than a process's own slots, so a process of few long attempts is not sent many to hold."""
    # Without settings no process is fresh enough: the capacity part answers nothing.
    fresh = now - timedelta(milliseconds=settings.worker_self_fence_ms) if settings is not None else now
    lead = settings.dispatch_lead if settings is not None else 0
    if is_sqlite(conn):
        rows = _counts_sqlite(conn, queue, fresh, now, epoch, lead)
    else:
        rows = _COUNTS.rows(
            conn,
            {
                "queue": queue,
                "now": now,
                "epoch": epoch,
                "fresh": fresh,
                "like": f"% {queue} %",
                "lead": lead,
            },
        )
    by_org: dict[str, int] = {}
    by_key: dict[tuple[str, str], int] = {}
    cap = Capacity(0, 0)
    for part, org, key, n, processes, offered_lead in rows:
        if part == "offers":
            if settings is not None:
                cap = Capacity(int(n), int(processes), int(offered_lead))
            continue
        org = org or ""
        by_org[org] = by_org.get(org, 0) + n
        if key is not None:
            by_key[(org, key)] = by_key.get((org, key), 0) + n
    return cap, by_org, by_key


@dataclass(frozen=True)
class _Head:
    id: str
    org: str
    priority: int
    key: str | None
    limit: int | None
    since: datetime
    # The row's job, read with the head so the claim need not read it again (parsed only if chosen).
    state: Any = field(compare=False, repr=False)


# Each organisation's heads in one statement: a skip scan over the line index finds the
# organisations with queued jobs in the queue (one index probe each, however long their lines),
# then each one's first ``n`` in line order. Jobs without an organisation (none is written today)
# get a line of their own.
_HEADS_PG = text(
    """
WITH RECURSIVE orgs(org) AS (
    (SELECT organization_id FROM jobs
     WHERE status = 'queued' AND worker_queue = :queue AND organization_id IS NOT NULL
     ORDER BY organization_id LIMIT 1)
    UNION ALL
    SELECT (SELECT organization_id FROM jobs
            WHERE status = 'queued' AND worker_queue = :queue AND organization_id > orgs.org
            ORDER BY organization_id LIMIT 1)
    FROM orgs WHERE orgs.org IS NOT NULL
)
SELECT h.* FROM orgs CROSS JOIN LATERAL (
    SELECT id, organization_id, priority, concurrency_key, concurrency_limit, status_changed_at, state
    FROM jobs j
    WHERE j.status = 'queued' AND j.worker_queue = :queue AND j.organization_id = orgs.org
      AND (j.available_at IS NULL OR j.available_at <= :now)
      AND (j.concurrency_key IS NULL OR NOT (j.organization_id || chr(31) || j.concurrency_key = ANY(:full)))
      AND NOT EXISTS (
          SELECT 1 FROM deliveries d WHERE d.job_id = j.id AND d.state = 'pending' AND d.deadline_at > :now
            AND (CAST(:epoch AS text) IS NULL OR d.broker_epoch IS NULL OR d.broker_epoch = :epoch))
    ORDER BY priority DESC, status_changed_at, id
    LIMIT :n
) h
WHERE orgs.org IS NOT NULL
UNION ALL
(SELECT id, organization_id, priority, concurrency_key, concurrency_limit, status_changed_at, state
 FROM jobs j
 WHERE j.status = 'queued' AND j.worker_queue = :queue AND j.organization_id IS NULL
   AND (j.available_at IS NULL OR j.available_at <= :now)
   AND NOT EXISTS (
       SELECT 1 FROM deliveries d WHERE d.job_id = j.id AND d.state = 'pending' AND d.deadline_at > :now
         AND (CAST(:epoch AS text) IS NULL OR d.broker_epoch IS NULL OR d.broker_epoch = :epoch))
 ORDER BY priority DESC, status_changed_at, id
 LIMIT :n)
"""
)


_HEADS = Direct(_HEADS_PG)


def heads(
    conn: Connection, queue: str, now: datetime, epoch: str | None, n: int, full: Sequence[tuple[str, str]]
) -> list[_Head]:
    """The first ``n`` ready jobs of each organisation's line in ``queue``, in line order."""
    if not is_sqlite(conn):
        rows = _HEADS.rows(
            conn,
            {
                "queue": queue,
                "now": now,
                "epoch": epoch,
                "n": n,
                "full": [f"{org}\x1f{key}" for org, key in full],
            },
        )
    else:
        j = jobs.c
        sent = select(deliveries.c.job_id).where(deliveries.c.job_id == j.id, _live_pending(now, epoch))
        rank = (
            func.row_number()
            .over(partition_by=j.organization_id, order_by=(j.priority.desc(), j.status_changed_at, j.id))
            .label("rank")
        )
        ready = (
            select(
                j.id,
                j.organization_id,
                j.priority,
                j.concurrency_key,
                j.concurrency_limit,
                j.status_changed_at,
                j.state,
                rank,
            )
            .where(
                j.status == "queued",
                j.worker_queue == queue,
                or_(j.available_at.is_(None), j.available_at <= now),
                ~sent.exists(),
            )
            .subquery()
        )
        rows = conn.execute(
            select(ready).where(ready.c.rank <= n).order_by(ready.c.organization_id, ready.c.rank)
        ).all()
        blocked = set(full)
        rows = [
            r
            for r in rows
            if r.concurrency_key is None or (r.organization_id or "", r.concurrency_key) not in blocked
        ]
    # By position: the direct path's rows are tuples (id, organisation, priority, key, limit, since,
    # state), SQLite's have a rank after them.
    return [
        _Head(job_id, org or "", priority, key, limit, as_utc(since), state)
        for job_id, org, priority, key, limit, since, state, *_rank in rows
    ]


def _has_line(conn: Connection, queue: str) -> bool:
    j = jobs.c
    return (
        conn.execute(select(j.id).where(j.status == "queued", j.worker_queue == queue).limit(1)).first()
        is not None
    )


def _turn_key(queue: str, org: str) -> str:
    return f"{TURN_PREFIX}{queue}:{org}"


def last_turns(conn: Connection, queue: str, orgs: Sequence[str]) -> dict[str, float]:
    keys = {_turn_key(queue, org): org for org in orgs}
    if not keys:
        return {}
    rows = conn.execute(
        select(dispatch_marks.c.key, dispatch_marks.c.at).where(dispatch_marks.c.key.in_(sorted(keys)))
    )
    return {keys[r.key]: as_utc(r.at).timestamp() for r in rows}


def run_pass(
    conn: Connection,
    queue: str,
    settings: Settings,
    now: datetime | None = None,
    *,
    epoch: str | None = None,
    dispatch_key: Callable[[Job], str] | None = None,
) -> PassResult:
    """Choose and claim what fills ``queue``'s free places; see the module's steps. Each delivery
    is keyed ``dispatch_key(job)`` (default: the job id, the enqueue's own key). ``now`` defaults
    to the database's clock once the queue's lock is held (read with the lock, one round trip)."""
    if now is None:
        now = lock_keys_then_now(conn, [f"dispatch:{queue}"])
    else:
        lock_keys(conn, [f"dispatch:{queue}"])
    cap, by_org, by_key = _counts(conn, queue, settings, now, epoch)
    total = sum(by_org.values())
    places = cap.places - total
    if places <= 0:
        return PassResult(queue, now, cap, total, 0, blocked=_has_line(conn, queue))
    # A key at or past the operator's limit for it cannot take a place: its heads are not read.
    full = [
        (org, key)
        for (org, key), n in by_key.items()
        if n >= (limits.declared_limit(settings.concurrency_limits, key) or limits.CONCURRENCY_LIMIT_CAP)
    ]
    found = heads(conn, queue, now, epoch, places + HEAD_SLACK, full)
    if not found:
        return PassResult(queue, now, cap, total, places)
    org_policy = policies.org_policies(conn, settings)
    line, rated = _line(settings, queue, places, found, by_org, by_key, org_policy)
    tats = rates.read(conn, rated)
    line = _with_turns_and_allowance(conn, queue, line, rated, tats, now)
    choice = choose(line)
    # The heads' rows as this pass read them: a job canceled or moved since is found out at its
    # lease, as for any delivery of a job that moved after its claim.
    rows = {h.id: h.state for h in found}
    chosen = [Job.from_json(rows[c.job_id]) for c in choice.send]
    claimed = claim(conn, settings, chosen, now, epoch, dispatch_key)
    rates.spend(conn, rated, tats, choice.spent, now)
    if len(line.heads) > 1:
        # Turns break ties between organisations: a line of one has none to break.
        put_marks(
            conn,
            {_turn_key(queue, c.org): now + timedelta(microseconds=i) for i, c in enumerate(choice.send)},
        )
    return PassResult(
        queue,
        now,
        cap,
        total,
        places,
        claimed,
        choice.waiting,
        _retry_at(choice, line, rated, tats, now),
    )


def _line(
    settings: Settings,
    queue: str,
    places: int,
    found: Sequence[_Head],
    by_org: Mapping[str, int],
    by_key: Mapping[tuple[str, str], int],
    org_policy: Mapping[str, policies.OrgPolicy],
) -> tuple[Line, dict[str, float]]:
    rated: dict[str, float] = {}
    lines: dict[str, list[Candidate]] = {}
    for h in found:
        limiter = None
        if h.key is not None:
            declared = limits.key_rate(settings.rate_limits, h.org, h.key)
            if declared is not None:
                limiter, rated[declared[0]] = declared[0], declared[1]
        lines.setdefault(h.org, []).append(
            Candidate(
                h.id,
                h.org,
                h.since.timestamp(),
                h.key,
                limits.concurrency_limit(settings.concurrency_limits, h.key, h.limit) if h.key else None,
                limiter,
            )
        )
    org_limiter: dict[str, str] = {}
    for org in lines:
        policy = org_policy.get(org, policies.DEFAULT)
        if policy.rate_per_s is not None:
            org_limiter[org] = limits.org_limiter(org)
            rated[org_limiter[org]] = policy.rate_per_s
    weights = {org: org_policy[org].weight for org in lines if org in org_policy}
    return Line(places, lines, by_org, by_key, weights, {}, org_limiter), rated


def _with_turns_and_allowance(
    conn: Connection,
    queue: str,
    line: Line,
    rated: Mapping[str, float],
    tats: Mapping[str, datetime],
    now: datetime,
) -> Line:
    allowance = {name: rates.allowance(rate, tats.get(name), now) for name, rate in rated.items()}
    return Line(
        line.places,
        line.heads,
        line.in_flight,
        line.key_in_flight,
        line.weights,
        allowance,
        line.org_limiter,
        last_turns(conn, queue, sorted(line.heads)) if len(line.heads) > 1 else {},
    )


def claim(
    conn: Connection,
    settings: Settings,
    ready: Sequence[Job],
    now: datetime,
    epoch: str | None,
    dispatch_key: Callable[[Job], str] | None = None,
) -> list[tuple[Job, delivery.StartDecision | DeliveryGenerationsExceeded]]:
    """Record a delivery for each of ``ready`` (keyed ``dispatch_key(job)``, default its id): the
    end of a pass, and a direct claim's (``app.dispatch.fast``)."""
    if not ready:
        return []
    requests = [
        delivery.StartRequest(
            job.id, dispatch_key(job) if dispatch_key else job.id, _driver_timeout_ms(job, settings)
        )
        for job in ready
    ]
    return list(zip(ready, delivery.begin_many(conn, requests, now, epoch=epoch), strict=True))


def _driver_timeout_ms(job: Job, settings: Settings) -> int:
    return timing_for(job.agent_id, job.kind, job.payload, settings).driver_timeout_ms


def _retry_at(
    choice: Choice, line: Line, rated: Mapping[str, float], tats: Mapping[str, datetime], now: datetime
) -> datetime | None:
    """When a limiter that holds a head back next admits one (None: no head waits for a rate)."""
    limiters: set[str] = set()
    by_id = {c.job_id: c for heads in line.heads.values() for c in heads}
    for job_id, why in choice.waiting.items():
        if why.reason != "rate":
            continue
        c = by_id[job_id]
        for name in (c.key_limiter, line.org_limiter.get(c.org)):
            if name is not None:
                limiters.add(name)
    if not limiters:
        return None
    spent_tats = {
        name: rates.advanced(rated[name], tats.get(name), now, choice.spent.get(name, 0))
        if choice.spent.get(name)
        else tats.get(name)
        for name in limiters
    }
    return min(rates.admits_at(rated[name], spent_tats[name], now) for name in limiters)


def waiting_reasons(
    conn: Connection, queued: Sequence[Job], settings: Settings, now: datetime, epoch: str | None = None
) -> dict[str, Waiting]:
    """Why each of these queued jobs waits, from the counts a pass would read now: ``concurrency``
    while its key holds its limit, ``rate`` while a limiter of its has no allowance, else ``share``
    (its organisation's turn for a free place). A job not waiting for a place gets none: one
    whose delivery is in flight, or whose time (``availableAt``) has not come."""
    ready = [j for j in queued if j.status == "queued" and not _later(j, now)]
    if not ready:
        return {}
    d = deliveries.c
    sent = {
        r.job_id
        for r in conn.execute(
            select(d.job_id).where(d.job_id.in_([j.id for j in ready]), _live_pending(now, epoch))
        )
    }
    ready = [j for j in ready if j.id not in sent]
    keyed = {(j.organization_id or "", j.flow.concurrency_key) for j in ready if j.flow.concurrency_key}
    held: dict[tuple[str, str], int] = {}
    if keyed:
        j_ = jobs.c
        org_of = func.coalesce(j_.organization_id, "")
        rows = conn.execute(
            select(org_of, j_.concurrency_key, func.count())
            .where(
                j_.concurrency_key.in_(sorted({k for _, k in keyed})),
                or_(j_.status.in_(sorted(LEASED_STATUSES)), j_.id.in_(_pending_ids(now, epoch))),
            )
            .group_by(org_of, j_.concurrency_key)
        )
        held = {(r[0], r[1]): int(r[2]) for r in rows}
    limiters: dict[str, tuple[str, float]] = {}
    policy = policies.org_policies(conn, settings)
    for job in ready:
        org = job.organization_id or ""
        key = job.flow.concurrency_key
        rated = limits.key_rate(settings.rate_limits, org, key) if key else None
        if rated is not None:
            limiters[rated[0]] = rated
        rate = policy.get(org, policies.DEFAULT).rate_per_s
        if rate is not None:
            limiters[limits.org_limiter(org)] = (limits.org_limiter(org), rate)
    tats = rates.read(conn, limiters)
    empty = {name for name, (_, rate) in limiters.items() if rates.allowance(rate, tats.get(name), now) <= 0}
    out: dict[str, Waiting] = {}
    for job in ready:
        org, key = job.organization_id or "", job.flow.concurrency_key
        if key is not None:
            limit = limits.concurrency_limit(settings.concurrency_limits, key, job.flow.concurrency_limit)
            if held.get((org, key), 0) >= limit:
                out[job.id] = Waiting("concurrency", key)
                continue
            rated = limits.key_rate(settings.rate_limits, org, key)
            if rated is not None and rated[0] in empty:
                out[job.id] = Waiting("rate", key)
                continue
        if limits.org_limiter(org) in empty:
            out[job.id] = Waiting("rate")
            continue
        out[job.id] = Waiting("share")
    return out


def _later(job: Job, now: datetime) -> bool:
    at = parse_iso(job.available_at)
    return at is not None and at > now


def _pending_ids(now: datetime, epoch: str | None) -> Any:
    return select(deliveries.c.job_id).where(_live_pending(now, epoch))


@dataclass(frozen=True)
class OrgShare:
    organization: str
    in_flight: int
    queued: int
    weight: float


@dataclass(frozen=True)
class QueueShare:
    """One worker queue as the pass sees it: its live slots, what is in flight, and each
    organisation's part (for the metrics and the dashboard's system page)."""

    queue: str
    slots: int
    processes: int
    places: int  # slots plus the lead, the most that may be in flight
    in_flight: int
    organizations: tuple[OrgShare, ...]


def shares(
    conn: Connection, settings: Settings, now: datetime, queues: Sequence[str], epoch: str | None = None
) -> list[QueueShare]:
    j = jobs.c
    waiting: dict[tuple[str, str], int] = {}
    for queue, org, n in conn.execute(
        select(j.worker_queue, j.organization_id, func.count())
        .where(j.status == "queued", j.worker_queue.in_(list(queues)))
        .group_by(j.worker_queue, j.organization_id)
    ):
        waiting[(queue, org or "")] = int(n)
    policy = policies.org_policies(conn, settings)
    out = []
    for queue in queues:
        cap, by_org, _ = _counts(conn, queue, settings, now, epoch)
        orgs = sorted({o for (q, o) in waiting if q == queue} | set(by_org))
        out.append(
            QueueShare(
                queue,
                cap.slots,
                cap.processes,
                cap.places,
                sum(by_org.values()),
                tuple(
                    OrgShare(
                        o,
                        by_org.get(o, 0),
                        waiting.get((queue, o), 0),
                        policy.get(o, policies.DEFAULT).weight,
                    )
                    for o in orgs
                ),
            )
        )
    return out
