"""JSON Schemas (2020-12, as OpenAPI 3.1 uses) for every request and response of the API.

These objects are the single source for both request validation (``api.inputs``) and the
OpenAPI document (``api.openapi``): nothing is written twice, so the two cannot drift. Every
closed vocabulary comes from ``app.jobs.vocab``. Request schemas are self-contained (no ``$ref``)
so they validate on their own; response schemas may ``$ref`` the document's components.

The schemas check shape; ``app.jobs.validation`` still applies the deeper rules (and is the
authority if the two ever disagree — a request must pass both before anything is written).
"""

from __future__ import annotations

import re
from typing import Any

from app.factory.vocab import (
    EXECUTION_PATHS,
    FAILURE_POLICIES,
    GOAL_MAX,
    OBJECTIVE_STATUSES,
    TASK_STATUSES,
    TITLE_MAX,
)
from app.jobs.ids import JOB_ID_PATTERN, ORGANIZATION_ID_PATTERN, SYSTEM_ORGANIZATION
from app.jobs.kinds import KINDS_WITHOUT_AUTH_CONTEXT, PAYLOAD_KINDS
from app.jobs.privilege import TOKEN_SCOPES
from app.jobs.validation import AGENT_ID_MAX, SESSION_KEY_MAX
from app.jobs.vocab import (
    AUTH_CONTEXT_OPTIONAL,
    AUTH_CONTEXT_REQUIRED,
    COMMAND_LANES,
    COMMAND_TYPES,
    LANES,
    SINGLETON_MODES,
    STATUSES,
)
from app.storage.queue import CURSOR_PATTERN

Schema = dict[str, Any]

# The projection's column for an organisation id is 256 characters; longer could never be stored.
ORG_ID_MAX = 256
# An organisation a client may name (app.jobs.ids), and one a system token may act in: those or
# the system's own.
ORGANIZATION_ID: Schema = {"type": "string", "pattern": ORGANIZATION_ID_PATTERN.pattern}
SCOPE_ORGANIZATION_PARAM: Schema = {
    "type": "string",
    "pattern": f"^(?:{re.escape(SYSTEM_ORGANIZATION)}|{ORGANIZATION_ID_PATTERN.pattern[1:-1]})$",
    "description": "Act in this organisation: a system token's way to name another one (any other "
    "token may name only its own). Default: the token's own organisation.",
}


# The query parameter a route naming one job or objective takes to act in another organisation.
ORGANIZATION_PARAM = "organizationId"


def scoped_query(query: Schema | None) -> Schema:
    """``query`` (or none) plus ``organizationId``: the query of a route naming one job or objective."""
    base = query or {"type": "object", "properties": {}}
    return {
        **base,
        "properties": {**base.get("properties", {}), ORGANIZATION_PARAM: SCOPE_ORGANIZATION_PARAM},
    }


TEXT_MAX = 256
REASON_MAX = 4096
LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 500
# An objective in a list carries its tasks (up to 1 000 each): pages stay smaller than job pages.
OBJECTIVE_LIMIT_MAX = 100
RECEIPTS_LIMIT_DEFAULT = 100
RECEIPTS_LIMIT_MAX = 1000
# Stream positions are 32-bit integers in the database.
SEQ_MAX = 2**31 - 1
# Every string the API reads — body values and keys, path and query parameters — is refused when
# it holds U+0000 (api.jsonbody: PostgreSQL text and jsonb cannot store it). The document says so
# with these patterns, so a client (or a fuzzer) that follows the document is never refused.
NO_NUL = r"^[^\u0000]*$"
NON_BLANK = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
MAX_JSON_DEPTH = 64  # api.jsonbody.MAX_DEPTH, stated in the document's descriptions


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _text(max_length: int = TEXT_MAX, *, nullable: bool = False, non_blank: bool = True) -> Schema:
    schema: Schema = {"type": ["string", "null"] if nullable else "string", "maxLength": max_length}
    schema["pattern"] = NON_BLANK if non_blank else NO_NUL
    return schema


def _enum(values: tuple[str, ...], *, nullable: bool = False) -> Schema:
    if nullable:
        return {"type": ["string", "null"], "enum": [*values, None]}
    return {"type": "string", "enum": list(values)}


