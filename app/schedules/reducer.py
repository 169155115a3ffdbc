"""The schedule state machine: a pure fold of ``schedules/<organizationId>/<scheduleId>`` receipts.

No I/O and no clock: every time arrives inside a receipt. What the fold keeps:

- the declaration (``Spec``) of the last ``schedule.created`` / ``schedule.updated``;
- ``status``: ``active``, ``paused`` or ``deleted``;
- the **cursor**: every tick at or before it has been decided (fired, skipped, buffered or recorded
  missed), so the next tick to decide is the first one after it. ``created``, a timing change and
  ``resumed`` set it to their own time (ticks before a schedule existed, or while it was paused,
  are not owed); the tick receipts move it to their tick;
- the last job a tick fired (the one an overlap policy looks at), a buffered tick, counts, and the
  last outcome;
- the **revision** of ticks withdrawn: ``schedule.withdrawn`` takes back a tick decided ahead of
  its time (its job was canceled before it came) and moves the cursor back to the withdrawal's own
  time, the one event that moves it back; every tick up to the latest withdrawn
  one is then fired as ``<scheduleId>:<tick>-<revision>`` (``app.schedules.vocab.fire_client_id``),
  since its first id names the canceled job.

Invariants: an event for a schedule that does not exist raises ``Invariant: no schedule for <id>``;
a deleted schedule absorbs everything but ``schedule.created`` (which declares it again); a tick
event on a schedule that is not active is inert, except a backfill's or a trigger's fire (an
operator's explicit act). Receipts for the system's operators (``trigger``, ``backfill``) never move
the cursor: they are beside the schedule's own sequence of ticks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from app.jobs.errors import InvariantError
from app.jobs.ids import client_id_of, qualify
from app.jobs.reducer import Receipt
from app.jobs.times import iso, parse_iso
from app.schedules.spec import Spec
from app.schedules.vocab import ScheduleStatus, schedule_key_of, schedule_stream

_TINY = timedelta(microseconds=1)
# Fires that belong to the schedule's own sequence of ticks (and move its cursor).
OWN_TRIGGERS = frozenset({"schedule", "buffered"})


def no_schedule_message(schedule_id: str) -> str:
    return f"Invariant: no schedule for {schedule_id}"


@dataclass(frozen=True)
class Outcome:
    """What became of the latest tick decided: fired, missed, skipped or buffered, and when."""

    type: str
    tick: str
    at: str | None
    job_id: str | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "tick": self.tick,
            "at": self.at,
            "jobId": self.job_id,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Outcome | None:
        if not data:
            return None
        return cls(data["type"], data["tick"], data.get("at"), data.get("jobId"), data.get("reason"))


@dataclass(frozen=True)
class Counts:
    fired: int = 0
    missed: int = 0
    skipped: int = 0
    buffered: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "fired": self.fired,
            "missed": self.missed,
            "skipped": self.skipped,
            "buffered": self.buffered,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Counts:
        data = data or {}
        return cls(
            int(data.get("fired", 0)),
            int(data.get("missed", 0)),
            int(data.get("skipped", 0)),
            int(data.get("buffered", 0)),
        )


@dataclass(frozen=True)
class Schedule:
    """A schedule's folded state. ``id`` is its storage key ``<organizationId>/<scheduleId>``."""

    id: str
    organization_id: str
    spec: Spec
    cursor: str
    status: ScheduleStatus = "active"
    paused_reason: str | None = None
    # The storage key of the last job a tick of the schedule's own (or a trigger) fired.
    last_job_id: str | None = None
    buffered_tick: str | None = None
    last_outcome: Outcome | None = None
    counts: Counts = field(default_factory=Counts)
    # Who declared the job template, as the server recorded it (what each fire's job records).
    enqueued_by: Mapping[str, Any] | None = None
    created_at: str | None = None
    updated_at: str | None = None
    seq: int = 0
    # Ticks at or before ``revision_until`` fire under ``<scheduleId>:<tick>-<revision>``.
    revision: int | None = None
    revision_until: str | None = None

    @property
    def client_id(self) -> str:
        return client_id_of(self.id)

    @property
    def stream(self) -> str:
        return schedule_stream(self.id)

    @property
    def active(self) -> bool:
        return self.status == "active"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "organizationId": self.organization_id,
            "spec": self.spec.to_json(),
            "cursor": self.cursor,
            "status": self.status,
            "pausedReason": self.paused_reason,
            "lastJobId": self.last_job_id,
            "bufferedTick": self.buffered_tick,
            "lastOutcome": self.last_outcome.to_json() if self.last_outcome else None,
            "counts": self.counts.to_json(),
            "enqueuedBy": dict(self.enqueued_by) if self.enqueued_by else None,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "seq": self.seq,
            "revision": self.revision,
            "revisionUntil": self.revision_until,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schedule:
        return cls(
            id=data["id"],
            organization_id=data["organizationId"],
            spec=Spec.from_json(data["spec"]),
            cursor=data["cursor"],
            status=data["status"],
            paused_reason=data.get("pausedReason"),
            last_job_id=data.get("lastJobId"),
            buffered_tick=data.get("bufferedTick"),
            last_outcome=Outcome.from_json(data.get("lastOutcome")),
            counts=Counts.from_json(data.get("counts")),
            enqueued_by=data.get("enqueuedBy"),
            created_at=data.get("createdAt"),
            updated_at=data.get("updatedAt"),
            seq=data.get("seq", 0),
            revision=data.get("revision"),
            revision_until=data.get("revisionUntil"),
        )

    def revision_for(self, tick: datetime) -> int | None:
        """The revision a fire of ``tick`` carries in its job id (None: the plain id)."""
        until = parse_iso(self.revision_until) if self.revision_until else None
        return self.revision if until is not None and tick <= until else None


