"""JSON Schemas (2020-12, as OpenAPI 3.1 uses) for every request and response of the API.

These objects are the single source for both request validation (``api.inputs``) and the
OpenAPI document (``api.openapi``): nothing is written twice, so the two cannot drift. Every
closed vocabulary comes from ``app.jobs.vocab``. Request schemas are self-contained (no ``$ref``)
so they validate on their own; response schemas may ``$ref`` the document's components.

The schemas check shape; ``app.jobs.validation`` still applies the deeper rules (and is the
authority if the two ever disagree — a request must pass both before anything is written).

One module per resource holds its schemas: ``jobs``, ``payload`` (a job's kind and authContext),
``streams`` (receipts and Server-Sent Events), ``objectives`` and ``service`` (health, readiness,
whoami), over ``base`` (the Schema type, limits, patterns and the helpers that build the rest).
This package is their one public face: callers write ``schemas.JOB_RESPONSE`` and never name a
submodule. The split serves whoever edits a resource's schemas; a caller reads them as one
vocabulary, and the components registry below must see every resource anyway, so the package
root imports them all whichever way a caller spelled its import.
"""

from __future__ import annotations

from api.schemas.base import (
    ERROR,
    JSON_VALUE,
    JSON_VALUE_COMPONENT,
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    MAX_JSON_DEPTH,
    NO_NUL,
    NON_BLANK,
    ORG_ID_MAX,
    ORGANIZATION_ID,
    ORGANIZATION_PARAM,
    REASON_MAX,
    SCOPE_ORGANIZATION_PARAM,
    TEXT_MAX,
    Schema,
    scoped_query,
)
from api.schemas.jobs import (
    AGENT_ID_PARAM,
    ARCHIVED_ERROR,
    ARCHIVED_SUMMARY,
    ASYNC_BLOCK,
    BATCH_ENQUEUE_REQUEST,
    BATCH_ENQUEUE_RESPONSE,
    BATCH_ITEM,
    BULK_REQUEST,
    BULK_RESPONSE,
    CANCEL_REQUEST,
    COMMAND,
    COMMAND_REQUEST,
    ENQUEUE_REQUEST,
    ENQUEUE_RESPONSE,
    JOB,
    JOB_ID_PARAM,
    JOB_PAGE,
    JOB_RESPONSE,
    LEASE,
    LIST_JOBS_QUERY,
    REPLAY_REQUEST,
    REPLAY_RESPONSE,
    ROUTE,
)
from api.schemas.objectives import (
    LIST_OBJECTIVES_QUERY,
    OBJECTIVE,
    OBJECTIVE_ASYNC,
    OBJECTIVE_DELTA,
    OBJECTIVE_EVENT,
    OBJECTIVE_ID_PARAM,
    OBJECTIVE_LAUNCH_RESPONSE,
    OBJECTIVE_LIMIT_MAX,
    OBJECTIVE_PAGE,
    OBJECTIVE_REQUEST,
    OBJECTIVE_RESPONSE,
    OBJECTIVE_TASK,
    OBJECTIVE_TASKS_CHANGED,
    PLAN_TASK,
    REPLAN_REQUEST,
)
from api.schemas.payload import AUTH_CONTEXT, PAYLOAD
from api.schemas.service import HEALTH, READY, WHOAMI
from api.schemas.streams import (
    EVENTS_QUERY,
    JOB_EVENT,
    LAST_EVENT_ID_HEADER,
    RECEIPT,
    RECEIPT_EVENT,
    RECEIPT_PAGE,
    RECEIPTS_LIMIT_DEFAULT,
    RECEIPTS_LIMIT_MAX,
    RECEIPTS_QUERY,
    SEQ_MAX,
    SEQ_TEXT_PATTERN,
    STREAM_PARAM,
)