# -- requests ---------------------------------------------------------------------------------

# Free-form JSON inside a request (a payload's own fields, a command's payload). Validation lets
# any value through here — api.jsonbody.check_storable enforces the text and depth rules first —
# while the document replaces this object with a $ref to the precise, recursive "JsonValue".
JSON_VALUE: Schema = {
    "description": "Any JSON value whose strings and object keys contain no U+0000, nested at most "
    f"{MAX_JSON_DEPTH} levels."
}
JSON_VALUE_COMPONENT: Schema = {
    "description": JSON_VALUE["description"],
    "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
        },
    ],
}

AUTH_CONTEXT: Schema = {
    "type": "object",
    "description": "Who the job acts for. organizationId must be the caller's organisation.",
    "properties": {
        "userId": _text(),
        "organizationId": ORGANIZATION_ID,
        **{name: _text(2048, nullable=True, non_blank=False) for name in AUTH_CONTEXT_OPTIONAL},
    },
    "additionalProperties": False,
}

_KINDS_NEEDING_AUTH = [kind for kind in PAYLOAD_KINDS if kind not in KINDS_WITHOUT_AUTH_CONTEXT]

PAYLOAD: Schema = {
    "type": "object",
    "description": f"The job's input: a kind (one of the {len(PAYLOAD_KINDS)}) and any kind-specific fields.",
    "properties": {
        "kind": _enum(PAYLOAD_KINDS),
        "authContext": {**AUTH_CONTEXT, "type": ["object", "null"]},
    },
    "required": ["kind"],
    "propertyNames": {"pattern": NO_NUL},
    "additionalProperties": JSON_VALUE,
    # Spec: every kind except factory.objective.watchdog needs authContext with userId and
    # organizationId; the watchdog may omit it. (Conditioned on the known kinds, so an unknown
    # kind is reported as the kind error — listing every kind — not as a missing authContext.)
    "if": {"properties": {"kind": {"enum": _KINDS_NEEDING_AUTH}}, "required": ["kind"]},
    "then": {
        "required": ["authContext"],
        "properties": {"authContext": {"type": "object", "required": list(AUTH_CONTEXT_REQUIRED)}},
    },
}

ENQUEUE_REQUEST: Schema = {
    "type": "object",
    "title": "EnqueueRequest",
    "properties": {
        "jobId": {
            "type": ["string", "null"],
            "pattern": JOB_ID_PATTERN.pattern,
            "description": "Idempotency key: re-posting an existing jobId returns that job unchanged.",
        },
        "lane": _enum(LANES, nullable=True),
        "payload": PAYLOAD,
        "sessionKey": _text(SESSION_KEY_MAX, nullable=True),
        "singletonMode": _enum(SINGLETON_MODES, nullable=True),
        "maxAttempts": {"type": ["integer", "null"], "description": "Clamped to 1..8; default 2."},
    },
    "required": ["payload"],
    "additionalProperties": False,
    # singletonMode cancel and steer act on a session: they need its key.
    "if": {"properties": {"singletonMode": {"enum": ["cancel", "steer"]}}, "required": ["singletonMode"]},
    "then": {"required": ["sessionKey"], "properties": {"sessionKey": {"type": "string"}}},
}

COMMAND_REQUEST: Schema = {
    "type": "object",
    "title": "CommandRequest",
    "properties": {
        "type": _enum(COMMAND_TYPES),
        "lane": {
            **_enum(COMMAND_LANES, nullable=True),
            "description": "The queue-command lane of a steer or follow_up (default: the one its type "
            "names); an abort takes none.",
        },
        "payload": JSON_VALUE,
        "reason": _text(REASON_MAX, nullable=True, non_blank=False),
    },
    "required": ["type"],
    "additionalProperties": False,
    # An abort stops the job on every lane: it takes none.
    "if": {"properties": {"type": {"const": "abort"}}, "required": ["type"]},
    "then": {
        "properties": {
            "lane": {"type": "null", "x-message": "is not taken by an abort: it stops the job on every lane"}
        }
    },
}

