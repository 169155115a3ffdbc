"""JSON Schemas of the schedule endpoints: the requests they validate and the responses they document.

Like ``api.schemas``: one object both validates (``api.inputs``) and documents (``api.openapi``).
Closed vocabularies come from ``app.schedules.vocab``. The schemas check shape;
``app.schedules.spec`` applies the rules a schema cannot state (a cron expression croniter runs, an
IANA zone that exists, a job template the job validation accepts) and names the field it refuses.
"""

from __future__ import annotations

from typing import Any

from api.schemas.base import NO_NUL, NON_BLANK, Schema
from api.schemas.payload import PAYLOAD
from app.jobs.delay import RUN_AT_MAX_CHARS
from app.jobs.validation import AGENT_ID_MAX, SESSION_KEY_MAX
from app.jobs.vocab import LANES, STATUSES
from app.schedules.spec import DESCRIPTION_MAX
from app.schedules.vocab import (
    CATCHUP_WINDOW_MAX_MS,
    CATCHUP_WINDOW_MIN_MS,
    EVENT_TYPES,
    FIRE_TRIGGERS,
    INTERVAL_MAX_MS,
    INTERVAL_MIN_MS,
    JITTER_MAX_MS,
    OVERLAPS,
    SCHEDULE_ID_PATTERN,
    SCHEDULE_STATUSES,
    SOURCES,
    TICK_EVENTS,
)
from app.storage.queue import CURSOR_PATTERN

LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 200
FIRES_LIMIT_DEFAULT = 50
FIRES_LIMIT_MAX = 500
SEQ_MAX = 2**31 - 1
REASON_MAX = 4096


def _job_ref() -> Schema:
    return {"$ref": "#/components/schemas/Job"}


def _nullable(schema: Schema) -> Schema:
    kind = schema.get("type", "string")
    return {**schema, "type": [kind, "null"] if isinstance(kind, str) else [*kind, "null"]}


_TIME: Schema = {"type": "string", "format": "date-time", "maxLength": RUN_AT_MAX_CHARS}
_TEXT: Schema = {"type": "string", "pattern": NON_BLANK}

# -- requests ---------------------------------------------------------------------------------------

# A template's payload: a job's, except that authContext may be left out (the token's is filled in).
TEMPLATE_PAYLOAD: Schema = {k: v for k, v in PAYLOAD.items() if k not in ("if", "then")}

JOB_TEMPLATE: Schema = {
    "type": "object",
    "description": "The job each tick enqueues, as POST /agents/<agentId>/jobs takes it (its id is the "
    "tick's, <scheduleId>:<tick>; a template takes no jobId, delay or singletonMode). A payload "
    "without authContext gets the token's organisation.",
    "properties": {
        "agentId": {"type": "string", "minLength": 1, "maxLength": AGENT_ID_MAX, "pattern": NON_BLANK},
        "payload": TEMPLATE_PAYLOAD,
        "lane": {"type": ["string", "null"], "enum": [*LANES, None]},
        "maxAttempts": {"type": ["integer", "null"], "description": "Clamped to 1..8; default 2."},
        "sessionKey": _nullable({**_TEXT, "maxLength": SESSION_KEY_MAX}),
    },
    "required": ["agentId", "payload"],
    "additionalProperties": False,
}

_SPEC_PROPERTIES: dict[str, Schema] = {
    "cron": {
        "type": ["string", "null"],
        "maxLength": 256,
        "pattern": NO_NUL,
        "description": "5 fields (minute hour day-of-month month day-of-week), 6 with a leading seconds "
        "field (`*/10 * * * * *`), or @hourly, @daily, @weekly, @monthly, @yearly; in timeZone. Not "
        "with intervalMs.",
    },
    "intervalMs": {
        "type": ["integer", "null"],
        "minimum": INTERVAL_MIN_MS,
        "maximum": INTERVAL_MAX_MS,
        "multipleOf": 1000,
        "description": "A tick every this many milliseconds (whole seconds), aligned to the Unix "
        "epoch in UTC. Not with cron.",
    },
    "timeZone": {
        "type": ["string", "null"],
        "maxLength": 64,
        "pattern": NO_NUL,
        "description": "The IANA zone the cron's wall clock is read in (default UTC). Daylight saving: "
        "a tick in a skipped hour fires once, at the end of the gap; a tick in a repeated hour fires "
        "once, at its first occurrence.",
    },
    "job": JOB_TEMPLATE,
    "overlap": {
        "type": ["string", "null"],
        "enum": [*OVERLAPS, None],
        "description": "While the previous job is still active: allow (fire anyway), skip (default), "
        "bufferOne (fire once it ends; one tick kept), cancelPrevious (cancel it, then fire).",
    },
    "catchupWindowMs": {
        "type": ["integer", "null"],
        "minimum": CATCHUP_WINDOW_MIN_MS,
        "maximum": CATCHUP_WINDOW_MAX_MS,
        "description": "After downtime, missed ticks at most this old fire once each, in order; older "
        "ones are recorded missed (default 60000).",
    },
    "jitterMs": {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": JITTER_MAX_MS,
        "description": "Each tick's job waits a delay of 0..jitterMs, the same every time for that tick.",
    },
    "startAt": _nullable({**_TIME, "description": "No tick before this time."}),
    "endAt": _nullable({**_TIME, "description": "No tick after this time."}),
    "description": _nullable({"type": "string", "maxLength": DESCRIPTION_MAX, "pattern": NO_NUL}),
}

