"""Authentication: Bearer tokens everywhere but the probes, revocation, and RECEIPT_AUTH=disabled."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from api.app import create_app
from api.token_cache import TokenCache
from app.storage import tokens
from tests.support.api import Api, json_of, make_settings, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

# One request per endpoint (path parameters need not exist: auth is checked first).
EVERY_AUTHENTICATED_REQUEST = [
    ("POST", "/agents/factory/jobs"),
    ("GET", "/jobs"),
    ("GET", "/jobs/some-job"),
    ("POST", "/jobs/some-job/commands"),
    ("POST", "/jobs/some-job/cancel"),
    ("GET", "/jobs/some-job/events"),
    ("GET", "/streams/jobs/some-job/receipts"),
    ("GET", "/streams/jobs/some-job/events"),
    ("GET", "/openapi.json"),
    ("GET", "/no-such-route"),
]


@pytest.mark.parametrize(("method", "url"), EVERY_AUTHENTICATED_REQUEST)
def test_missing_credentials_are_401_with_a_challenge(api: Api, method: str, url: str) -> None:
    response = api.client.open(url, method=method, json={"type": "steer"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert json_of(response)["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    "header",
    [
        "Bearer rcpt_not-a-real-token",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "rcpt_token-without-scheme",
        "Bearer " + "x" * 300,
        "Bearer abc\tdef",
    ],
)
def test_invalid_credentials_are_401(sqlite_api: Api, header: str) -> None:
    response = sqlite_api.client.get("/jobs", headers={"Authorization": header})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    assert json_of(response)["error"]["code"] == "invalid_token"


def test_scheme_is_case_insensitive(sqlite_api: Api) -> None:
    response = sqlite_api.client.get("/jobs", headers={"Authorization": f"bearer {sqlite_api.secrets['a']}"})
    assert response.status_code == 200


def test_revoked_token_is_401(api: Api) -> None:
    assert api.client.get("/jobs", headers=api.headers("a")).status_code == 200
    assert tokens.revoke(api.engine, api.secrets["a"])
    assert api.client.get("/jobs", headers=api.headers("a")).status_code == 401


def test_a_token_revoked_by_another_process_stops_working_once_the_token_cache_ttl_passes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RECEIPT_TOKEN_CACHE_MS (default 1000): the API process reuses what it read of a token for
    that long; a revocation this process did not make (the CLI elsewhere) is seen after it."""
    clock = [500.0]
    api.state.token_cache = TokenCache(api.state.settings.token_cache_ms, clock=lambda: clock[0])
    assert api.client.get("/jobs", headers=api.headers("a")).status_code == 200
    seen = tokens.revocations()
    monkeypatch.setattr(tokens, "revocations", lambda: seen)  # this process does not see it revoked
    assert tokens.revoke(api.engine, api.secrets["a"])
    clock[0] += api.state.settings.token_cache_ms / 1000 - 0.001
    assert api.client.get("/jobs", headers=api.headers("a")).status_code == 200
    clock[0] += 0.001
    response = api.client.get("/jobs", headers=api.headers("a"))
    assert response.status_code == 401
    assert json_of(response)["error"]["code"] == "invalid_token"


def test_healthz_needs_no_credentials(sqlite_api: Api) -> None:
    response = sqlite_api.client.get("/healthz")
    assert response.status_code == 200
    assert response.json == {"status": "ok"}
    assert "X-Receipt-Warning" not in response.headers


def test_auth_disabled_allows_anonymous_with_a_warning_on_every_response(
    sqlite_engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="receipt.api"):
        app = create_app(
            make_settings(tmp_path, auth=False), engine=sqlite_engine, on_dispatchable=lambda jobs: None
        )
    assert any("RECEIPT_AUTH=disabled" in r.getMessage() for r in caplog.records)
    client = app.test_client()
    created = client.post("/agents/factory/jobs", json={"payload": payload()})
    assert created.status_code == 202
    responses = [
        created,
        client.get("/healthz"),
        client.get("/jobs"),
        client.get("/jobs/nope"),  # errors carry it too
        client.post("/agents/factory/jobs", data=b"{"),
    ]
    for response in responses:
        assert response.headers["X-Receipt-Warning"] == "authentication disabled"
    # Anonymous sees every organisation but is no system identity: no watchdog posts.
    watchdog = client.post(
        "/agents/factory-control/jobs", json={"payload": {"kind": "factory.objective.watchdog"}}
    )
    assert watchdog.status_code == 403
    assert len(json_of(client.get("/jobs"))["jobs"]) == 1
    # A token that is sent is still checked.
    assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
