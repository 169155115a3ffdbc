"""The schemas of objectives (the Factory): launch and replan requests, the objective list's query,
the objective and its tasks as responses show them, and the events that follow one live.

Shape only; ``app.factory.plan.validate_objective`` applies the graph rules (cycles, unknown
dependencies, duplicate ids, the task cap, kinds, the job validation of each task payload).
"""

from __future__ import annotations

from api.schemas.base import (
    ANY,
    LIST_LIMIT_DEFAULT,
    REASON_MAX,
    RECORD_ORGANIZATION_ID,
    STREAM_DESCRIPTION,
    TIME,
    Schema,
    ref,
    sse_event,
    string_enum,
    text,
)
from api.schemas.jobs import LIST_JOBS_QUERY
from api.schemas.payload import AUTH_CONTEXT
from app.factory.vocab import (
    EXECUTION_PATHS,
    FAILURE_POLICIES,
    GOAL_MAX,
    OBJECTIVE_STATUSES,
    TASK_STATUSES,
    TITLE_MAX,
)

# An objective in a list carries its tasks (up to 1 000 each): pages stay smaller than job pages.
OBJECTIVE_LIMIT_MAX = 100


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
        "executionPath": string_enum(EXECUTION_PATHS, nullable=True),
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
        "title": text(TITLE_MAX),
        "goal": text(GOAL_MAX),
        "plan": {
            "type": "object",
            "properties": {"tasks": {"type": "array", "items": PLAN_TASK}},
            "required": ["tasks"],
            "additionalProperties": False,
        },
        "failurePolicy": string_enum(FAILURE_POLICIES, nullable=True),
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
        "reason": text(REASON_MAX, nullable=True, non_blank=False),
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
        "result": ANY,
        "error": ANY,
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
        "organizationId": RECORD_ORGANIZATION_ID,
        "stream": {"type": "string", "description": STREAM_DESCRIPTION},
        "title": {"type": "string"},
        "goal": {"type": "string"},
        "status": {"type": "string", "enum": list(OBJECTIVE_STATUSES)},
        "phase": {"type": "integer"},
        "failurePolicy": {"type": "string", "enum": list(FAILURE_POLICIES)},
        "tasks": {"type": "array", "items": ref("ObjectiveTask")},
        "audit": {"description": "The terminal audit report, once the objective ended and was audited."},
        "ledger": {
            "type": ["object", "null"],
            "description": "GET only: the durable ledger's summary (workflows; activities by status and "
            "total duration); null when the ledger could not be read.",
        },
        "createdAt": TIME,
        "updatedAt": TIME,
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
    "properties": {"objective": ref("Objective"), "async": ref("ObjectiveAsync")},
    "required": ["objective", "async"],
}

OBJECTIVE_RESPONSE: Schema = {
    "type": "object",
    "properties": {"objective": ref("Objective")},
    "required": ["objective"],
}

OBJECTIVE_PAGE: Schema = {
    "type": "object",
    "properties": {
        "objectives": {"type": "array", "items": ref("Objective")},
        "nextCursor": {"type": ["string", "null"]},
    },
    "required": ["objectives", "nextCursor"],
}

OBJECTIVE_ID_PARAM: Schema = {"type": "string", "minLength": 1, "maxLength": 56}

LIST_OBJECTIVES_QUERY: Schema = {
    "type": "object",
    "properties": {
        "status": string_enum(OBJECTIVE_STATUSES),
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
        "updatedAt": TIME,
        "tasks": {"type": "array", "items": ref("ObjectiveTask")},
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
    "properties": {"tasks": {"type": "array", "items": ref("ObjectiveTask")}},
    "required": ["tasks"],
}
_OBJECTIVE_TASK_EVENT: Schema = sse_event(
    "task", "ObjectiveTasksChanged", "The live running overlay (event: task, no id: the resume point stays)."
)
_OBJECTIVE_TASK_EVENT["required"] = ["event", "data"]
OBJECTIVE_EVENT: Schema = {
    "description": "First `event: objective` (id: the objective's seq): the whole objective, GET's shape "
    "without `ledger`, live overlay included. Then `event: delta` (id: seq), one per objective receipt, "
    "and `event: task` (no id) when a task's job starts running. Apply them to the snapshot.",
    "oneOf": [
        sse_event("objective", "Objective", "The snapshot: the objective now (event: objective, id: seq)."),
        sse_event("delta", "ObjectiveDelta", "One objective receipt's changes (event: delta, id: seq)."),
        _OBJECTIVE_TASK_EVENT,
    ],
}