CANCEL_REQUEST: Schema = {
    "type": "object",
    "title": "CancelRequest",
    "properties": {"reason": _text(REASON_MAX, nullable=True, non_blank=False)},
    "additionalProperties": False,
}

AGENT_ID_PARAM: Schema = {"type": "string", "minLength": 1, "maxLength": AGENT_ID_MAX, "pattern": NON_BLANK}
JOB_ID_PARAM: Schema = {"type": "string", "minLength": 1, "pattern": NO_NUL}
STREAM_PARAM: Schema = {
    "type": "string",
    "minLength": 1,
    "pattern": NO_NUL,
    "description": "e.g. jobs/<jobId>",
}


# Query parameters: one object schema per operation; integers are coerced from text first.
LIST_JOBS_QUERY: Schema = {
    "type": "object",
    "properties": {
        "status": _enum(STATUSES),
        "agentId": _text(AGENT_ID_MAX),
        "lane": _enum(LANES),
        "sessionKey": _text(SESSION_KEY_MAX),
        "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": LIST_LIMIT_DEFAULT},
        "cursor": {
            "type": "string",
            "pattern": CURSOR_PATTERN,
            "description": "nextCursor from the previous page: the position after it, "
            "`<createdAt in microseconds since the epoch>.<jobId>`. Anything of another shape is not "
            "a cursor this server issues and is refused with 400.",
        },
        "organizationId": {
            **_text(ORG_ID_MAX),
            "description": "System tokens only: list one organisation (default: all).",
        },
    },
}

RECEIPTS_QUERY: Schema = {
    "type": "object",
    "properties": {
        "after": {
            "type": "integer",
            "minimum": 0,
            "maximum": SEQ_MAX,
            "default": 0,
            "description": "Return receipts with seq greater than this.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": RECEIPTS_LIMIT_MAX,
            "default": RECEIPTS_LIMIT_DEFAULT,
        },
    },
}

EVENTS_QUERY: Schema = {
    "type": "object",
    "properties": {
        "after": {
            "type": "integer",
            "minimum": 0,
            "maximum": SEQ_MAX,
            "default": 0,
            "description": "Resume after this seq (the Last-Event-ID header wins when both are sent).",
        },
    },
}

# A seq as decimal text, 0 .. 2**31-1 (SEQ_MAX) — the pattern spells the bound out, digit by digit.
SEQ_TEXT_PATTERN = (
    r"^(?:[0-9]{1,9}|[01][0-9]{9}|20[0-9]{8}|21[0-3][0-9]{7}|214[0-6][0-9]{6}|2147[0-3][0-9]{5}"
    r"|21474[0-7][0-9]{4}|214748[0-2][0-9]{3}|2147483[0-5][0-9]{2}|21474836[0-3][0-9]|214748364[0-7])$"
)
LAST_EVENT_ID_HEADER: Schema = {
    "type": "string",
    "pattern": SEQ_TEXT_PATTERN,
    "description": f"The seq of the last event received (0..{SEQ_MAX}).",
}

# -- responses --------------------------------------------------------------------------------

_ANY: Schema = {}
_TIME: Schema = {"type": ["string", "null"], "format": "date-time"}
_ORGANIZATION_ID: Schema = {
    "type": ["string", "null"],
    "description": "The organisation it belongs to: its id is unique within that organisation only "
    "(null only for the system's own records written before ids were qualified).",
}
_STREAM_DESCRIPTION = (
    "Its receipt stream: jobs/<organizationId>/<id> or objectives/<organizationId>/<id> "
    "(records written before ids were qualified keep jobs/<id>)."
)

LEASE: Schema = {
    "type": ["object", "null"],
    "properties": {
        "workerId": {"type": "string"},
        "attempt": {"type": "integer"},
        "expiresAt": _TIME,
    },
    "required": ["workerId", "attempt", "expiresAt"],
}

COMMAND: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string"},
        "lane": {
            "type": "string",
            "enum": list(COMMAND_LANES),
            "description": "The lane a steer or follow_up was sent on (absent for an abort).",
        },
        "payload": _ANY,
        "reason": {"type": ["string", "null"]},
        "at": _TIME,
        "consumed": {"type": "boolean"},
        "fromSessionKey": {"type": ["string", "null"]},
        "fromEnqueue": {"type": "boolean"},
        "fromJobId": {
            "type": ["string", "null"],
            "description": "The jobId of the steer enqueue that sent this command (its idempotency key).",
        },
    },
    "required": ["id", "type", "payload", "reason", "at", "consumed"],
}

