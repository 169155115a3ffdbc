"""``GET /whoami``: the token's organisation, id, system flag and scopes, never its secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from api.app import create_app
from app.jobs.privilege import COMMANDS_SCOPE
from app.storage import tokens
from tests.support.api import ORG_A, Api, json_of, make_settings

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def test_whoami_answers_the_tokens_organisation_id_and_scopes_never_its_secret(api: Api) -> None:
    info, secret = tokens.create(api.engine, ORG_A, scopes=(COMMANDS_SCOPE,))
    response = api.client.get("/whoami", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200
    assert json_of(response) == {
        "organizationId": ORG_A,
        "tokenId": info.id,
        "system": False,
        "scopes": [COMMANDS_SCOPE],
    }
    assert secret not in response.get_data(as_text=True)


def test_whoami_of_a_system_token_says_system(api: Api) -> None:
    body = json_of(api.client.get("/whoami", headers=api.headers("system")))
    assert body["organizationId"] == "ops" and body["system"] is True and body["scopes"] == []


def test_whoami_needs_a_token_and_refuses_a_bad_one(api: Api) -> None:
    assert api.client.get("/whoami").status_code == 401
    bad = api.client.get("/whoami", headers={"Authorization": "Bearer rcpt_nope"})
    assert bad.status_code == 401 and json_of(bad)["error"]["code"] == "invalid_token"


def test_whoami_with_auth_disabled_is_the_anonymous_caller(sqlite_engine: Engine, tmp_path: Path) -> None:
    app = create_app(
        make_settings(tmp_path, auth="disabled"), engine=sqlite_engine, on_dispatchable=lambda jobs: None
    )
    response = app.test_client().get("/whoami")
    assert response.status_code == 200
    assert response.json == {"organizationId": None, "tokenId": None, "system": False, "scopes": []}
