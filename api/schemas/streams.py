"""The schemas of receipt streams: a stream's receipts page by page, and the Server-Sent Events that
follow a job or a stream live (their query, the Last-Event-ID header and each event's shape)."""

from __future__ import annotations

from api.schemas.base import NO_NUL, Schema, ref, sse_event

RECEIPTS_LIMIT_DEFAULT = 100
RECEIPTS_LIMIT_MAX = 1000
# Stream positions are 32-bit integers in the database.
SEQ_MAX = 2**31 - 1

STREAM_PARAM: Schema = {
    "type": "string",
    "minLength": 1,
    "pattern": NO_NUL,
    "description": "e.g. jobs/<jobId>",
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
        "receipts": {"type": "array", "items": ref("Receipt")},
        "nextAfter": {
            "type": ["integer", "null"],
            "description": "Pass as ?after= for the next page; null when this page is the end.",
        },
    },
    "required": ["stream", "receipts", "nextAfter"],
}

JOB_EVENT: Schema = sse_event("job", "Job", "The job's state after one receipt (event: job, id: seq).")
RECEIPT_EVENT: Schema = sse_event("receipt", "Receipt", "One raw receipt (event: receipt, id: seq).")
