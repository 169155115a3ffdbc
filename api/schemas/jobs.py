"""The schemas of jobs: the enqueue, command and cancel requests, the job list's query, and the job
as every response shows it (its lease, commands and route)."""

from __future__ import annotations

from api.schemas.base import (
    ANY,
    JSON_VALUE,
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    NO_NUL,
    NON_BLANK,
    ORG_ID_MAX,
    REASON_MAX,
    RECORD_ORGANIZATION_ID,
    STREAM_DESCRIPTION,
    TIME,
    Schema,
    ref,
    string_enum,
    text,
)
from api.schemas.payload import PAYLOAD
from app.dispatch.choice import WAITING_REASONS
from app.jobs.delay import MAX_DELAY_MS, RUN_AT_MAX_CHARS
from app.jobs.flow import (
    CONCURRENCY_LIMIT_MAX,
    CONCURRENCY_LIMIT_MIN,
    CONCURRENCY_LIMIT_RULE,
    DEBOUNCE_WINDOW_MAX_MS,
    DEBOUNCE_WINDOW_MIN_MS,
    DEBOUNCE_WINDOW_RULE,
    DEBOUNCE_WITH_DELAY_RULE,
    KEY_MAX,
    KEY_PATTERN,
    KEY_RULE,
    LIMIT_NEEDS_KEY_RULE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PRIORITY_RULE,
)
from app.jobs.ids import JOB_ID_PATTERN
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.privilege import TOKEN_SCOPES
from app.jobs.replay import REPLAY_KEY_DEFAULT, REPLAY_KEY_PATTERN
from app.jobs.tags import (
    TAG_FILTER_PATTERN,
    TAG_KEY_MAX,
    TAG_KEY_PATTERN,
    TAG_KEY_RULE,
    TAG_VALUE_MAX,
    TAG_VALUE_PATTERN,
    TAG_VALUE_RULE,
    TAGS_MAX_KEYS,
)
from app.jobs.validation import AGENT_ID_MAX, SESSION_KEY_MAX
from app.jobs.vocab import BULK_ACTIONS, COMMAND_LANES, COMMAND_TYPES, LANES, SINGLETON_MODES, STATUSES
from app.ops.bulk_actions import BULK_PAGE_MAX
from app.storage.db import ERROR_TEXT_LENGTH
from app.storage.queue import CURSOR_PATTERN

# -- requests ---------------------------------------------------------------------------------

# A delayed job (app.jobs.delay): one of the two, checked further by app.jobs.validation.
DELAY_PROPERTIES: dict[str, Schema] = {
    "runAt": {
        "type": ["string", "null"],
        "format": "date-time",
        "maxLength": RUN_AT_MAX_CHARS,
        "description": "Do not deliver before this time (RFC 3339 with an offset). A time in the past "
        "is accepted and runs at once. Not with delayMs.",
    },
    "delayMs": {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": MAX_DELAY_MS,
        "description": "Do not deliver before this many milliseconds after the enqueue (database "
        "clock). Not with runAt.",
    },
}

# runAt and delayMs are two ways to say one thing: a body may give one (a null is as absent).
DELAY_BOTH: Schema = {
    "properties": {"runAt": {"type": "string"}, "delayMs": {"type": "integer"}},
    "required": ["runAt", "delayMs"],
}

TAGS: Schema = {
    "type": ["object", "null"],
    "description": f"Tags to find the job by (GET /jobs?tag=key:value): at most {TAGS_MAX_KEYS}, kept in "
    "job.enqueued. Never read by any rule.",
    "maxProperties": TAGS_MAX_KEYS,
    "x-message": f"must be an object of at most {TAGS_MAX_KEYS} tags",
    "propertyNames": {
        "pattern": TAG_KEY_PATTERN.pattern,
        "maxLength": TAG_KEY_MAX,
        "x-message": f"holds a key that is not a tag key: a key {TAG_KEY_RULE}",
    },
    "additionalProperties": {
        "type": "string",
        "pattern": TAG_VALUE_PATTERN.pattern,
        "maxLength": TAG_VALUE_MAX,
        "x-message": TAG_VALUE_RULE,
    },
}