ROUTE: Schema = {
    "type": "object",
    "description": "Where the job is delivered (agent id first, kind second) beside its kind contract.",
    "properties": {
        "workerGroup": {"type": "string"},
        "queue": {"type": "string"},
        "contractWorkerGroup": {"type": ["string", "null"]},
        "agreesWithContract": {"type": "boolean"},
    },
    "required": ["workerGroup", "queue", "contractWorkerGroup", "agreesWithContract"],
}

JOB: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "agentId": {"type": "string"},
        "lane": {"type": "string", "enum": list(LANES)},
        "status": {"type": "string", "enum": list(STATUSES)},
        "payload": {"type": "object"},
        "sessionKey": {"type": ["string", "null"]},
        "singletonMode": {"type": "string", "enum": list(SINGLETON_MODES)},
        "maxAttempts": {"type": "integer"},
        "attempt": {"type": "integer"},
        "lease": _ref("Lease"),
        "abortRequested": {"type": "boolean"},
        "commands": {"type": "array", "items": _ref("Command")},
        "progress": _ANY,
        "result": _ANY,
        "error": _ANY,
        "createdAt": _TIME,
        "updatedAt": _TIME,
        "availableAt": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "A retry's earliest redelivery (its backoff), or null.",
        },
        "organizationId": _ORGANIZATION_ID,
        "stream": {"type": "string", "description": _STREAM_DESCRIPTION},
        "seq": {"type": "integer", "description": "The last receipt folded into this state."},
        "route": _ref("Route"),
        "enqueuedBy": {
            "type": ["object", "null"],
            "description": "Who posted the job, as the server authenticated it (never taken from the "
            "request); null for a job written by another path.",
            "properties": {
                "tokenId": {"type": ["string", "null"]},
                "scopes": {"type": "array", "items": {"type": "string", "enum": list(TOKEN_SCOPES)}},
                "system": {"type": "boolean"},
            },
            "required": ["tokenId", "scopes", "system"],
        },
    },
    "required": [
        "id",
        "agentId",
        "lane",
        "status",
        "payload",
        "sessionKey",
        "singletonMode",
        "maxAttempts",
        "attempt",
        "lease",
        "abortRequested",
        "commands",
        "result",
        "error",
        "createdAt",
        "updatedAt",
        "availableAt",
        "organizationId",
        "stream",
        "seq",
        "route",
        "enqueuedBy",
    ],
}

ASYNC_BLOCK: Schema = {
    "type": "object",
    "properties": {
        "jobId": {"type": "string"},
        "stream": {"type": "string"},
        "jobEventsUrl": {"type": "string"},
        "receiptEventsUrl": {"type": "string"},
        "status": {"type": "string", "enum": list(STATUSES)},
    },
    "required": ["jobId", "stream", "jobEventsUrl", "receiptEventsUrl", "status"],
}

ENQUEUE_RESPONSE: Schema = {
    "type": "object",
    "properties": {"job": _ref("Job"), "async": _ref("Async")},
    "required": ["job", "async"],
}

JOB_RESPONSE: Schema = {"type": "object", "properties": {"job": _ref("Job")}, "required": ["job"]}

JOB_PAGE: Schema = {
    "type": "object",
    "properties": {
        "jobs": {"type": "array", "items": _ref("Job")},
        "nextCursor": {"type": ["string", "null"]},
    },
    "required": ["jobs", "nextCursor"],
}

RECEIPT: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "stream": {"type": "string"},
        "seq": {"type": "integer"},
        "type": {"type": "string"},
        "body": {"type": "object"},
        "at": {"type": "string", "format": "date-time"},
        "prevHash": {"type": ["string", "null"]},
        "hash": {"type": "string"},
    },
    "required": ["id", "stream", "seq", "type", "body", "at", "prevHash", "hash"],
}

