"""Delivery records — the spec's driver/execute "promises" — kept in Postgres, keyed by dispatch key.

A delivery is *pending* from the moment the driver starter creates it until the attempt it
started settles, or until its deadline (the driver invocation timeout) passes; after that it is
terminal and the next start on the same key advances the delivery generation, bounded at 32.

These rows are best-effort bookkeeping, not ownership: losing them loses no job, because the
queued redrive re-delivers from receipts. Celery task ids are derived from key + generation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Select, String, and_, any_, bindparam, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from app.jobs.errors import (
    ACTIVE_DELIVERY_REASON,
    MAX_DELIVERY_GENERATIONS,
    DeliveryGenerationsExceeded,
    generations_exceeded_message,
)
from app.jobs.vocab import TERMINAL_STATUSES, AttemptStatus, DeliveryOutcome, Status
from app.storage import bulk
from app.storage.db import as_utc, deliveries, jobs, lock_keys
from app.storage.direct import Direct, DirectMany, multi_row_params, multi_row_values


@dataclass(frozen=True)
class StartDecision:
    """What the driver starter did: created a delivery (and its task id) or not, and why."""

    created: bool
    dispatch_key: str
    generation: int
    task_id: str | None = None
    reason: str | None = None


def redrive_key(job_id: str, seq: int, status: Status) -> str:
    """Spec: the redrive dispatch key ``<jobId>:redrive:<a>:<b>`` — one observed queue state."""
    return f"{job_id}:redrive:{seq}:{status}"


def attempt_fence(job_id: str, attempt: int) -> str:
    """Spec: the worker RPC's attempt fence id ``<jobId>:attempt:<n>``."""
    return f"{job_id}:attempt:{attempt}"


def parse_fence(fence: str) -> tuple[str, int]:
    job_id, _, attempt = fence.rpartition(":attempt:")
    return job_id, int(attempt)


def driver_task_id(dispatch_key: str, generation: int) -> str:
    return f"{dispatch_key}:driver:{generation}"


def decide_generation(
    last_generation: int | None, last_pending: bool, job_id: str, key: str
) -> StartDecision:
    """Pure rule: first delivery is generation 0; a pending one blocks; a terminal one advances.

    Past ``MAX_DELIVERY_GENERATIONS`` the starter errors (spec: "exceeded 32 generations").
    """
    if last_generation is None:
        return StartDecision(True, key, 0, driver_task_id(key, 0))
    if last_pending:
        return StartDecision(False, key, last_generation, reason=ACTIVE_DELIVERY_REASON)
    nxt = last_generation + 1
    if nxt >= MAX_DELIVERY_GENERATIONS:
        raise DeliveryGenerationsExceeded(generations_exceeded_message(job_id))
    return StartDecision(True, key, nxt, driver_task_id(key, nxt))


# Deliveries started for one observed queue state: the queued redrive's, and the objective-control
# outbox redrive's for a control job whose wake-up was lost (``<jobId>:outbox:<seq>``).
OBSERVED_PURPOSES = ("redrive", "outbox")


@dataclass(frozen=True)
class DeliveryKey:
    """A dispatch key by structure: (job id, purpose, observed queue state).

    The spec writes keys as text (``<jobId>`` and ``<jobId>:redrive:<a>:<b>``), and a client
    jobId may itself contain ``:redrive:``; read *together with its job id* the text is
    unambiguous, and records are stored by structure, so two jobs' keys can never collide.
    """

    job_id: str
    purpose: str  # "dispatch", or one of OBSERVED_PURPOSES
    observed: str = ""

    @property
    def text(self) -> str:
        return self.job_id if self.purpose == "dispatch" else f"{self.job_id}:{self.purpose}:{self.observed}"

    @classmethod
    def of(cls, job_id: str, text: str) -> DeliveryKey:
        if text == job_id:
            return cls(job_id, "dispatch")
        for purpose in OBSERVED_PURPOSES:
            prefix = f"{job_id}:{purpose}:"
            if text.startswith(prefix):
                return cls(job_id, purpose, text[len(prefix) :])
        raise ValueError(f"{text!r} is not a dispatch key of job {job_id!r}")