# What the dispatch pass weighs beside the job's organisation (app.jobs.flow, docs/dispatch.md). The
# same bounds and messages as the validator, so the document refuses exactly what the server does.
FLOW_KEY: Schema = {
    "type": "string",
    "pattern": KEY_PATTERN.pattern,
    "maxLength": KEY_MAX,
    "x-message": KEY_RULE,
}
FLOW_PROPERTIES: dict[str, Schema] = {
    "priority": {
        "type": ["integer", "null"],
        "minimum": PRIORITY_MIN,
        "maximum": PRIORITY_MAX,
        "x-message": PRIORITY_RULE,
        "description": f"Order inside the organisation's share of the workers: {PRIORITY_MAX} runs first, "
        f"{PRIORITY_MIN} last; default 0 (oldest first). Never moves the job ahead of another "
        "organisation's fair share.",
    },
    "concurrencyKey": {
        **FLOW_KEY,
        "type": ["string", "null"],
        "description": "At most concurrencyLimit attempts of this organisation's jobs with this key run at "
        "once, across every worker process (counted from leases, so a crash or a cancel frees the slot).",
    },
    "concurrencyLimit": {
        "type": ["integer", "null"],
        "minimum": CONCURRENCY_LIMIT_MIN,
        "maximum": CONCURRENCY_LIMIT_MAX,
        "x-message": CONCURRENCY_LIMIT_RULE,
        "description": "The concurrencyKey's limit (needs a concurrencyKey). Without one, the operator's "
        "limit for the key, else 1.",
    },
    "debounce": {
        "type": ["object", "null"],
        "x-message": "must be an object with key and windowMs",
        "description": "The job waits windowMs (availableAt, database clock); a later enqueue of the "
        "organisation with the same key while it is still queued cancels it (job.canceled, reason "
        "'debounced', replacedBy naming the new job) and takes its place. A leased or running job is "
        "never canceled by it. Not with runAt or delayMs.",
        "properties": {
            "key": FLOW_KEY,
            "windowMs": {
                "type": "integer",
                "minimum": DEBOUNCE_WINDOW_MIN_MS,
                "maximum": DEBOUNCE_WINDOW_MAX_MS,
                "x-message": DEBOUNCE_WINDOW_RULE,
            },
        },
        "required": ["key", "windowMs"],
        "additionalProperties": False,
    },
}

# The flow fields' rules across fields: a limit needs its key, and a debounced job's window decides
# when it runs (so no runAt or delayMs beside it). Each names the field the validator names.
FLOW_RULES: list[Schema] = [
    {
        "if": {
            "anyOf": [
                {"not": {"required": ["concurrencyKey"]}},
                {"properties": {"concurrencyKey": {"type": "null"}}},
            ]
        },
        "then": {"properties": {"concurrencyLimit": {"type": "null", "x-message": LIMIT_NEEDS_KEY_RULE}}},
    },
    {
        "if": {
            "anyOf": [
                {"properties": {"runAt": {"type": "string"}}, "required": ["runAt"]},
                {"properties": {"delayMs": {"type": "integer"}}, "required": ["delayMs"]},
            ]
        },
        "then": {"properties": {"debounce": {"type": "null", "x-message": DEBOUNCE_WITH_DELAY_RULE}}},
    },
]

ENQUEUE_REQUEST: Schema = {
    "type": "object",
    "title": "EnqueueRequest",
    "properties": {
        "jobId": {
            "type": ["string", "null"],
            "pattern": JOB_ID_PATTERN.pattern,
            "description": "Idempotency key: re-posting an existing jobId returns that job unchanged.",
        },
        "lane": string_enum(LANES, nullable=True),
        "payload": PAYLOAD,
        "sessionKey": text(SESSION_KEY_MAX, nullable=True),
        "singletonMode": string_enum(SINGLETON_MODES, nullable=True),
        "maxAttempts": {"type": ["integer", "null"], "description": "Clamped to 1..8; default 2."},
        **DELAY_PROPERTIES,
        "tags": TAGS,
        **FLOW_PROPERTIES,
    },
    "required": ["payload"],
    "additionalProperties": False,
    # singletonMode cancel and steer act on a session: they need its key.
    "if": {"properties": {"singletonMode": {"enum": ["cancel", "steer"]}}, "required": ["singletonMode"]},
    "then": {"required": ["sessionKey"], "properties": {"sessionKey": {"type": "string"}}},
    "not": DELAY_BOTH,
    "allOf": FLOW_RULES,
}

