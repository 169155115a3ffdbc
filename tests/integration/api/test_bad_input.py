"""Nothing a client sends may produce a 5xx or a partial write.

A corpus of broken requests: each must get a 4xx JSON error naming the field, and the receipts
table must be exactly as it was. (The ``api`` fixture also fails the test if any request
reached the catch-all 500 handler.)
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from werkzeug.test import EnvironBuilder, run_wsgi_app

from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.vocab import LANES, SINGLETON_MODES
from tests.support.api import Api, auth_context, json_of, key, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

ENQUEUE = "/agents/factory/jobs"
OK = payload()


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"x": value}
    return value


# (name, url, raw body, expected field)
CORPUS: list[tuple[str, str, bytes, str]] = [
    ("empty body", ENQUEUE, b"", "body"),
    ("whitespace body", ENQUEUE, b"  \n ", "body"),
    ("truncated JSON", ENQUEUE, b'{"payload": {"kind": ', "body"),
    ("not JSON", ENQUEUE, b"kind=factory.run", "body"),
    ("array instead of object", ENQUEUE, b"[]", "body"),
    ("array of objects", ENQUEUE, _json([{"payload": OK}]), "body"),
    ("string instead of object", ENQUEUE, b'"factory.run"', "body"),
    ("number instead of object", ENQUEUE, b"42", "body"),
    ("null body", ENQUEUE, b"null", "body"),
    ("NaN literal", ENQUEUE, b'{"payload": {"kind": "factory.run", "n": NaN}}', "body"),
    ("Infinity literal", ENQUEUE, b'{"payload": {"kind": "factory.run", "n": Infinity}}', "body"),
    ("-Infinity literal", ENQUEUE, b'{"maxAttempts": -Infinity, "payload": {}}', "body"),
    ("overflowing float", ENQUEUE, b'{"payload": {"kind": "factory.run", "n": 1e999}}', "body"),
    ("integer with 5000 digits", ENQUEUE, b'{"maxAttempts": ' + b"9" * 5000 + b"}", "body"),
    ("invalid UTF-8", ENQUEUE, b'{"payload": "\xff\xfe"}', "body"),
    ("nesting 100000 deep", ENQUEUE, b"[" * 100000 + b"]" * 100000, "body"),
    ("unknown top-level field", ENQUEUE, _json({"payload": OK, "urgency": 1}), "urgency"),
    ("missing payload", ENQUEUE, _json({"lane": "chat"}), "payload"),
    ("payload is an array", ENQUEUE, _json({"payload": [OK]}), "payload"),
    ("payload is a string", ENQUEUE, _json({"payload": "factory.run"}), "payload"),
    ("payload without kind", ENQUEUE, _json({"payload": {"authContext": auth_context()}}), "payload.kind"),
    ("kind is a number", ENQUEUE, _json({"payload": {**OK, "kind": 7}}), "payload.kind"),
    ("unknown kind", ENQUEUE, _json({"payload": {**OK, "kind": "factory.explode"}}), "payload.kind"),
    ("kind with different case", ENQUEUE, _json({"payload": {**OK, "kind": "Factory.Run"}}), "payload.kind"),
    ("unknown lane", ENQUEUE, _json({"payload": OK, "lane": "express"}), "lane"),
    ("lane is a number", ENQUEUE, _json({"payload": OK, "lane": 3}), "lane"),
    ("three-lane world", ENQUEUE, _json({"payload": OK, "lane": "steering"}), "lane"),
    (
        "unknown singleton mode",
        ENQUEUE,
        _json({"payload": OK, "singletonMode": "always", "sessionKey": "s"}),
        "singletonMode",
    ),
    (
        "singleton steer without session key",
        ENQUEUE,
        _json({"payload": OK, "singletonMode": "steer"}),
        "sessionKey",
    ),
    ("maxAttempts as a string", ENQUEUE, _json({"payload": OK, "maxAttempts": "3"}), "maxAttempts"),
    ("maxAttempts as a float", ENQUEUE, _json({"payload": OK, "maxAttempts": 2.5}), "maxAttempts"),
    ("maxAttempts as a boolean", ENQUEUE, _json({"payload": OK, "maxAttempts": True}), "maxAttempts"),
    ("empty jobId", ENQUEUE, _json({"payload": OK, "jobId": ""}), "jobId"),
    ("jobId with a space", ENQUEUE, _json({"payload": OK, "jobId": "has space"}), "jobId"),
    ("jobId with a slash", ENQUEUE, _json({"payload": OK, "jobId": "a/b"}), "jobId"),
    ("jobId of 200 characters", ENQUEUE, _json({"payload": OK, "jobId": "j" * 200}), "jobId"),
    ("jobId as a number", ENQUEUE, _json({"payload": OK, "jobId": 123}), "jobId"),
    ("empty sessionKey", ENQUEUE, _json({"payload": OK, "sessionKey": ""}), "sessionKey"),
    ("blank sessionKey", ENQUEUE, _json({"payload": OK, "sessionKey": "   "}), "sessionKey"),
    ("huge sessionKey", ENQUEUE, _json({"payload": OK, "sessionKey": "k" * 600}), "sessionKey"),
    ("sessionKey as an object", ENQUEUE, _json({"payload": OK, "sessionKey": {"k": 1}}), "sessionKey"),
    ("missing authContext", ENQUEUE, _json({"payload": {"kind": "factory.run"}}), "payload.authContext"),
    (
        "null authContext",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": None}}),
        "payload.authContext",
    ),
    (
        "authContext as a string",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": "org-a"}}),
        "payload.authContext",
    ),
    (
        "authContext without userId",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": {"organizationId": "org-a"}}}),
        "payload.authContext.userId",
    ),
    (
        "blank organizationId",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": auth_context(org=" ")}}),
        "payload.authContext.organizationId",
    ),
    (
        "organizationId longer than storable",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": auth_context(org="o" * 300)}}),
        "payload.authContext.organizationId",
    ),
    (
        "unknown authContext field",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": auth_context(role="admin")}}),
        "payload.authContext.role",
    ),
    (
        "authContext optional field of wrong type",
        ENQUEUE,
        _json({"payload": {"kind": "factory.run", "authContext": auth_context(workspaceId=5)}}),
        "payload.authContext.workspaceId",
    ),
    ("NUL in a payload string", ENQUEUE, _json({"payload": {**OK, "note": "a\u0000b"}}), "payload.note"),
    ("NUL in a payload key", ENQUEUE, _json({"payload": {**OK, "a\u0000": 1}}), "payload"),
    (
        "lone surrogate in payload",
        ENQUEUE,
        b'{"payload": {"kind": "factory.run", "note": "\\ud800"}}',
        "payload.note",
    ),
    ("nested garbage 100 deep", ENQUEUE, _json({"payload": {**OK, "deep": _nested(100)}}), "payload.deep"),
    ("huge string in a known field", ENQUEUE, _json({"payload": OK, "lane": "c" * 100_000}), "lane"),
    ("agentId of 300 characters", "/agents/" + "a" * 300 + "/jobs", _json({"payload": OK}), "agentId"),
    ("blank agentId", "/agents/%20/jobs", _json({"payload": OK}), "agentId"),
    ("NUL in agentId", "/agents/a%00b/jobs", _json({"payload": OK}), "agentId"),
    ("command body is an array", "/jobs/{job}/commands", b'[{"type": "steer"}]', "body"),
    ("command without type", "/jobs/{job}/commands", _json({"payload": 1}), "type"),
    ("unknown command type", "/jobs/{job}/commands", _json({"type": "restart"}), "type"),
    (
        "command with unknown field",
        "/jobs/{job}/commands",
        _json({"type": "steer", "urgent": True}),
        "urgent",
    ),
    ("command on a job lane", "/jobs/{job}/commands", _json({"type": "steer", "lane": "chat"}), "lane"),
    ("abort naming a lane", "/jobs/{job}/commands", _json({"type": "abort", "lane": "steer"}), "lane"),
    ("command reason of wrong type", "/jobs/{job}/commands", _json({"type": "abort", "reason": 5}), "reason"),
    ("command NaN payload", "/jobs/{job}/commands", b'{"type": "steer", "payload": NaN}', "body"),
    ("cancel body is a list", "/jobs/{job}/cancel", b"[1]", "body"),
    ("cancel reason of wrong type", "/jobs/{job}/cancel", _json({"reason": ["x"]}), "reason"),
    ("cancel with malformed JSON", "/jobs/{job}/cancel", b"{reason: 'x'}", "body"),
]


@pytest.mark.parametrize("who", ["a", "system"])
def test_broken_requests_are_4xx_json_naming_the_field_and_write_nothing(api: Api, who: str) -> None:
    job = api.job()
    before = api.receipt_count()
    failures = []
    for name, url, raw, field in CORPUS:
        response = api.client.post(
            url.format(job=job["id"]), data=raw, headers=api.headers(who), content_type="application/json"
        )
        body = response.get_json(silent=True)
        ok = (
            response.status_code == 400
            and response.mimetype == "application/json"
            and isinstance(body, dict)
            and set(body) == {"error"}
            and body["error"]["code"] in ("invalid_json", "invalid_field")
            # The field itself, or a place inside it (a too-deep value is named where it gets too deep).
            and (
                body["error"]["details"]["field"] == field
                or body["error"]["details"]["field"].startswith(field + ".")
            )
        )
        if not ok:
            failures.append((name, response.status_code, body))
    assert failures == []
    assert api.receipt_count() == before
    assert len(CORPUS) >= 30
    # The job the commands and cancels aimed at is untouched.
    stored = api.queue.get(key(job))
    assert stored is not None and stored.seq == 1


def test_closed_sets_name_their_allowed_values(sqlite_api: Api) -> None:
    cases = [
        ({"payload": OK, "lane": "x"}, "lane", list(LANES)),
        ({"payload": OK, "singletonMode": "x", "sessionKey": "s"}, "singletonMode", list(SINGLETON_MODES)),
        ({"payload": {**OK, "kind": "x"}}, "payload.kind", list(PAYLOAD_KINDS)),
    ]
    for body, field, allowed in cases:
        response = sqlite_api.client.post(ENQUEUE, json=body, headers=sqlite_api.headers())
        assert json_of(response)["error"]["details"] == {"field": field, "allowed": allowed}


def test_body_over_the_limit_is_413_by_content_length(api: Api) -> None:
    limit = api.state.settings.max_body_bytes
    before = api.receipt_count()
    big = _json({"payload": {**OK, "blob": "x" * limit}})
    response = api.client.post(ENQUEUE, data=big, headers=api.headers(), content_type="application/json")
    assert response.status_code == 413
    assert json_of(response)["error"]["code"] == "payload_too_large"
    assert api.receipt_count() == before


def _post_streamed(api: Api, body: bytes) -> tuple[str, bytes]:
    """POST ``body`` as a server hands over a chunked upload: no declared length, terminated stream."""
    builder = EnvironBuilder(
        path=ENQUEUE,
        method="POST",
        input_stream=io.BytesIO(body),
        content_type="application/json",
        headers=list(api.headers().items()),
    )
    environ = builder.get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    environ["wsgi.input_terminated"] = True
    # Straight to the WSGI app: the test client would rebuild the environ with a length.
    app_iter, status, _headers = run_wsgi_app(api.app, environ)
    return status, b"".join(app_iter)


def test_body_over_the_limit_is_413_when_streamed_without_length(sqlite_api: Api) -> None:
    limit = sqlite_api.state.settings.max_body_bytes
    skeleton = _json({"payload": {**OK, "blob": ""}})
    over = _json({"payload": {**OK, "blob": "x" * (limit - len(skeleton) + 1)}})
    assert len(over) == limit + 1
    status, body = _post_streamed(sqlite_api, over)
    assert status.startswith("413")
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    # Exactly at the limit is fine when streamed too (the stream is not cut short at the limit).
    exact = _json({"payload": {**OK, "blob": "x" * (limit - len(skeleton))}})
    status, body = _post_streamed(sqlite_api, exact)
    assert status.startswith("202"), body


def test_body_at_the_limit_is_accepted(sqlite_api: Api) -> None:
    limit = sqlite_api.state.settings.max_body_bytes
    skeleton = _json({"payload": {**OK, "blob": ""}})
    body = _json({"payload": {**OK, "blob": "x" * (limit - len(skeleton))}})
    assert len(body) == limit
    response = sqlite_api.client.post(
        ENQUEUE, data=body, headers=sqlite_api.headers(), content_type="application/json"
    )
    assert response.status_code == 202


def test_unknown_routes_and_methods_are_json(sqlite_api: Api) -> None:
    missing = sqlite_api.client.get("/nope", headers=sqlite_api.headers())
    assert missing.status_code == 404
    assert json_of(missing)["error"]["code"] == "not_found"
    wrong = sqlite_api.client.delete("/jobs", headers=sqlite_api.headers())
    assert wrong.status_code == 405
    assert json_of(wrong)["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong.headers["Allow"]


def test_body_without_json_content_type_is_still_parsed(sqlite_api: Api) -> None:
    response = sqlite_api.client.post(
        ENQUEUE, data=_json({"payload": OK}), headers=sqlite_api.headers(), content_type="text/plain"
    )
    assert response.status_code == 202


def test_an_unexpected_error_still_answers_in_the_json_shape(sqlite_api: Api) -> None:
    def explode() -> str:
        raise RuntimeError("boom")

    sqlite_api.app.add_url_rule("/explode", "explode", explode)
    response = sqlite_api.client.get("/explode", headers=sqlite_api.headers())
    assert response.status_code == 500
    assert response.json == {"error": {"code": "internal_error", "message": "internal server error"}}
    assert sqlite_api.state.internal_errors == 1
    sqlite_api.state.internal_errors = 0  # expected here; the fixture checks the rest stayed at 0
