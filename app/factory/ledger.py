"""The durable ledger beside receipts (spec: "The durable ledger is beside receipts, not above them").

Everything in it derives from receipts only, so ``rebuild`` recreates it exactly:

- ``durable_workflows`` holds one ``objective-control:<objective key>`` row per objective whose
  control ran (status, start and end from the objective stream; ``steps`` = control steps that
  consumed requests);
- a ``run:<job key>`` workflow per ``factory.run`` job is that job's projection row read as a
  workflow (``run_workflows``): its status, start, end and attempts are the job's own fold, which
  the receipt's transaction already writes, so it is never written a second time and never lags;
- ``durable_activities``: one row per attempt of a kind whose contract sets
  ``hasDurableActivity`` (only ``factory.task.run``): start (its ``job.leased``), end (its
  completion, failure, cancel or lease expiry), status, worker and duration.

The written rows happen **after** the receipt's transaction commits (``Queue`` calls ``after_commit``)
and are best effort: a failure is logged and never fails, retries or rolls back the mutation that
already committed. Each sync re-derives the job's rows from its whole stream (a job's stream is
short), and an objective's control workflow from its projection header (the fold keeps the step
count and the last move's time, so no write re-reads an objective stream that grows with every
step); a missed write is repaired by the next one, or by ``receipt rebuild-ledger``, which folds
every stream from the start. Queue commands (steer, follow_up, abort) never touch the ledger: they
stay a straight pass-through.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from app.factory.reducer import Objective
from app.factory.reducer import fold as fold_objective
from app.factory.vocab import objective_stream
from app.jobs.ids import client_id_of, is_bare, qualify
from app.jobs.kinds import CONTRACTS, contract_for
from app.jobs.reducer import Job
from app.jobs.reducer import fold as fold_job
from app.jobs.vocab import job_stream
from app.storage import store
from app.storage.db import (
    RUN_OBJECTIVE,
    as_utc,
    durable_activities,
    durable_workflows,
    jobs,
    objectives,
    parse_iso,
    transaction,
)

log = logging.getLogger("receipt.ledger")

# Receipt types that change a ledger row (heartbeats, progress and queue commands never do).
LEDGER_EVENTS: Final[frozenset[str]] = frozenset(
    {
        "job.enqueued",
        "job.leased",
        "job.completed",
        "job.failed",
        "job.canceled",
        "job.lease_expired",
        "job.released",
    }
)
ENDINGS: Final[Mapping[str, str]] = {
    "job.completed": "completed",
    "job.failed": "failed",
    "job.canceled": "canceled",
    "job.lease_expired": "expired",
    "job.released": "released",
}
OBJECTIVE_CONTROL: Final = "objective-control"
RUN: Final = "run"


# The workflows kept as rows of their own; a ``run`` workflow is read from its job's projection row.
STORED_WORKFLOWS: Final[frozenset[str]] = frozenset({OBJECTIVE_CONTROL})
# The kinds whose jobs are ``run`` workflows (read from the kind contracts, never hard-coded).
RUN_KINDS: Final[tuple[str, ...]] = tuple(
    sorted(kind for kind, contract in CONTRACTS.items() if contract.durable_workflow == RUN)
)


def tracked(kind: str) -> bool:
    """Whether transitions of jobs of this kind write ledger rows (read from the kind contract, never
    hard-coded): activities, or a workflow kept as a row. A ``run`` workflow writes nothing."""
    contract = CONTRACTS.get(kind)
    return contract is not None and (
        contract.has_durable_activity or contract.durable_workflow in STORED_WORKFLOWS
    )


def _at(text: str | None) -> datetime | None:
    return parse_iso(text) if text else None


def _ms(start: datetime | None, end: datetime | None) -> int | None:
    return None if start is None or end is None else int((end - start).total_seconds() * 1000)


# -- derivations (pure over receipts) ------------------------------------------------------------


def activities(
    job_id: str, kind: str, objective_id: str | None, receipts: Sequence[store.StoredReceipt]
) -> list[dict[str, Any]]:
    """One row per attempt: opened by its ``job.leased``, closed by the attempt's own ending."""
    rows: dict[int, dict[str, Any]] = {}
    current: int | None = None
    for r in receipts:
        if r.type == "job.leased" and isinstance(r.body.get("attempt"), int):
            current = int(r.body["attempt"])
            rows[current] = {
                "job_id": job_id,
                "attempt": current,
                "kind": kind,
                "objective_id": objective_id,
                "status": "running",
                "worker_id": r.body.get("workerId"),
                "started_at": _at(r.at),
                "ended_at": None,
                "duration_ms": None,
            }
        elif r.type in ENDINGS and current is not None and rows[current]["ended_at"] is None:
            attempt = r.body.get("attempt", current)
            if attempt != current:
                continue  # a superseded attempt's event (the reducer ignores it too)
            row = rows[current]
            row["status"] = ENDINGS[r.type]
            row["ended_at"] = _at(r.at)
            row["duration_ms"] = _ms(row["started_at"], row["ended_at"])
    return [rows[a] for a in sorted(rows)]


