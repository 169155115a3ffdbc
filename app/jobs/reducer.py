"""The job state machine: a pure fold of ``jobs/<jobId>`` receipts into a ``Job``.

No I/O and no clock: every time a rule needs (lease deadlines, receipt times) arrives inside
the receipt. The three invariants of the spec ("Lifecycle receipts") are enforced here and
nowhere else:

1. ``job.leased`` is ignored unless the job is ``queued``.
2. ``job.heartbeat`` promotes ``leased`` to ``running`` only when its worker id and attempt
   match the active lease; ``job.progress``, ``job.completed`` and ``job.failed`` apply the
   same check, so a superseded attempt's event is inert.
3. An event for a job that does not exist raises ``Invariant: no job for <jobId>``, except
   ``job.failed`` and ``job.lease_expired``, which are ignored.

``job.released`` (beyond the spec's ten, docs/deviations.md) passes the same fence as
``job.lease_expired``: the lease holder hands its attempt back, the job is queued again at once,
and ``released`` counts it so the retry budget charges ``attempt - released`` attempts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.jobs.delay import AVAILABLE_AT_FIELD
from app.jobs.errors import InvariantError, no_job_message
from app.jobs.flow import PLAIN, Flow, flow_of
from app.jobs.ids import client_id_of, organization_of_key
from app.jobs.privilege import ENQUEUED_BY_FIELD, Enqueuer
from app.jobs.tags import TAGS_FIELD, tags_of
from app.jobs.tracecontext import TRACE_CONTEXT_FIELD, trace_context_of
from app.jobs.vocab import (
    COMMAND_LANES,
    LEASED_STATUSES,
    MAX_ATTEMPTS_DEFAULT,
    TERMINAL_STATUSES,
    Status,
    job_stream,
)
from app.jobs.vocab import job_id_of as job_id_of  # re-exported: callers import it from here

_T = TypeVar("_T")


def _evolve(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for these frozen dataclasses, without re-running ``__init__``.

    They have no ``__post_init__``, no ``init=False`` fields and no validation in ``__init__``, so
    the instance ``replace`` would build is exactly a copy of the instance's fields with the
    changes. ``replace`` introspects the fields and calls ``__init__`` with all of them; the fold
    evolves the state twice per receipt, and that was ~15 % of a transition's client CPU
    (cProfile, ``bench/README.md``). Unknown names are refused as ``replace`` refuses them
    (``tests/unit/test_properties.py`` folds random streams both ways and compares).
    """
    unknown = changes.keys() - obj.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no fields {sorted(unknown)}")
    new = object.__new__(type(obj))
    fields = new.__dict__
    fields.update(obj.__dict__)
    fields.update(changes)
    return new


@dataclass(frozen=True)
class Lease:
    """The active lease: who holds the job, for which attempt, until when (database clock)."""

    worker_id: str
    attempt: int
    expires_at: str | None

    def to_json(self) -> dict[str, Any]:
        return {"workerId": self.worker_id, "attempt": self.attempt, "expiresAt": self.expires_at}


