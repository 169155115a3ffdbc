"""What every resource's schemas share: the Schema type, the text limits and patterns, the JSON value
slot, the organisation parameters, the error body and the helpers that build the rest."""

from __future__ import annotations

import re
from typing import Any

from app.jobs.ids import ORGANIZATION_ID_PATTERN, SYSTEM_ORGANIZATION

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


# The same parameter on a route over many jobs (a bulk action, its progress, the dead letters).
NAMED_ORGANIZATION_PARAM: Schema = {
    **SCOPE_ORGANIZATION_PARAM,
    "description": "Act in this organisation. Required for a system token (403 without it: an action "
    "on a filter never falls on the token's own organisation by omission); any other token may name "
    "only its own, and defaults to it.",
}


def scoped_query(query: Schema | None, *, named: bool = False) -> Schema:
    """``query`` (or none) plus ``organizationId``: the query of a route naming one job or objective
    (``named``: of a route over many jobs, where a system token must give it)."""
    base = query or {"type": "object", "properties": {}}
    param = NAMED_ORGANIZATION_PARAM if named else SCOPE_ORGANIZATION_PARAM
    return {**base, "properties": {**base.get("properties", {}), ORGANIZATION_PARAM: param}}


TEXT_MAX = 256
REASON_MAX = 4096
LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 500
# Every string the API reads — body values and keys, path and query parameters — is refused when
# it holds U+0000 (api.jsonbody: PostgreSQL text and jsonb cannot store it). The document says so
# with these patterns, so a client (or a fuzzer) that follows the document is never refused.
NO_NUL = r"^[^\u0000]*$"
# Blank means what the server's own check means (``str.strip``): Python's whitespace, spelled out,
# since each regex engine reading the document (ECMA, Rust, Python) has its own ``\s`` — ECMA's
# leaves out U+001C-U+001F and U+0085, which Python strips.
_WHITESPACE = "".join(f"\\u{c:04x}" for c in range(0x10000) if chr(c).isspace())
NON_BLANK = rf"^[^\u0000]*[^{_WHITESPACE}\u0000][^\u0000]*$"
MAX_JSON_DEPTH = 64  # api.jsonbody.MAX_DEPTH, stated in the document's descriptions


def ref(name: str) -> Schema:
    """A ``$ref`` to the document's component ``name`` (for responses: requests stay self-contained)."""
    return {"$ref": f"#/components/schemas/{name}"}


def text(max_length: int = TEXT_MAX, *, nullable: bool = False, non_blank: bool = True) -> Schema:
    """A request string of at most ``max_length`` characters, never holding U+0000."""
    schema: Schema = {"type": ["string", "null"] if nullable else "string", "maxLength": max_length}
    schema["pattern"] = NON_BLANK if non_blank else NO_NUL
    return schema


def string_enum(values: tuple[str, ...], *, nullable: bool = False) -> Schema:
    """One of a closed vocabulary's ``values`` (or null, when ``nullable``)."""
    if nullable:
        return {"type": ["string", "null"], "enum": [*values, None]}
    return {"type": "string", "enum": list(values)}


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

# Pieces of response schemas.
ANY: Schema = {}
TIME: Schema = {"type": ["string", "null"], "format": "date-time"}
RECORD_ORGANIZATION_ID: Schema = {
    "type": ["string", "null"],
    "description": "The organisation it belongs to: its id is unique within that organisation only "
    "(null only for the system's own records written before ids were qualified).",
}
STREAM_DESCRIPTION = (
    "Its receipt stream: jobs/<organizationId>/<id> or objectives/<organizationId>/<id> "
    "(records written before ids were qualified keep jobs/<id>)."
)

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


def sse_event(name: str, data: str, description: str) -> Schema:
    """One Server-Sent Event as OpenAPI 3.1 describes an event-stream item: its fields as strings."""
    return {
        "type": "object",
        "description": description + " Comment lines (`: heartbeat`) keep idle connections open; "
        "resume with the Last-Event-ID header.",
        "properties": {
            "event": {"const": name},
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The receipt's seq."},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": ref(data)},
            "retry": {"type": "integer"},
        },
        "required": ["event", "id", "data"],
    }