def objective_key(job: Job) -> str | None:
    """The key of the objective the job's payload names. A payload names it as its organisation
    knows it; the key is in the job's organisation, qualified as the job's own key is (the Factory
    derives its jobs' keys from the objective's key, so a bare-keyed job names a bare-keyed one)."""
    objective_id = job.payload.get("objectiveId")
    if not isinstance(objective_id, str):
        return None
    return objective_id if is_bare(job.id) else qualify(job.organization_id, objective_id)


def run_row(job: Job) -> dict[str, Any]:
    """A ``run`` workflow's row, from the job's fold alone (no stream read).

    Started by ``job.enqueued`` (the job's creation), ended by its terminal receipt, which is the
    last receipt of a terminal job (nothing is appended after one), so its time is the fold's
    ``updatedAt``; steps are attempts.
    """
    return {
        "id": f"{RUN}:{job.id}",
        "name": RUN,
        "objective_id": objective_key(job),
        "job_id": job.id,
        "organization_id": job.organization_id,
        "status": job.status,
        "steps": job.attempt,
        "started_at": _at(job.created_at),
        "ended_at": _at(job.updated_at) if job.terminal else None,
        "updated_at": _at(job.updated_at),
    }


def control_row(obj: Objective) -> dict[str, Any]:
    """An ``objective-control`` workflow's row, from the objective's fold (its header suffices:
    the fold keeps the step count and the time of the last move)."""
    objective_id = obj.id
    return {
        "id": f"{OBJECTIVE_CONTROL}:{objective_id}",
        "name": OBJECTIVE_CONTROL,
        "objective_id": objective_id,
        "job_id": None,
        "organization_id": obj.organization_id,
        "status": obj.status,
        "steps": obj.control_steps,
        "started_at": _at(obj.created_at),
        "ended_at": _at(obj.ended_at),
        # The workflow's own last move (the terminal audit and new requests are not steps of it).
        "updated_at": _at(obj.control_moved_at),
    }


# -- writes ----------------------------------------------------------------------------------------


def sync_objective(conn: Connection, objective_id: str, *, from_stream: bool = False) -> None:
    """The objective's control workflow row: from its projection header (one row; written in the
    same transactions as its receipts), or — ``rebuild`` — from the stream itself. A header written
    before the fold kept the control counters is re-derived from the stream once."""
    obj: Objective | None = None
    if not from_stream:
        state = conn.execute(select(objectives.c.state).where(objectives.c.id == objective_id)).scalar()
        if isinstance(state, dict) and "controlSteps" in state:
            obj = Objective.from_header(state, {})
    if obj is None:
        obj = fold_objective(r.to_receipt() for r in store.read_stream(conn, objective_stream(objective_id)))
    if obj is not None:
        conn.execute(_upsert_statement(conn), [control_row(obj)])


