"""The authorization matrix, route by route: every cell of ``tests/support/authz_matrix.ROWS`` played
against one app over a real PostgreSQL database.

Callers: the owner (organisation A, with the row's scope), organisation B knowing A's ids (its own
token, with the same scope), A's token without the scope, a system token (naming A with
``?organizationId=`` on by-id routes) and no token. The dashboard's rows sign each caller in with
its token (the cookie) and send the page's CSRF token, none, or another session's.

Every cell gets new ids (a job and an objective of A's made for it), so one app serves them all.
B's answer for A's ids must equal its answer for ids no one holds, and A's job and objective are
the same after B's request as before it. A route of the app, a payload kind or a command type
without a row fails ``test_every_route_has_a_row`` and its neighbours.
"""

from __future__ import annotations

import os
import re
import secrets
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.engine import Engine

from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.vocab import COMMAND_TYPES
from app.storage import tokens
from app.storage.db import make_engine
from tests.support import authz_matrix
from tests.support.api import ORG_A, ORG_B, Api, build_api, json_of, make_settings
from tests.support.authz_matrix import (
    A_VALUES,
    COMMANDS,
    ENQUEUE,
    IDENTITIES,
    ORG_PARAM,
    PLACEHOLDER,
    ROWS,
    Identity,
    Row,
    fill,
)
from tests.support.databases import new_database
from tests.support.queue_ops import close_queues

# Cells whose expectation is the tenancy rules the core is being changed to (per-organisation ids,
# ?organizationId= for system tokens, reserved id shapes, the kinds' door rules): today's server
# answers otherwise. Each is skipped with this reason until that change is in; then delete the set.
_ENQUEUE = "POST /agents/{agentId}/jobs"
_RESERVED_IDS = (
    "a task's id `...:p<n>:...`",
    "a control id `...:control:...`",
    "an audit id `...:audit`",
    "a monitor id `...:monitor`",
    "a watchdog tick's id",
)
# -- the app -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Env:
    """One app over one PostgreSQL database, and the tokens the callers use."""

    api: Api
    secrets: Mapping[str, str]  # a, a_commands, b, b_commands, system
    token_stream: str  # the tokens/<id> stream of one of A's tokens

    @property
    def app(self) -> Flask:
        return self.api.app

    def secret(self, row: Row, identity: Identity) -> str | None:
        scoped = "_commands" if row.scope == COMMANDS else ""
        return {
            "owner": self.secrets.get("a" + scoped),
            "other_org": self.secrets.get("b" + scoped),
            "no_scope": self.secrets["a"],
            "system": self.secrets["system"],
            "anonymous": None,
        }[identity]