RECEIPT_PAGE: Schema = {
    "type": "object",
    "properties": {
        "stream": {"type": "string"},
        "receipts": {"type": "array", "items": _ref("Receipt")},
        "nextAfter": {
            "type": ["integer", "null"],
            "description": "Pass as ?after= for the next page; null when this page is the end.",
        },
    },
    "required": ["stream", "receipts", "nextAfter"],
}

ERROR: Schema = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
            "required": ["code", "message"],
            "additionalProperties": False,
        },
    },
    "required": ["error"],
    "additionalProperties": False,
}

HEALTH: Schema = {"type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}

WHOAMI: Schema = {
    "type": "object",
    "description": "Who the request's token stands for (never its secret).",
    "properties": {
        "organizationId": {
            "type": ["string", "null"],
            "description": "The token's organisation: the authContext.organizationId its jobs carry. "
            "null for the anonymous caller of RECEIPT_AUTH=disabled.",
        },
        "tokenId": {"type": ["string", "null"], "description": "The token's id (null when anonymous)."},
        "system": {"type": "boolean", "description": "A system token acts for any organisation."},
        "scopes": {"type": "array", "items": {"type": "string", "enum": list(TOKEN_SCOPES)}},
    },
    "required": ["organizationId", "tokenId", "system", "scopes"],
    "additionalProperties": False,
}

READY: Schema = {
    "type": "object",
    "properties": {
        "database": {"const": "ok"},
        "broker": {"const": "ok"},
        "wake": {"const": "ok"},
        "loops": {"const": "ok"},
        "loopRuns": {
            "type": "object",
            "description": "Each recovery loop's last run; a loop is overdue past 3 intervals.",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "lastRun": {"type": ["string", "null"], "format": "date-time"},
                    "ageMs": {"type": ["integer", "null"]},
                    "intervalMs": {"type": "integer"},
                    "overdue": {"type": "boolean"},
                },
                "required": ["lastRun", "ageMs", "intervalMs", "overdue"],
            },
        },
    },
    "required": ["database", "broker", "wake", "loops", "loopRuns"],
}


def _event(name: str, data: str, description: str) -> Schema:
    """One Server-Sent Event as OpenAPI 3.1 describes an event-stream item: its fields as strings."""
    return {
        "type": "object",
        "description": description + " Comment lines (`: heartbeat`) keep idle connections open; "
        "resume with the Last-Event-ID header.",
        "properties": {
            "event": {"const": name},
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The receipt's seq."},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref(data)},
            "retry": {"type": "integer"},
        },
        "required": ["event", "id", "data"],
    }


JOB_EVENT: Schema = _event("job", "Job", "The job's state after one receipt (event: job, id: seq).")
RECEIPT_EVENT: Schema = _event("receipt", "Receipt", "One raw receipt (event: receipt, id: seq).")

# -- objectives (the Factory) --------------------------------------------------------------------
# Shape only; app.factory.plan.validate_objective applies the graph rules (cycles, unknown
# dependencies, duplicate ids, the task cap, kinds, the job validation of each task payload).

PLAN_TASK: Schema = {
    "type": "object",
    "description": "One task: a job of its own once its dependencies completed.",
    "properties": {
        "id": {
            "type": "string",
            "description": "Unique in the plan; 1-56 of letters, digits, '.', '_', '-'.",
        },
        "agentId": {"type": ["string", "null"], "description": "Default codex."},
        "payload": {
            "type": ["object", "null"],
            "description": "The job payload; kind defaults to factory.task.run. authContext, objectiveId, "
            "taskId, phase and inputs (each dependency's result) are set by the objective.",
        },
        "dependsOn": {"type": ["array", "null"], "items": {"type": "string"}},
        "maxAttempts": {"type": ["integer", "null"]},
        "executionPath": _enum(EXECUTION_PATHS, nullable=True),
    },
    "required": ["id"],
    "additionalProperties": False,
}

