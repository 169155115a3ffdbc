"""Replaying a terminal job: a new job with the same (or an edited) payload, linked both ways.

The new job's ``job.enqueued`` names its source (``replayOf``) and the source's stream gets a
``job.replayed`` receipt naming the new job (``replayedAs``), in one transaction. The new job is
in the source's organisation, on the source's agent, lane, session key and attempt budget, with
the source's tags and flow fields (priority, concurrency key and limit, debounce) unless the request
gives its own; singleton modes are not replayed (a replay never cancels or steers a session's jobs).

Its id is the request's ``jobId``, or derived from the source's key and a replay key (default
``1``), so a retried request names the same job and gets it back instead of a second one. A second,
deliberate replay of the same job takes another replay key (or id).

A job of an objective (its payload names ``objectiveId``: a task, a control step, an audit, a
monitor) is never replayed around the objective's control: its replay is the objective's replan.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from app.jobs.errors import ConflictError, ValidationError
from app.jobs.flow import CONCURRENCY_KEY_FIELD, CONCURRENCY_LIMIT_FIELD, FLOW_FIELDS
from app.jobs.ids import SYSTEM_ORGANIZATION
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest, validate_enqueue

REPLAY_KEY_DEFAULT: Final = "1"
REPLAY_KEY_MAX: Final = 64
REPLAY_KEY_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
REPLAY_KEY_RULE: Final = (
    f"must be 1-{REPLAY_KEY_MAX} characters of letters, digits, '.', '_', ':' or '-', starting with a "
    "letter or digit"
)
# A derived id: ``replay-`` and 32 hex digits of SHA-256 over the source's key and the replay key.
DERIVED_PREFIX: Final = "replay-"


class NotReplayable(ConflictError):
    """The source cannot be replayed here (not terminal, or an objective's job)."""


def derived_id(source_key: str, replay_key: str) -> str:
    """The client id of the replay of ``source_key`` under ``replay_key`` (deterministic)."""
    digest = hashlib.sha256(f"{source_key}\x00{replay_key}".encode()).hexdigest()
    return DERIVED_PREFIX + digest[:32]


def check_replay_key(value: Any, field: str = "replayKey") -> str:
    if value is None:
        return REPLAY_KEY_DEFAULT
    if not isinstance(value, str) or not REPLAY_KEY_PATTERN.fullmatch(value):
        raise ValidationError(field, REPLAY_KEY_RULE)
    return value


def objective_of(job: Job) -> str | None:
    """The objective a job belongs to (its payload's ``objectiveId``), if any."""
    objective = job.payload.get("objectiveId")
    return objective if isinstance(objective, str) else None


def refuse_unless_replayable(job: Job) -> None:
    """409 for a job that may not be replayed: one of an objective (its replan replays it), or one
    that has not ended."""
    objective = objective_of(job)
    if objective is not None:
        raise NotReplayable(
            f"job {job.client_id} belongs to objective {objective}: it is replayed through the "
            f"objective's control, never around it: replan it (POST /objectives/{objective}/plan)"
        )
    if not job.terminal:
        raise NotReplayable(
            f"job {job.client_id} is {job.status}: only a completed, failed or canceled job is replayed"
        )


def replay_request(
    source: Job,
    *,
    job_id: str | None = None,
    replay_key: str | None = None,
    payload: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    flow: Mapping[str, Any] | None = None,
) -> EnqueueRequest:
    """The enqueue of ``source``'s replay, checked as any enqueue (400 naming the field); the caller
    checks the right to post it (an edited payload may run a command) and its organisation.

    ``flow``: the flow fields the request gives (``app.jobs.flow``), each replacing the source's (a
    null clears it); the others are the source's."""
    if job_id is None:
        job_id = derived_id(source.id, check_replay_key(replay_key))
    elif replay_key is not None:
        raise ValidationError("replayKey", "give jobId or replayKey, not both")
    body: dict[str, Any] = {
        "jobId": job_id,
        "lane": source.lane,
        "payload": dict(payload if payload is not None else source.payload),
        "sessionKey": source.session_key,
        "maxAttempts": source.max_attempts,
        "tags": dict(tags) if tags is not None else (dict(source.tags) or None),
        **replayed_flow(source, flow or {}),
    }
    if payload is not None and "objectiveId" in payload:
        raise ValidationError(
            "payload.objectiveId", "is not taken by a replay: an objective's jobs run under its control"
        )
    req = validate_enqueue(source.agent_id, body)
    if (req.organization_id or SYSTEM_ORGANIZATION) != (source.organization_id or SYSTEM_ORGANIZATION):
        raise ValidationError(
            "payload.authContext.organizationId",
            "must stay the replayed job's organisation: a replay never leaves its organisation",
        )
    return replace(req, replay_of=source.id)


def replayed_flow(source: Job, given: Mapping[str, Any]) -> dict[str, Any]:
    """The flow fields of ``source``'s replay: the source's, each one ``given`` replaced. A new key
    does not inherit the old key's limit: that limit bounded another set of jobs."""
    unknown = sorted(set(given) - set(FLOW_FIELDS))
    if unknown:
        raise ValueError(f"not flow fields: {unknown}")
    kept = source.flow.to_body()
    if CONCURRENCY_KEY_FIELD in given and CONCURRENCY_LIMIT_FIELD not in given:
        kept.pop(CONCURRENCY_LIMIT_FIELD, None)
    return {**kept, **given}
