"""The OpenAPI 3.1 document, generated from the route table and the schemas that validate requests.

Each view is declared with ``@operation(...)``: that one declaration both *enforces* the
operation's input (query, body and path parameters are validated against ``api.schemas``
before the view runs) and *documents* it. ``document(app)`` walks Flask's URL map, so a route
exists in the document exactly when it exists in the server.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Flask, current_app, g, jsonify
from flask.typing import ResponseReturnValue

from api import auth, inputs, schemas
from api.schemas import Schema

API_TITLE = "Receipt"
API_VERSION = "0.1.0"
JSON = "application/json"
EVENT_STREAM = "text/event-stream"

_ERROR_DESCRIPTIONS = {
    400: "Malformed JSON or an invalid field (details name the field and its allowed values).",
    401: "Missing or invalid credentials.",
    403: "The caller's organisation may not do this, or its token lacks a scope the operation needs "
    "(code missing_scope, details.scope names it: posting a job that runs a command needs 'commands'), "
    "or the job runs a command on a deployment that runs none (code commands_disabled, "
    "details.setting names RECEIPT_CODEX_COMMANDS).",
    404: "No such job or stream (another organisation's job answers the same way), or no such route.",
    409: "The job's (or objective's) state does not allow this, its id belongs to someone else, or the "
    "job already holds RECEIPT_MAX_COMMANDS_PER_JOB queue commands (code too_many_commands).",
    410: "The id names a job (or objective) the archiving pass moved out of the database (code "
    "archived): details hold its summary from the tombstone and the archive segment holding its "
    "receipts. The id stays taken: nothing was written.",
    413: "The request body is larger than the configured limit.",
    429: "Too many requests: the organisation's write rate limit (code rate_limited) or this token's or "
    "this server's open event streams (code too_many_streams). Retry-After says when to try again.",
    500: "An unexpected server error (the same JSON shape).",
    503: "The database or broker is unreachable.",
}


# The query schema of an operation that takes no query parameters (any parameter is a 400).
NO_QUERY: Schema = {"type": "object", "properties": {}}
ORGANIZATION_PARAM = schemas.ORGANIZATION_PARAM


@dataclass(frozen=True)
class Operation:
    """One endpoint's contract: its inputs' schemas and its responses."""

    summary: str
    tag: str
    responses: Mapping[int, Schema]
    description: str = ""
    body: Schema | None = None
    body_required: bool = True
    query: Schema | None = None
    path: Mapping[str, Schema] = field(default_factory=dict)
    headers: Mapping[str, Schema] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    auth: bool = True
    streams: bool = False
    media: str = JSON  # the 200 response's media type (event streams use EVENT_STREAM)
    # OpenAPI links from the success response: name -> (target endpoint, its parameters as
    # runtime expressions), so clients and stateful fuzzers can follow what this call created.
    links: Mapping[str, tuple[str, Mapping[str, str]]] = field(default_factory=dict)
    # A route naming one job or objective by the id its organisation knows it by: it acts in the
    # caller's organisation, or in the one ``?organizationId=`` names (a system token's way to act
    # in another; any other token may name only its own).
    scoped: bool = False
    # A scoped route over many jobs (a bulk action, its progress, the dead letters): an identity of
    # every organisation must name the one it acts in (``api.auth.named_organization``).
    named: bool = False

    def effective_query(self) -> Schema | None:
        """The query schema the route validates and documents (a scoped route adds organizationId)."""
        return self._effective_query

    @functools.cached_property
    def _effective_query(self) -> Schema | None:
        # Built once per route: the validators are compiled and kept per schema object, so a new
        # dict per request would compile (and keep) a validator per request.
        return schemas.scoped_query(self.query, named=self.named) if self.scoped else self.query

    def error_statuses(self) -> list[int]:
        # 400 everywhere: any operation refuses undocumented query parameters.
        statuses = set(self.errors) | {400, 500}
        if self.auth:
            statuses |= {401, 404, 503}
        if self.body is not None:
            statuses.add(413)
        if self.scoped:
            statuses.add(403)  # ?organizationId= naming another organisation, for a tenant token
        return sorted(statuses)


def operation(
    op: Operation,
) -> Callable[[Callable[..., ResponseReturnValue]], Callable[..., ResponseReturnValue]]:
    """Declare a view's contract; the view receives ``query=`` and/or ``body=`` already validated."""

    def decorate(view: Callable[..., ResponseReturnValue]) -> Callable[..., ResponseReturnValue]:
        @functools.wraps(view)
        def wrapper(**kwargs: Any) -> ResponseReturnValue:
            for name, value in kwargs.items():
                if isinstance(value, str):
                    inputs.path_param(value, name, op.path.get(name))
            query = inputs.read_query(op.effective_query() or NO_QUERY)
            if op.scoped:
                requested = query.pop(ORGANIZATION_PARAM, None)
                if op.named and requested is None and auth.current().all_organizations:
                    raise auth.unnamed_organization()
                g.scope_organization = auth.scope_organization(requested)
            if op.query is not None:
                kwargs["query"] = query
            if op.body is not None:
                kwargs["body"] = inputs.read_body(op.body, required=op.body_required)
            return view(**kwargs)

        wrapper.openapi = op  # type: ignore[attr-defined]
        return wrapper

    return decorate