_EXACTLY_ONE_TIMING: Schema = {
    "oneOf": [
        {
            "properties": {"cron": {"type": "string"}},
            "required": ["cron"],
            "not": {"properties": {"intervalMs": {"type": "integer"}}, "required": ["intervalMs"]},
        },
        {
            "properties": {"intervalMs": {"type": "integer"}},
            "required": ["intervalMs"],
            "not": {"properties": {"cron": {"type": "string"}}, "required": ["cron"]},
        },
    ]
}

SCHEDULE_CREATE: Schema = {
    "type": "object",
    "title": "ScheduleRequest",
    "properties": {
        "scheduleId": {
            "type": "string",
            "pattern": SCHEDULE_ID_PATTERN.pattern,
            "description": "Unique in the organisation: re-posting an existing one returns it unchanged.",
        },
        **_SPEC_PROPERTIES,
        "paused": {"type": ["boolean", "null"], "description": "Declare it paused (default false)."},
    },
    "required": ["scheduleId", "job"],
    "additionalProperties": False,
    **_EXACTLY_ONE_TIMING,
}

SCHEDULE_PATCH: Schema = {
    "type": "object",
    "title": "ScheduleUpdate",
    "description": "The fields to change; null clears one, job is replaced whole. Switching cron for an "
    'interval: {"intervalMs": 60000, "cron": null}. A change of when it ticks restarts it from now.',
    "properties": _SPEC_PROPERTIES,
    "additionalProperties": False,
}

REASON_REQUEST: Schema = {
    "type": "object",
    "properties": {"reason": {"type": ["string", "null"], "maxLength": REASON_MAX, "pattern": NO_NUL}},
    "additionalProperties": False,
}

NO_BODY: Schema = {"type": "object", "properties": {}, "additionalProperties": False}

TRIGGER_REQUEST: Schema = {
    "type": "object",
    "properties": {
        "overlap": {
            "type": ["string", "null"],
            "enum": [*OVERLAPS, None],
            "description": "This trigger's policy (default the schedule's); a trigger is never buffered.",
        }
    },
    "additionalProperties": False,
}

BACKFILL_REQUEST: Schema = {
    "type": "object",
    "properties": {"startAt": _TIME, "endAt": _TIME},
    "required": ["startAt", "endAt"],
    "additionalProperties": False,
    "description": "Every tick in [startAt, endAt] fired once (at most 1000; endAt not after now), under "
    "the ids the schedule's own ticks use: a tick whose job exists is left as it is.",
}

SCHEDULE_ID_PARAM: Schema = {"type": "string", "minLength": 1, "pattern": NO_NUL}

LIST_SCHEDULES_QUERY: Schema = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": list(SCHEDULE_STATUSES)},
        "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": LIST_LIMIT_DEFAULT},
        "cursor": {
            "type": "string",
            "pattern": CURSOR_PATTERN,
            "description": "nextCursor from the previous page.",
        },
        "organizationId": {
            "type": "string",
            "maxLength": 256,
            "pattern": NON_BLANK,
            "description": "System tokens only: list one organisation (default: all).",
        },
    },
}

FIRES_QUERY: Schema = {
    "type": "object",
    "properties": {
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": FIRES_LIMIT_MAX,
            "default": FIRES_LIMIT_DEFAULT,
        },
        "before": {
            "type": "integer",
            "minimum": 1,
            "maximum": SEQ_MAX,
            "description": "Only tick receipts before this seq (nextBefore of the previous page).",
        },
    },
}

# -- responses --------------------------------------------------------------------------------------

_OUTCOME: Schema = {
    "type": ["object", "null"],
    "properties": {
        "type": {"type": "string", "enum": [t.removeprefix("schedule.") for t in TICK_EVENTS]},
        "tick": {"type": "string", "format": "date-time"},
        "at": {"type": ["string", "null"], "format": "date-time"},
        "jobId": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
    },
    "required": ["type", "tick", "at", "jobId", "reason"],
}

