"""Commands are a privilege: token scopes and expiry at the API.

A hostile tenant's ordinary token must not be able to make Receipt run a command: posting a job
that would run one needs the ``commands`` scope (or a system token), and the server records who
posted it on ``job.enqueued`` — never the caller.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from api.app import create_app
from api.token_cache import TokenCache
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.privilege import runs_command
from app.storage import store, tokens
from app.storage.db import db_now
from tests.support.api import ORG_A, Api, build_api, json_of, key, make_settings, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

COMMAND = ["/bin/echo", "hi"]


def post_codex(api: Api, secret: str, **extra: Any) -> Any:
    body = {"payload": payload("factory.task.run", command=COMMAND), **extra}
    return api.client.post("/agents/codex/jobs", json=body, headers={"Authorization": f"Bearer {secret}"})


def test_an_ordinary_token_gets_403_naming_the_scope_and_nothing_is_written(api: Api) -> None:
    before = api.receipt_count()
    response = post_codex(api, api.secrets["a"])
    assert response.status_code == 403
    error = json_of(response)["error"]
    assert error["code"] == "missing_scope"
    assert error["details"] == {"scope": "commands"}
    assert "'commands' scope" in error["message"]
    assert api.receipt_count() == before
    assert api.woken == []


def test_a_commands_token_posts_and_the_server_records_who_did(api: Api, projection_equals_fold: Any) -> None:
    info, secret = tokens.create(api.engine, ORG_A, scopes=["commands"])
    response = post_codex(api, secret)
    assert response.status_code == 202, response.json
    job = json_of(response)["job"]
    assert job["enqueuedBy"] == {"tokenId": info.id, "scopes": ["commands"], "system": False}
    with api.engine.connect() as conn:
        [enqueued] = store.read_stream(conn, job["stream"])
    assert enqueued.body["enqueuedBy"] == job["enqueuedBy"]
    projection_equals_fold(api.engine, key(job))
    assert (
        json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]["enqueuedBy"]
        == job["enqueuedBy"]
    )


def test_a_system_token_may_post_commands(api: Api) -> None:
    response = post_codex(api, api.secrets["system"])
    assert response.status_code == 202
    assert json_of(response)["job"]["enqueuedBy"]["system"] is True


def test_ordinary_jobs_record_their_enqueuer_too(api: Api) -> None:
    job = api.job()
    assert job["enqueuedBy"]["scopes"] == [] and job["enqueuedBy"]["system"] is False


def test_enqueued_by_is_never_taken_from_the_request(api: Api) -> None:
    before = api.receipt_count()
    forged = {"tokenId": "tok_x", "scopes": ["commands"], "system": True}
    response = post_codex(api, api.secrets["a"], enqueuedBy=forged)
    assert response.status_code == 400
    assert json_of(response)["error"]["details"]["field"] == "enqueuedBy"
    assert api.receipt_count() == before
    # Inside the payload it is just data: the recorded enqueuer is still the token's.
    _info, secret = tokens.create(api.engine, ORG_A)
    body = {"payload": payload("factory.run", enqueuedBy=forged)}
    job = json_of(
        api.client.post("/agents/factory/jobs", json=body, headers={"Authorization": f"Bearer {secret}"})
    )
    assert job["job"]["enqueuedBy"]["system"] is False


def test_which_posts_run_a_command_is_decided_from_the_kinds_table() -> None:
    """factory.task.run to the codex group, validate (routing sends every factory.integration.* job
    to codex whatever its agent), and publish when its payload gives a command."""
    agents = ("codex", "factory", "factory-control")

    def running(payload: dict[str, Any]) -> set[tuple[str, str]]:
        return {(a, k) for a in agents for k in PAYLOAD_KINDS if runs_command(a, k, payload)}

    validate = {(a, "factory.integration.validate") for a in agents}
    publish = {(a, "factory.integration.publish") for a in agents}
    assert running({}) == {("codex", "factory.task.run")} | validate
    assert running({"command": COMMAND}) == {("codex", "factory.task.run")} | validate | publish


def test_a_publish_without_a_command_needs_no_scope_and_one_with_a_command_does(api: Api) -> None:
    objective = api.objective()
    body = {"payload": payload("factory.integration.publish", objectiveId=objective["id"])}
    assert api.client.post("/agents/codex/jobs", json=body, headers=api.headers()).status_code == 202
    body["payload"]["command"] = COMMAND
    refused = api.client.post("/agents/codex/jobs", json=body, headers=api.headers())
    assert refused.status_code == 403
    assert json_of(refused)["error"]["code"] == "missing_scope"


def test_a_task_run_for_a_non_codex_agent_needs_no_scope(api: Api) -> None:
    body = {"payload": payload("factory.task.run", command=COMMAND)}
    assert api.client.post("/agents/factory/jobs", json=body, headers=api.headers()).status_code == 202


def test_an_expired_token_is_401_saying_so(api: Api) -> None:
    # The test moves the expiry under the API (a deployment never changes a token's expiry), so
    # the process keeps nothing it read of the token.
    api.state.token_cache = TokenCache(0)
    info, secret = tokens.create(api.engine, ORG_A, expires_in=timedelta(seconds=3600))
    assert api.client.get("/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    with api.engine.begin() as conn:
        from app.storage.db import api_tokens

        conn.execute(
            api_tokens.update()
            .where(api_tokens.c.id == info.id)
            .values(expires_at=db_now(conn) - timedelta(1))
        )
    response = api.client.get("/jobs", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 401
    assert json_of(response)["error"] == {"code": "invalid_token", "message": "the token has expired"}
    assert "invalid_token" in response.headers["WWW-Authenticate"]


def test_auth_disabled_never_grants_system_or_commands_rights(sqlite_engine: Engine, tmp_path: Path) -> None:
    app = create_app(
        make_settings(tmp_path, auth=False), engine=sqlite_engine, on_dispatchable=lambda j: None
    )
    client = app.test_client()
    codex = client.post("/agents/codex/jobs", json={"payload": payload("factory.task.run", command=COMMAND)})
    assert codex.status_code == 403
    assert json_of(codex)["error"]["code"] == "missing_scope"
    watchdog = client.post(
        "/agents/factory-control/jobs", json={"payload": {"kind": "factory.objective.watchdog"}}
    )
    assert watchdog.status_code == 403
    tokens.create(sqlite_engine, "ops")
    with sqlite_engine.connect() as conn:
        [token_stream] = store.streams(conn, "tokens/")
    assert client.get(f"/streams/{token_stream}/receipts").status_code == 404  # token hashes stay hidden
    # Still every organisation's ordinary work: anonymous posts and lists for any of them.
    assert client.post("/agents/factory/jobs", json={"payload": payload()}).status_code == 202
    assert client.post("/agents/factory/jobs", json={"payload": payload(org="org-b")}).status_code == 202
    assert len(json_of(client.get("/jobs"))["jobs"]) == 2


@pytest.mark.parametrize("who", ["a", "system"])
def test_posting_a_command_job_with_a_revoked_token_is_401(api: Api, who: str) -> None:
    assert tokens.revoke(api.engine, api.secrets[who])
    assert post_codex(api, api.secrets[who]).status_code == 401


# -- a deployment that runs no command: refused at the door -------------------------------------------


@pytest.fixture
def commands_off(sqlite_engine: Engine, tmp_path: Path) -> Api:
    return build_api(sqlite_engine, make_settings(tmp_path, codex_commands=False))


def assert_commands_disabled(response: Any, *, where: str = "") -> None:
    assert response.status_code == 403, response.json
    error = json_of(response)["error"]
    assert error["code"] == "commands_disabled"
    assert error["details"]["setting"] == "RECEIPT_CODEX_COMMANDS"
    assert error["message"].startswith(where)
    assert "RECEIPT_CODEX_COMMANDS=enabled" in error["message"]


def test_with_commands_off_a_command_job_is_403_naming_the_setting_whatever_the_token(
    commands_off: Api,
) -> None:
    """Never a 202 and then a failure when the codex handler refuses it."""
    _info, commands = tokens.create(commands_off.engine, ORG_A, scopes=["commands"])
    before = commands_off.receipt_count()
    for secret in (commands, commands_off.secrets["system"], commands_off.secrets["a"]):
        assert_commands_disabled(post_codex(commands_off, secret))
    assert commands_off.receipt_count() == before
    assert commands_off.woken == []
    # A job that runs nothing is still taken.
    assert (
        commands_off.client.post(
            "/agents/factory/jobs", json={"payload": payload()}, headers=commands_off.headers()
        ).status_code
        == 202
    )


def test_with_commands_off_a_batch_an_objective_or_a_schedule_holding_a_command_is_403(
    commands_off: Api,
) -> None:
    headers = {"Authorization": f"Bearer {commands_off.secrets['system']}"}
    before = commands_off.receipt_count()
    command_job = {"agentId": "codex", "payload": payload("factory.task.run", command=COMMAND)}
    batch = {"items": [{"agentId": "factory", "payload": payload()}, command_job]}
    assert_commands_disabled(
        commands_off.client.post("/jobs:batch", json=batch, headers=headers), where="items[1]: "
    )
    task = {"id": "t", "agentId": "codex", "payload": {"kind": "factory.task.run", "command": COMMAND}}
    objective = {
        "title": "t",
        "goal": "g",
        "plan": {"tasks": [task]},
        "authContext": payload()["authContext"],
    }
    assert_commands_disabled(commands_off.client.post("/objectives", json=objective, headers=headers))
    schedule = {"scheduleId": "s", "cron": "0 0 1 1 *", "job": command_job}
    assert_commands_disabled(commands_off.client.post("/schedules", json=schedule, headers=headers))
    assert commands_off.receipt_count() == before


def test_with_commands_off_a_factory_run_or_dispatch_whose_plan_runs_a_command_is_403(
    commands_off: Api,
) -> None:
    """The plan a job names outright is checked at the door too: its task would fail at run time."""
    headers = {"Authorization": f"Bearer {commands_off.secrets['system']}"}
    before = commands_off.receipt_count()
    command_task = {
        "id": "t",
        "agentId": "codex",
        "payload": {"kind": "factory.task.run", "command": COMMAND},
    }
    quiet_task = {"id": "t", "agentId": "factory", "payload": {"kind": "factory.task.run"}}
    launch = {"title": "t", "goal": "g", "plan": {"tasks": [command_task]}}
    for body in (
        payload("factory.run", plan={"tasks": [command_task]}),
        payload("factory.run", goal={"text": "g", "plan": {"tasks": [command_task]}}),
        payload("factory.dispatch", objective={**launch, "authContext": payload()["authContext"]}),
    ):
        refused = commands_off.client.post("/agents/factory/jobs", json={"payload": body}, headers=headers)
        assert_commands_disabled(
            refused, where=f"a {body['kind']} job whose plan holds a factory.task.run task"
        )
    assert commands_off.receipt_count() == before
    taken = payload("factory.run", plan={"tasks": [quiet_task]})
    assert (
        commands_off.client.post("/agents/factory/jobs", json={"payload": taken}, headers=headers).status_code
        == 202
    )
