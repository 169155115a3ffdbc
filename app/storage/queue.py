"""Queue operations: each one a transaction over the receipt store and the ``jobs`` projection.

Pattern of every operation: read the job (projection), *decide* which receipts to append from
its current state and the database clock, append them optimistically, fold them, write the
projection — all in one transaction. Losing an append race re-reads and re-decides.

Callers that deliver work (the Celery layer) learn about jobs that became dispatchable through
the ``on_dispatchable`` hook, called after commit, so this module never imports Celery.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import func, literal, select, union_all, update
from sqlalchemy.engine import Connection, Engine

from app import tracing
from app.jobs import delay, transitions
from app.jobs.delay import AVAILABLE_AT_FIELD
from app.jobs.errors import (
    AppendConflict,
    ConflictError,
    JobArchived,
    JobNotFound,
    ValidationError,
)
from app.jobs.ids import (
    KEY_SEPARATOR,
    SYSTEM_ORGANIZATION,
    client_id_of,
    new_id,
    qualify,
)
from app.jobs.privilege import ENQUEUED_BY_FIELD, Enqueuer
from app.jobs.reducer import REPLAY_OF_FIELD, REPLAYED_AS_FIELD, Job, reduce
from app.jobs.replay import refuse_unless_replayable
from app.jobs.routing import QUEUES, queue_for
from app.jobs.tags import TAGS_FIELD
from app.jobs.tracecontext import TRACE_CONTEXT_FIELD
from app.jobs.transitions import AttemptStartStatus, Event
from app.jobs.validation import EnqueueRequest, command_lane, steer_lane
from app.jobs.vocab import (
    ACTIVE_STATUSES,
    LEASED_STATUSES,
    STATUSES,
    FailureStatus,
    ReleaseReason,
    job_stream,
)
from app.storage import concurrency_keys as keys
from app.storage import delivery, projection, search, store, tombstones
from app.storage.db import (
    as_utc,
    autocommit_connection,
    db_now,
    is_sqlite,
    iso,
    jobs,
    lock_keys,
    transaction,
)
from app.storage.direct import DIRECT_DRIVER, Direct
from app.storage.group_commit import GroupCommit
from app.storage.hooks import Change, Companion, Hook, Write, run_after
from app.storage.keyset import CURSOR_PATTERN as CURSOR_PATTERN
from app.storage.keyset import decode_cursor as decode_cursor
from app.storage.keyset import encode_cursor as encode_cursor
from app.storage.retry import optimistic

H = TypeVar("H", bound=Hook)
# A transition's decision: the receipts to append, from the job as read and the database clock.
Decide = Callable[[Job, datetime], Sequence[Event]]
T = TypeVar("T")

log = logging.getLogger("receipt.queue")

# RECEIPT_MAX_COMMANDS_PER_JOB's default. Every command is folded into the job's state,
# so without a cap one tenant could grow a job (and every read of it) without bound.
MAX_COMMANDS_PER_JOB_DEFAULT = 1000


# How long a reading of the database clock stands in for another read (``DbClock``): the monotonic
# clock's drift from the database's over it is far below a millisecond.
CLOCK_REUSE_S = 1.0


@dataclass(frozen=True)
class ClockReading:
    """The database clock as read (``at``), and this process's monotonic clock once the answer had
    arrived (``mono``). ``now`` advances the one by the other: never ahead of the database's clock
    (it lags by the reading's round trip), and never behind ``at``."""

    at: datetime
    mono: float

    def age_s(self, monotonic: Callable[[], float] = time.monotonic) -> float:
        return max(0.0, monotonic() - self.mono)

    def now(self, monotonic: Callable[[], float] = time.monotonic) -> datetime:
        return self.at + timedelta(seconds=self.age_s(monotonic))


class DbClock:
    """The database clock as this process last read it, advanced by its monotonic clock.

    A new job's first receipt needs the database's time and nothing else from a read when its id is
    new: a reading younger than ``CLOCK_REUSE_S`` stands in for it (``Queue.enqueue``)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._last: ClockReading | None = None

    def saw(self, at: datetime) -> None:
        self._last = ClockReading(at, self._monotonic())

    def now(self, within_s: float = CLOCK_REUSE_S) -> datetime | None:
        last = self._last
        if last is None or last.age_s(self._monotonic) > within_s:
            return None
        return last.now(self._monotonic)


@dataclass(frozen=True)
class Known:
    """A job's head as this process's own write left it, and the database clock that write read.

    The holder's next transition may be decided and written on it without reading the row again
    (``Queue.settle_attempt``): the write names the seq it follows, so a receipt appended since
    (a heartbeat, an abort request, the lease's expiry) makes it conflict, and it is decided again
    on a fresh read. Its clock (``ClockReading``) is never behind the head's own receipts, so the
    stream's times still never go back."""

    head: projection.Loaded
    clock: ClockReading

    def now(self) -> datetime:
        return self.clock.now()


@dataclass(frozen=True)
class Outcome:
    """What an operation did: the job after it, and whether its receipts took effect; ``known``,
    where the operation can tell it, the head its write left (``Known``)."""

    job: Job
    applied: bool
    known: Known | None = None


@dataclass(frozen=True)
class AttemptStart:
    """What the worker's first write did: ``started`` (it holds the lease now) or why not."""

    status: AttemptStartStatus
    job: Job | None
    # The head the lease wrote, for the attempt's settlement (``Queue.settle_attempt``).
    known: Known | None = None


@dataclass(frozen=True)
class EnqueueResult:
    job: Job
    created: bool
    steered: bool = False
    canceled: tuple[str, ...] = ()
    aborted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Archived:
    """A batch item whose jobId names an archived job: nothing written, its tombstone's summary."""

    key: str
    summary: Mapping[str, Any]
    created: bool = False


@dataclass(frozen=True)
class Page:
    jobs: list[Job]
    next_cursor: str | None


@dataclass
class _Tx:
    """One transaction's view: the connection, its clock, and the changes made in it."""

    conn: Connection
    changes: list[Change] = field(default_factory=list)
    # What each hook's in-transaction writes returned, by the hook's index (its after-commit input).
    results: dict[int, list[Any]] = field(default_factory=dict)
    # An autocommit connection on which the transition must be one statement (``Queue.mutate``).
    one_statement: bool = False
    _now: datetime | None = None
    # A new job written with no read of its id first (``Queue.enqueue``): its key and what its
    # write must not shadow.
    unseen: tuple[str, projection.Unseen] | None = None

    @property
    def now(self) -> datetime:
        """The database clock, read once, on first use: after the reads (and lock waits) that decide.

        A time read before them could predate a receipt another transaction committed in between,
        so the receipts appended here would go back in time on their stream.
        """
        if self._now is None:
            self._now = db_now(self.conn)
        return self._now


@dataclass(frozen=True)
class _Step:
    """One job's transition decided and folded, not yet written (``Queue._step``)."""

    loaded: projection.Loaded | None
    state: Job
    chained: store.Chained
    change: Change
    companion: Companion | None
    writes: list[tuple[int, Write]]


def _organization(req: EnqueueRequest) -> str:
    """The organisation a job is enqueued in: its authContext's, or the system's own for the jobs
    the system enqueues for itself (no authContext)."""
    return req.organization_id or SYSTEM_ORGANIZATION


def _singleton(req: EnqueueRequest) -> bool:
    return req.singleton_mode != "allow" and req.session_key is not None


def _session_lock(req: EnqueueRequest) -> str:
    """The lock that serialises singleton enqueues per (organisation, session key)."""
    return f"session:{_organization(req)}:{req.session_key}"


def _debounce_key(req: EnqueueRequest) -> str | None:
    return req.flow.debounce.key if req.flow.debounce is not None else None


def _locks(req: EnqueueRequest) -> list[str]:
    """The names an enqueue serialises on: its session (a singleton mode) and its debounce key, so two
    concurrent enqueues of one key cannot both find no pending job and both stay queued. Taken with
    ``lock_keys``, in its one global order, so a batch and a single enqueue cannot deadlock."""
    names = [_session_lock(req)] if _singleton(req) else []
    key = _debounce_key(req)
    if key is not None:
        names.append(f"debounce:{_organization(req)}:{key}")
    return names


def _as_write(companion: Companion) -> Write:
    """A second companion cannot ride in the one statement: it runs beside it in the transaction."""
    return Write(lambda conn: companion.statement.count(conn, companion.params))


class _NeedsTransaction(Exception):
    """A one-statement transition found it must write more (``Queue._run``); nothing was written."""


class _Keyed(Exception):
    """A start decided in one statement met a concurrency key: it needs the keyed transaction."""


class Queue:
    """Every job mutation Receipt performs. Construct with an engine; pass it around."""

    def __init__(
        self,
        engine: Engine,
        *,
        hooks: Sequence[Hook] = (),
        max_commands_per_job: int = MAX_COMMANDS_PER_JOB_DEFAULT,
        group_commit_max: int = 1,
        observe_group_commit: Callable[[int], None] | None = None,
    ) -> None:
        """``hooks``: the effects a transition causes beyond its own receipts (``app/storage/hooks.py``),
        composed at one root (``app/composition.py``). Without any, this is a bare job queue.
        ``group_commit_max`` above 1: concurrent ``mutate`` calls share commits, that many at most
        (``GroupCommit``), each commit's size told to ``observe_group_commit``."""
        self.engine = engine
        self._group = (
            GroupCommit(self, group_commit_max, observe_group_commit) if group_commit_max > 1 else None
        )
        # PostgreSQL (the direct path): a single-job transition is one autocommitted statement.
        self._one_statement = engine.dialect.driver == DIRECT_DRIVER
        self.max_commands_per_job = max_commands_per_job
        # The database clock as this queue last read it, for the enqueues that need nothing else.
        self._clock = DbClock()
        self.hooks = tuple(hooks)
        for hook in self.hooks:
            hook.bind(self)

    def hook(self, kind: type[H]) -> H | None:
        """The registered hook of this type, if any."""
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    def close(self) -> None:
        """Finish what the hooks still hold (the ledger rows pending in the background), as a process
        shuts down or a test's database goes away. Mutations keep working after it."""
        for hook in self.hooks:
            hook.close()

    # -- the transaction machinery ----------------------------------------------------------
    def _run(self, work: Callable[[_Tx], Any], *, one_statement: bool = False) -> Any:
        """Run ``work`` in a transaction, re-running it from scratch when it loses an append race.

        ``one_statement``: on an autocommit connection instead, for work whose only write is one
        statement (which is then a transaction of its own); it raises ``_NeedsTransaction``
        before writing anything when it needs more.
        """

        return optimistic(lambda: self._once(work, one_statement=one_statement), what="job transition")

    def _once(self, work: Callable[[_Tx], Any], *, one_statement: bool = False) -> Any:
        """One try of ``work`` (``_run`` without the re-runs): its connection and commit, then the
        hooks' after-commit halves."""
        with autocommit_connection(self.engine) if one_statement else transaction(self.engine) as conn:
            tx = _Tx(conn, one_statement=one_statement)
            result = work(tx)
        run_after(self.hooks, tx.changes, tx.results)
        return result

    def _apply(self, tx: _Tx, loaded: projection.Loaded | None, job_id: str, events: Sequence[Event]) -> Job:
        """Append ``events`` to ``jobs/<job_id>`` after ``loaded``, write the projection, and what the
        hooks' in-transaction halves add."""
        return self._apply_head(tx, loaded, job_id, events).job

    def _apply_head(
        self, tx: _Tx, loaded: projection.Loaded | None, job_id: str, events: Sequence[Event]
    ) -> projection.Loaded:
        """``_apply``, returning the stream's new head (what a later append in the same
        transaction follows)."""
        step = self._step(tx, loaded, job_id, events)
        if tx.one_statement and (step.writes or not Direct.available(tx.conn)):
            raise _NeedsTransaction  # nothing is written yet
        return self._write(tx, step)

    def _step(self, tx: _Tx, loaded: projection.Loaded | None, job_id: str, events: Sequence[Event]) -> _Step:
        """A transition decided and folded, with what each hook adds in its transaction; nothing
        is written yet."""
        chained, state = store.advance(
            job_stream(job_id),
            loaded.job if loaded else None,
            (loaded.job.seq, loaded.last_hash) if loaded else (0, None),
            events,
            reduce,
            at=tx.now,
        )
        change = Change(loaded.job if loaded else None, state, tuple(t for t, _ in events), tx.now)
        companion: Companion | None = None
        writes: list[tuple[int, Write]] = []
        for index, hook in enumerate(self.hooks):
            effect = hook.during(change)
            if isinstance(effect, Companion) and companion is None:
                companion = effect
            elif isinstance(effect, Companion):
                writes.append((index, _as_write(effect)))
            elif effect is not None:
                writes.append((index, effect))
        return _Step(loaded, state, chained, change, companion, writes)

    def _write(self, tx: _Tx, step: _Step) -> projection.Loaded:
        """Write one transition: its receipts, the projection row after them and the companion (the
        deliveries' settlement) in one statement on PostgreSQL, then the hooks' other writes."""
        companion = step.companion
        pair = (companion.statement, companion.params) if companion is not None else None
        unseen = tx.unseen[1] if tx.unseen is not None and tx.unseen[0] == step.state.id else None
        head, _stored = projection.append_and_save(
            tx.conn, step.state, previous=step.loaded, chained=step.chained, companion=pair, unseen=unseen
        )
        for index, write in step.writes:
            tx.results.setdefault(index, []).append(write.run(tx.conn))
        tx.changes.append(step.change)
        return head

    def _write_plain(self, tx: _Tx, steps: Sequence[_Step]) -> list[projection.Loaded]:
        """Write transitions that carry nothing beside their receipts (no hook adds a write): one
        alone as ``_write`` does; several at once as two statements, all their receipts and all their
        rows (``projection.advance_many``: a message's leases are one write, not one per job)."""
        if len(steps) == 1:
            return [self._write(tx, steps[0])]
        moved = []
        for step in steps:
            assert step.loaded is not None
            moved.append((step.loaded, step.state, step.chained))
        heads = projection.advance_many(tx.conn, moved)
        tx.changes.extend(step.change for step in steps)
        return heads

    def mutate(self, job_id: str, decide: Decide) -> Outcome:
        """Load a job, let ``decide`` choose receipts from its state, append them.

        With group commit on (a worker process), a call made while the process's commit slots are
        busy waits, then shares one transaction with the calls that queued beside it."""
        if self._group is not None:
            return self._group.mutate(job_id, decide)
        return self.mutate_alone(job_id, decide)

    def mutate_many(
        self,
        items: Sequence[tuple[str, Decide]],
        *,
        before: Callable[[Connection, Sequence[Job], datetime], None] | None = None,
        before_locks: Callable[[Sequence[Job]], bool] | None = None,
    ) -> list[Outcome | Exception]:
        """Several ``mutate`` calls in one transaction and one commit, decided in order on one read of
        their jobs and one clock; a job named twice is decided the second time on what the first
        appended. Each item's answer is its ``Outcome``, or the exception its own decision raised
        (``JobNotFound``, or ``decide`` raising), which writes nothing for it and spoils nothing
        else. A write that fails rolls the whole transaction back and raises: no item took effect.
        Losing an append race re-reads and re-decides every item. ``before`` sees the jobs as read
        and the clock, in the transaction, before any decision (to take locks and read beside them);
        ``before_locks`` says whether it would take a lock for these jobs as read.

        On PostgreSQL, items naming distinct jobs whose transitions carry nothing beside their
        receipts, and for which ``before`` takes no lock, need no transaction (``_mutate_unlocked``):
        an autocommitted read, then one autocommitted statement that writes each job's row where it
        still is at the seq it was read at and the receipts of only those. A job that moved meanwhile
        gets nothing, and is decided again, alone with the others that moved, in a transaction."""
        if (
            self._one_statement
            and len({job_id for job_id, _ in items}) == len(items)
            and (before is None or before_locks is not None)
        ):
            done = self._mutate_unlocked(items, before, before_locks)
            if done is not None:
                return done
        return self._mutate_many_in_transaction(items, before)

    def _decided(
        self, tx: _Tx, loaded: projection.Loaded | None, job_id: str, decide: Decide
    ) -> _Step | Outcome | Exception:
        """One item of ``mutate_many`` decided on its job as read: its step, or its answer when it
        writes nothing (``JobNotFound``, its decision's own exception, or an ``Outcome`` not applied)."""
        if loaded is None:
            return JobNotFound(job_id)
        try:
            events = decide(loaded.job, tx.now)
        except Exception as exc:  # this item's own refusal: nothing written for it
            return exc
        if not events:
            return Outcome(loaded.job, False)
        return self._step(tx, loaded, job_id, events)

    def _mutate_unlocked(
        self,
        items: Sequence[tuple[str, Decide]],
        before: Callable[[Connection, Sequence[Job], datetime], None] | None,
        before_locks: Callable[[Sequence[Job]], bool] | None,
    ) -> list[Outcome | Exception] | None:
        """``mutate_many`` without a transaction (see there); None, with nothing written, when these
        items need one."""
        answers: list[Outcome | Exception | None] = []
        steps: dict[str, _Step] = {}

        def work(tx: _Tx) -> tuple[dict[str, projection.Loaded], datetime] | None:
            heads, tx._now = projection.load_many_at_clock(tx.conn, [job_id for job_id, _ in items])
            read = [heads[job_id].job for job_id, _ in items if job_id in heads]
            if before is not None:
                if before_locks is None or before_locks(read):
                    return None
                before(tx.conn, read, tx.now)
            for job_id, decide in items:
                step = self._decided(tx, heads.get(job_id), job_id, decide)
                if not isinstance(step, _Step):
                    answers.append(step)
                    continue
                if step.companion is not None or step.writes:
                    return None  # nothing is written yet
                steps[job_id] = step
                answers.append(None)
            moved = projection.advance_unlocked(
                tx.conn, [(s.loaded, s.state, s.chained) for s in steps.values() if s.loaded is not None]
            )
            tx.changes.extend(step.change for job_id, step in steps.items() if job_id in moved)
            return moved, tx.now

        try:
            done = self._once(work, one_statement=True)
        except AppendConflict:
            return None  # the statement wrote nothing: every item is decided again in a transaction
        if done is None:
            return None
        moved, read_at = done
        clock = ClockReading(read_at, time.monotonic())
        again = [
            item
            for item, answer in zip(items, answers, strict=True)
            if answer is None and item[0] not in moved
        ]
        redone = iter(self._mutate_many_in_transaction(again, before) if again else [])
        out: list[Outcome | Exception] = []
        for (job_id, _), answer in zip(items, answers, strict=True):
            if answer is not None:
                out.append(answer)
            elif job_id in moved:
                out.append(Outcome(steps[job_id].state, True, Known(moved[job_id], clock)))
            else:
                out.append(next(redone))
        return out

    def _mutate_many_in_transaction(
        self,
        items: Sequence[tuple[str, Decide]],
        before: Callable[[Connection, Sequence[Job], datetime], None] | None,
    ) -> list[Outcome | Exception]:
        written: dict[str, projection.Loaded] = {}
        clock: list[datetime] = []

        def work(tx: _Tx) -> list[Outcome | Exception]:
            written.clear()
            clock[:] = []
            heads, tx._now = projection.load_many_at_clock(tx.conn, [job_id for job_id, _ in items])
            clock.append(tx.now)
            if before is not None:
                before(tx.conn, [heads[job_id].job for job_id, _ in items if job_id in heads], tx.now)
            answers: list[Outcome | Exception] = []
            # Transitions with nothing beside their receipts wait to be written together; a job
            # named again is written first, so its next decision follows what was appended.
            plain: dict[str, _Step] = {}

            def write_plain() -> None:
                moved = dict(zip(plain, self._write_plain(tx, list(plain.values())), strict=True))
                heads.update(moved)
                written.update(moved)
                plain.clear()

            for job_id, decide in items:
                if job_id in plain:
                    write_plain()
                step = self._decided(tx, heads.get(job_id), job_id, decide)
                if not isinstance(step, _Step):
                    answers.append(step)
                    continue
                if step.companion is None and not step.writes:
                    plain[job_id] = step
                else:
                    heads[job_id] = written[job_id] = self._write(tx, step)
                answers.append(Outcome(step.state, True))
            if plain:
                write_plain()
            return answers

        result: list[Outcome | Exception] = self._run(work)
        reading = ClockReading(clock[0], time.monotonic())
        named = Counter(job_id for job_id, _ in items)
        return [
            replace(answer, known=Known(written[job_id], reading))
            if isinstance(answer, Outcome) and answer.applied and named[job_id] == 1 and job_id in written
            else answer
            for (job_id, _), answer in zip(items, result, strict=True)
        ]

    def mutate_alone(self, job_id: str, decide: Decide) -> Outcome:
        """``mutate`` in a transition of its own (never grouped)."""

        def work(tx: _Tx) -> Outcome:
            # One job decides: its row and the clock come in one round trip (projection.load_at_clock).
            loaded, tx._now = projection.load_at_clock(tx.conn, job_id)
            if loaded is None:
                raise JobNotFound(job_id)
            reading = ClockReading(tx.now, time.monotonic())  # taken after the server read its clock
            events = decide(loaded.job, tx.now)
            if not events:
                return Outcome(loaded.job, False)
            head = self._apply_head(tx, loaded, job_id, events)
            return Outcome(head.job, True, Known(head, reading))

        if self._one_statement:
            # Read, decide, then write the transition as one statement on an autocommit connection:
            # no BEGIN and COMMIT round trips. The read need not share the write's transaction:
            # the write names the seq it follows (the stream's unique seq and the row's last_seq),
            # so a receipt committed after the read makes it conflict, and the work re-runs.
            try:
                one: Outcome = self._run(work, one_statement=True)
                return one
            except _NeedsTransaction:
                pass  # callbacks or an objective's control request to write beside it
        result: Outcome = self._run(work)
        return result

    # -- reads --------------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        """The job with this storage key (``Job.id``)."""
        with self.engine.connect() as conn:
            loaded = projection.load(conn, job_id)
        return loaded.job if loaded else None

    def find(self, organization_id: str | None, client_id: str) -> Job | None:
        """The job an organisation knows by ``client_id``; ``None`` when it has none by that id
        (another organisation's job of the same id is exactly as absent)."""
        if KEY_SEPARATOR in client_id:
            return None  # a client id never holds the separator: never a key, never a foreign job
        org = organization_id or SYSTEM_ORGANIZATION
        with self.engine.connect() as conn:
            loaded = projection.load_in(conn, qualify(org, client_id), org, client_id)
        return loaded.job if loaded else None

    def archived(self, organization_id: str | None, client_id: str) -> tombstones.Tombstone | None:
        """The tombstone of the job an organisation knew by ``client_id``, when it was archived."""
        if KEY_SEPARATOR in client_id:
            return None
        org = organization_id or SYSTEM_ORGANIZATION
        with self.engine.connect() as conn:
            return tombstones.find(conn, job_stream(qualify(org, client_id)))

    def list_jobs(
        self,
        *,
        organization_id: str | None = None,
        all_organizations: bool = False,
        status: str | None = None,
        agent_id: str | None = None,
        lane: str | None = None,
        session_key: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        where: search.JobFilter | None = None,
    ) -> Page:
        """A page of jobs, newest first (``search.list_jobs``). ``cursor`` is the opaque value of a
        previous page; ``where`` a whole filter instead of the named ones."""
        f = where or search.JobFilter(status=status, agent_id=agent_id, lane=lane, session_key=session_key)
        scope = search.Scope(organization_id, all_organizations=all_organizations)
        with self.engine.connect() as conn:
            page = search.list_jobs(conn, scope, f, limit=limit, cursor=cursor)
        return Page(page.jobs, page.next_cursor)

    # -- replay -------------------------------------------------------------------------------
    def replay(
        self, source_key: str, req: EnqueueRequest, *, enqueued_by: Enqueuer | None = None
    ) -> EnqueueResult:
        """Replay the terminal job ``source_key`` as ``req`` (``app.jobs.replay.replay_request``):
        the new job's ``job.enqueued`` (``replayOf``) and the source's ``job.replayed`` in one
        transaction. Idempotent: when ``req``'s id already names this source's replay, that job is
        returned (``created`` False) and nothing is written; an id naming any other job is a
        ``ConflictError``. ``JobNotFound`` without the source, ``NotReplayable`` for a source that
        may not be replayed."""
        results = self.replay_many([(source_key, req)], enqueued_by=enqueued_by)
        result = results[0]
        if isinstance(result, Exception):
            raise result
        return result

    def replay_many(
        self,
        items: Sequence[tuple[str, EnqueueRequest]],
        *,
        enqueued_by: Enqueuer | None = None,
        known: Mapping[str, projection.Loaded] | None = None,
    ) -> list[EnqueueResult | Exception]:
        """``replay`` for many sources in one transaction: each item's answer is its result, or the
        exception its own refusal raised (nothing written for it; the others are unaffected).

        ``known``: sources as the caller has just read them (a bulk action's page). The first
        attempt appends after those heads without reading them again; every append names the seq it
        follows (the stream's unique seq, the row's ``last_seq``), so a source that moved since
        makes the attempt conflict, and the re-run reads everything anew."""
        hints = dict(known or {})

        def work(tx: _Tx) -> list[EnqueueResult | Exception]:
            keys = [qualify(_organization(req), req.job_id or "") for _src, req in items]
            sources = [s for s, _r in items]
            trusted = {s: hints[s] for s in sources if s in hints}
            hints.clear()  # a re-run (a conflict) trusts nothing it did not read itself
            locks = sorted({name for _src, req in items for name in _locks(req)})
            lock_keys(tx.conn, locks)
            # The pending jobs a debounced replay replaces are read with the others, before the clock.
            pending = [
                job_id
                for _src, req in items
                if (key := _debounce_key(req)) is not None
                for job_id in _debounced_ids(tx.conn, _organization(req), key)
            ]
            heads, tx._now = projection.load_many_at_clock(
                tx.conn, [k for k in sources + keys + pending if k not in trusted]
            )
            heads.update(trusted)
            gone = tombstones.find_many(tx.conn, (job_stream(k) for k in keys if k not in heads))
            if len(set(sources + keys)) == 2 * len(items) and not is_sqlite(tx.conn) and not locks:
                # Every job named once: the page's writes in four statements, not two per job.
                return self._replay_page(tx, heads, gone, items, keys, enqueued_by)
            out: list[EnqueueResult | Exception] = []
            for (source_key, req), key in zip(items, keys, strict=True):
                try:
                    out.append(self._replay_in(tx, heads, gone, source_key, req, key, enqueued_by))
                except (ConflictError, JobNotFound, JobArchived) as exc:
                    out.append(exc)
            return out

        result: list[EnqueueResult | Exception] = self._run(work)
        return result

    def _replay_page(
        self,
        tx: _Tx,
        heads: dict[str, projection.Loaded],
        gone: Mapping[str, tombstones.Tombstone],
        items: Sequence[tuple[str, EnqueueRequest]],
        keys: Sequence[str],
        enqueued_by: Enqueuer | None,
    ) -> list[EnqueueResult | Exception]:
        """``replay_many`` when no job is named twice: each item decided as ``_replay_in`` decides,
        the new jobs written at once (``projection.insert_new``) and the sources' ``job.replayed``
        at once (``projection.advance_many``); the hooks see every change, as for single writes."""
        out: list[EnqueueResult | Exception] = []
        created: list[tuple[Job, store.Chained]] = []
        moved: list[tuple[projection.Loaded, Job, store.Chained]] = []
        changes: list[Change] = []
        for (source_key, req), key in zip(items, keys, strict=True):
            source = heads.get(source_key)
            existing = heads.get(key)
            try:
                if source is None:
                    raise JobNotFound(source_key)
                if existing is not None:
                    if existing.job.replay_of == source_key:
                        out.append(EnqueueResult(existing.job, created=False))
                        continue
                    raise ConflictError(
                        f"jobId {existing.job.client_id} names another job, not a replay of this one"
                    )
                if job_stream(key) in gone:
                    raise gone[job_stream(key)].refusal()
                refuse_unless_replayable(source.job)
            except (ConflictError, JobNotFound, JobArchived) as exc:
                out.append(exc)
                continue
            body = _enqueued_body(key, replace(req, replay_of=source_key), enqueued_by, tx)
            new_chain, new_job = store.advance(
                job_stream(key), None, (0, None), [("job.enqueued", body)], reduce, at=tx.now
            )
            src_chain, src_job = store.advance(
                job_stream(source_key),
                source.job,
                (source.job.seq, source.last_hash),
                [("job.replayed", {REPLAYED_AS_FIELD: key})],
                reduce,
                at=tx.now,
            )
            created.append((new_job, new_chain))
            moved.append((source, src_job, src_chain))
            changes += [
                Change(None, new_job, ("job.enqueued",), tx.now),
                Change(source.job, src_job, ("job.replayed",), tx.now),
            ]
            out.append(EnqueueResult(new_job, created=True))
        writes: list[tuple[int, Write]] = []
        for change in changes:
            for index, hook in enumerate(self.hooks):
                effect = hook.during(change)
                if isinstance(effect, Companion):
                    writes.append((index, _as_write(effect)))
                elif effect is not None:
                    writes.append((index, effect))
        projection.insert_new(tx.conn, created)
        projection.advance_many(tx.conn, moved)
        for index, write in writes:
            tx.results.setdefault(index, []).append(write.run(tx.conn))
        tx.changes.extend(changes)
        return out

    def _replay_in(
        self,
        tx: _Tx,
        heads: dict[str, projection.Loaded],
        gone: Mapping[str, tombstones.Tombstone],
        source_key: str,
        req: EnqueueRequest,
        key: str,
        enqueued_by: Enqueuer | None,
    ) -> EnqueueResult:
        source = heads.get(source_key)
        if source is None:
            raise JobNotFound(source_key)
        existing = heads.get(key)
        if existing is not None:
            if existing.job.replay_of == source_key:
                return EnqueueResult(existing.job, created=False)  # a retried request
            raise ConflictError(f"jobId {existing.job.client_id} names another job, not a replay of this one")
        if job_stream(key) in gone:
            raise gone[job_stream(key)].refusal()
        refuse_unless_replayable(source.job)
        body = _enqueued_body(key, replace(req, replay_of=source_key), enqueued_by, tx)
        debounce = _debounce_key(req)
        if debounce is not None:
            replaced = self._pending_debounced(tx, _organization(req), debounce, heads)
            for loaded in replaced:
                heads[loaded.job.id] = self._replace_debounced(tx, loaded, key)
        heads[key] = self._apply_head(tx, None, key, [("job.enqueued", body)])
        heads[source_key] = self._apply_head(
            tx, source, source_key, [("job.replayed", {REPLAYED_AS_FIELD: key})]
        )
        return EnqueueResult(heads[key].job, created=True)

    # -- enqueue ------------------------------------------------------------------------------
    def enqueue(self, req: EnqueueRequest, *, enqueued_by: Enqueuer | None = None) -> EnqueueResult:
        """Append ``job.enqueued`` (after singleton handling). Idempotent on an explicit jobId.

        ``enqueued_by`` is who the server authenticated: written as ``enqueuedBy`` so the
        codex handler can re-check the right to run a command. Never taken from the request.
        """
        # The first try may write without reading (``_enqueue_in``'s ``unread``); a try after a
        # conflict reads.
        tries = [0]

        def work(tx: _Tx) -> EnqueueResult:
            tries[0] += 1
            return self._enqueue_in(tx, req, enqueued_by, unread=tries[0] == 1)

        return self._run_enqueue(req, work)

    def enqueue_many(
        self, reqs: Sequence[EnqueueRequest], *, enqueued_by: Enqueuer | None = None
    ) -> list[EnqueueResult | Archived]:
        """Every request in one transaction, in order: all of them are written, or none.

        Each is idempotent on its jobId exactly as a single enqueue (a jobId twice in one batch is
        one job; an archived one is answered with its tombstone, ``Archived``), and singleton rules
        apply per item in order, and so do debounces (an item replaces a pending job an earlier item
        created). The session and debounce locks of the batch are all taken first, in one order, so
        two batches cannot deadlock.
        """

        def work(tx: _Tx) -> list[EnqueueResult | Archived]:
            lock_keys(tx.conn, sorted({name for r in reqs for name in _locks(r)}))
            out: list[EnqueueResult | Archived] = []
            for req in reqs:
                try:
                    out.append(self._enqueue_in(tx, req, enqueued_by))
                except JobArchived as exc:
                    out.append(Archived(exc.key, exc.summary))
            return out

        results: list[EnqueueResult | Archived] = self._run(work)
        return results

    def _run_enqueue(self, req: EnqueueRequest, work: Callable[[_Tx], EnqueueResult]) -> EnqueueResult:
        if self._one_statement and not _locks(req):
            # Not a singleton nor a debounce (no lock, no other job touched): the enqueue is one write,
            # autocommitted, as in ``mutate``; a concurrent identical post conflicts and re-reads.
            try:
                one: EnqueueResult = self._run(work, one_statement=True)
                return one
            except _NeedsTransaction:
                pass
        result: EnqueueResult = self._run(work)
        return result

    def _enqueue_in(
        self, tx: _Tx, req: EnqueueRequest, enqueued_by: Enqueuer | None, *, unread: bool = False
    ) -> EnqueueResult:
        """One enqueue inside ``tx``: ``job.enqueued`` after the singleton handling, or the job the
        jobId already names (``enqueued_by``: who the server authenticated, never the request).

        ``unread``: an enqueue that takes no lock, written as one autocommitted statement, skips
        the read of its id and of the clock while this process's reading of the clock is fresh
        (``DbClock``). Its write then inserts the row only if the id is new, not archived and not an
        older bare id of the organisation's; otherwise it conflicts, and the next try reads, so a
        re-post still answers with the job it names and an archived id with its tombstone."""
        org = _organization(req)
        # A client id that existed before keys were qualified is still its organisation's.
        legacy = req.job_id if req.key is None else None
        conn = tx.conn
        singleton = _singleton(req)
        debounce = _debounce_key(req)
        locks = _locks(req)
        lock_keys(conn, locks)
        explicit = req.key or (qualify(org, req.job_id) if req.job_id is not None else None)
        if explicit is not None:
            if locks:
                existing = projection.load_in(conn, explicit, org, legacy)
                # Read after the projection: the pass removes the row and writes the tombstone in
                # one commit, so one of the two reads sees the job.
                archived = existing is None and tombstones.find(conn, job_stream(explicit)) is not None
            elif unread and tx.one_statement and (guess := self._clock.now()) is not None:
                tx._now, tx.unseen = guess, (explicit, projection.Unseen(org, legacy))
                existing, archived = None, False
            else:
                # Only this job decides: read the clock with it (the singleton path reads the
                # session's other jobs first, so its clock must come after those reads), and
                # whether its id was archived, in the same statement.
                existing, tx._now, archived = projection.load_for_enqueue(conn, explicit, org, legacy)
                self._clock.saw(tx._now)
            if existing is not None:
                return EnqueueResult(existing.job, created=False)
            if archived:
                gone = tombstones.find(conn, job_stream(explicit))
                assert gone is not None  # tombstones are never removed
                raise gone.refusal()
        elif unread and tx.one_statement and not locks:
            # A new id of its own: the clock is all this enqueue reads, and a fresh reading stands in.
            guess = self._clock.now()
            if guess is None:
                guess = db_now(conn)
                self._clock.saw(guess)
            tx._now = guess
        if singleton and req.singleton_mode == "steer" and req.job_id is not None:
            # Spec: re-posting the same enqueue never disturbs the first. A steer creates no
            # job under its jobId, so its command carries that id, and a re-post finds it.
            prior = self._steered_by(tx, org, req.session_key or "", req.job_id)
            if prior is not None:
                return EnqueueResult(prior, created=False, steered=True)
        job_id = explicit or qualify(org, new_id())
        canceled: list[str] = []
        aborted: list[str] = []
        # Read before the clock (the singleton handling below reads it), as every read that decides.
        replaced = self._pending_debounced(tx, org, debounce, None) if debounce is not None else []
        if singleton:
            active = self._active_on_session(tx, org, req.session_key or "")
            cap = self.max_commands_per_job
            if req.singleton_mode == "steer" and active:
                target = active[0]  # the most recent active job
                events = transitions.singleton_steer(
                    target.job,
                    tx.now,
                    new_id("cmd_"),
                    req.payload,
                    req.session_key or "",
                    req.job_id,
                    cap=cap,
                    lane=steer_lane(req.lane),
                )
                steered = self._apply(tx, target, target.job.id, events)
                return EnqueueResult(steered, created=False, steered=True)
            if req.singleton_mode == "cancel":
                for loaded in active:
                    events = transitions.singleton_cancel(loaded.job, tx.now, new_id("cmd_"), cap=cap)
                    if events:
                        self._apply(tx, loaded, loaded.job.id, events)
                        (canceled if loaded.job.status == "queued" else aborted).append(loaded.job.id)
        body = _enqueued_body(job_id, req, enqueued_by, tx)
        for loaded in replaced:
            if loaded.job.id not in canceled and loaded.job.id not in aborted:  # a singleton cancel took it
                self._replace_debounced(tx, loaded, job_id)
                canceled.append(loaded.job.id)
        job = self._apply(tx, None, job_id, [("job.enqueued", body)])
        return EnqueueResult(job, created=True, canceled=tuple(canceled), aborted=tuple(aborted))

    def _pending_debounced(
        self, tx: _Tx, org: str, key: str, heads: Mapping[str, projection.Loaded] | None
    ) -> list[projection.Loaded]:
        """The organisation's jobs still queued with debounce ``key`` (one, but for jobs written before
        the lock existed), from ``heads`` where read already. Called under the key's lock."""
        found = []
        for job_id in _debounced_ids(tx.conn, org, key):
            loaded = heads.get(job_id) if heads is not None else None
            loaded = loaded if loaded is not None else projection.load(tx.conn, job_id)
            if loaded is not None and loaded.job.status == "queued":
                found.append(loaded)
        return found

    def _replace_debounced(self, tx: _Tx, pending: projection.Loaded, by: str) -> projection.Loaded:
        """Cancel ``pending`` (``transitions.debounce_replace``) for the job ``by`` that replaces it."""
        events = transitions.debounce_replace(pending.job, client_id_of(by))
        return self._apply_head(tx, pending, pending.job.id, events) if events else pending

    def batch(self, work: Callable[[Batch], T]) -> T:
        """Run ``work`` in one transaction (``Batch``), re-running it from scratch when it loses an
        append race, and the hooks' after-commit halves once it commits."""
        result: T = self._run(lambda tx: work(Batch(self, tx)))
        return result

    def _enqueue_many(
        self, tx: _Tx, items: Sequence[tuple[EnqueueRequest, Enqueuer | None]]
    ) -> list[EnqueueResult]:
        keys = []
        for req, _by in items:
            if req.singleton_mode != "allow" and req.session_key is not None:
                raise ValueError("a batch enqueue takes no singleton mode")
            if req.flow.debounce is not None:
                raise ValueError(
                    "a batch enqueue takes no debounce: a debounce locks its key, which this path does not"
                )
            org = req.organization_id or SYSTEM_ORGANIZATION
            keys.append(req.key or qualify(org, req.job_id or new_id()))
        known = {job.id: job for job in projection.load_jobs(tx.conn, list(dict.fromkeys(keys)))}
        gone = tombstones.find_many(tx.conn, (job_stream(k) for k in keys if k not in known))
        results: list[EnqueueResult] = []
        created: list[tuple[Job, store.Chained]] = []
        writes: list[tuple[int, Write]] = []
        for (req, by), key in zip(items, keys, strict=True):
            if key in known:
                results.append(EnqueueResult(known[key], created=False))
                continue
            if job_stream(key) in gone:
                # The system derives these ids from a tick or a plan: one named again after its job
                # was archived is a fault to surface, never a second job.
                raise gone[job_stream(key)].refusal()
            body = _enqueued_body(key, req, by, tx)
            chained, job = store.advance(
                job_stream(key), None, (0, None), [("job.enqueued", body)], reduce, at=tx.now
            )
            known[key] = job
            change = Change(None, job, ("job.enqueued",), tx.now)
            for index, hook in enumerate(self.hooks):
                effect = hook.during(change)
                if isinstance(effect, Companion):
                    writes.append((index, _as_write(effect)))
                elif effect is not None:
                    writes.append((index, effect))
            created.append((job, chained))
            tx.changes.append(change)
            results.append(EnqueueResult(job, created=True))
        projection.insert_new(tx.conn, created)
        for index, write in writes:
            tx.results.setdefault(index, []).append(write.run(tx.conn))
        return results

    def _cancel_in(self, tx: _Tx, job_id: str, reason: str | None) -> Job | None:
        loaded = projection.load(tx.conn, job_id)
        if loaded is None or loaded.job.terminal:
            return None
        events = transitions.cancel(loaded.job, tx.now, new_id("cmd_"), reason, cap=self.max_commands_per_job)
        return self._apply(tx, loaded, job_id, events) if events else loaded.job

    def _steered_by(self, tx: _Tx, org: str, session_key: str, job_id: str) -> Job | None:
        """The job on this session key that an earlier steer enqueue with ``job_id`` steered."""
        rows = tx.conn.execute(
            select(jobs.c.state)
            .where(
                jobs.c.session_key == session_key,
                jobs.c.organization_id == org,
            )
            .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
        ).all()
        return transitions.steered_by([Job.from_json(row.state) for row in rows], job_id)

    def _active_on_session(self, tx: _Tx, org: str, session_key: str) -> list[projection.Loaded]:
        """Active jobs on a session key, newest first — after expiring dead leases among them.

        Spec: lease expiry is evaluated before the session scan, so a dead worker's running
        job cannot swallow a steer.
        """
        ids = (
            tx.conn.execute(
                select(jobs.c.id)
                .where(
                    jobs.c.session_key == session_key,
                    jobs.c.status.in_(sorted(ACTIVE_STATUSES)),
                    jobs.c.organization_id == org,
                )
                .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
            )
            .scalars()
            .all()
        )
        # Read every candidate before the clock (first used below), so no receipt seen here is newer.
        # A job settled between the id scan and its load is no longer active: it must not take a steer.
        candidates = [
            c
            for c in (projection.load(tx.conn, job_id) for job_id in ids)
            if c is not None and c.job.status in ACTIVE_STATUSES
        ]
        active: list[projection.Loaded] = []
        for loaded in candidates:
            job_id = loaded.job.id
            expiry = transitions.expire_lease(loaded.job, tx.now)
            if expiry:
                job = self._apply(tx, loaded, job_id, expiry)
                reloaded = projection.load(tx.conn, job_id)
                if reloaded is None or job.status not in ACTIVE_STATUSES:
                    continue
                loaded = reloaded
            active.append(loaded)
        return active

    # -- the worker's operations (fenced by worker id + attempt) --------------------------------
    def start_attempt(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        lease_ms: Callable[[Job], int],
        key_limit: Callable[[Job], int] | None = None,
    ) -> AttemptStart:
        """The worker's first write for a delivered attempt, decided on the job as read, in one commit
        (``transitions.start_attempt``). ``lease_ms`` gives the lease for the job read (its timing
        depends on kind and payload); ``key_limit`` its concurrency key's limit. A job with a key
        starts through ``start_attempts``, whose transaction holds the key's lock to its commit."""
        verdict: list[AttemptStartStatus] = []

        def decide(job: Job, now: datetime) -> Sequence[Event]:
            verdict.clear()
            if job.flow.concurrency_key is not None and job.status == "queued":
                raise _Keyed
            start = transitions.start_attempt(job, now, worker_id, attempt, lease_ms(job))
            verdict.append(start.status)
            return start.events

        try:
            out = self.mutate(job_id, decide)
        except JobNotFound:
            return AttemptStart("stale_attempt", None)
        except _Keyed:
            (only,) = self.start_attempts([(job_id, worker_id, attempt)], lease_ms, key_limit)
            if isinstance(only, Exception):
                raise only from None
            return only
        return AttemptStart(verdict[0], out.job, out.known)

    def start_attempts(
        self,
        items: Sequence[tuple[str, str, int]],
        lease_ms: Callable[[Job], int],
        key_limit: Callable[[Job], int] | None = None,
    ) -> list[AttemptStart | Exception]:
        """``start_attempt`` for several delivered attempts (job id, worker id, attempt) in one
        transaction and one commit (``mutate_many``), each decided on its own job under its own
        fence. A queued job whose concurrency key already holds ``key_limit`` leases answers
        ``concurrency_limited`` and stays queued (``app.storage.concurrency_keys``). An item whose
        own decision raised answers with that exception. Raises when the transaction fails: then
        none of them was written."""
        verdicts: list[list[AttemptStartStatus]] = [[] for _ in items]
        full: set[str] = set()

        def gate(conn: Connection, read: Sequence[Job], now: datetime) -> None:
            full.clear()
            full.update(keys.refused(conn, read, key_limit or keys.own_limit))

        def decide_for(verdict: list[AttemptStartStatus], worker_id: str, attempt: int) -> Decide:
            def decide(job: Job, now: datetime) -> Sequence[Event]:
                verdict.clear()
                if job.id in full:
                    verdict.append(keys.KEY_FULL)
                    return ()
                start = transitions.start_attempt(job, now, worker_id, attempt, lease_ms(job))
                verdict.append(start.status)
                return start.events

            return decide

        answers = self.mutate_many(
            [
                (job_id, decide_for(verdict, worker_id, attempt))
                for (job_id, worker_id, attempt), verdict in zip(items, verdicts, strict=True)
            ],
            before=gate,
            before_locks=keys.locks_for,
        )
        out: list[AttemptStart | Exception] = []
        for answer, verdict in zip(answers, verdicts, strict=True):
            if isinstance(answer, JobNotFound):
                out.append(AttemptStart("stale_attempt", None))
            elif isinstance(answer, Exception):
                out.append(answer)
            else:
                out.append(AttemptStart(verdict[0], answer.job, answer.known))
        return out

    def heartbeat(self, job_id: str, worker_id: str, attempt: int, lease_ms: int) -> Outcome:
        """Renew the lease (and promote leased → running); inert for a superseded attempt."""
        return self.mutate(
            job_id, lambda job, now: transitions.heartbeat_holder(job, now, worker_id, attempt, lease_ms)
        )

    def progress(self, job_id: str, worker_id: str, attempt: int, progress: Any) -> Outcome:
        return self.mutate(
            job_id,
            lambda job, now: transitions.fenced_holder(
                job, worker_id, attempt, "job.progress", {"progress": progress}
            ),
        )

    def fail(
        self,
        job_id: str,
        worker_id: str | None,
        attempt: int | None,
        error: Any,
        *,
        retryable: bool,
        status: FailureStatus = "failed",
        result: Any = None,
    ) -> Outcome:
        """Fail an attempt. ``worker_id=None`` fails a queued job at system level (not leased)."""
        body = transitions.failure_body(error, retryable=retryable, status=status, result=result)
        if worker_id is None:
            return self.mutate(job_id, lambda job, now: transitions.fail_queued(job, body))
        return self.mutate(
            job_id, lambda job, now: transitions.fenced_holder(job, worker_id, attempt, "job.failed", body)
        )

    def settle_attempt(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        *,
        result: Any = None,
        error: Any = None,
        retryable: bool = True,
        status: FailureStatus | None = None,
        retry_delay_ms: int = 0,
        known: Known | None = None,
    ) -> Outcome:
        """The worker's settlement under the attempt fence (``transitions.settle_holder``). With
        ``known`` (the head its lease wrote), decided and written on that head in one statement, no
        read; a head that moved since, or a settlement that needs more than one statement, is decided
        again on a fresh read, as without it."""

        def decide(job: Job, now: datetime) -> Sequence[Event]:
            return transitions.settle_holder(
                job,
                now,
                worker_id,
                attempt,
                result=result,
                error=error,
                retryable=retryable,
                status=status,
                retry_delay_ms=retry_delay_ms,
            )

        if known is not None:
            done = self._mutate_on(known, job_id, decide)
            if done is not None:
                return done
        return self.mutate(job_id, decide)

    def _mutate_on(self, known: Known, job_id: str, decide: Decide) -> Outcome | None:
        """``decide`` on ``known``'s head and its clock, written after that head: as one autocommitted
        statement, or in a transaction when a hook writes beside it. None, with nothing written,
        when it cannot be: not PostgreSQL, nothing to append or a refusal (the caller's fresh read
        decides those), or a head that moved."""
        if not self._one_statement or known.head.job.id != job_id:
            return None
        now = known.now()
        try:
            events = decide(known.head.job, now)
        except Exception:
            return None
        if not events:
            return None

        def work(tx: _Tx) -> Outcome:
            tx._now = now
            return Outcome(self._apply(tx, known.head, job_id, events), True)

        try:
            try:
                out: Outcome = self._once(work, one_statement=True)
            except _NeedsTransaction:
                out = self._once(work)  # a hook writes beside it
        except AppendConflict:
            return None
        return out

    def release(self, job_id: str, worker_id: str, attempt: int, reason: ReleaseReason) -> Outcome:
        """Hand the attempt back uncharged (``job.released``), re-read under the attempt fence: the
        job is queued again at once; a pending abort cancels it instead (``transitions.release_holder``)."""
        return self.mutate(
            job_id, lambda job, now: transitions.release_holder(job, worker_id, attempt, reason)
        )

    # -- commands and cancel -----------------------------------------------------------------------
    def command(
        self,
        job_id: str,
        type_: str,
        payload: Any = None,
        reason: str | None = None,
        *,
        lane: str | None = None,
    ) -> Outcome:
        """Send a queue command, a steer or follow-up on ``lane`` (default: its type's). A terminal
        job refuses commands (ConflictError)."""
        on = command_lane(type_, lane)
        cap = self.max_commands_per_job
        return self.mutate(
            job_id,
            lambda job, now: transitions.send_command(
                job, now, new_id("cmd_"), type_, payload, reason, cap=cap, lane=on
            ),
        )

    def consume_command(self, job_id: str, command_id: str) -> Outcome:
        return self.mutate(job_id, lambda job, now: transitions.consume_command(job, command_id))

    def cancel(self, job_id: str, reason: str | None = None) -> Outcome:
        """Cancel: a queued job outright; a leased/running one gets an ``abort`` command."""
        cap = self.max_commands_per_job
        return self.mutate(
            job_id, lambda job, now: transitions.cancel(job, now, new_id("cmd_"), reason, cap=cap)
        )

    def cancel_queued(self, job_id: str, reason: str | None) -> Outcome:
        """Cancel a job only if it is still queued (the driver honouring ``abortRequested``)."""
        return self.mutate(job_id, lambda job, now: transitions.cancel_queued(job, reason))

    # -- lease expiry ------------------------------------------------------------------------------
    def expire_lease(self, job_id: str) -> Outcome:
        """Append ``job.lease_expired`` if the job's lease deadline has passed (database clock)."""
        return self.mutate(job_id, transitions.expire_lease)

    def expire_leases(self, limit: int = 500, between: Callable[[], None] | None = None) -> list[Job]:
        """Expire every lease past its deadline; returns the jobs that were expired.

        ``between`` runs before each job (a loop pass renewing its claim)."""
        with self.engine.connect() as conn:
            now = db_now(conn)
            ids = (
                conn.execute(
                    select(jobs.c.id)
                    .where(jobs.c.status.in_(sorted(LEASED_STATUSES)), jobs.c.lease_expires_at < now)
                    .order_by(jobs.c.lease_expires_at)
                    .limit(limit)
                )
                .scalars()
                .all()
            )
        expired = []
        for job_id in ids:
            if between is not None:
                between()
            out = self.expire_lease(job_id)
            if out.applied:
                expired.append(out.job)
        return expired

    def due_retries(
        self, limit: int = 500, *, skip_in_flight: bool = False, epoch: str | None = None
    ) -> list[Job]:
        """Queued jobs whose retry delay has passed (database clock), oldest due first.

        ``skip_in_flight`` leaves out jobs whose delivery is already in flight (``delivery.in_flight``).
        """
        with self.engine.connect() as conn:
            now = db_now(conn)
            q = select(jobs.c.state).where(
                jobs.c.status == "queued", jobs.c.available_at.is_not(None), jobs.c.available_at <= now
            )
            if skip_in_flight:
                q = delivery.without_in_flight(conn, q, jobs.c.id, now, epoch)
            rows = conn.execute(q.order_by(jobs.c.available_at).limit(limit)).all()
        return [Job.from_json(r.state) for r in rows]

    def lines_waiting_since(self, min_age_ms: int, limit: int = 500) -> list[str]:
        """The worker queues whose line holds a job ready (queued, past any backoff) for at least
        ``min_age_ms``: lines a lost wake-up may have left still. Queued rows an older release wrote
        without their ``worker_queue`` (up to ``limit`` a call) get it here first."""
        since = func.coalesce(jobs.c.available_at, jobs.c.status_changed_at)
        with transaction(self.engine) as conn:
            now = db_now(conn)
            unset = conn.execute(
                select(jobs.c.id, jobs.c.agent_id, jobs.c.kind)
                .where(jobs.c.status == "queued", jobs.c.worker_queue.is_(None))
                .limit(limit)
            ).all()
            by_queue: dict[str, list[str]] = {}
            for row in unset:
                by_queue.setdefault(queue_for(row.agent_id, row.kind), []).append(row.id)
            for name, ids in by_queue.items():
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id.in_(ids), jobs.c.worker_queue.is_(None))
                    .values(worker_queue=name)
                )
            # One probe per worker queue, each stopping at its first such job: a DISTINCT over
            # the queued rows would read a whole backlog on every pass of the loop.
            cutoff = now - timedelta(milliseconds=min_age_ms)
            probes = [
                select(literal(name).label("worker_queue")).where(
                    select(jobs.c.id)
                    .where(jobs.c.status == "queued", jobs.c.worker_queue == name, since <= cutoff)
                    .limit(1)
                    .exists()
                )
                for name in sorted(QUEUES.values())
            ]
            rows = conn.execute(union_all(*probes)).all()
        return sorted(r.worker_queue for r in rows)

    def queued_older_than(
        self, min_age_ms: int, limit: int = 500, *, skip_in_flight: bool = False, epoch: str | None = None
    ) -> list[tuple[Job, datetime]]:
        """Queued jobs that have been deliverable for at least ``min_age_ms`` (oldest first).

        Age counts from when the job became deliverable: its requeue, or the end of its retry
        backoff — a retry still backing off is not stuck, and is the due-retries pass's to start.
        ``skip_in_flight`` leaves out jobs whose delivery is already in flight.
        """
        since = func.coalesce(jobs.c.available_at, jobs.c.status_changed_at)
        with self.engine.connect() as conn:
            now = db_now(conn)
            q = select(jobs.c.state, jobs.c.status_changed_at).where(
                jobs.c.status == "queued", since <= now - timedelta(milliseconds=min_age_ms)
            )
            if skip_in_flight:
                q = delivery.without_in_flight(conn, q, jobs.c.id, now, epoch)
            rows = conn.execute(q.order_by(since).limit(limit)).all()
        return [(Job.from_json(r.state), as_utc(r.status_changed_at)) for r in rows]