def sync_job(engine: Engine, job_id: str, *, from_stream: bool = False) -> None:
    """Re-derive the ledger rows of one job (and its objective's control workflow) from receipts
    (the control workflow from the objective's header unless ``from_stream``: see sync_objective)."""
    with transaction(engine) as conn:
        receipts = store.read_stream(conn, job_stream(job_id))
        if not receipts:
            return
        job = fold_job(r.to_receipt() for r in receipts)
        if job is None:
            return
        contract = contract_for(job.kind)
        objective_id = objective_key(job)
        if contract.has_durable_activity:
            conn.execute(delete(durable_activities).where(durable_activities.c.job_id == job_id))
            rows = activities(job_id, job.kind, objective_id, receipts)
            if rows:
                conn.execute(durable_activities.insert(), rows)
        if contract.durable_workflow == OBJECTIVE_CONTROL and objective_id is not None:
            sync_objective(conn, objective_id, from_stream=from_stream)


def _upsert_statement(conn: Connection) -> Any:
    """The workflow-row upsert for this connection's dialect, built once (every job step writes one;
    building ``excluded`` and its column proxies cost more than executing it)."""
    name = "sqlite" if conn.dialect.name == "sqlite" else "postgresql"
    stmt = _UPSERTS.get(name)
    if stmt is None:
        stmt = _UPSERTS[name] = _build_upsert(sqlite_insert if name == "sqlite" else pg_insert)
    return stmt


_UPSERTS: dict[str, Any] = {}


def _build_upsert(insert: Any) -> Any:
    stmt = insert(durable_workflows)
    return stmt.on_conflict_do_update(
        index_elements=[durable_workflows.c.id],
        set_={c.name: stmt.excluded[c.name] for c in durable_workflows.c if c.name != "id"},
        # After-commit writes of one job from two processes may land out of order: a fold never
        # replaces a later one (a stream's receipt times never go back).
        where=durable_workflows.c.updated_at <= stmt.excluded.updated_at,
    )


# How long the background writer gathers after a wake-up before it writes: the ledger trails its
# receipts by this much more, and a burst's transitions share one transaction.
LINGER_S = 0.05


class BackgroundWriter:
    """Writes ledger rows off the caller's path, batched.

    ``submit`` records the jobs whose rows must be re-derived from their streams (activities, an
    objective's control workflow), then wakes one daemon thread, which lingers ``LINGER_S`` to let
    a burst gather, then drains everything pending, each re-derivation in its own transaction (a
    job that moved twice meanwhile is re-derived once). Best effort like every ledger write: rows
    not yet written when the process dies are repaired by the job's next write or by ``receipt
    rebuild-ledger``. ``flush`` writes what is pending now; ``close`` writes it and stops the thread
    (a process shutting down, a test tearing down its database).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._syncs: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        # Set by ``close``: ends a gathering at once, so closing never waits out ``LINGER_S``.
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, syncs: Iterable[str]) -> None:
        with self._lock:
            self._syncs.update(syncs)
            closed = self._closed
            if not closed and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="receipt-ledger", daemon=True)
                self._thread.start()
        if closed:
            self.flush()  # after close: written by the caller, as without a writer
        else:
            self._wake.set()

    def close(self) -> None:
        """Write what is pending and stop the thread (idempotent)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._closing.set()
        self._wake.set()
        if thread is not None:
            thread.join(LINGER_S * 20)
        self.flush()

    def flush(self) -> None:
        with self._lock:
            syncs, self._syncs = self._syncs, set()
        _write(self.engine, sorted(syncs))

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            if self._closed:
                return  # close() writes what is pending
            # Gather: a job's transitions close together (a lease, then its settlement) re-derive once.
            if self._closing.wait(LINGER_S):
                return  # close() writes what is pending
            self._wake.clear()
            self.flush()


def _write(engine: Engine, syncs: Sequence[str]) -> None:
    """Re-derive each job's rows; log each failure, never raise."""
    for job_id in syncs:
        try:
            sync_job(engine, job_id)
        except Exception:
            log.exception(
                "durable ledger write for job %s failed; receipts are unaffected (rebuild-ledger)", job_id
            )


def after_commit(engine: Engine, changed: Iterable[Job], writer: BackgroundWriter | None = None) -> None:
    """Best effort, after the receipts committed: a failure is logged, never raised. The rows that
    need a stream (activities per attempt, an objective's control workflow) re-derive from it; with
    a ``writer``, on its thread, off the caller's path."""
    syncs = sorted({job.id for job in changed})
    if writer is not None:
        writer.submit(syncs)
    else:
        _write(engine, syncs)