OBJECTIVE_REQUEST: Schema = {
    "type": "object",
    "title": "ObjectiveRequest",
    "properties": {
        "objectiveId": {
            "type": ["string", "null"],
            "description": "Idempotency key: re-posting an existing objectiveId returns it unchanged.",
        },
        "title": _text(TITLE_MAX),
        "goal": _text(GOAL_MAX),
        "plan": {
            "type": "object",
            "properties": {"tasks": {"type": "array", "items": PLAN_TASK}},
            "required": ["tasks"],
            "additionalProperties": False,
        },
        "failurePolicy": _enum(FAILURE_POLICIES, nullable=True),
        "authContext": {**AUTH_CONTEXT, "type": ["object", "null"]},
    },
    "required": ["title", "goal", "plan"],
    "additionalProperties": False,
}

REPLAN_REQUEST: Schema = {
    "type": "object",
    "title": "ReplanRequest",
    "description": "Phase n+1's plan: validated as at launch; task ids must be new to the objective.",
    "properties": {
        "tasks": {"type": "array", "items": PLAN_TASK},
        "reason": _text(REASON_MAX, nullable=True, non_blank=False),
    },
    "required": ["tasks"],
    "additionalProperties": False,
}

OBJECTIVE_TASK: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "agentId": {"type": "string"},
        "kind": {"type": "string"},
        "dependsOn": {"type": "array", "items": {"type": "string"}},
        "status": {"type": "string", "enum": list(TASK_STATUSES)},
        "jobId": {"type": ["string", "null"]},
        "jobStream": {"type": ["string", "null"], "description": "The task's job's receipt stream."},
        "attempt": {"type": "integer"},
        "result": _ANY,
        "error": _ANY,
        "phase": {"type": "integer"},
    },
    "required": [
        "id",
        "agentId",
        "kind",
        "dependsOn",
        "status",
        "jobId",
        "attempt",
        "result",
        "error",
        "phase",
    ],
}

OBJECTIVE: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The objective's id, unique within its organisation."},
        "organizationId": _ORGANIZATION_ID,
        "stream": {"type": "string", "description": _STREAM_DESCRIPTION},
        "title": {"type": "string"},
        "goal": {"type": "string"},
        "status": {"type": "string", "enum": list(OBJECTIVE_STATUSES)},
        "phase": {"type": "integer"},
        "failurePolicy": {"type": "string", "enum": list(FAILURE_POLICIES)},
        "tasks": {"type": "array", "items": _ref("ObjectiveTask")},
        "audit": {"description": "The terminal audit report, once the objective ended and was audited."},
        "ledger": {
            "type": ["object", "null"],
            "description": "GET only: the durable ledger's summary (workflows; activities by status and "
            "total duration); null when the ledger could not be read.",
        },
        "createdAt": _TIME,
        "updatedAt": _TIME,
    },
    "required": [
        "id",
        "organizationId",
        "stream",
        "title",
        "goal",
        "status",
        "phase",
        "failurePolicy",
        "tasks",
        "audit",
        "createdAt",
        "updatedAt",
    ],
}

OBJECTIVE_ASYNC: Schema = {
    "type": "object",
    "properties": {
        "objectiveId": {"type": "string"},
        "stream": {"type": "string"},
        "eventsUrl": {"type": "string"},
    },
    "required": ["objectiveId", "stream", "eventsUrl"],
}

OBJECTIVE_LAUNCH_RESPONSE: Schema = {
    "type": "object",
    "properties": {"objective": _ref("Objective"), "async": _ref("ObjectiveAsync")},
    "required": ["objective", "async"],
}

OBJECTIVE_RESPONSE: Schema = {
    "type": "object",
    "properties": {"objective": _ref("Objective")},
    "required": ["objective"],
}

OBJECTIVE_PAGE: Schema = {
    "type": "object",
    "properties": {
        "objectives": {"type": "array", "items": _ref("Objective")},
        "nextCursor": {"type": ["string", "null"]},
    },
    "required": ["objectives", "nextCursor"],
}

OBJECTIVE_ID_PARAM: Schema = {"type": "string", "minLength": 1, "maxLength": 56}

LIST_OBJECTIVES_QUERY: Schema = {
    "type": "object",
    "properties": {
        "status": _enum(OBJECTIVE_STATUSES),
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": OBJECTIVE_LIMIT_MAX,
            "default": LIST_LIMIT_DEFAULT,
        },
        "cursor": LIST_JOBS_QUERY["properties"]["cursor"],
        "organizationId": LIST_JOBS_QUERY["properties"]["organizationId"],
    },
}

