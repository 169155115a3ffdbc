"""Validation of an enqueue request: pure, and complete before anything is written.

Every rejection is a ``ValidationError`` naming the field and, where there is a closed set,
the allowed values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from app.jobs.delay import DELAY_MS_FIELD, RUN_AT_FIELD, check_delay_ms, parse_run_at
from app.jobs.errors import ValidationError
from app.jobs.flow import DEBOUNCE_FIELD, DEBOUNCE_WITH_DELAY_RULE, FLOW_FIELDS, PLAIN, Flow, validate_flow
from app.jobs.ids import (
    JOB_ID_PATTERN,
    ORGANIZATION_ID_PATTERN,
    ORGANIZATION_ID_RULE,
    RESERVED_JOB_ID_SHAPES,
    reserved_shape,
)
from app.jobs.kinds import KINDS_WITHOUT_AUTH_CONTEXT, PAYLOAD_KINDS
from app.jobs.tags import TAGS_FIELD, validate_tags
from app.jobs.vocab import (
    AUTH_CONTEXT_OPTIONAL,
    AUTH_CONTEXT_REQUIRED,
    COMMAND_LANES,
    COMMAND_TYPES,
    DEFAULT_LANE,
    DEFAULT_SINGLETON_MODE,
    LANES,
    MAX_ATTEMPTS_DEFAULT,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    SINGLETON_MODES,
    CommandLane,
)

ENQUEUE_FIELDS = (
    "jobId",
    "lane",
    "payload",
    "sessionKey",
    "singletonMode",
    "maxAttempts",
    RUN_AT_FIELD,
    DELAY_MS_FIELD,
    TAGS_FIELD,
    *FLOW_FIELDS,
)
AGENT_ID_MAX = 256
SESSION_KEY_MAX = 512


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated enqueue: every field present, defaults applied, maxAttempts clamped."""

    agent_id: str
    payload: Mapping[str, Any]
    job_id: str | None = None
    lane: str = DEFAULT_LANE
    session_key: str | None = None
    singleton_mode: str = DEFAULT_SINGLETON_MODE
    max_attempts: int = MAX_ATTEMPTS_DEFAULT
    # The storage key, for an id the system derives (a Factory task, control or audit job, a
    # watchdog tick): already qualified, used as it is. A client's request never sets it; its
    # ``job_id`` is qualified with its organisation instead (``app.jobs.ids``).
    key: str | None = None
    # A delayed job (``app.jobs.delay``): not delivered before ``run_at``, or ``delay_ms`` after the
    # enqueue (database clock). At most one of the two is set.
    run_at: datetime | None = None
    delay_ms: int | None = None
    # The W3C trace context the job belongs to, when the caller decides it (an objective's task
    # jobs are children of the objective's); None: the context the enqueue runs in
    # (app.tracing.carrier), if any.
    trace_context: Mapping[str, str] | None = None
    # Tags to find the job by (``app.jobs.tags``), kept in job.enqueued; a replay names its source.
    tags: Mapping[str, str] = field(default_factory=dict)
    replay_of: str | None = None
    # What the dispatch pass weighs beside the organisation (``app.jobs.flow``).
    flow: Flow = PLAIN

    @property
    def organization_id(self) -> str | None:
        ctx = self.payload.get("authContext")
        return ctx.get("organizationId") if isinstance(ctx, Mapping) else None


def clamp_max_attempts(value: int) -> int:
    """Spec: ``maxAttempts`` defaults to 2 and is clamped to the range 1..8."""
    return max(MAX_ATTEMPTS_MIN, min(MAX_ATTEMPTS_MAX, value))


def _opt_str(body: Mapping[str, Any], name: str, max_len: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(name, "must be a non-empty string")
    if len(value) > max_len:
        raise ValidationError(name, f"must be at most {max_len} characters")
    return value


def _check_finite(value: Any, path: str) -> None:
    # NaN and Infinity are not JSON: they would make a receipt's canonical encoding fail later.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(path, "must be a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_finite(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{path}[{i}]")


def validate_auth_context(kind: str, ctx: Any) -> None:
    """Every kind but ``factory.objective.watchdog`` needs ``userId`` and ``organizationId``."""
    if ctx is None:
        if kind in KINDS_WITHOUT_AUTH_CONTEXT:
            return
        raise ValidationError(
            "payload.authContext",
            f"is required for kind {kind} and must carry userId and organizationId",
        )
    if not isinstance(ctx, Mapping):
        raise ValidationError("payload.authContext", "must be an object")
    for name in AUTH_CONTEXT_REQUIRED:
        value = ctx.get(name)
        required = kind not in KINDS_WITHOUT_AUTH_CONTEXT or value is not None
        if required and (not isinstance(value, str) or not value.strip()):
            raise ValidationError(f"payload.authContext.{name}", "is required and must be a non-empty string")
    org = ctx.get("organizationId")
    if isinstance(org, str) and not ORGANIZATION_ID_PATTERN.fullmatch(org):
        raise ValidationError("payload.authContext.organizationId", ORGANIZATION_ID_RULE)
    for name in AUTH_CONTEXT_OPTIONAL:
        value = ctx.get(name)
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"payload.authContext.{name}", "must be a string")
    unknown = sorted(set(ctx) - set(AUTH_CONTEXT_REQUIRED) - set(AUTH_CONTEXT_OPTIONAL))
    if unknown:
        raise ValidationError(
            f"payload.authContext.{unknown[0]}",
            "is not a known field",
            allowed=AUTH_CONTEXT_REQUIRED + AUTH_CONTEXT_OPTIONAL,
        )