COMMAND_REQUEST: Schema = {
    "type": "object",
    "title": "CommandRequest",
    "properties": {
        "type": string_enum(COMMAND_TYPES),
        "lane": {
            **string_enum(COMMAND_LANES, nullable=True),
            "description": "The queue-command lane of a steer or follow_up (default: the one its type "
            "names); an abort takes none.",
        },
        "payload": JSON_VALUE,
        "reason": text(REASON_MAX, nullable=True, non_blank=False),
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
    "properties": {"reason": text(REASON_MAX, nullable=True, non_blank=False)},
    "additionalProperties": False,
}

REPLAY_REQUEST: Schema = {
    "type": "object",
    "title": "ReplayRequest",
    "properties": {
        "jobId": {
            "type": ["string", "null"],
            "pattern": JOB_ID_PATTERN.pattern,
            "description": "The new job's id (chosen); re-posting it returns that replay unchanged.",
        },
        "replayKey": {
            "type": ["string", "null"],
            "pattern": REPLAY_KEY_PATTERN.pattern,
            "description": f"Derive the new job's id from the replayed job's and this key (default "
            f"{REPLAY_KEY_DEFAULT!r}): a retried request names the same replay. A second replay of the same "
            "job takes another key. Not with jobId.",
        },
        "payload": {**PAYLOAD, "description": "An edited payload (default: the replayed job's)."},
        "tags": {**TAGS, "description": "The new job's tags (default: the replayed job's)."},
        # The replayed job's flow fields carry over; a field given here replaces its value (null
        # clears it), and a new concurrencyKey does not inherit the old key's limit.
        **{
            name: {
                **schema,
                "description": f"{schema['description']} Default: the replayed job's; null clears it.",
            }
            for name, schema in FLOW_PROPERTIES.items()
        },
    },
    "additionalProperties": False,
    "not": {
        "properties": {"jobId": {"type": "string"}, "replayKey": {"type": "string"}},
        "required": ["jobId", "replayKey"],
    },
}

REPLAY_RESPONSE: Schema = {
    "type": "object",
    "properties": {
        "job": ref("Job"),
        "created": {"type": "boolean", "description": "False: the replay existed (a retried request)."},
        "replayOf": {"type": "string", "description": "The id of the job it replays."},
    },
    "required": ["job", "created", "replayOf"],
}

AGENT_ID_PARAM: Schema = {"type": "string", "minLength": 1, "maxLength": AGENT_ID_MAX, "pattern": NON_BLANK}

# One job of a batch: the body of a single enqueue plus the agent it is posted to.
BATCH_ITEM: Schema = {
    **ENQUEUE_REQUEST,
    "title": "BatchEnqueueItem",
    "properties": {"agentId": AGENT_ID_PARAM, **ENQUEUE_REQUEST["properties"]},
    "required": ["agentId", "payload"],
}

BATCH_ENQUEUE_REQUEST: Schema = {
    "type": "object",
    "title": "BatchEnqueueRequest",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 1,
            "items": BATCH_ITEM,
            "description": "At most RECEIPT_BATCH_MAX jobs (default 1000), within RECEIPT_MAX_BODY_BYTES.",
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}

JOB_ID_PARAM: Schema = {"type": "string", "minLength": 1, "pattern": NO_NUL}

# Query parameters: one object schema per operation; integers are coerced from text first.
# The filters of a job search (app.storage.search.FILTER_FIELDS): GET /jobs's query, a bulk
# action's ``filter``. Each narrows; together they all hold.
JOB_FILTER_PROPERTIES: dict[str, Schema] = {
    "status": string_enum(STATUSES),
    "agentId": text(AGENT_ID_MAX),
    "lane": string_enum(LANES),
    "sessionKey": text(SESSION_KEY_MAX),
    "kind": {**string_enum(PAYLOAD_KINDS), "description": "The payload kind."},
    "tag": {
        "type": "string",
        "pattern": TAG_FILTER_PATTERN.pattern,
        "maxLength": TAG_KEY_MAX + 1 + TAG_VALUE_MAX,
        "description": "One tag, `key:value` (the first ':' separates them): jobs enqueued with it.",
    },
    "errorPrefix": {
        **text(ERROR_TEXT_LENGTH),
        "description": "The start of the job's error text (a string error, or an object error's "
        "message), case-sensitive.",
    },
    "createdAfter": {
        "type": "string",
        "format": "date-time",
        "maxLength": RUN_AT_MAX_CHARS,
        "description": "Created at or after this time (RFC 3339 with an offset).",
    },
    "createdBefore": {
        "type": "string",
        "format": "date-time",
        "maxLength": RUN_AT_MAX_CHARS,
        "description": "Created before this time (RFC 3339 with an offset); a range that ends before "
        "it starts selects nothing.",
    },
}

LIST_JOBS_QUERY: Schema = {
    "type": "object",
    "properties": {
        **JOB_FILTER_PROPERTIES,
        "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": LIST_LIMIT_DEFAULT},
        "cursor": {
            "type": "string",
            "pattern": CURSOR_PATTERN,
            "description": "nextCursor from the previous page: the position after it, "
            "`<createdAt in microseconds since the epoch>.<jobId>`. Anything of another shape is not "
            "a cursor this server issues and is refused with 400.",
        },
        "organizationId": {
            **text(ORG_ID_MAX),
            "description": "System tokens only: list one organisation (default: all).",
        },
    },
}