def _of_key(key: DeliveryKey) -> Any:
    c = deliveries.c
    return and_(c.job_id == key.job_id, c.purpose == key.purpose, c.observed == key.observed)


@dataclass(frozen=True)
class StartRequest:
    """One job the driver starter is asked to deliver, under ``dispatch_key``."""

    job_id: str
    dispatch_key: str
    driver_timeout_ms: int
    presume_lost_before: datetime | None = None


def begin(
    conn: Connection,
    job_id: str,
    dispatch_key: str,
    now: datetime,
    driver_timeout_ms: int,
    *,
    epoch: str | None = None,
    presume_lost_before: datetime | None = None,
) -> StartDecision:
    """The driver starter's bookkeeping for one job (``begin_many`` of one request)."""
    [decision] = begin_many(
        conn, [StartRequest(job_id, dispatch_key, driver_timeout_ms, presume_lost_before)], now, epoch=epoch
    )
    if isinstance(decision, DeliveryGenerationsExceeded):
        raise decision
    return decision


def begin_many(
    conn: Connection, requests: Sequence[StartRequest], now: datetime, *, epoch: str | None = None
) -> list[StartDecision | DeliveryGenerationsExceeded]:
    """The driver starter's bookkeeping: record a new pending delivery unless one is in flight.

    A delivery is in flight while it is pending, within its deadline, and its message went to
    the broker incarnation that is running now (``epoch``): a delivery recorded before a broker
    restart or flush is known lost, and is superseded here at once instead of blocking the job
    until its deadline (docs/faults.md: a deliberate improvement on the spec's active_delivery
    wait). Any key of the job counts, so a redrive never sends a second message beside a live
    one. ``presume_lost_before`` (the redrive, when the broker holds no message that could be it)
    ends every pending delivery of the job created before that time first.

    Many jobs in one transaction and a fixed number of round trips (the dispatch scan claims a
    batch): one lock statement, then on PostgreSQL one statement that records the first delivery of
    every job that has none yet (``_first_deliveries``), and for the rest one read of their delivery
    records and one multi-row insert. One decision per request, in order; a job past its generation
    bound gets the exception.
    """
    # One starter at a time per job: the in-flight check below reads several rows, which a
    # concurrent starter could otherwise change between the reads (Postgres; SQLite's write lock
    # already serialises). Held to commit, so no concurrent starter inserts the same generation.
    lock_keys(conn, [f"delivery:{r.job_id}" for r in requests])
    firsts = _first_deliveries(conn, requests, now, epoch)
    rest = [r for r in requests if r.job_id not in firsts]
    decided = iter(_begin_after_read(conn, rest, now, epoch) if rest else [])
    return [firsts[r.job_id] if r.job_id in firsts else next(decided) for r in requests]


def _first_deliveries(
    conn: Connection, requests: Sequence[StartRequest], now: datetime, epoch: str | None
) -> dict[str, StartDecision]:
    """PostgreSQL: generation 0 of each job that has no delivery record at all, recorded in one
    statement with no read first (the rule for a job with no record, ``decide_generation``: its
    first delivery). A job named twice in the batch, or one whose pending deliveries a redrive
    presumes lost, takes the read path."""
    if not Direct.available(conn):
        return {}
    named = Counter(r.job_id for r in requests)
    candidates = {r.job_id: r for r in requests if named[r.job_id] == 1 and r.presume_lost_before is None}
    rows = [_row_values(r, 0, driver_task_id(r.dispatch_key, 0), now, epoch) for r in candidates.values()]
    inserted = bulk.insert_absent(conn, deliveries, rows, "job_id")
    return {
        job_id: StartDecision(True, r.dispatch_key, 0, driver_task_id(r.dispatch_key, 0))
        for job_id, r in candidates.items()
        if job_id in inserted
    }


def _row_values(
    req: StartRequest, generation: int, task_id: str, now: datetime, epoch: str | None
) -> dict[str, Any]:
    key = DeliveryKey.of(req.job_id, req.dispatch_key)
    return {
        "job_id": req.job_id,
        "purpose": key.purpose,
        "observed": key.observed,
        "generation": generation,
        "dispatch_key": req.dispatch_key[:320],
        "task_id": task_id,
        "state": "pending",
        "broker_epoch": epoch,
        "created_at": now,
        "deadline_at": now + timedelta(milliseconds=req.driver_timeout_ms),
    }