# The document's components: every named schema, so responses can $ref them.
COMPONENTS: dict[str, Schema] = {
    "Job": JOB,
    "Lease": LEASE,
    "Command": COMMAND,
    "Route": ROUTE,
    "Async": ASYNC_BLOCK,
    "EnqueueRequest": ENQUEUE_REQUEST,
    "EnqueueResponse": ENQUEUE_RESPONSE,
    "BatchEnqueueItem": BATCH_ITEM,
    "BatchEnqueueRequest": BATCH_ENQUEUE_REQUEST,
    "BatchEnqueueResponse": BATCH_ENQUEUE_RESPONSE,
    "JobResponse": JOB_RESPONSE,
    "JobPage": JOB_PAGE,
    "CommandRequest": COMMAND_REQUEST,
    "CancelRequest": CANCEL_REQUEST,
    "ReplayRequest": REPLAY_REQUEST,
    "BulkRequest": BULK_REQUEST,
    "BulkResponse": BULK_RESPONSE,
    "ReplayResponse": REPLAY_RESPONSE,
    "Receipt": RECEIPT,
    "ReceiptPage": RECEIPT_PAGE,
    "Error": ERROR,
    "ArchivedError": ARCHIVED_ERROR,
    "Archived": ARCHIVED_SUMMARY,
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


__all__ = [
    "AGENT_ID_PARAM",
    "ARCHIVED_ERROR",
    "ARCHIVED_SUMMARY",
    "ASYNC_BLOCK",
    "AUTH_CONTEXT",
    "BATCH_ENQUEUE_REQUEST",
    "BATCH_ENQUEUE_RESPONSE",
    "BATCH_ITEM",
    "BULK_REQUEST",
    "BULK_RESPONSE",
    "CANCEL_REQUEST",
    "COMMAND",
    "COMMAND_REQUEST",
    "COMPONENTS",
    "ENQUEUE_REQUEST",
    "ENQUEUE_RESPONSE",
    "ERROR",
    "EVENTS_QUERY",
    "HEALTH",
    "JOB",
    "JOB_EVENT",
    "JOB_ID_PARAM",
    "JOB_PAGE",
    "JOB_RESPONSE",
    "JSON_VALUE",
    "JSON_VALUE_COMPONENT",
    "LAST_EVENT_ID_HEADER",
    "LEASE",
    "LIST_JOBS_QUERY",
    "LIST_LIMIT_DEFAULT",
    "LIST_LIMIT_MAX",
    "LIST_OBJECTIVES_QUERY",
    "MAX_JSON_DEPTH",
    "NON_BLANK",
    "NO_NUL",
    "OBJECTIVE",
    "OBJECTIVE_ASYNC",
    "OBJECTIVE_DELTA",
    "OBJECTIVE_EVENT",
    "OBJECTIVE_ID_PARAM",
    "OBJECTIVE_LAUNCH_RESPONSE",
    "OBJECTIVE_LIMIT_MAX",
    "OBJECTIVE_PAGE",
    "OBJECTIVE_REQUEST",
    "OBJECTIVE_RESPONSE",
    "OBJECTIVE_TASK",
    "OBJECTIVE_TASKS_CHANGED",
    "ORGANIZATION_ID",
    "ORGANIZATION_PARAM",
    "ORG_ID_MAX",
    "PAYLOAD",
    "PLAN_TASK",
    "READY",
    "REASON_MAX",
    "RECEIPT",
    "RECEIPTS_LIMIT_DEFAULT",
    "RECEIPTS_LIMIT_MAX",
    "RECEIPTS_QUERY",
    "RECEIPT_EVENT",
    "RECEIPT_PAGE",
    "REPLAN_REQUEST",
    "REPLAY_REQUEST",
    "REPLAY_RESPONSE",
    "ROUTE",
    "SCOPE_ORGANIZATION_PARAM",
    "SEQ_MAX",
    "SEQ_TEXT_PATTERN",
    "STREAM_PARAM",
    "TEXT_MAX",
    "WHOAMI",
    "Schema",
    "component_name",
    "scoped_query",
]