# A bulk action (app.ops.bulk_actions): the filter a list takes, and how to run it.
BULK_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,59}$"
BULK_REQUEST: Schema = {
    "type": "object",
    "title": "BulkRequest",
    "properties": {
        "action": string_enum(BULK_ACTIONS),
        "filter": {
            "type": "object",
            "properties": JOB_FILTER_PROPERTIES,
            "additionalProperties": False,
            "description": "The jobs to act on, as GET /jobs filters them, in the organisation the "
            "request acts in ({} : every job of it).",
        },
        "dryRun": {
            "type": "boolean",
            "default": False,
            "description": "Only count and sample what the filter selects; nothing is written.",
        },
        "idempotencyKey": {
            "type": "string",
            "pattern": BULK_KEY_PATTERN,
            "description": "Names the operation (required unless dryRun): its audit stream is "
            "operations/<organizationId>/<idempotencyKey>; a retried page answers what it did.",
        },
        "cursor": {
            "type": "string",
            "pattern": CURSOR_PATTERN,
            "description": "nextCursor of the previous page of this operation.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": BULK_PAGE_MAX,
            "default": BULK_PAGE_MAX,
            "description": f"Jobs this call acts on at most (1..{BULK_PAGE_MAX}).",
        },
        "reason": text(REASON_MAX, nullable=True, non_blank=False),
    },
    "required": ["action", "filter"],
    "additionalProperties": False,
    "if": {"properties": {"dryRun": {"const": False}}},
    "then": {"required": ["idempotencyKey"]},
}

BULK_RESPONSE: Schema = {
    "type": "object",
    "description": "A dry run: count and sample. A run: the operation's progress after this page.",
    "properties": {
        "dryRun": {"type": "boolean"},
        "count": {"type": "integer"},
        "sample": {"type": "array", "items": ref("Job")},
        "operationId": {"type": "string"},
        "action": {"type": "string", "enum": list(BULK_ACTIONS)},
        "matched": {"type": "integer", "description": "Jobs the filter selected when the operation started."},
        "processed": {"type": "integer"},
        "affected": {"type": "integer"},
        "skipped": {"type": "integer", "description": "Selected jobs the action did not apply to."},
        "nextCursor": {"type": ["string", "null"]},
        "done": {"type": "boolean"},
        "repeated": {"type": "boolean", "description": "This page was done before: its answer again."},
    },
    "required": ["dryRun"],
}

OPERATION_ID_PARAM: Schema = {
    "type": "string",
    "pattern": BULK_KEY_PATTERN,
    "description": "The idempotencyKey the operation was started with.",
}