def _begin_after_read(
    conn: Connection, requests: Sequence[StartRequest], now: datetime, epoch: str | None
) -> list[StartDecision | DeliveryGenerationsExceeded]:
    """``begin_many``'s decisions from the jobs' delivery records, read under their locks."""
    rows = _records_of(conn, sorted({r.job_id for r in requests}))
    pending: dict[str, list[tuple[DeliveryKey, int, Any]]] = {}
    newest: dict[DeliveryKey, int] = {}
    for row in rows:
        row_key = DeliveryKey(row.job_id, row.purpose, row.observed)
        newest[row_key] = max(newest.get(row_key, -1), row.generation)
        if row.state == "pending":
            pending.setdefault(row.job_id, []).append((row_key, row.generation, row))
    decisions: list[StartDecision | DeliveryGenerationsExceeded] = []
    inserts: list[dict[str, Any]] = []
    for req in requests:
        key = DeliveryKey.of(req.job_id, req.dispatch_key)
        in_flight = []
        for row_key, generation, row in pending.get(req.job_id, []):
            outcome = _lost_because(row, now, epoch, req.presume_lost_before)
            if outcome is not None:
                _settle_row(conn, row_key, generation, outcome, now)
            else:
                in_flight.append((row_key, generation, row))
        pending[req.job_id] = in_flight
        if in_flight:
            same = [g for k, g, _ in in_flight if k == key]
            generation = same[0] if same else in_flight[0][1]
            decisions.append(
                StartDecision(False, req.dispatch_key, generation, reason=ACTIVE_DELIVERY_REASON)
            )
            continue
        try:
            decision = decide_generation(newest.get(key), False, req.job_id, req.dispatch_key)
        except DeliveryGenerationsExceeded as exc:
            decisions.append(exc)
            continue
        assert decision.task_id is not None
        row_values = _row_values(req, decision.generation, decision.task_id, now, epoch)
        deadline = row_values["deadline_at"]
        inserts.append(row_values)
        # A second request for the same job in this batch finds this one in flight.
        newest[key] = decision.generation
        pending[req.job_id] = [(key, decision.generation, _Pending(now, deadline, epoch))]
        decisions.append(decision)
    if inserts:
        _insert(conn, inserts)
    return decisions


class _Record(NamedTuple):
    """What begin_many reads of a job's delivery records."""

    job_id: str
    purpose: str
    observed: str
    generation: int
    state: str
    created_at: datetime
    deadline_at: datetime
    broker_epoch: str | None


_RECORD_COLUMNS = [deliveries.c[name] for name in _Record._fields]
# PostgreSQL: the batch's ids as one array parameter, on the driver's cursor (app/storage/direct.py).
_RECORDS_OF = Direct(
    select(*_RECORD_COLUMNS).where(deliveries.c.job_id == any_(bindparam("job_ids", type_=ARRAY(String))))
)
_INSERT_COLUMNS = (
    "job_id",
    "purpose",
    "observed",
    "generation",
    "dispatch_key",
    "task_id",
    "state",
    "broker_epoch",
    "created_at",
    "deadline_at",
)
_INSERT_ROWS = DirectMany(
    lambda n: deliveries.insert().values(multi_row_values((deliveries.c[c] for c in _INSERT_COLUMNS), n)),
    limit=128,  # one shape per batch size: a scan claims up to 100 jobs (delivery/dispatch.py)
)


def _records_of(conn: Connection, job_ids: list[str]) -> list[_Record]:
    if not Direct.available(conn):
        q = select(*_RECORD_COLUMNS).where(deliveries.c.job_id.in_(job_ids))
        return [_Record(*row) for row in conn.execute(q)]
    return [_Record(*row) for row in _RECORDS_OF.rows(conn, {"job_ids": job_ids})]


def _insert(conn: Connection, rows: list[dict[str, Any]]) -> None:
    # One multi-row INSERT on either backend (Direct runs it through SQLAlchemy on SQLite).
    _INSERT_ROWS.for_rows(len(rows)).count(conn, multi_row_params(rows))


