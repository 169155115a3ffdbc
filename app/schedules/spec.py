"""A schedule's declaration, validated: when it ticks, the job each tick enqueues, and its policies.

Pure and complete before anything is written: every refusal is a ``ValidationError`` naming the
field (``job.payload.kind``, ``cron``, ``timeZone`` ...) and, for a closed set, the allowed values.
The job template is checked by the job validation itself, so a schedule can never hold a job the
enqueue endpoint would refuse.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from app.jobs.delay import parse_run_at
from app.jobs.errors import ValidationError
from app.jobs.ids import ORGANIZATION_ID_PATTERN, ORGANIZATION_ID_RULE
from app.jobs.times import iso
from app.jobs.validation import EnqueueRequest, validate_enqueue
from app.jobs.vocab import DEFAULT_LANE, MAX_ATTEMPTS_DEFAULT
from app.schedules.ticks import DEFAULT_ZONE, Timing, TimingError, check_cron, zone_of
from app.schedules.vocab import (
    CATCHUP_WINDOW_DEFAULT_MS,
    CATCHUP_WINDOW_MAX_MS,
    CATCHUP_WINDOW_MIN_MS,
    DEFAULT_OVERLAP,
    INTERVAL_MAX_MS,
    INTERVAL_MIN_MS,
    JITTER_MAX_MS,
    OVERLAPS,
    SCHEDULE_ID_PATTERN,
    SCHEDULE_ID_RULE,
    SOURCES,
)

# What a declaration may say (PATCH: any of the mutable ones).
SPEC_FIELDS: Final = (
    "cron",
    "intervalMs",
    "timeZone",
    "job",
    "overlap",
    "catchupWindowMs",
    "jitterMs",
    "startAt",
    "endAt",
    "description",
)
CREATE_FIELDS: Final = ("scheduleId", *SPEC_FIELDS, "paused")
# A template is a job the enqueue endpoint takes, minus what only one job can have: its id, a delay,
# and a singleton mode (the overlap policy is a schedule's singleton rule).
JOB_FIELDS: Final = ("agentId", "payload", "lane", "maxAttempts", "sessionKey")
DESCRIPTION_MAX: Final = 1024


@dataclass(frozen=True)
class JobTemplate:
    """The job each tick enqueues (its id is the tick's: ``<scheduleId>:<tick>``)."""

    agent_id: str
    payload: Mapping[str, Any]
    lane: str = DEFAULT_LANE
    max_attempts: int = MAX_ATTEMPTS_DEFAULT
    session_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "agentId": self.agent_id,
            "payload": dict(self.payload),
            "lane": self.lane,
            "maxAttempts": self.max_attempts,
            "sessionKey": self.session_key,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobTemplate:
        return cls(
            agent_id=str(data.get("agentId", "")),
            payload=dict(data.get("payload") or {}),
            lane=str(data.get("lane") or DEFAULT_LANE),
            max_attempts=int(data.get("maxAttempts") or MAX_ATTEMPTS_DEFAULT),
            session_key=data.get("sessionKey"),
        )

    @property
    def organization_id(self) -> str | None:
        ctx = self.payload.get("authContext")
        org = ctx.get("organizationId") if isinstance(ctx, Mapping) else None
        return org if isinstance(org, str) else None

    def request(self, key: str, available_at: datetime | None) -> EnqueueRequest:
        """The enqueue of one tick's job, under its storage key."""
        return EnqueueRequest(
            agent_id=self.agent_id,
            payload=dict(self.payload),
            lane=self.lane,
            max_attempts=self.max_attempts,
            session_key=self.session_key,
            key=key,
            run_at=available_at,
        )


@dataclass(frozen=True)
class Spec:
    """A schedule's declaration: what its ``schedule.created`` / ``schedule.updated`` receipts carry."""

    job: JobTemplate
    cron: str | None = None
    interval_ms: int | None = None
    time_zone: str = DEFAULT_ZONE
    overlap: str = DEFAULT_OVERLAP
    catchup_window_ms: int = CATCHUP_WINDOW_DEFAULT_MS
    jitter_ms: int = 0
    start_at: str | None = None
    end_at: str | None = None
    description: str | None = None
    source: str = "api"

    @functools.cached_property
    def timing(self) -> Timing:  # cached: a pass asks for it several times per schedule
        return Timing(
            cron=self.cron,
            interval_ms=self.interval_ms,
            zone=self.time_zone,
            start_at=parse_run_at(self.start_at, "startAt") if self.start_at else None,
            end_at=parse_run_at(self.end_at, "endAt") if self.end_at else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cron": self.cron,
            "intervalMs": self.interval_ms,
            "timeZone": self.time_zone,
            "job": self.job.to_json(),
            "overlap": self.overlap,
            "catchupWindowMs": self.catchup_window_ms,
            "jitterMs": self.jitter_ms,
            "startAt": self.start_at,
            "endAt": self.end_at,
            "description": self.description,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spec:
        return cls(
            job=JobTemplate.from_json(data.get("job") or {}),
            cron=data.get("cron"),
            interval_ms=data.get("intervalMs"),
            time_zone=str(data.get("timeZone") or DEFAULT_ZONE),
            overlap=str(data.get("overlap") or DEFAULT_OVERLAP),
            catchup_window_ms=int(data.get("catchupWindowMs") or CATCHUP_WINDOW_DEFAULT_MS),
            jitter_ms=int(data.get("jitterMs") or 0),
            start_at=data.get("startAt"),
            end_at=data.get("endAt"),
            description=data.get("description"),
            source=str(data.get("source") or "api"),
        )

    def timing_changed(self, other: Spec) -> bool:
        """Whether ``other`` ticks at other times (its cursor then restarts from the change)."""
        return (self.cron, self.interval_ms, self.time_zone, self.start_at, self.end_at) != (
            other.cron,
            other.interval_ms,
            other.time_zone,
            other.start_at,
            other.end_at,
        )


@dataclass(frozen=True)
class Declared:
    """A validated create: the schedule's id, organisation, declaration and whether it starts paused."""

    schedule_id: str
    organization_id: str
    spec: Spec
    paused: bool = False


# -- validation ------------------------------------------------------------------------------------


def check_schedule_id(value: Any, field: str = "scheduleId") -> str:
    if not isinstance(value, str) or not SCHEDULE_ID_PATTERN.fullmatch(value):
        raise ValidationError(field, SCHEDULE_ID_RULE)
    return value


def _int(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(name, f"must be an integer from {low} to {high} (milliseconds)")
    return value


def _time(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    return None if value is None else iso(parse_run_at(value, name))


def _template(raw: Any, default_auth: Mapping[str, Any] | None) -> JobTemplate:
    if not isinstance(raw, Mapping):
        raise ValidationError("job", "is required: an object with agentId and payload (a job template)")
    unknown = sorted(set(raw) - set(JOB_FIELDS))
    if unknown:
        raise ValidationError(f"job.{unknown[0]}", "is not a field of a job template", allowed=JOB_FIELDS)
    payload = raw.get("payload")
    if isinstance(payload, Mapping) and payload.get("authContext") is None and default_auth is not None:
        payload = {**payload, "authContext": dict(default_auth)}
    body = {k: v for k, v in raw.items() if k != "agentId"}
    body["payload"] = payload
    try:
        req = validate_enqueue(raw.get("agentId"), body)
    except ValidationError as exc:
        # The job validation names its own fields: say where they sit in a schedule.
        raise ValidationError(f"job.{exc.field}", exc.reason, allowed=exc.allowed) from None
    return JobTemplate(req.agent_id, req.payload, req.lane, req.max_attempts, req.session_key)


def validate_spec(
    body: Mapping[str, Any], *, default_auth: Mapping[str, Any] | None = None, source: str = "api"
) -> Spec:
    """Check a declaration (the create body's, or an update merged onto the current one)."""
    unknown = sorted(set(body) - set(SPEC_FIELDS))
    if unknown:
        raise ValidationError(unknown[0], "is not a field of a schedule", allowed=SPEC_FIELDS)
    cron, interval = body.get("cron"), body.get("intervalMs")
    if (cron is None) == (interval is None):
        raise ValidationError("cron", "give cron or intervalMs (exactly one)")
    checked_cron: str | None = None
    if cron is not None:
        if not isinstance(cron, str) or len(cron) > 256:
            raise ValidationError("cron", "must be a string (a cron expression)")
        try:
            checked_cron = check_cron(cron)
        except TimingError as exc:
            raise ValidationError("cron", str(exc)) from None
    interval_ms = None
    if interval is not None:
        interval_ms = _int(body, "intervalMs", 0, INTERVAL_MIN_MS, INTERVAL_MAX_MS)
        if interval_ms % 1000:
            raise ValidationError("intervalMs", "must be a whole number of seconds (a multiple of 1000)")
    zone = body.get("timeZone") or DEFAULT_ZONE
    if not isinstance(zone, str):
        raise ValidationError("timeZone", "must be an IANA time zone name (e.g. UTC, Europe/Paris)")
    try:
        zone_of(zone)
    except TimingError as exc:
        raise ValidationError("timeZone", str(exc)) from None
    overlap = body.get("overlap") or DEFAULT_OVERLAP
    if overlap not in OVERLAPS:
        raise ValidationError("overlap", "is not an overlap policy", allowed=OVERLAPS)
    catchup = _int(
        body, "catchupWindowMs", CATCHUP_WINDOW_DEFAULT_MS, CATCHUP_WINDOW_MIN_MS, CATCHUP_WINDOW_MAX_MS
    )
    jitter = _int(body, "jitterMs", 0, 0, JITTER_MAX_MS)
    start_at, end_at = _time(body, "startAt"), _time(body, "endAt")
    if start_at is not None and end_at is not None and end_at <= start_at:
        raise ValidationError("endAt", "must be after startAt")
    description = body.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > DESCRIPTION_MAX):
        raise ValidationError("description", f"must be a string of at most {DESCRIPTION_MAX} characters")
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {SOURCES}")
    return Spec(
        job=_template(body.get("job"), default_auth),
        cron=checked_cron,
        interval_ms=interval_ms,
        time_zone=zone,
        overlap=overlap,
        catchup_window_ms=catchup,
        jitter_ms=jitter,
        start_at=start_at,
        end_at=end_at,
        description=description,
        source=source,
    )


def validate_create(
    body: Any, *, default_auth: Mapping[str, Any] | None = None, source: str = "api"
) -> Declared:
    """Check a create body: ``scheduleId``, the declaration, ``paused``; the organisation is the job
    template's ``authContext.organizationId`` (``default_auth`` fills a template without one)."""
    if not isinstance(body, Mapping):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(body) - set(CREATE_FIELDS))
    if unknown:
        raise ValidationError(unknown[0], "is not a field of a schedule", allowed=CREATE_FIELDS)
    schedule_id = check_schedule_id(body.get("scheduleId"))
    paused = body.get("paused", False)
    if paused is None:
        paused = False
    if not isinstance(paused, bool):
        raise ValidationError("paused", "must be true or false")
    spec = validate_spec(
        {k: v for k, v in body.items() if k not in ("scheduleId", "paused")},
        default_auth=default_auth,
        source=source,
    )
    org = spec.job.organization_id
    if org is None:
        # A kind that takes no authContext (the system's own) still belongs to an organisation here.
        if default_auth is None or not isinstance(default_auth.get("organizationId"), str):
            raise ValidationError(
                "job.payload.authContext", "must name the organisation the schedule belongs to"
            )
        org = str(default_auth["organizationId"])
    if not ORGANIZATION_ID_PATTERN.fullmatch(org):
        raise ValidationError("job.payload.authContext.organizationId", ORGANIZATION_ID_RULE)
    return Declared(schedule_id, org, spec, paused)


def merged(current: Spec, patch: Any) -> dict[str, Any]:
    """An update's body merged onto the current declaration: a field given replaces the current one
    (``null`` clears it; ``job`` is replaced whole), so switching cron for an interval is
    ``{"intervalMs": 60000, "cron": null}``."""
    if not isinstance(patch, Mapping):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(patch) - set(SPEC_FIELDS))
    if unknown:
        raise ValidationError(unknown[0], "is not a field an update may change", allowed=SPEC_FIELDS)
    base = current.to_json()
    base.pop("source", None)
    return {**base, **patch}