OPERATION_RESPONSE: Schema = {
    "type": "object",
    "properties": {
        "operation": {
            "type": "object",
            "title": "Operation",
            "description": "A bulk operation as its audit stream records it: totals over its pages so far.",
            "properties": {
                "operationId": {"type": "string"},
                "organizationId": {"type": "string"},
                "action": {"type": "string", "enum": list(BULK_ACTIONS)},
                "filter": {"type": "object", "description": "The filter, as the request gave it."},
                "by": {"type": "object", "description": "Who started it, as the server authenticated them."},
                "matched": {"type": "integer", "description": "Jobs the filter selected when it started."},
                "processed": {"type": "integer"},
                "affected": {"type": "integer"},
                "skipped": {"type": "integer"},
                "pages": {"type": "integer"},
                "nextCursor": {"type": ["string", "null"], "description": "Where the next page starts."},
                "done": {"type": "boolean"},
                "repeated": {"type": "boolean"},
                "startedAt": TIME,
                "updatedAt": TIME,
                "stream": {
                    "type": "string",
                    "description": "Its audit stream: operations/<organizationId>/<operationId>.",
                },
            },
            "required": [
                "operationId",
                "organizationId",
                "action",
                "filter",
                "matched",
                "processed",
                "affected",
                "skipped",
                "pages",
                "nextCursor",
                "done",
                "stream",
            ],
        }
    },
    "required": ["operation"],
}

DEAD_LETTERS_QUERY: Schema = {
    "type": "object",
    "properties": {
        k: JOB_FILTER_PROPERTIES[k]
        for k in ("agentId", "kind", "lane", "tag", "errorPrefix", "createdAfter", "createdBefore")
    },
}

DEAD_LETTERS: Schema = {
    "type": "object",
    "properties": {
        "groups": {
            "type": "array",
            "description": "Per agent and kind, most dead letters first (at most 200 groups).",
            "items": {
                "type": "object",
                "properties": {
                    "agentId": {"type": "string"},
                    "kind": {"type": "string"},
                    "count": {"type": "integer"},
                    "errors": {
                        "type": "array",
                        "description": "Counts by error text (its first 256 characters; null: none), most "
                        "first, at most 20.",
                        "items": {
                            "type": "object",
                            "properties": {
                                "error": {"type": ["string", "null"]},
                                "count": {"type": "integer"},
                            },
                            "required": ["error", "count"],
                        },
                    },
                },
                "required": ["agentId", "kind", "count", "errors"],
            },
        },
        "total": {"type": "integer"},
    },
    "required": ["groups", "total"],
}

# -- responses --------------------------------------------------------------------------------

LEASE: Schema = {
    "type": ["object", "null"],
    "properties": {
        "workerId": {"type": "string"},
        "attempt": {"type": "integer"},
        "expiresAt": TIME,
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
        "payload": ANY,
        "reason": {"type": ["string", "null"]},
        "at": TIME,
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
        "released": {
            "type": "integer",
            "description": "Attempts handed back uncharged (job.released, a worker shutting down); "
            "present once one was. The retry budget counts attempt - released against maxAttempts.",
        },
        "lease": ref("Lease"),
        "abortRequested": {"type": "boolean"},
        "commands": {"type": "array", "items": ref("Command")},
        "progress": ANY,
        "result": ANY,
        "error": ANY,
        "createdAt": TIME,
        "updatedAt": TIME,
        "availableAt": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "The earliest time the job may be delivered: a delayed job's runAt (or "
            "the enqueue plus delayMs), a retry's backoff; null when it may be delivered at once.",
        },
        "organizationId": RECORD_ORGANIZATION_ID,
        "stream": {"type": "string", "description": STREAM_DESCRIPTION},
        "seq": {"type": "integer", "description": "The last receipt folded into this state."},
        "route": ref("Route"),
        "tags": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "The tags it was enqueued with; present when it has any.",
        },
        "replayOf": {
            "type": "string",
            "description": "A replay: the id of the job it re-runs (same organisation); present on a replay.",
        },
        "replayedAs": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The ids of the jobs replaying this one, oldest first; present once replayed.",
        },
        "archivedBy": {
            "type": "string",
            "description": "The bulk archive (its idempotencyKey) moving this ended job out of the "
            "database: present once its job.archived receipt is written; the job then reads 410.",
        },
        "waiting": {
            "type": "object",
            "description": "Why a queued job waits for a place (docs/dispatch.md); present on a queued job "
            "that is ready and not yet sent: `concurrency` while its concurrencyKey runs its limit, "
            "`rate` while a rate limit of its key or organisation has no allowance (key null for the "
            "organisation's), `share` while the free places go to other organisations' turns.",
            "properties": {
                "reason": {"type": "string", "enum": list(WAITING_REASONS)},
                "key": {"type": ["string", "null"]},
            },
            "required": ["reason", "key"],
        },
        "priority": {
            "type": "integer",
            "description": "Its priority inside its organisation's share; present when not 0.",
        },
        "concurrencyKey": {"type": "string", "description": "Its concurrency key; present when set."},
        "concurrencyLimit": {
            "type": "integer",
            "description": "The limit it was enqueued with for its key; present when set.",
        },
        "debounce": {
            "type": "object",
            "description": "The debounce it was enqueued with; present when set. A job a later one "
            "replaced is canceled with error 'debounced' (its job.canceled names the job in replacedBy).",
            "properties": {"key": {"type": "string"}, "windowMs": {"type": "integer"}},
            "required": ["key", "windowMs"],
        },
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
        "traceContext": {
            "type": "object",
            "description": "The W3C trace context of the enqueue (docs/tracing.md): the request's "
            "own `traceparent`, its span's, or a new root's; every span of the job belongs to its "
            "trace. Absent when none was recorded.",
            "properties": {"traceparent": {"type": "string"}, "tracestate": {"type": "string"}},
            "required": ["traceparent"],
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
    "properties": {"job": ref("Job"), "async": ref("Async")},
    "required": ["job", "async"],
}