@dataclass(frozen=True)
class _Pending:
    """A delivery recorded earlier in the same ``begin_many`` (it has no row read yet)."""

    created_at: datetime
    deadline_at: datetime
    broker_epoch: str | None


def _lost_because(
    row: Any, now: datetime, epoch: str | None, presume_lost_before: datetime | None
) -> str | None:
    """Why a pending delivery can no longer be in flight (its outcome), or None if it may be."""
    if as_utc(row.deadline_at) <= now:
        return "expired"
    if epoch is not None and row.broker_epoch is not None and row.broker_epoch != epoch:
        return "broker_lost"
    if presume_lost_before is not None and as_utc(row.created_at) < presume_lost_before:
        return "presumed_lost"
    return None


def _settle_row(conn: Connection, key: DeliveryKey, generation: int, outcome: str, now: datetime) -> None:
    conn.execute(
        update(deliveries)
        .where(_of_key(key), deliveries.c.generation == generation, deliveries.c.state == "pending")
        .values(state="settled", outcome=outcome[:64], settled_at=now)
    )


def settle(
    conn: Connection,
    job_id: str,
    dispatch_key: str,
    generation: int,
    outcome: DeliveryOutcome | AttemptStatus | str,
    now: datetime,
) -> None:
    """Mark a delivery terminal (idempotent: the first outcome wins)."""
    _settle_row(conn, DeliveryKey.of(job_id, dispatch_key), generation, outcome, now)


def settle_job_params(job_id: str, outcome: str, now: datetime) -> dict[str, Any]:
    """``SETTLE_JOB``'s parameters (also run inside a job's transition statement: projection.py)."""
    return {"b_job_id": job_id, "b_outcome": outcome[:64], "b_at": now}


# Built once (every settling receipt runs it): building the statement per call cost a quarter of
# a settlement's client CPU.
SETTLE_JOB = Direct(
    update(deliveries)
    .where(deliveries.c.job_id == bindparam("b_job_id"), deliveries.c.state == "pending")
    .values(state="settled", outcome=bindparam("b_outcome"), settled_at=bindparam("b_at"))
)


def sweep(conn: Connection, now: datetime) -> int:
    """Settle pending deliveries past their deadline or of terminal jobs; returns how many.

    Bookkeeping that ends: whatever path left a record pending (a driver killed between recording
    and sending, a race with a cancel), no record stays pending once it can no longer matter.
    """
    c = deliveries.c
    expired = conn.execute(
        update(deliveries)
        .where(c.state == "pending", c.deadline_at <= now)
        .values(state="settled", outcome="expired", settled_at=now)
    ).rowcount
    ended = conn.execute(
        update(deliveries)
        .where(
            c.state == "pending",
            c.job_id.in_(select(jobs.c.id).where(jobs.c.status.in_(sorted(TERMINAL_STATUSES)))),
        )
        .values(state="settled", outcome="job_terminal", settled_at=now)
    ).rowcount
    return int(expired or 0) + int(ended or 0)


def last_started_at(conn: Connection, job_id: str, epoch: str | None = None) -> datetime | None:
    """When the latest delivery of this job (any key) was created: the redrive cooldown's input.

    With ``epoch``, deliveries sent to an earlier broker incarnation do not count: their
    messages are gone, so they are no reason to wait.
    """
    q = select(func.max(deliveries.c.created_at)).where(deliveries.c.job_id == job_id)
    if epoch is not None:
        q = q.where(or_(deliveries.c.broker_epoch.is_(None), deliveries.c.broker_epoch == epoch))
    value = conn.execute(q).scalar()
    return as_utc(value) if value is not None else None


def in_flight(job_id: Any, now: datetime, epoch: str | None = None) -> Any:
    """SQL: the job (a column) has a pending delivery within its deadline, sent to this broker epoch.

    The recovery scans leave such jobs out in SQL: a backlog of delivered-but-not-yet-leased jobs
    would otherwise be re-examined, and fill the scan's limit, on every pass.
    """
    c = deliveries.c
    live = [c.job_id == job_id, c.state == "pending", c.deadline_at > now]
    if epoch is not None:
        live.append(or_(c.broker_epoch.is_(None), c.broker_epoch == epoch))
    return select(c.generation).where(*live).exists()