def rebuild(engine: Engine) -> dict[str, int]:
    """Recreate the written rows from receipts: every tracked job, every objective whose control
    ran. ``workflows`` counts the ``run`` workflows too, which are read from their jobs' rows."""
    kinds = [k for k in CONTRACTS if tracked(k)]
    with transaction(engine) as conn:
        conn.execute(delete(durable_activities))
        # Every row, the ``run`` rows an earlier release wrote included: they are read from jobs now.
        conn.execute(delete(durable_workflows))
        job_ids = list(
            conn.execute(select(jobs.c.id).where(jobs.c.kind.in_(kinds)).order_by(jobs.c.id)).scalars()
        )
    for job_id in job_ids:
        sync_job(engine, job_id, from_stream=True)
    with engine.connect() as conn:
        stored = len(conn.execute(select(durable_workflows.c.id)).all())
        runs = int(conn.execute(select(func.count()).where(jobs.c.kind.in_(RUN_KINDS))).scalar_one())
        acts = len(conn.execute(select(durable_activities.c.job_id)).all())
    return {"jobs": len(job_ids), "workflows": stored + runs, "activities": acts}


# -- reads -----------------------------------------------------------------------------------------


def _iso(at: Any) -> str | None:
    return as_utc(at).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if at is not None else None


def stored_workflows(conn: Connection, objective_id: str | None = None) -> list[dict[str, Any]]:
    """The workflows kept as rows (an objective's, or every one), by id. ``run`` rows an earlier
    release wrote are left out: a run workflow is its job's row (``run_workflows``)."""
    q = select(durable_workflows).where(durable_workflows.c.name.in_(STORED_WORKFLOWS))
    if objective_id is not None:
        q = q.where(durable_workflows.c.objective_id == objective_id)
    return [dict(r._mapping) for r in conn.execute(q.order_by(durable_workflows.c.id))]


def _objective_named(dialect: str) -> Any:
    """The objective a job's payload names, spelled as PostgreSQL's index on it (``RUN_OBJECTIVE``)."""
    if dialect == "postgresql":
        return RUN_OBJECTIVE
    return func.json_extract(jobs.c.state, "$.payload.objectiveId")


def run_workflows(conn: Connection, objective_id: str | None = None) -> list[dict[str, Any]]:
    """The ``run`` workflows (of the jobs whose payload names ``objective_id``, or every one), by
    id: each its job's projection row, as ``run_row`` reads a fold."""
    q = select(jobs.c.state).where(jobs.c.kind.in_(RUN_KINDS))
    if objective_id is not None:
        # The payload names the objective as its organisation knows it; ``objective_key`` (in
        # ``run_row``) then keeps the jobs whose organisation holds this key.
        q = q.where(_objective_named(conn.dialect.name) == client_id_of(objective_id))
    found = [run_row(Job.from_json(state)) for (state,) in conn.execute(q)]
    if objective_id is not None:
        found = [row for row in found if row["objective_id"] == objective_id]
    return sorted(found, key=lambda row: row["id"])


def workflows(conn: Connection, objective_id: str | None = None) -> list[dict[str, Any]]:
    """Every workflow of the ledger (of one objective), stored and read from jobs, by id."""
    both = stored_workflows(conn, objective_id) + run_workflows(conn, objective_id)
    return sorted(both, key=lambda row: row["id"])


def summary(conn: Connection, objective_id: str) -> dict[str, Any]:
    """The objective's ledger: its workflows and its activities by status, with their total duration."""
    flows = workflows(conn, objective_id)
    acts = conn.execute(
        select(durable_activities.c.status, durable_activities.c.duration_ms).where(
            durable_activities.c.objective_id == objective_id
        )
    ).all()
    return {
        "workflows": [
            {
                "id": f["id"],
                "name": f["name"],
                "status": f["status"],
                "steps": f["steps"],
                "startedAt": _iso(f["started_at"]),
                "endedAt": _iso(f["ended_at"]),
            }
            for f in flows
        ],
        "activities": {
            "total": len(acts),
            "byStatus": dict(sorted(Counter(a.status for a in acts).items())),
            "durationMs": sum(a.duration_ms or 0 for a in acts),
        },
    }