_T = TypeVar("_T")


def replace(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for these frozen dataclasses, without re-running ``__init__`` (they
    validate nothing there): a pass folds a receipt per schedule per tick, and ``replace``'s field
    introspection was a tenth of a page's client time. Unknown names are refused as it refuses them."""
    unknown = changes.keys() - obj.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no fields {sorted(unknown)}")
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def _later(a: str, b: str) -> str:
    """The later of two receipt times (the cursor only moves forward)."""
    pa, pb = parse_iso(a), parse_iso(b)
    if pa is None or pb is None:
        return a if pb is None else b
    return a if pa >= pb else b


def reduce(state: Schedule | None, receipt: Receipt) -> Schedule | None:
    """Fold one receipt; an inert one moves only ``seq``."""
    body = receipt.body
    if receipt.type == "schedule.created":
        new: Schedule | None = _created(state, receipt)
    elif state is None:
        raise InvariantError(no_schedule_message(schedule_key_of(receipt.stream)))
    elif state.status == "deleted":
        new = None
    else:
        handler = _HANDLERS.get(receipt.type)
        new = handler(state, body, receipt.at) if handler else None
    if new is None:
        assert state is not None
        return replace(state, seq=receipt.seq)
    return replace(new, seq=receipt.seq, updated_at=receipt.at or new.updated_at)


def fold(receipts: Iterable[Receipt], state: Schedule | None = None) -> Schedule | None:
    for r in receipts:
        state = reduce(state, r)
    return state


def _created(state: Schedule | None, r: Receipt) -> Schedule | None:
    b = r.body
    if state is not None and state.status != "deleted":
        return None  # declared twice: the first declaration stands (the create is idempotent)
    key = schedule_key_of(r.stream)
    org = str(b.get("organizationId") or "")
    at = r.at or ""
    return Schedule(
        id=key,
        organization_id=org,
        spec=Spec.from_json(b.get("spec") or {}),
        cursor=str(b.get("cursor") or at),
        status="paused" if b.get("paused") else "active",
        paused_reason=b.get("reason") if b.get("paused") else None,
        enqueued_by=b.get("enqueuedBy"),
        created_at=at,
        updated_at=at,
        # Counts and outcomes survive a re-declaration: the stream's history is one.
        counts=state.counts if state is not None else Counts(),
        last_outcome=state.last_outcome if state is not None else None,
    )


def _updated(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    spec = Spec.from_json(b.get("spec") or {})
    cursor = s.cursor
    if isinstance(b.get("cursor"), str):
        cursor = _later(s.cursor, b["cursor"])
    enqueued_by = b.get("enqueuedBy", s.enqueued_by)
    return replace(s, spec=spec, cursor=cursor, enqueued_by=enqueued_by)


def _paused(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    if s.status != "active":
        return None
    return replace(s, status="paused", paused_reason=b.get("reason"))


def _resumed(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    if s.status != "paused":
        return None
    cursor = _later(s.cursor, str(b.get("cursor") or at or s.cursor))
    return replace(s, status="active", paused_reason=None, cursor=cursor)


def _deleted(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    return replace(s, status="deleted", buffered_tick=None)


def _withdrawn(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    text, revision = b.get("tick"), b.get("revision")
    if not isinstance(text, str) or not isinstance(revision, int):
        return None
    # Back to the withdrawal's own time: every tick up to it stays decided, the first one after it is
    # the first withdrawn (or, after a timing change, the new timing's first).
    tick, cursor = parse_iso(text), parse_iso(s.cursor)
    assert tick is not None and cursor is not None
    moment = parse_iso(at) if at else None
    back = tick - _TINY if moment is None else min(moment, tick - _TINY)
    until = text if s.revision_until is None else _later(s.revision_until, text)
    return replace(
        s, cursor=iso(back) if back < cursor else s.cursor, revision=revision, revision_until=until
    )


def _fired(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    tick, trigger = b.get("tick"), b.get("trigger")
    if not isinstance(tick, str):
        return None
    own = trigger in OWN_TRIGGERS
    if own and not s.active:
        return None
    changes: dict[str, Any] = {
        "counts": replace(s.counts, fired=s.counts.fired + 1),
        "last_outcome": Outcome("fired", tick, at, str(b.get("jobId")), str(trigger)),
    }
    if trigger == "buffered":
        changes["buffered_tick"] = None
    if trigger != "backfill":
        changes["last_job_id"] = qualify(s.organization_id, str(b.get("jobId")))
    if trigger == "schedule":
        changes["cursor"] = _later(s.cursor, tick)
    return replace(s, **changes)


def _missed(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    last, count = b.get("lastTick"), b.get("count")
    if not s.active or not isinstance(last, str) or not isinstance(count, int):
        return None
    cursor = _later(s.cursor, str(b.get("cursor") or last))
    outcome = Outcome("missed", last, at, None, b.get("reason"))
    return replace(
        s, cursor=cursor, counts=replace(s.counts, missed=s.counts.missed + count), last_outcome=outcome
    )


def _skipped(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    tick = b.get("tick")
    # An operator's trigger is decided whatever the status; the schedule's own ticks only when active.
    if not isinstance(tick, str) or (not s.active and b.get("trigger") != "trigger"):
        return None
    outcome = Outcome("skipped", tick, at, b.get("activeJobId"), b.get("reason"))
    cursor = s.cursor if b.get("trigger") == "trigger" else _later(s.cursor, tick)
    return replace(
        s, cursor=cursor, counts=replace(s.counts, skipped=s.counts.skipped + 1), last_outcome=outcome
    )


def _buffered(s: Schedule, b: Mapping[str, Any], at: str | None) -> Schedule | None:
    tick = b.get("tick")
    if not s.active or not isinstance(tick, str) or s.buffered_tick is not None:
        return None
    outcome = Outcome("buffered", tick, at, b.get("activeJobId"), None)
    return replace(
        s,
        cursor=_later(s.cursor, tick),
        buffered_tick=tick,
        counts=replace(s.counts, buffered=s.counts.buffered + 1),
        last_outcome=outcome,
    )


_HANDLERS = {
    "schedule.updated": _updated,
    "schedule.paused": _paused,
    "schedule.resumed": _resumed,
    "schedule.deleted": _deleted,
    "schedule.fired": _fired,
    "schedule.missed": _missed,
    "schedule.skipped": _skipped,
    "schedule.buffered": _buffered,
    "schedule.withdrawn": _withdrawn,
}