# Costing a merge join makes PostgreSQL's planner read the actual ends of the join keys' indexes.
# While the archiving pass deletes the oldest jobs and deliveries, those ends are deleted entries
# that every plan steps over until a vacuum: measured half way through a million-job pass, the
# due-retries scan planned in 3 ms against 0.35 ms still, to execute in 0.05 ms. The anti-join's
# outer side is a scan page, for which a nested loop or a hash join is the plan anyway.
_NO_MERGE_JOIN = text("SET LOCAL enable_mergejoin = off")


def without_in_flight(
    conn: Connection, q: Select[Any], job_id: Any, now: datetime, epoch: str | None
) -> Select[Any]:
    """``q`` leaving out the jobs ``in_flight``, to run on ``conn`` in its current transaction,
    which plans without merge joins from here on."""
    if conn.dialect.name == "postgresql":
        conn.execute(_NO_MERGE_JOIN)
    return q.where(~in_flight(job_id, now, epoch))


# -- deliveries whose fetcher died (delivery/fetches.py) --------------------------------------------------

FETCHER_LOST: DeliveryOutcome = "fetcher_lost"
UNFETCHED: DeliveryOutcome = "unfetched"
# Outcomes whose message is known gone: no reason for the redrive cooldown to wait.
KNOWN_LOST: tuple[DeliveryOutcome, ...] = (FETCHER_LOST, UNFETCHED)


@dataclass(frozen=True)
class PendingRow:
    """A pending, live delivery of a queued job: what the fetch records are checked for."""

    job_id: str
    purpose: str
    observed: str
    generation: int
    task_id: str
    created_at: datetime
    agent_id: str = ""
    kind: str = ""


def pending_of_queued(conn: Connection, now: datetime, epoch: str | None, limit: int) -> list[PendingRow]:
    """Pending deliveries within their deadline, sent to this broker epoch, of queued jobs (oldest
    first): the ones that block a redrive and may have lost their message with their fetcher."""
    c = deliveries.c
    live = [c.state == "pending", c.deadline_at > now, jobs.c.status == "queued"]
    if epoch is not None:
        live.append(or_(c.broker_epoch.is_(None), c.broker_epoch == epoch))
    rows = conn.execute(
        select(
            c.job_id,
            c.purpose,
            c.observed,
            c.generation,
            c.task_id,
            c.created_at,
            jobs.c.agent_id,
            jobs.c.kind,
        )
        .join(jobs, jobs.c.id == c.job_id)
        .where(*live)
        .order_by(c.created_at)
        .limit(limit)
    ).all()
    return [
        PendingRow(
            r.job_id, r.purpose, r.observed, r.generation, r.task_id, as_utc(r.created_at), r.agent_id, r.kind
        )
        for r in rows
    ]


def settle_fetcher_lost(conn: Connection, row: PendingRow, now: datetime) -> None:
    """End a delivery whose message died with the process that fetched it (idempotent)."""
    settle_pending(conn, row, FETCHER_LOST, now)


def settle_pending(conn: Connection, row: PendingRow, outcome: str, now: datetime) -> None:
    """End one pending delivery ``pending_of_queued`` found, with ``outcome``."""
    _settle_row(conn, DeliveryKey(row.job_id, row.purpose, row.observed), row.generation, outcome, now)


def settle_unfetched(conn: Connection, row: PendingRow, now: datetime) -> None:
    """End a delivery whose message nobody fetched and no queue holds (idempotent)."""
    settle_pending(conn, row, UNFETCHED, now)


def last_live_start(conn: Connection, job_id: str, epoch: str | None = None) -> datetime | None:
    """``last_started_at``, leaving out deliveries known lost (with their fetcher, or unfetched):
    like a delivery sent to an earlier broker epoch, such a delivery is no reason for the redrive
    cooldown to wait."""
    c = deliveries.c
    q = select(func.max(c.created_at)).where(
        c.job_id == job_id, or_(c.outcome.is_(None), c.outcome.not_in(KNOWN_LOST))
    )
    if epoch is not None:
        q = q.where(or_(c.broker_epoch.is_(None), c.broker_epoch == epoch))
    value = conn.execute(q).scalar()
    return as_utc(value) if value is not None else None