def validate_enqueue(agent_id: Any, body: Any) -> EnqueueRequest:
    """Check a raw enqueue body; return the request with defaults applied."""
    if not isinstance(agent_id, str) or not agent_id.strip() or len(agent_id) > AGENT_ID_MAX:
        raise ValidationError("agentId", f"must be a non-empty string of at most {AGENT_ID_MAX} characters")
    if not isinstance(body, Mapping):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(body) - set(ENQUEUE_FIELDS))
    if unknown:
        raise ValidationError(unknown[0], "is not a known field", allowed=ENQUEUE_FIELDS)

    job_id = body.get("jobId")
    # fullmatch, not match: the pattern's `$` also matches before a trailing newline.
    if job_id is not None and (not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id)):
        raise ValidationError(
            "jobId",
            "must be 1-128 characters of letters, digits, '.', '_', ':' or '-', starting with a "
            "letter or digit",
        )
    shape = reserved_shape(job_id) if job_id is not None else None
    if shape is not None:
        raise ValidationError(
            "jobId",
            f"has the shape {shape}, which only the system derives for its own jobs; "
            f"reserved shapes: {', '.join(s for s, _ in RESERVED_JOB_ID_SHAPES)}",
        )

    lane = body.get("lane", DEFAULT_LANE)
    if lane is None:
        lane = DEFAULT_LANE
    if lane not in LANES:
        raise ValidationError("lane", "is not a lane", allowed=LANES)

    payload = body.get("payload")
    if not isinstance(payload, Mapping):
        raise ValidationError("payload", "is required and must be an object with a kind")
    kind = payload.get("kind")
    if not isinstance(kind, str) or kind not in PAYLOAD_KINDS:
        raise ValidationError("payload.kind", "is not a payload kind", allowed=PAYLOAD_KINDS)
    validate_auth_context(kind, payload.get("authContext"))
    _check_finite(payload, "payload")

    session_key = _opt_str(body, "sessionKey", SESSION_KEY_MAX)

    mode = body.get("singletonMode", DEFAULT_SINGLETON_MODE)
    if mode is None:
        mode = DEFAULT_SINGLETON_MODE
    if mode not in SINGLETON_MODES:
        raise ValidationError("singletonMode", "is not a singleton mode", allowed=SINGLETON_MODES)
    if mode != "allow" and session_key is None:
        raise ValidationError("sessionKey", f"is required when singletonMode is {mode}")

    attempts = body.get("maxAttempts", MAX_ATTEMPTS_DEFAULT)
    if attempts is None:
        attempts = MAX_ATTEMPTS_DEFAULT
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise ValidationError(
            "maxAttempts", f"must be an integer (clamped to {MAX_ATTEMPTS_MIN}..{MAX_ATTEMPTS_MAX})"
        )

    run_at, delay_ms = _delay(body)
    tags = validate_tags(body.get(TAGS_FIELD))
    flow = validate_flow(body)
    if flow.debounce is not None and (run_at is not None or delay_ms is not None):
        raise ValidationError(DEBOUNCE_FIELD, DEBOUNCE_WITH_DELAY_RULE)

    return EnqueueRequest(
        agent_id=agent_id,
        payload=dict(payload),
        job_id=job_id,
        lane=lane,
        session_key=session_key,
        singleton_mode=mode,
        max_attempts=clamp_max_attempts(attempts),
        run_at=run_at,
        delay_ms=delay_ms,
        tags=tags,
        flow=flow,
    )


def command_lane(type_: str, lane: Any) -> CommandLane | None:
    """The lane a queue command of ``type_`` is sent on (spec: "the queue-command lanes are steer and
    follow_up only"): a steer or follow-up on the lane it names, by default the one its type names;
    an abort on none (it stops the job whatever it is doing), so naming one is refused."""
    if type_ not in COMMAND_TYPES:
        raise ValidationError("type", "is not a queue command type", allowed=COMMAND_TYPES)
    if type_ == "abort":
        if lane is not None:
            raise ValidationError("lane", "is not taken by an abort: it stops the job on every lane")
        return None
    if lane is None:
        lane = type_
    if lane not in COMMAND_LANES:
        raise ValidationError("lane", "is not a queue-command lane", allowed=COMMAND_LANES)
    return cast(CommandLane, lane)


def steer_lane(posted: str) -> CommandLane:
    """The lane of the steer a ``singletonMode: steer`` enqueue sends: the lane it was posted with
    when that is a command lane, else ``steer`` (a chat or collect post has no command lane)."""
    return cast(CommandLane, posted) if posted in COMMAND_LANES else "steer"


def _delay(body: Mapping[str, Any]) -> tuple[datetime | None, int | None]:
    """``runAt`` or ``delayMs`` (null is the same as absent); both at once is refused."""
    raw_at, raw_delay = body.get(RUN_AT_FIELD), body.get(DELAY_MS_FIELD)
    if raw_at is not None and raw_delay is not None:
        raise ValidationError(RUN_AT_FIELD, f"give {RUN_AT_FIELD} or {DELAY_MS_FIELD}, not both")
    run_at = parse_run_at(raw_at) if raw_at is not None else None
    delay_ms = check_delay_ms(raw_delay) if raw_delay is not None else None
    return run_at, delay_ms
