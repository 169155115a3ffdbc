"""The schemas of the service's own endpoints: liveness, readiness and who the caller is."""

from __future__ import annotations

from api.schemas.base import Schema
from app.jobs.privilege import TOKEN_SCOPES

HEALTH: Schema = {"type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}

READY: Schema = {
    "type": "object",
    "description": "Without a token, only status; with one, every check and each loop's last run.",
    "properties": {
        "status": {"const": "ok"},
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
    "required": ["status"],
}

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
