"""The OpenAPI document: valid OpenAPI 3.1, complete, and built from the validating schemas."""

from __future__ import annotations

import re
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource

from api import schemas
from app.jobs.vocab import COMMAND_TYPES, LANES, PAYLOAD_KINDS, SINGLETON_MODES, STATUSES
from tests.support.api import WORKER, Api, json_of


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
        if rule.endpoint == "static":
            continue
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
    assert components["EnqueueRequest"] == schemas.ENQUEUE_REQUEST
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
    job_id = created["job"]["id"]
    attempt = sqlite_api.lease_and_start(job_id)
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
    sqlite_api.queue.fail(job_id, WORKER, attempt, {"message": "x"}, retryable=False)
    check(sqlite_api.client.get(f"/jobs/{job_id}", headers=h).json, "JobResponse")
    check(sqlite_api.client.get("/jobs", headers=h).json, "JobPage")
    check(sqlite_api.client.get(f"/streams/jobs/{job_id}/receipts", headers=h).json, "ReceiptPage")
    check(sqlite_api.client.get("/readyz", headers=h).json, "Ready")
    check(sqlite_api.client.get("/healthz").json, "Health")
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