@pytest.fixture(scope="module")
def env(pg_admin: Engine, pg_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with new_database(pg_admin, "receipt_t", pg_template) as url:
        engine = make_engine(
            url, prepared_statements=os.environ.get("RECEIPT_TEST_PREPARED_STATEMENTS") == "1"
        )
        try:
            hour = 3_600_000
            settings = make_settings(
                tmp_path_factory.mktemp("authz"),
                # Hundreds of posts per organisation and route: the write limit has its own tests.
                rate_limit_writes="disabled",
                # /readyz calls a loop that never ran overdue three intervals after the app
                # started; this module's app lives longer than the defaults allow.
                queued_redrive_interval_ms=hour,
                retry_scan_interval_ms=hour,
                schedule_scan_interval_ms=hour,
                lease_expiry_interval_ms=hour,
            )
            api = build_api(engine, settings)
            extra = {
                "a_commands": tokens.create(engine, ORG_A, scopes=(COMMANDS,))[1],
                "b_commands": tokens.create(engine, ORG_B, scopes=(COMMANDS,))[1],
            }
            info, _ = tokens.create(engine, ORG_A)
            yield Env(api, {**api.secrets, **extra}, f"{tokens.TOKEN_STREAM_PREFIX}{info.id}")
            assert api.state.internal_errors == 0, "a request reached the catch-all 500 handler"
        finally:
            close_queues(engine)
            engine.dispose()


# -- the world each cell starts from ----------------------------------------------------------------


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def a_world(env: Env, row: Row) -> dict[str, str]:
    """A's job and objective for this cell (only those the row names), and A's other values."""
    names = row.placeholders()
    world = {"org": ORG_A, "tokenStream": env.token_stream}
    client = env.app.test_client()
    headers = {"Authorization": f"Bearer {env.secrets['a']}"}
    if names & {"jobId", "sessionKey", "jobStream", "claimJobId"}:
        job_id, session_key = fresh("job"), fresh("session")
        body = {
            "jobId": job_id,
            "sessionKey": session_key,
            "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG_A}},
        }
        response = client.post("/agents/factory/jobs", json=body, headers=headers)
        assert response.status_code == 202, response.get_data(as_text=True)
        job = json_of(response)["job"]
        world.update(jobId=job_id, sessionKey=session_key, jobStream=job["stream"])
    if names & {"objectiveId", "objectiveStream", "claimObjectiveId"}:
        objective_id = fresh("objective")
        body = {
            "objectiveId": objective_id,
            "title": "A's",
            "goal": "Stay A's",
            "plan": {
                "tasks": [{"id": "one", "agentId": "test-echo", "payload": {"kind": "factory.task.run"}}]
            },
        }
        response = client.post("/objectives", json=body, headers=headers)
        assert response.status_code == 202, response.get_data(as_text=True)
        world.update(objectiveId=objective_id, objectiveStream=json_of(response)["async"]["stream"])
    if "archivedJobId" in names:
        world["archivedJobId"] = archived_job(env, client, headers)
    if "failedJobId" in names:
        world["failedJobId"] = failed_job(env, client, headers)
    if "operationId" in names:
        world["operationId"] = operation_of_a(client, headers)
    if names & {"scheduleId", "claimScheduleId"}:
        schedule_id = fresh("schedule")
        body = {
            "scheduleId": schedule_id,
            "cron": "0 0 1 1 *",
            "job": {"agentId": "factory", "payload": {"kind": "factory.run"}},
        }
        response = client.post("/schedules", json=body, headers=headers)
        assert response.status_code == 201, response.get_data(as_text=True)
        world["scheduleId"] = schedule_id
    return world


def failed_job(env: Env, client: Any, headers: Mapping[str, str]) -> str:
    """A job of A's that failed for good (not retryable)."""
    job_id = fresh("failed")
    body = {
        "jobId": job_id,
        "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG_A}},
    }
    response = client.post("/agents/factory/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.get_data(as_text=True)
    assert env.api.queue.fail(f"{ORG_A}/{job_id}", None, None, "boom", retryable=False).job.status == "failed"
    return job_id


def operation_of_a(client: Any, headers: Mapping[str, str]) -> str:
    """A bulk operation A ran (a cancel of a session no job is on): its idempotency key."""
    key = fresh("op")
    body = {"action": "cancel", "filter": {"sessionKey": fresh("session")}, "idempotencyKey": key}
    response = client.post("/jobs:bulk", json=body, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return key


def archived_job(env: Env, client: Any, headers: Mapping[str, str]) -> str:
    """A job of A's, completed, ended forty days ago (as its projection row says), archived."""
    from sqlalchemy import update

    from app.retention import archive
    from app.retention.policy import Policy
    from app.retention.sink import DirectorySink
    from app.storage.db import jobs, transaction
    from tests.support.queue_ops import complete, lease

    job_id = fresh("archived")
    body = {
        "jobId": job_id,
        "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG_A}},
    }
    response = client.post("/agents/factory/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.get_data(as_text=True)
    key = f"{ORG_A}/{job_id}"
    lease(env.api.queue, key, "w1", 60_000)
    complete(env.api.queue, key, "w1", 1, {})
    with transaction(env.api.engine) as conn:
        ended = jobs.c.status_changed_at - timedelta(days=40)
        conn.execute(update(jobs).where(jobs.c.id == key).values(status_changed_at=ended))
    sink = DirectorySink(Path(env.api.state.settings.home) / "archive")
    totals = archive.run_pass(env.api.engine, sink, Policy(days=30), page_size=10)
    assert totals.jobs == 1, totals
    return job_id


def values_for(identity: Identity, world: Mapping[str, str]) -> dict[str, str]:
    """What ``identity`` fills the row's templates with: B posts A's ids, everyone else new ones."""
    values = dict(world)
    values["authOrg"] = ORG_B if identity == "other_org" else ORG_A
    if identity == "other_org":
        values["claimJobId"] = world.get("jobId", fresh("job"))
        values["claimObjectiveId"] = world.get("objectiveId", fresh("objective"))
        values["claimScheduleId"] = world.get("scheduleId", fresh("schedule"))
    else:
        values["claimJobId"], values["claimObjectiveId"] = fresh("job"), fresh("objective")
        values["claimScheduleId"] = fresh("schedule")
    values["taskId"] = fresh("task")
    values["missingObjectiveId"] = fresh("objective")
    tick = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=secrets.randbelow(1_000_000))
    values["watchdogTick"] = f"watchdog:{tick.strftime('%Y%m%dT%H%M%SZ')}"
    return values


def never_used(values: Mapping[str, str]) -> dict[str, str]:
    """``values`` with each of A's ids replaced by one no one holds (streams keep their shape)."""
    out = dict(values)
    replacements = {}
    for name, prefix in (
        ("jobId", "job"),
        ("objectiveId", "objective"),
        ("sessionKey", "session"),
        ("scheduleId", "schedule"),
        ("archivedJobId", "archived"),
        ("failedJobId", "failed"),
        ("operationId", "op"),
    ):
        if name in values:
            replacements[values[name]] = out[name] = fresh(prefix)
    for name in ("jobStream", "objectiveStream"):
        if name in values:
            stream = values[name]
            for old, new in replacements.items():
                stream = stream.replace(old, new)
            out[name] = stream
    out["tokenStream"] = f"{tokens.TOKEN_STREAM_PREFIX}tok_{uuid.uuid4().hex[:26]}"
    out["org"] = fresh("org")
    out["claimJobId"] = replacements.get(values["claimJobId"], values["claimJobId"])
    out["claimObjectiveId"] = replacements.get(values["claimObjectiveId"], values["claimObjectiveId"])
    out["claimScheduleId"] = replacements.get(values["claimScheduleId"], values["claimScheduleId"])
    return out


# -- asking -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """A client as one identity: for the dashboard, signed in (its cookie) with the CSRF to send."""

    identity: Identity
    client: FlaskClient
    secret: str | None
    csrf: str | None


_CSRF_FIELD = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


def signed_in(app: Flask, secret: str) -> tuple[FlaskClient, str]:
    """A client holding a dashboard session of ``secret``, and that session's CSRF token."""
    client = app.test_client()
    response = client.post("/ui/signin", data={"token": secret})
    assert response.status_code == 302, response.get_data(as_text=True)
    page = client.get("/ui/jobs", query_string={"q": "nothing-matches"}).get_data(as_text=True)
    match = _CSRF_FIELD.search(page)
    assert match, "the dashboard page carries no CSRF field"
    return client, match.group(1)


def caller(env: Env, row: Row, identity: Identity) -> Caller:
    secret = env.secret(row, identity)
    if not row.ui or row.signin or secret is None:
        return Caller(identity, env.app.test_client(), secret, None)
    client, csrf = signed_in(env.app, secret)
    if row.csrf == "foreign":
        _, csrf = signed_in(env.app, secret)  # the same token's other session
    return Caller(identity, client, secret, csrf if row.csrf in ("valid", "foreign") else None)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # a 200 event stream: its first chunk only
    mimetype: str
    location: str | None


def ask(row: Row, who: Caller, values: Mapping[str, str]) -> Answer:
    path = row.path
    for name in PLACEHOLDER.findall(row.path):
        path = path.replace("{" + name + "}", fill(row.args.get(name, "{" + name + "}"), values))
    query: dict[str, str] = fill(dict(row.query), values)
    if who.identity == "system" and row.by_id:
        query[ORG_PARAM] = ORG_A
    headers = {"Origin": row.origin} if row.origin else {}
    kwargs: dict[str, Any] = {}
    if row.ui:
        form: dict[str, str] = fill(dict(row.form or {}), values)
        if row.signin:
            form["token"] = who.secret or ""
        if who.csrf is not None:
            form["csrf"] = who.csrf
        if row.method == "POST":
            kwargs["data"] = form
    else:
        if who.secret is not None:
            headers["Authorization"] = f"Bearer {who.secret}"
        if row.json is not None:
            kwargs["json"] = fill(row.json, values)
    response = who.client.open(
        path, method=row.method, query_string=query, headers=headers, buffered=False, **kwargs
    )
    try:
        if row.streams and response.status_code == 200:
            # The server runs the stream lazily: read what it sends first, then hang up.
            body = next(iter(response.response), b"")
            body = body if isinstance(body, bytes) else str(body).encode()
        else:
            body = response.get_data()
        return Answer(response.status_code, body, response.mimetype or "", response.headers.get("Location"))
    finally:
        response.close()


_TIMESTAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
_GENERATED_ID = re.compile(rb"\b[0-9a-hjkmnp-tv-z]{26}\b")  # app.jobs.ids.new_id


def masked(body: bytes, values: Mapping[str, str]) -> bytes:
    """``body`` with the ids the caller sent, timestamps and server-made ids masked."""
    for name, value in sorted(values.items(), key=lambda item: -len(item[1])):
        if name in A_VALUES:
            body = body.replace(value.encode(), b"<" + name.encode() + b">")
    return _GENERATED_ID.sub(b"<new-id>", _TIMESTAMP.sub(b"<time>", body))


def a_view(env: Env, world: Mapping[str, str]) -> list[Any]:
    """A's job and objective as A reads them (the objective's ledger summary is written in the
    background, so it is left out)."""
    headers = {"Authorization": f"Bearer {env.secrets['a']}"}
    client = env.app.test_client()
    out: list[Any] = []
    if "jobId" in world:
        out.append(json_of(client.get(f"/jobs/{world['jobId']}", headers=headers)))
    if "objectiveId" in world:
        objective = json_of(client.get(f"/objectives/{world['objectiveId']}", headers=headers))["objective"]
        objective.pop("ledger", None)
        out.append(objective)
    if "scheduleId" in world:
        out.append(json_of(client.get(f"/schedules/{world['scheduleId']}", headers=headers)))
        out.append(json_of(client.get(f"/schedules/{world['scheduleId']}/fires", headers=headers)))
    return out


# -- the cells --------------------------------------------------------------------------------------


def _cells() -> list[Any]:
    cells = []
    for row in ROWS:
        for identity in IDENTITIES:
            cells.append(pytest.param(row, identity, id=f"{row.key} | {identity}"))
    return cells


@pytest.mark.parametrize(("row", "identity"), _cells())
def test_cell(env: Env, row: Row, identity: Identity) -> None:
    errors = env.api.state.internal_errors
    world = a_world(env, row)
    values = values_for(identity, world)
    who = caller(env, row, identity)
    before = a_view(env, world) if identity == "other_org" else None
    answer = ask(row, who, values)
    expected = row.expected(identity)
    assert answer.status == expected, (
        f"{row.key} as {identity}: expected {expected}, got {answer.status}: {answer.body[:400]!r}"
    )
    if row.streams and answer.status == 200:
        assert answer.mimetype == "text/event-stream"
        assert answer.body.startswith(b"retry: "), answer.body[:100]
    if row.ui and identity == "anonymous" and answer.status == 302:
        assert (answer.location or "").startswith("/ui/signin"), answer.location
    if identity == "other_org" and row.placeholders() & A_VALUES:
        unknown_values = never_used(values)
        unknown = ask(row, who, unknown_values)
        assert (unknown.status, masked(unknown.body, unknown_values)) == (
            answer.status,
            masked(answer.body, values),
        ), f"{row.key}: B can tell A's ids from ids no one holds"
        assert a_view(env, world) == before, f"{row.key}: B's request changed A's job or objective"
    assert env.api.state.internal_errors == errors, "a request reached the catch-all 500 handler"


# -- the table covers the app -----------------------------------------------------------------------

_RULE_ARG = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def app_routes(app: Flask) -> set[tuple[str, str]]:
    """Every (method, path template) of the app's URL map, in the OpenAPI document's spelling."""
    routes = set()
    for rule in app.url_map.iter_rules():
        path = _RULE_ARG.sub(lambda m: "{" + m.group(1) + "}", rule.rule)
        routes |= {(method, path) for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}}
    return routes


def test_every_route_has_a_row(env: Env) -> None:
    response = env.app.test_client().get(
        "/openapi.json", headers={"Authorization": f"Bearer {env.secrets['a']}"}
    )
    document = json_of(response)
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    routes = documented | app_routes(env.app)
    rows = {row.route for row in ROWS}
    missing = sorted(routes - rows)
    assert not missing, "routes without a row in tests/support/authz_matrix.py: " + ", ".join(
        f"{method} {path}" for method, path in missing
    )
    stale = sorted(rows - routes)
    assert not stale, "rows for routes the app does not have: " + ", ".join(f"{m} {p}" for m, p in stale)


def test_every_payload_kind_and_command_type_has_a_row() -> None:
    kinds = {row.kind for row in ROWS if row.route == ("POST", ENQUEUE)}
    missing = [kind for kind in PAYLOAD_KINDS if kind not in kinds]
    assert not missing, f"payload kinds without a row for POST {ENQUEUE}: {', '.join(missing)}"
    commands = {row.command for row in ROWS if row.route == ("POST", "/jobs/{jobId}/commands")}
    missing = [t for t in COMMAND_TYPES if t not in commands]
    assert not missing, f"command types without a row for POST /jobs/{{jobId}}/commands: {', '.join(missing)}"


def test_rows_are_distinct() -> None:
    keys = [row.key for row in ROWS]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_docs_security_carries_the_matrix() -> None:
    table = authz_matrix.documented(authz_matrix.DOC.read_text())
    assert table == authz_matrix.markdown(), "run `make docs` to regenerate the matrix in docs/security.md"