JOB_RESPONSE: Schema = {"type": "object", "properties": {"job": ref("Job")}, "required": ["job"]}

# What a tombstone answers for an archived job or objective (410's details, a batch item's
# ``archived``): who it was, how it ended, and where its receipts went.
ARCHIVED_SUMMARY: Schema = {
    "type": "object",
    "description": "An archived job's (or objective's) summary, from its tombstone.",
    "properties": {
        "id": {"type": "string"},
        "organizationId": {"type": ["string", "null"]},
        "status": {"type": "string"},
        "archived": {"const": True},
        "agentId": {"type": "string"},
        "kind": {"type": "string"},
        "lane": {"type": "string"},
        "title": {"type": "string"},
        "attempt": {"type": "integer"},
        "maxAttempts": {"type": "integer"},
        "createdAt": {"type": ["string", "null"]},
        "updatedAt": {"type": ["string", "null"]},
        "jobs": {"type": "integer"},
        "archive": {
            "type": "object",
            "properties": {
                "stream": {"type": "string"},
                "segment": {"type": "string"},
                "receiptCount": {"type": "integer"},
                "finalHash": {"type": "string"},
                "archivedAt": {"type": ["string", "null"]},
            },
            "required": ["stream", "segment", "receiptCount", "finalHash", "archivedAt"],
        },
    },
    "required": ["id", "organizationId", "status", "archived", "archive"],
}

ARCHIVED_ERROR: Schema = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"const": "archived"},
                "message": {"type": "string"},
                "details": ARCHIVED_SUMMARY,
            },
            "required": ["code", "message", "details"],
            "additionalProperties": False,
        },
    },
    "required": ["error"],
    "additionalProperties": False,
}

BATCH_ENQUEUE_RESPONSE: Schema = {
    "type": "object",
    "properties": {
        "jobs": {
            "type": "array",
            "description": "One entry per item, in order: the job it created, or the one its jobId "
            "already named (created false), or the job a singletonMode steer steered.",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "created": {"type": "boolean"},
                    "steered": {"type": "boolean"},
                    "job": ref("Job"),
                    "archived": ARCHIVED_SUMMARY,
                },
                "required": ["index", "created", "steered"],
                "description": "`job` for a live job; `archived` (and no `job`) when the jobId names a "
                "job the archiving pass moved out: nothing is written for that item.",
            },
        }
    },
    "required": ["jobs"],
}

JOB_PAGE: Schema = {
    "type": "object",
    "properties": {
        "jobs": {"type": "array", "items": ref("Job")},
        "nextCursor": {"type": ["string", "null"]},
    },
    "required": ["jobs", "nextCursor"],
}