OBJECTIVE_DELTA: Schema = {
    "type": "object",
    "description": "What one objective receipt changed: the receipt's seq and type, the tasks whose "
    "shown state changed (GET's task shape), and status, phase and audit only when they changed.",
    "properties": {
        "seq": {"type": "integer"},
        "type": {"type": "string", "description": "The receipt's type (objective.*)."},
        "updatedAt": _TIME,
        "tasks": {"type": "array", "items": _ref("ObjectiveTask")},
        "status": {"type": "string", "enum": list(OBJECTIVE_STATUSES)},
        "phase": {"type": "integer"},
        "audit": {"description": "The terminal audit report, when this receipt appended it."},
    },
    "required": ["seq", "type", "updatedAt", "tasks"],
}
OBJECTIVE_TASKS_CHANGED: Schema = {
    "type": "object",
    "description": "Tasks whose job's lease changed what GET shows (a queued task's job started "
    "running, or a retry put it back in the queue), with no objective receipt.",
    "properties": {"tasks": {"type": "array", "items": _ref("ObjectiveTask")}},
    "required": ["tasks"],
}
_OBJECTIVE_TASK_EVENT: Schema = _event(
    "task", "ObjectiveTasksChanged", "The live running overlay (event: task, no id: the resume point stays)."
)
_OBJECTIVE_TASK_EVENT["required"] = ["event", "data"]
OBJECTIVE_EVENT: Schema = {
    "description": "First `event: objective` (id: the objective's seq): the whole objective, GET's shape "
    "without `ledger`, live overlay included. Then `event: delta` (id: seq), one per objective receipt, "
    "and `event: task` (no id) when a task's job starts running. Apply them to the snapshot.",
    "oneOf": [
        _event("objective", "Objective", "The snapshot: the objective now (event: objective, id: seq)."),
        _event("delta", "ObjectiveDelta", "One objective receipt's changes (event: delta, id: seq)."),
        _OBJECTIVE_TASK_EVENT,
    ],
}

# The document's components: every named schema, so responses can $ref them.
COMPONENTS: dict[str, Schema] = {
    "Job": JOB,
    "Lease": LEASE,
    "Command": COMMAND,
    "Route": ROUTE,
    "Async": ASYNC_BLOCK,
    "EnqueueRequest": ENQUEUE_REQUEST,
    "EnqueueResponse": ENQUEUE_RESPONSE,
    "JobResponse": JOB_RESPONSE,
    "JobPage": JOB_PAGE,
    "CommandRequest": COMMAND_REQUEST,
    "CancelRequest": CANCEL_REQUEST,
    "Receipt": RECEIPT,
    "ReceiptPage": RECEIPT_PAGE,
    "Error": ERROR,
    "JsonValue": JSON_VALUE_COMPONENT,
    "Health": HEALTH,
    "Ready": READY,
    "WhoAmI": WHOAMI,
    "JobEvent": JOB_EVENT,
    "ReceiptEvent": RECEIPT_EVENT,
    "ObjectiveRequest": OBJECTIVE_REQUEST,
    "ReplanRequest": REPLAN_REQUEST,
    "Objective": OBJECTIVE,
    "ObjectiveTask": OBJECTIVE_TASK,
    "ObjectiveAsync": OBJECTIVE_ASYNC,
    "ObjectiveLaunchResponse": OBJECTIVE_LAUNCH_RESPONSE,
    "ObjectiveResponse": OBJECTIVE_RESPONSE,
    "ObjectivePage": OBJECTIVE_PAGE,
    "ObjectiveEvent": OBJECTIVE_EVENT,
    "ObjectiveDelta": OBJECTIVE_DELTA,
    "ObjectiveTasksChanged": OBJECTIVE_TASKS_CHANGED,
}


def component_name(schema: Schema) -> str | None:
    """The components name of a schema object (by identity), so operations can ``$ref`` it."""
    for name, candidate in COMPONENTS.items():
        if candidate is schema:
            return name
    return None
