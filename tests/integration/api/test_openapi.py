"""The OpenAPI document: valid OpenAPI 3.1, complete, and built from the validating schemas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource

from api import schemas
from api.openapi import _as_documented
from app.config import Settings
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.vocab import COMMAND_TYPES, LANES, SINGLETON_MODES, STATUSES
from tests.support.api import WORKER, Api, idle_loops, json_of, key, make_settings


@pytest.fixture
def api_settings(tmp_path: Path) -> Settings:
    # No worker runs beside this API: with its loops idle, /readyz answers 200 however long a
    # loaded machine makes the test.
    return make_settings(tmp_path, **idle_loops())


@pytest.fixture
def document(sqlite_api: Api) -> dict[str, Any]:
    response = sqlite_api.client.get("/openapi.json", headers=sqlite_api.headers())
    assert response.status_code == 200
    body: dict[str, Any] = json_of(response)
    return body


def test_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_route_is_documented(sqlite_api: Api, document: dict[str, Any]) -> None:
    served = set()
    for rule in sqlite_api.app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("ui."):
            continue  # the dashboard's HTML pages are not part of the JSON API
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            served.add((path, method.lower()))
    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert served == documented
    assert ("/agents/{agentId}/jobs", "post") in documented
    assert ("/streams/{stream}/receipts", "get") in documented


def test_security_and_error_responses(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from `receipt token create`.",
    }
    assert document["security"] == [{"bearer": []}]
    assert document["paths"]["/healthz"]["get"]["security"] == []
    enqueue = document["paths"]["/agents/{agentId}/jobs"]["post"]["responses"]
    assert {"202", "400", "401", "403", "404", "409", "413", "500", "503"} <= set(enqueue)
    assert enqueue["409"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_the_document_uses_the_very_schemas_that_validate(document: dict[str, Any]) -> None:
    components = document["components"]["schemas"]
    # The same schema, except that each free-form JSON slot names the precise JsonValue rule.
    assert components["EnqueueRequest"] == _as_documented(schemas.ENQUEUE_REQUEST)
    assert components["JsonValue"] == schemas.JSON_VALUE_COMPONENT
    payload = components["EnqueueRequest"]["properties"]["payload"]
    assert payload["properties"]["kind"]["enum"] == list(PAYLOAD_KINDS)
    assert components["EnqueueRequest"]["properties"]["lane"]["enum"] == [*LANES, None]
    assert components["EnqueueRequest"]["properties"]["singletonMode"]["enum"] == [*SINGLETON_MODES, None]
    assert components["CommandRequest"]["properties"]["type"]["enum"] == list(COMMAND_TYPES)
    params = {p["name"]: p for p in document["paths"]["/jobs"]["get"]["parameters"]}
    assert params["status"]["schema"]["enum"] == list(STATUSES)
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}


def test_real_responses_match_their_documented_schemas(sqlite_api: Api, document: dict[str, Any]) -> None:
    registry: Registry[Any] = Registry().with_resource(
        "urn:doc",
        Resource.from_contents({**document, "$schema": "https://json-schema.org/draft/2020-12/schema"}),
    )

    def check(instance: Any, name: str) -> None:
        schema = {"$ref": f"urn:doc#/components/schemas/{name}"}
        errors = list(Draft202012Validator(schema, registry=registry).iter_errors(instance))
        assert errors == [], [e.message for e in errors]

    h = sqlite_api.headers()
    created = sqlite_api.client.post(
        "/agents/factory/jobs",
        headers=h,
        json={
            "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "org-a"}},
            "sessionKey": "s",
        },
    ).json
    check(created, "EnqueueResponse")
    assert created is not None
    job_id, job_key, stream = created["job"]["id"], key(created["job"]), created["job"]["stream"]
    attempt = sqlite_api.lease_and_start(job_key)
    sqlite_api.client.post(f"/jobs/{job_id}/commands", headers=h, json={"type": "steer", "payload": [1]})
    steered = sqlite_api.client.post(
        "/agents/factory/jobs",
        headers=h,
        json={
            "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "org-a"}},
            "sessionKey": "s",
            "singletonMode": "steer",
        },
    ).json
    check(steered, "EnqueueResponse")
    sqlite_api.queue.fail(job_key, WORKER, attempt, {"message": "x"}, retryable=False)
    check(sqlite_api.client.get(f"/jobs/{job_id}", headers=h).json, "JobResponse")
    check(sqlite_api.client.get("/jobs", headers=h).json, "JobPage")
    check(sqlite_api.client.get(f"/streams/{stream}/receipts", headers=h).json, "ReceiptPage")
    check(sqlite_api.client.get("/readyz", headers=h).json, "Ready")
    check(sqlite_api.client.get("/healthz").json, "Health")
    check(sqlite_api.client.get("/whoami", headers=h).json, "WhoAmI")
    check(sqlite_api.client.get("/jobs/nope", headers=h).json, "Error")


def test_error_codes_are_the_documented_set(sqlite_api: Api) -> None:
    """Every code a test saw is one of api.errors.ERROR_CODES (clients branch on these)."""
    from api.errors import ERROR_CODES

    h = sqlite_api.headers()
    seen = {
        json_of(sqlite_api.client.get("/jobs/nope", headers=h))["error"]["code"],
        json_of(sqlite_api.client.get("/jobs"))["error"]["code"],
        json_of(sqlite_api.client.get("/jobs", headers={"Authorization": "Bearer x"}))["error"]["code"],
        json_of(sqlite_api.client.delete("/jobs", headers=h))["error"]["code"],
        json_of(sqlite_api.client.post("/agents/a/jobs", data=b"{", headers=h))["error"]["code"],
        json_of(sqlite_api.client.post("/agents/a/jobs", json={}, headers=h))["error"]["code"],
    }
    assert seen <= set(ERROR_CODES)
    assert seen == {
        "not_found",
        "unauthorized",
        "invalid_token",
        "method_not_allowed",
        "invalid_json",
        "invalid_field",
    }


def _doc_validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource(
        "urn:doc",
        Resource.from_contents({**document, "$schema": "https://json-schema.org/draft/2020-12/schema"}),
    )
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


AUTH = {"userId": "u", "organizationId": "org-a"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        # U+0000 anywhere in a string or key (PostgreSQL cannot store it).
        ({"payload": {"kind": "factory.run", "authContext": AUTH, "note": {"deep": ["a\u0000b"]}}}, None),
        ({"payload": {"kind": "factory.run", "authContext": AUTH, "k\u0000": 1}}, None),
        ({"payload": {"kind": "factory.run", "authContext": {**AUTH, "source": "x\u0000"}}}, None),
        (
            {"payload": {"kind": "factory.run", "authContext": {**AUTH, "organizationId": "org-a\u0000"}}},
            None,
        ),
        # singletonMode cancel/steer needs a session key.
        ({"payload": {"kind": "factory.run", "authContext": AUTH}, "singletonMode": "steer"}, "sessionKey"),
        ({"payload": {"kind": "factory.run", "authContext": AUTH}, "singletonMode": "cancel"}, "sessionKey"),
    ],
    ids=[
        "nul-deep-value",
        "nul-key",
        "nul-auth-context",
        "nul-after-text",
        "steer-without-session",
        "cancel-without-session",
    ],
)
def test_the_document_refuses_what_the_server_refuses(
    sqlite_api: Api, document: dict[str, Any], body: dict[str, Any], field: str | None
) -> None:
    import json

    raw = json.dumps(body)  # NUL is sent escaped (\u0000), as any JSON client sends it
    response = sqlite_api.client.post(
        "/agents/factory/jobs", data=raw, headers={**sqlite_api.headers(), "Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.json
    if field is not None:
        assert response.json["error"]["details"]["field"] == field  # type: ignore[index]
    assert not _doc_validator(document, "EnqueueRequest").is_valid(json.loads(raw))


def test_a_valid_free_form_payload_passes_both(sqlite_api: Api, document: dict[str, Any]) -> None:
    body = {"payload": {"kind": "factory.run", "authContext": AUTH, "x": [{"y": None, "z": 1.5, "s": "ok"}]}}
    assert _doc_validator(document, "EnqueueRequest").is_valid(body)
    assert (
        sqlite_api.client.post("/agents/factory/jobs", json=body, headers=sqlite_api.headers()).status_code
        == 202
    )


def test_cursors_and_resume_points_state_their_rules(sqlite_api: Api, document: dict[str, Any]) -> None:
    params = {p["name"]: p for p in document["paths"]["/jobs"]["get"]["parameters"]}
    cursor = re.compile(params["cursor"]["schema"]["pattern"])
    sqlite_api.job()
    sqlite_api.job()
    issued = sqlite_api.client.get("/jobs?limit=1", headers=sqlite_api.headers()).json["nextCursor"]  # type: ignore[index]
    assert issued is not None and cursor.match(issued)  # what the server issues, the document allows
    assert sqlite_api.client.get(f"/jobs?cursor={issued}", headers=sqlite_api.headers()).status_code == 200
    assert cursor.match("1796058000123456.any-job-id")  # any such position is one the server resumes from
    r = sqlite_api.client.get("/jobs?cursor=bm90LWEtY3Vyc29y", headers=sqlite_api.headers())
    assert not cursor.match("bm90LWEtY3Vyc29y")
    assert r.status_code == 400 and r.json["error"]["details"]["field"] == "cursor"  # type: ignore[index]
    events = {p["name"]: p for p in document["paths"]["/jobs/{jobId}/events"]["get"]["parameters"]}
    pattern = re.compile(events["Last-Event-ID"]["schema"]["pattern"])
    assert pattern.match(str(schemas.SEQ_MAX)) and not pattern.match(str(schemas.SEQ_MAX + 1))


def test_enqueue_links_lead_to_every_operation_on_the_created_job(document: dict[str, Any]) -> None:
    links = document["paths"]["/agents/{agentId}/jobs"]["post"]["responses"]["202"]["links"]
    operation_ids = {
        op["operationId"]: (path, op) for path, item in document["paths"].items() for op in item.values()
    }
    targets = set()
    for name, link in links.items():
        assert link["operationId"] in operation_ids, name
        path, op = operation_ids[link["operationId"]]
        # Each parameter the link fills is one the target declares, from the response body; a route
        # naming the job by its id is also told its organisation (a system token may have posted it
        # for another).
        declared = {p["name"]: p["in"] for p in op.get("parameters", [])}
        for param, expression in link["parameters"].items():
            assert param in declared and expression.startswith("$response.body#/job/"), (name, param)
        if "{jobId}" in path:
            assert declared["organizationId"] == "query", name
            assert link["parameters"]["organizationId"] == "$response.body#/job/organizationId", name
        targets.add(path)
    assert {
        "/jobs/{jobId}",
        "/jobs/{jobId}/commands",
        "/jobs/{jobId}/cancel",
        "/jobs/{jobId}/events",
    } <= targets
