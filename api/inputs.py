"""Reading a request's input — body, query string, path parameters — against ``api.schemas``.

Each reader raises ``app.jobs.errors.ValidationError`` naming the offending field (and the allowed
values, for a closed set) so the client gets the same 400 shape whether the schema or
``app.jobs.validation`` caught the problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema_rs
from flask import request
from jsonschema import Draft202012Validator
from jsonschema import ValidationError as SchemaError
from jsonschema.exceptions import best_match

from api import jsonbody
from api.context import state
from api.errors import INVALID_JSON, PAYLOAD_TOO_LARGE, ApiError
from api.schemas import Schema
from app.jobs.errors import ValidationError
from app.storage.queue import decode_cursor

_INTEGER = re.compile(r"-?[0-9]{1,30}")


def check(instance: Any, schema: Schema, *, root: str = "") -> None:
    """Validate ``instance``; raise ``ValidationError`` for the most relevant failure.

    A valid instance is known in one compiled pass (jsonschema-rs); only a refused one walks
    jsonschema's error tree, whose best match names the field. Both read the same schema object,
    the one ``/openapi.json`` publishes. The fast pass only ever accepts: where it refuses, the
    error tree decides, so a stricter fast pass (its ``$`` does not match before a final newline,
    as Python's does) changes no answer.
    """
    fast, full = _compiled(schema)
    if fast is not None and fast.is_valid(instance):
        return
    error = best_match(full.iter_errors(instance))
    if error is not None:
        raise to_validation_error(error, root)


# Schemas are module constants, so the validators per schema object are kept for reuse.
_COMPILED: dict[int, tuple[Schema, Any, Draft202012Validator]] = {}


def _compiled(schema: Schema) -> tuple[Any, Draft202012Validator]:
    hit = _COMPILED.get(id(schema))
    if hit is None or hit[0] is not schema:
        # Formats stay annotations, as jsonschema treats them without a format checker.
        try:
            fast = jsonschema_rs.validator_for(schema, validate_formats=False)
        except jsonschema_rs.ValidationError:
            fast = None  # a schema that refers into the OpenAPI document is checked the slow way
        hit = (schema, fast, Draft202012Validator(schema))
        _COMPILED[id(schema)] = hit
    return hit[1], hit[2]


def to_validation_error(error: SchemaError, root: str = "") -> ValidationError:
    """Name the field a schema failure is about, and what it allows."""
    path = root
    for key in error.absolute_path:
        path = jsonbody.field_path(path, key)
    kind = error.validator
    value = error.validator_value
    instance = error.instance
    if kind == "required" and isinstance(instance, Mapping):
        missing = next((name for name in value if name not in instance), value[0])
        return ValidationError(jsonbody.field_path(path, missing), "is required")
    if kind == "additionalProperties" and isinstance(instance, Mapping):
        known = list(error.schema.get("properties", {}))
        extra = sorted(set(instance) - set(known))
        name = extra[0] if extra else "?"
        return ValidationError(jsonbody.field_path(path, name), "is not a known field", allowed=known)
    if kind == "not" and isinstance(value, Mapping) and len(value.get("required", ())) > 1:
        # Fields that exclude one another (runAt and delayMs): name the first, and say why.
        names = list(value["required"])
        return ValidationError(jsonbody.field_path(path, names[0]), f"give {' or '.join(names)}, not both")
    field = path or "body"
    # A schema that says why it refuses (``x-message``, an OpenAPI extension) is quoted as it says it.
    said = error.schema.get("x-message") if isinstance(error.schema, Mapping) else None
    if isinstance(said, str):
        return ValidationError(field, said)
    if kind == "enum":
        allowed = [v for v in value if v is not None]
        return ValidationError(field, "is not one of the allowed values", allowed=allowed)
    if kind == "type":
        wanted = value if isinstance(value, str) else " or ".join(value)
        return ValidationError(field, f"must be of type {wanted}")
    if kind == "pattern":
        return ValidationError(field, f"must match the pattern {value}")
    if kind in ("maxLength", "minLength"):
        bound = "at most" if kind == "maxLength" else "at least"
        return ValidationError(field, f"must be {bound} {value} characters")
    if kind in ("minimum", "maximum"):
        bound = "at least" if kind == "minimum" else "at most"
        return ValidationError(field, f"must be {bound} {value}")
    return ValidationError(field, error.message[:200])


# -- body -------------------------------------------------------------------------------------


def max_body_bytes() -> int:
    limit: int = state().settings.max_body_bytes
    return limit


def _too_large() -> ApiError:
    limit = max_body_bytes()
    return ApiError(413, PAYLOAD_TOO_LARGE, f"request body is larger than {limit} bytes", {"limit": limit})


def raw_body() -> bytes:
    """The request body, refused with 413 past the limit by declared *and* actual length.

    ``MAX_CONTENT_LENGTH`` is the limit plus one byte (see ``create_app``): Werkzeug cuts a
    streamed (chunked) body there, so a body of exactly the limit passes and one byte more is
    seen — and refused here — instead of being silently truncated into a JSON error.
    """
    limit = max_body_bytes()
    if request.content_length is not None and request.content_length > limit:
        raise _too_large()
    data = request.get_data(cache=True)
    if len(data) > limit:
        raise _too_large()
    return data


def read_body(schema: Schema, *, required: bool = True) -> Any:
    """Parse the body as strict JSON and check it against ``schema``.

    An absent body is ``{}`` when ``required`` is False (e.g. cancel's optional reason).
    """
    data = raw_body()
    if not data.strip():
        if required:
            raise ApiError(400, INVALID_JSON, "request body is required (a JSON object)", {"field": "body"})
        data = b"{}"
    body = jsonbody.parse(data)
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object")
    check(body, schema)
    return body


# -- query and path ---------------------------------------------------------------------------


def checked_cursor(cursor: str | None) -> str | None:
    """A list's ``cursor`` as given, once it decodes and its id passes the parameter text rules."""
    if cursor is not None:
        _, last_id = decode_cursor(cursor)
        jsonbody.check_param(last_id, "cursor")
    return cursor


def read_query(schema: Schema, args: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The query parameters, integers coerced, defaults applied, checked by ``schema``.

    An undocumented parameter is a 400 naming it and the documented ones: a misspelt filter
    (``?stauts=queued``) must not silently widen a listing to everything.
    """
    source = request.args if args is None else args
    properties: Mapping[str, Schema] = schema.get("properties", {})
    if not source:  # the common case: only defaults, which are valid by construction
        return {name: prop["default"] for name, prop in properties.items() if "default" in prop}
    unknown = sorted(name for name in source if name not in properties)
    if unknown:
        jsonbody.check_param(unknown[0], "query")
        raise ValidationError(
            unknown[0] or "query", "is not a known query parameter", allowed=list(properties)
        )
    values: dict[str, Any] = {}
    for name, prop in properties.items():
        raw = source.get(name)
        if raw is None:
            if "default" in prop:
                values[name] = prop["default"]
            continue
        jsonbody.check_param(raw, name)
        values[name] = _coerce(name, raw, prop)
    check(values, schema)
    return values


def _coerce(name: str, raw: str, prop: Schema) -> Any:
    types = prop.get("type")
    wanted: Iterable[str] = [types] if isinstance(types, str) else (types or [])
    if "integer" in wanted:
        if not _INTEGER.fullmatch(raw):
            raise ValidationError(name, "must be an integer")
        return int(raw)
    return raw


def path_param(value: str, name: str, schema: Schema | None = None) -> str:
    """A path parameter: text rules always, and ``schema`` when the operation declares one."""
    jsonbody.check_param(value, name)
    if schema is not None:
        check(value, schema, root=name)
    return value