@dataclass(frozen=True)
class Command:
    """A queue command sent to a job (steer, follow_up or abort).

    ``lane``: the queue-command lane (steer or follow_up) a steer or follow-up was sent on; None for
    an abort, and for a command whose receipt was written before commands carried their lane.
    """

    id: str
    type: str
    payload: Any
    reason: str | None
    at: str | None
    consumed: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    lane: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": self.type}
        if self.lane is not None:
            # Only when recorded: a projection folded before lanes were recorded stays byte-equal
            # to a rebuild of the same receipts.
            out["lane"] = self.lane
        out.update({"payload": self.payload, "reason": self.reason, "at": self.at, "consumed": self.consumed})
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Job:
    """A job's folded state. ``seq`` is the last receipt folded (its stream position)."""

    id: str
    agent_id: str
    lane: str
    payload: Mapping[str, Any]
    session_key: str | None
    singleton_mode: str
    max_attempts: int
    organization_id: str | None
    status: Status = "queued"
    attempt: int = 0
    lease: Lease | None = None
    abort_requested: bool = False
    commands: tuple[Command, ...] = ()
    progress: Any = None
    result: Any = None
    error: Any = None
    created_at: str | None = None
    updated_at: str | None = None
    available_at: str | None = None
    seq: int = 0
    # Attempts handed back with job.released (a worker shutting down): never charged to maxAttempts.
    released: int = 0
    # Who posted the job, as the server recorded it on job.enqueued (None: written by another path).
    enqueued_by: Enqueuer | None = None
    # The W3C trace context the enqueue ran in (app.jobs.tracecontext); None: none was recorded.
    trace_context: Mapping[str, str] | None = None
    # Tags to find the job by (``app.jobs.tags``), from job.enqueued.
    tags: Mapping[str, str] = field(default_factory=dict)
    # A replay: the job it re-runs (its storage key), from job.enqueued's ``replayOf``; and on a
    # replayed job, the jobs that re-run it (``job.replayed`` receipts), oldest first.
    replay_of: str | None = None
    replayed_as: tuple[str, ...] = ()
    # The bulk archive (its operation id) that is moving this ended job's stream out of the
    # database (``job.archived``); the job is gone from the projection once it commits.
    archived_by: str | None = None
    # What the dispatch pass weighs beside the organisation (``app.jobs.flow``), from job.enqueued.
    flow: Flow = PLAIN

    @property
    def stream(self) -> str:
        return job_stream(self.id)

    @property
    def client_id(self) -> str:
        """The id the job's organisation knows it by (``id`` is the organisation-qualified key)."""
        return client_id_of(self.id)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def kind(self) -> str:
        return str(self.payload.get("kind", ""))

    @property
    def charged_attempts(self) -> int:
        """The attempts the retry budget counts: every attempt but those handed back uncharged."""
        return self.attempt - self.released

    @property
    def pending_commands(self) -> tuple[Command, ...]:
        return tuple(c for c in self.commands if not c.consumed)

    @property
    def abort_reason(self) -> str | None:
        """The reason of the latest abort command, if one was sent."""
        for c in reversed(self.commands):
            if c.type == "abort":
                return c.reason or "abort requested"
        return None

    def holds_lease(self, worker_id: Any, attempt: Any) -> bool:
        """True when (worker_id, attempt) is the active lease: the fence every worker event passes."""
        return (
            self.status in LEASED_STATUSES
            and self.lease is not None
            and self.lease.worker_id == worker_id
            and self.lease.attempt == attempt
        )

    def to_json(self) -> dict[str, Any]:
        """The camelCase job object (without the API's derived ``route``)."""
        return {
            "id": self.id,
            "agentId": self.agent_id,
            "lane": self.lane,
            "status": self.status,
            "payload": self.payload,
            "sessionKey": self.session_key,
            "singletonMode": self.singleton_mode,
            "maxAttempts": self.max_attempts,
            "attempt": self.attempt,
            "lease": self.lease.to_json() if self.lease else None,
            "abortRequested": self.abort_requested,
            "commands": [c.to_json() for c in self.commands],
            "progress": self.progress,
            "result": self.result,
            "error": self.error,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "availableAt": self.available_at,
            "stream": self.stream,
            "seq": self.seq,
            ENQUEUED_BY_FIELD: self.enqueued_by.to_json() if self.enqueued_by else None,
            # Only once an attempt was released: a projection folded before releases existed stays
            # byte-equal to a rebuild of the same receipts.
            **({"released": self.released} if self.released else {}),
            # Only when recorded, for the same reason.
            **({TRACE_CONTEXT_FIELD: dict(self.trace_context)} if self.trace_context else {}),
            # Only when set: a projection folded before these existed stays byte-equal to a rebuild.
            **({TAGS_FIELD: dict(self.tags)} if self.tags else {}),
            **({REPLAY_OF_FIELD: self.replay_of} if self.replay_of else {}),
            **({REPLAYED_AS_FIELD: list(self.replayed_as)} if self.replayed_as else {}),
            **({ARCHIVED_BY_FIELD: self.archived_by} if self.archived_by else {}),
            **self.flow.to_body(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        """Inverse of ``to_json`` (used by the projection's stored snapshot)."""
        lease = data.get("lease")
        return cls(
            id=data["id"],
            agent_id=data["agentId"],
            lane=data["lane"],
            payload=data["payload"],
            session_key=data.get("sessionKey"),
            singleton_mode=data["singletonMode"],
            max_attempts=data["maxAttempts"],
            organization_id=_org_of(data["payload"], data["id"]),
            status=data["status"],
            attempt=data["attempt"],
            lease=Lease(lease["workerId"], lease["attempt"], lease.get("expiresAt")) if lease else None,
            abort_requested=data["abortRequested"],
            commands=tuple(
                Command(
                    id=c["id"],
                    type=c["type"],
                    payload=c.get("payload"),
                    reason=c.get("reason"),
                    at=c.get("at"),
                    consumed=c.get("consumed", False),
                    extra={k: v for k, v in c.items() if k not in _COMMAND_KEYS},
                    lane=c.get("lane"),
                )
                for c in data.get("commands", [])
            ),
            progress=data.get("progress"),
            result=data.get("result"),
            error=data.get("error"),
            created_at=data.get("createdAt"),
            updated_at=data.get("updatedAt"),
            available_at=data.get("availableAt"),
            seq=data.get("seq", 0),
            released=data.get("released", 0),
            enqueued_by=Enqueuer.from_json(data.get(ENQUEUED_BY_FIELD)),
            trace_context=trace_context_of(data.get(TRACE_CONTEXT_FIELD)),
            tags=data.get(TAGS_FIELD) or {},
            replay_of=data.get(REPLAY_OF_FIELD),
            replayed_as=tuple(data.get(REPLAYED_AS_FIELD) or ()),
            archived_by=data.get(ARCHIVED_BY_FIELD),
            flow=flow_of(data),
        )


# job.enqueued's link to the job a replay re-runs, and the job's list of its replays.
REPLAY_OF_FIELD = "replayOf"
REPLAYED_AS_FIELD = "replayedAs"
# job.archived's operation (a bulk archive's id), kept on the job as ``archivedBy``.
ARCHIVED_BY_FIELD = "archivedBy"
OPERATION_ID_FIELD = "operationId"

_COMMAND_KEYS = frozenset({"id", "type", "lane", "payload", "reason", "at", "consumed"})
_COMMAND_EXTRA_KEYS = ("fromSessionKey", "fromEnqueue", "fromJobId")


@dataclass(frozen=True)
class Receipt:
    """One receipt as the reducer sees it. ``at`` is the database time of the append."""

    stream: str
    seq: int
    type: str
    body: Mapping[str, Any]
    at: str | None = None


def _org_of(payload: Mapping[str, Any], key: str) -> str | None:
    """The job's organisation: the one its authContext names, else the one its key names (the
    system's own jobs carry no authContext); ``None`` only for a bare key without either."""
    ctx = payload.get("authContext")
    if isinstance(ctx, Mapping):
        org = ctx.get("organizationId")
        if isinstance(org, str):
            return org
    return organization_of_key(key)


def reduce(state: Job | None, receipt: Receipt) -> Job | None:
    """Fold one receipt. Returns the new state; an inert event returns ``state`` with only ``seq`` moved."""
    kind = receipt.type
    if state is None:
        if kind == "job.enqueued":
            return _enqueued(receipt)
        if kind in ("job.failed", "job.lease_expired"):
            # Invariant 3's exceptions: a late settlement for a job never appended cannot break a fold.
            return None
        raise InvariantError(no_job_message(job_id_of(receipt.stream)))

    new = _handled(state, receipt)
    if new is None:
        # Inert (or an unknown type): the stream position still advances.
        return _evolve(state, seq=receipt.seq)
    return _evolve(new, seq=receipt.seq, updated_at=receipt.at or state.updated_at)


def applies(state: Job | None, receipt: Receipt) -> bool:
    """Whether ``reduce`` applies ``receipt`` to ``state`` (False: it is inert and only moves
    ``seq``). Decided by the event's rule itself, so a receipt that is applied but changes nothing
    else -- a lease holder's heartbeat renewing to the same deadline -- still counts as applied."""
    if state is None:
        return receipt.type == "job.enqueued"
    return _handled(state, receipt) is not None


def _handled(state: Job, receipt: Receipt) -> Job | None:
    handler = _HANDLERS.get(receipt.type)
    return handler(state, receipt.body) if handler else None


def fold(receipts: Iterable[Receipt], state: Job | None = None) -> Job | None:
    """Fold a stream from ``state`` (``None`` = the beginning)."""
    for r in receipts:
        state = reduce(state, r)
    return state


# -- one function per event type; each returns the new state or None when inert ---------


def _enqueued(r: Receipt) -> Job:
    b = r.body
    # Tolerate a malformed body (``receipt replay`` folds hand-edited files): only the
    # documented InvariantError may escape the reducer, never a TypeError from int() or .get().
    payload = b.get("payload")
    if not isinstance(payload, Mapping):
        payload = {}
    max_attempts = b.get("maxAttempts", MAX_ATTEMPTS_DEFAULT)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        max_attempts = MAX_ATTEMPTS_DEFAULT
    job_id = str(b.get("jobId") or job_id_of(r.stream))
    # A delayed job is queued but not deliverable before this time (app.jobs.delay).
    available = b.get(AVAILABLE_AT_FIELD)
    return Job(
        id=job_id,
        agent_id=str(b.get("agentId", "")),
        lane=str(b.get("lane", "collect")),
        payload=payload,
        session_key=b.get("sessionKey"),
        singleton_mode=str(b.get("singletonMode", "allow")),
        max_attempts=max_attempts,
        organization_id=_org_of(payload, job_id),
        created_at=r.at,
        updated_at=r.at,
        available_at=available if isinstance(available, str) else None,
        seq=r.seq,
        enqueued_by=Enqueuer.from_json(b.get(ENQUEUED_BY_FIELD)),
        trace_context=trace_context_of(b.get(TRACE_CONTEXT_FIELD)),
        tags=tags_of(b),
        replay_of=replay_of if isinstance(replay_of := b.get(REPLAY_OF_FIELD), str) else None,
        flow=flow_of(b),
    )


def _duplicate_enqueue(s: Job, b: Mapping[str, Any]) -> Job | None:
    # A second job.enqueued on an existing stream changes nothing (idempotency contract).
    return None


def _leased(s: Job, b: Mapping[str, Any]) -> Job | None:
    if s.status != "queued":  # invariant 1
        return None
    attempt = s.attempt + 1
    if b.get("attempt", attempt) != attempt:
        return None  # a lease written against a state that no longer exists
    return _evolve(
        s,
        status="leased",
        attempt=attempt,
        available_at=None,
        lease=Lease(str(b.get("workerId", "")), attempt, b.get("expiresAt")),
    )


def _heartbeat(s: Job, b: Mapping[str, Any]) -> Job | None:
    if not s.holds_lease(b.get("workerId"), b.get("attempt")):  # invariant 2
        return None
    lease = s.lease
    assert lease is not None
    expires = b.get("expiresAt", lease.expires_at)
    return _evolve(s, status="running", lease=_evolve(lease, expires_at=expires))


def _progress(s: Job, b: Mapping[str, Any]) -> Job | None:
    if not s.holds_lease(b.get("workerId"), b.get("attempt")):
        return None
    return _evolve(s, progress=b.get("progress"))


def _completed(s: Job, b: Mapping[str, Any]) -> Job | None:
    if not s.holds_lease(b.get("workerId"), b.get("attempt")):
        return None
    return _evolve(s, status="completed", lease=None, result=b.get("result"), error=None)


def _failed(s: Job, b: Mapping[str, Any]) -> Job | None:
    if s.terminal:
        return None
    if s.status in LEASED_STATUSES:
        if not s.holds_lease(b.get("workerId"), b.get("attempt")):
            return None
    elif b.get("workerId") is not None:
        return None  # a worker's failure for a job it no longer holds
    # A queued job with no worker named: a system-level failure (e.g. delivery exhausted).
    retry_at = b.get("retryAt")
    return _settle_failure(
        s,
        error=b.get("error"),
        retryable=bool(b.get("retryable", False)),
        status=str(b.get("status", "failed")),
        result=b.get("result"),
        retry_at=retry_at if isinstance(retry_at, str) else None,
    )


def _settle_failure(
    s: Job, *, error: Any, retryable: bool, status: str, result: Any, retry_at: str | None = None
) -> Job:
    """Retryable with attempts left → back to queued (not before ``retry_at``), status kept out of
    result; else failed."""
    if retryable and s.charged_attempts < s.max_attempts:
        return _evolve(s, status="queued", lease=None, error=error, available_at=retry_at)
    merged: dict[str, Any] = dict(result) if isinstance(result, Mapping) else {}
    merged["status"] = status
    return _evolve(s, status="failed", lease=None, error=error, result=merged)


def _canceled(s: Job, b: Mapping[str, Any]) -> Job | None:
    if s.terminal:
        return None
    if s.status in LEASED_STATUSES and not s.holds_lease(b.get("workerId"), b.get("attempt")):
        return None  # only the lease holder stops work in flight; others send an abort command
    return _evolve(s, status="canceled", lease=None, result=b.get("result"), error=b.get("reason"))


def _command(s: Job, b: Mapping[str, Any]) -> Job | None:
    if s.terminal:
        return None
    ctype = str(b.get("type", ""))
    cmd = Command(
        id=str(b.get("commandId", "")),
        type=ctype,
        payload=b.get("payload"),
        reason=b.get("reason"),
        at=b.get("at"),
        extra={k: b[k] for k in _COMMAND_EXTRA_KEYS if k in b},
        # Only a queue-command lane is a command's lane (a hand-edited body's other text is not).
        lane=lane if (lane := b.get("lane")) in COMMAND_LANES else None,
    )
    return _evolve(
        s,
        commands=(*s.commands, cmd),
        abort_requested=s.abort_requested or ctype == "abort",
    )


def _command_consumed(s: Job, b: Mapping[str, Any]) -> Job | None:
    if s.terminal:
        return None  # terminal states are absorbing: a settled job's commands stay as they were
    cid = b.get("commandId")
    if not any(c.id == cid and not c.consumed for c in s.commands):
        return None
    return _evolve(s, commands=tuple(_evolve(c, consumed=True) if c.id == cid else c for c in s.commands))


def _lease_expired(s: Job, b: Mapping[str, Any]) -> Job | None:
    # Only the lease the expiry was observed on may be expired: a newer lease is untouched.
    if not s.holds_lease(b.get("workerId"), b.get("attempt")):
        return None
    return _settle_failure(
        s,
        error=b.get("error", "lease expired"),
        retryable=True,
        status="lease_lost",
        result=None,
    )


def _released(s: Job, b: Mapping[str, Any]) -> Job | None:
    # The lease holder hands its attempt back (its process is shutting down): queued again now,
    # not at lease expiry, and not charged. Any other lease's release is inert, like its expiry.
    if not s.holds_lease(b.get("workerId"), b.get("attempt")):
        return None
    return _evolve(s, status="queued", lease=None, available_at=None, released=s.released + 1)


def _replayed(s: Job, b: Mapping[str, Any]) -> Job | None:
    # A record on a terminal job (its status unchanged): the job that re-runs it, once each.
    new = b.get(REPLAYED_AS_FIELD)
    if not s.terminal or not isinstance(new, str) or new in s.replayed_as:
        return None
    return _evolve(s, replayed_as=(*s.replayed_as, new))


def _archived(s: Job, b: Mapping[str, Any]) -> Job | None:
    # A record on an ended job (its status unchanged): the bulk archive about to move its stream.
    operation = b.get(OPERATION_ID_FIELD)
    if not s.terminal or not isinstance(operation, str) or operation == s.archived_by:
        return None
    return _evolve(s, archived_by=operation)


_HANDLERS = {
    "job.enqueued": _duplicate_enqueue,
    "job.leased": _leased,
    "job.heartbeat": _heartbeat,
    "job.progress": _progress,
    "job.completed": _completed,
    "job.failed": _failed,
    "job.canceled": _canceled,
    "queue.command": _command,
    "queue.command.consumed": _command_consumed,
    "job.lease_expired": _lease_expired,
    "job.released": _released,
    "job.replayed": _replayed,
    "job.archived": _archived,
}