def operation_of(app: Flask, endpoint: str | None) -> Operation | None:
    """The ``Operation`` declared for an endpoint, if any."""
    if endpoint is None:
        return None
    view = app.view_functions.get(endpoint)
    return getattr(view, "openapi", None)


def operation_id(endpoint: str) -> str:
    """The document's operationId for a Flask endpoint (``jobs.get_job`` -> ``jobs_get_job``)."""
    return endpoint.replace(".", "_")


_RULE_ARG = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def _content(schema: Schema, media: str = JSON) -> dict[str, Any]:
    name = schemas.component_name(schema)
    return {media: {"schema": {"$ref": f"#/components/schemas/{name}"} if name else schema}}


def _parameters(op: Operation, path_args: list[str]) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for name in path_args:
        params.append(
            {"name": name, "in": "path", "required": True, "schema": op.path.get(name, {"type": "string"})}
        )
    query = op.effective_query()
    if query is not None:
        for name, prop in query.get("properties", {}).items():
            param: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": prop}
            if "description" in prop:
                param["description"] = prop["description"]
            params.append(param)
    for name, prop in op.headers.items():
        params.append({"name": name, "in": "header", "required": False, "schema": prop})
    return params


def _operation_object(op: Operation, endpoint: str, path_args: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": operation_id(endpoint), "summary": op.summary, "tags": [op.tag]}
    if op.description:
        out["description"] = op.description
    params = _parameters(op, path_args)
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required, "content": _content(op.body)}
    responses: dict[str, Any] = {}
    for status, schema in op.responses.items():
        media = EVENT_STREAM if op.streams and status == 200 else op.media if status == 200 else JSON
        responses[str(status)] = {"description": "Success.", "content": _content(schema, media)}
        if op.links and 200 <= status < 300:
            responses[str(status)]["links"] = {
                name: {"operationId": operation_id(target), "parameters": dict(params)}
                for name, (target, params) in op.links.items()
            }
    for status in op.error_statuses():
        responses[str(status)] = {
            "description": _ERROR_DESCRIPTIONS[status],
            "content": _content(schemas.ARCHIVED_ERROR if status == 410 else schemas.ERROR),
        }
        if status == 429:
            responses[str(status)]["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                }
            }
    out["responses"] = responses
    if not op.auth:
        out["security"] = []
    return out


def document(app: Flask) -> dict[str, Any]:
    """Assemble the OpenAPI 3.1 document from ``app``'s URL map and each operation's schemas."""
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        op = operation_of(app, rule.endpoint)
        if op is None:
            continue
        path = _RULE_ARG.sub(lambda m: "{" + m.group(1) + "}", rule.rule)
        path_args = _RULE_ARG.findall(rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation_object(op, rule.endpoint, path_args)
    documented: dict[str, Any] = _as_documented(
        {
            "openapi": "3.1.0",
            "info": {
                "title": API_TITLE,
                "version": API_VERSION,
                "description": "Durable background jobs: enqueue, read and follow jobs whose state is "
                "the fold of their receipt stream.",
            },
            "paths": paths,
            "components": {
                "schemas": schemas.COMPONENTS,
                "securitySchemes": {
                    "bearer": {
                        "type": "http",
                        "scheme": "bearer",
                        "description": "A token from `receipt token create`.",
                    }
                },
            },
            "security": [{"bearer": []}],
        }
    )
    return documented


def _as_documented(node: Any) -> Any:
    """A copy of the document in which each free-form JSON slot names the precise ``JsonValue``.

    Validation keeps those slots open (``api.jsonbody`` enforces their rules on the raw body
    first, naming the field); the document states the rules, so it describes exactly what the
    server accepts.
    """
    if node is schemas.JSON_VALUE:
        return {"$ref": "#/components/schemas/JsonValue"}
    if isinstance(node, dict):
        return {key: _as_documented(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_as_documented(item) for item in node]
    return node


blueprint = Blueprint("openapi", __name__)


@blueprint.get("/openapi.json")
@operation(Operation(summary="This document.", tag="meta", responses={200: {"type": "object"}}))
def openapi_json() -> ResponseReturnValue:
    """Serve the generated document (built once per app and cached on it)."""
    cached = current_app.extensions.get("receipt.openapi")
    if cached is None:
        cached = document(current_app)
        current_app.extensions["receipt.openapi"] = cached
    return jsonify(cached)