SCHEDULE: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "organizationId": {"type": "string"},
        "stream": {"type": "string", "description": "schedules/<organizationId>/<id>"},
        "status": {"type": "string", "enum": list(SCHEDULE_STATUSES)},
        "pausedReason": {"type": ["string", "null"]},
        "cron": {"type": ["string", "null"]},
        "intervalMs": {"type": ["integer", "null"]},
        "timeZone": {"type": "string"},
        "job": {"type": "object"},
        "overlap": {"type": "string", "enum": list(OVERLAPS)},
        "catchupWindowMs": {"type": "integer"},
        "jitterMs": {"type": "integer"},
        "startAt": {"type": ["string", "null"], "format": "date-time"},
        "endAt": {"type": ["string", "null"], "format": "date-time"},
        "description": {"type": ["string", "null"]},
        "source": {"type": "string", "enum": list(SOURCES)},
        "nextFireAt": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "The next tick to decide; null when paused, deleted or past endAt.",
        },
        "bufferedTick": {"type": ["string", "null"], "format": "date-time"},
        "lastJobId": {"type": ["string", "null"]},
        "lastOutcome": _OUTCOME,
        "counts": {
            "type": "object",
            "properties": {k: {"type": "integer"} for k in ("fired", "missed", "skipped", "buffered")},
            "required": ["fired", "missed", "skipped", "buffered"],
        },
        "createdAt": {"type": "string", "format": "date-time"},
        "updatedAt": {"type": "string", "format": "date-time"},
        "seq": {"type": "integer"},
    },
    "required": [
        "id",
        "organizationId",
        "stream",
        "status",
        "cron",
        "intervalMs",
        "timeZone",
        "job",
        "overlap",
        "catchupWindowMs",
        "jitterMs",
        "nextFireAt",
        "lastOutcome",
        "counts",
        "createdAt",
        "updatedAt",
        "seq",
    ],
}

SCHEDULE_RESPONSE: Schema = {"type": "object", "properties": {"schedule": SCHEDULE}, "required": ["schedule"]}

SCHEDULE_PAGE: Schema = {
    "type": "object",
    "properties": {
        "schedules": {"type": "array", "items": SCHEDULE},
        "nextCursor": {"type": ["string", "null"]},
    },
    "required": ["schedules", "nextCursor"],
}

TRIGGER_RESPONSE: Schema = {
    "type": "object",
    "properties": {
        "outcome": {"type": "string", "enum": ["fired", "skipped"]},
        "job": {"oneOf": [_job_ref(), {"type": "null"}]},
        "schedule": SCHEDULE,
    },
    "required": ["outcome", "job", "schedule"],
}

BACKFILL_RESPONSE: Schema = {
    "type": "object",
    "properties": {
        "created": {"type": "array", "items": _job_ref(), "description": "The jobs this backfill made."},
        "existing": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The ids of ticks whose job was there already (left as they are).",
        },
        "schedule": SCHEDULE,
    },
    "required": ["created", "existing", "schedule"],
}

FIRE: Schema = {
    "type": "object",
    "description": "One tick receipt: fired (tick, jobId, trigger, lateMs, or aheadMs when decided before "
    "its tick; its job as it is now), missed (firstTick, lastTick, count), skipped (tick, reason, "
    "activeJobId), buffered (tick) or withdrawn (tick, jobId, reason: a tick decided ahead that a "
    "pause, change or delete took back before it came; its job, canceled).",
    "properties": {
        "seq": {"type": "integer"},
        "type": {"type": "string", "enum": [t for t in EVENT_TYPES if t in TICK_EVENTS]},
        "at": {"type": "string", "format": "date-time"},
        "tick": {"type": ["string", "null"], "format": "date-time"},
        "trigger": {"type": ["string", "null"], "enum": [*FIRE_TRIGGERS, None]},
        "jobId": {"type": ["string", "null"]},
        "existing": {"type": "boolean"},
        "lateMs": {"type": ["integer", "null"]},
        "aheadMs": {"type": ["integer", "null"], "description": "How long before its tick it was decided."},
        "reason": {"type": ["string", "null"]},
        "firstTick": {"type": ["string", "null"], "format": "date-time"},
        "lastTick": {"type": ["string", "null"], "format": "date-time"},
        "count": {"type": ["integer", "null"]},
        "jobStatus": {"type": ["string", "null"], "enum": [*STATUSES, None]},
        "job": {"oneOf": [_job_ref(), {"type": "null"}]},
    },
    "required": ["seq", "type", "at", "tick", "jobId", "job"],
}

FIRES_PAGE: Schema = {
    "type": "object",
    "properties": {
        "fires": {"type": "array", "items": FIRE},
        "nextBefore": {
            "type": ["integer", "null"],
            "description": "Pass as ?before= for older receipts; null when this page is the end.",
        },
    },
    "required": ["fires", "nextBefore"],
}


def body_of(receipt_body: dict[str, Any]) -> dict[str, Any]:
    """The fields of a tick receipt a fire shows (the rest are bookkeeping)."""
    keys = (
        "tick",
        "trigger",
        "jobId",
        "existing",
        "lateMs",
        "aheadMs",
        "reason",
        "firstTick",
        "lastTick",
        "count",
    )
    return {k: receipt_body.get(k) for k in keys if k in receipt_body}