def _debounced_ids(conn: Connection, org: str, key: str) -> list[str]:
    """The ids of an organisation's queued jobs with debounce ``key`` (``ix_jobs_debounce``)."""
    rows = conn.execute(
        select(jobs.c.id)
        .where(jobs.c.organization_id == org, jobs.c.debounce_key == key, jobs.c.status == "queued")
        .order_by(jobs.c.id)
    )
    return list(rows.scalars().all())


def _enqueued_body(job_id: str, req: EnqueueRequest, enqueued_by: Enqueuer | None, tx: _Tx) -> dict[str, Any]:
    """The ``job.enqueued`` body of a new job. ``enqueuedBy`` is who the server authenticated; a
    delayed job's ``availableAt`` is decided on the database clock (``app.jobs.delay``), and so is a
    debounced one's: its window is a delay, during which a later enqueue of its key replaces it."""
    body: dict[str, Any] = {
        "jobId": job_id,
        "agentId": req.agent_id,
        "lane": req.lane,
        "payload": dict(req.payload),
        "sessionKey": req.session_key,
        "singletonMode": req.singleton_mode,
        "maxAttempts": req.max_attempts,
    }
    if enqueued_by is not None:
        body[ENQUEUED_BY_FIELD] = enqueued_by.to_json()
    trace_context = req.trace_context if req.trace_context is not None else tracing.enqueue_context()
    if trace_context is not None:
        body[TRACE_CONTEXT_FIELD] = dict(trace_context)
    if req.tags:
        body[TAGS_FIELD] = dict(req.tags)
    if req.replay_of is not None:
        body[REPLAY_OF_FIELD] = req.replay_of
    body.update(req.flow.to_body())
    if req.flow.debounce is not None:
        when = delay.available_at(tx.now, None, req.flow.debounce.window_ms)
        if when is not None:
            body[AVAILABLE_AT_FIELD] = iso(when)
    elif req.run_at is not None or req.delay_ms is not None:
        when = delay.available_at(tx.now, req.run_at, req.delay_ms)
        if when is not None:
            body[AVAILABLE_AT_FIELD] = iso(when)
    return body


