"""A job's receipt timeline for the dashboard: the stream folded one receipt at a time.

Pure: receipts in, entries out. Each entry says what the receipt was (enqueued, lease,
heartbeat, progress, command, settlement, expiry), its time, attempt and worker, and whether
the reducer *applied* it — a superseded attempt's heartbeat or a second lease is inert, and
the dashboard shows that rather than hiding it. Runs of applied heartbeats from one attempt are
collapsed into one entry (a long job heartbeats hundreds of times).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.jobs.errors import InvariantError
from app.jobs.reducer import Job, Receipt, applies, reduce

# The timeline's phases, in lifecycle order (used as CSS classes and legend).

_PHASE_OF = {
    "job.enqueued": "enqueued",
    "job.leased": "lease",
    "job.heartbeat": "heartbeat",
    "job.progress": "progress",
    "queue.command": "command",
    "queue.command.consumed": "command",
    "job.completed": "settlement",
    "job.failed": "settlement",
    "job.canceled": "settlement",
    "job.lease_expired": "expiry",
    "job.released": "expiry",
}


@dataclass(frozen=True)
class Entry:
    """One row of the timeline (``count`` > 1 for a collapsed run of heartbeats)."""

    seq: int
    type: str
    phase: str
    at: str | None
    applied: bool
    status_after: str | None
    attempt: int | None = None
    worker_id: str | None = None
    title: str = ""
    # Label → value pairs worth showing (error, result, reason, progress, command payload...).
    details: Mapping[str, Any] = field(default_factory=dict)
    count: int = 1
    last_at: str | None = None
    last_seq: int | None = None


def _title(type_: str, body: Mapping[str, Any], before: Job | None, after: Job | None) -> str:
    if type_ == "job.enqueued":
        return f"enqueued for {body.get('agentId', '?')} on lane {body.get('lane', '?')}"
    if type_ == "job.leased":
        return f"leased, attempt {body.get('attempt', '?')}"
    if type_ == "job.heartbeat":
        return "heartbeat"
    if type_ == "job.progress":
        return "progress"
    if type_ == "queue.command":
        lane = body.get("lane")
        return f"command {body.get('type', '?')}" + (f" on lane {lane}" if lane else "")
    if type_ == "queue.command.consumed":
        return "command consumed"
    if type_ == "job.completed":
        return "completed"
    if type_ == "job.canceled":
        return "canceled"
    if type_ == "job.lease_expired":
        return "lease expired"
    if type_ == "job.released":
        return f"handed back ({body.get('reason', '?')}), not charged"
    if type_ == "job.failed":
        if after is not None and after.status == "queued":
            return "failed, will retry"
        return "failed"
    return type_


def _details(type_: str, body: Mapping[str, Any]) -> dict[str, Any]:
    keys: tuple[str, ...]
    if type_ == "job.enqueued":
        keys = ("kind", "sessionKey", "singletonMode", "maxAttempts")
        out = {k: body[k] for k in keys if body.get(k) is not None}
        payload = body.get("payload")
        if isinstance(payload, Mapping) and payload.get("kind") is not None:
            out["kind"] = payload["kind"]
        return out
    keys = {
        "job.leased": ("expiresAt",),
        "job.heartbeat": ("expiresAt",),
        "job.progress": ("progress",),
        "queue.command": ("type", "lane", "reason", "payload", "commandId"),
        "queue.command.consumed": ("commandId",),
        "job.completed": ("result",),
        "job.failed": ("error", "status", "retryable", "retryAt", "result"),
        "job.canceled": ("reason", "replacedBy"),
        "job.lease_expired": ("error", "expiresAt"),
        "job.released": ("reason",),
        "job.replayed": ("replayedAs",),
        "job.archived": ("operationId",),
    }.get(type_, ())
    return {k: body[k] for k in keys if k in body and body[k] is not None}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def build(receipts: Iterable[Receipt]) -> tuple[list[Entry], Job | None]:
    """Fold ``receipts`` (one job's stream, in order) into timeline entries and the final state."""
    entries: list[Entry] = []
    state: Job | None = None
    for r in receipts:
        before = state
        try:
            state = reduce(state, r)
        except InvariantError:
            # A stream that breaks the fold is shown, not hidden: the row says so.
            entries.append(
                Entry(r.seq, r.type, "other", r.at, False, None, title=f"{r.type} (breaks the fold)")
            )
            continue
        body = r.body
        applied = applies(before, r)
        attempt = _int(body.get("attempt"))
        worker = body.get("workerId")
        if r.type == "job.leased" and applied and state is not None:
            attempt = state.attempt
        entry = Entry(
            seq=r.seq,
            type=r.type,
            phase=_PHASE_OF.get(r.type, "other"),
            at=r.at,
            applied=applied,
            status_after=state.status if state is not None else None,
            attempt=attempt,
            worker_id=str(worker) if worker is not None else None,
            title=_title(r.type, body, before, state),
            details=_details(r.type, body),
        )
        previous = entries[-1] if entries else None
        if (
            previous is not None
            and entry.type == "job.heartbeat"
            and previous.type == "job.heartbeat"
            and previous.applied == entry.applied
            and previous.attempt == entry.attempt
            and previous.worker_id == entry.worker_id
        ):
            entries[-1] = replace(
                previous,
                count=previous.count + 1,
                last_at=entry.at,
                last_seq=entry.seq,
                status_after=entry.status_after,
                details=entry.details,
            )
            continue
        entries.append(entry)
    return entries, state