class Batch:
    """One queue transaction several writes share (``Queue.batch``): a page of new jobs enqueued in
    two statements, cancels, and the caller's own writes on ``conn`` (a schedules pass writes its
    schedules' receipts there), all committed together. The hooks run as for any transition:
    in the transaction, then after the commit (the dispatch wake-up, metrics)."""

    def __init__(self, queue: Queue, tx: _Tx) -> None:
        self._queue = queue
        self._tx = tx

    @property
    def conn(self) -> Connection:
        return self._tx.conn

    @property
    def now(self) -> datetime:
        """The database clock, read once, on first use (after the reads that decide)."""
        return self._tx.now

    def jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs among ``job_ids`` that exist (storage keys), in one read."""
        return {job.id: job for job in projection.load_jobs(self._tx.conn, list(dict.fromkeys(job_ids)))}

    def enqueue_new(self, items: Sequence[tuple[EnqueueRequest, Enqueuer | None]]) -> list[EnqueueResult]:
        """Enqueue each request under its storage key (``EnqueueRequest.key``), unless a job of that
        key exists, which is returned unchanged (``created`` False): the idempotency contract, for
        ids the system derives. Singleton modes are not taken here (they lock a session)."""
        return self._queue._enqueue_many(self._tx, items)

    def cancel(self, job_id: str, reason: str | None) -> Job | None:
        """Cancel a job in this transaction (a queued one outright, a running one gets an abort);
        None when it does not exist or has ended."""
        return self._queue._cancel_in(self._tx, job_id, reason)


def validate_status_filter(status: str | None) -> None:
    if status is not None and status not in STATUSES:
        raise ValidationError("status", "is not a job status", allowed=STATUSES)
