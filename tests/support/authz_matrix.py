"""The authorization matrix: every route (and every payload kind), who may call it, what each caller gets.

``ROWS`` is the one table. ``tests/integration/api/test_authorization_matrix.py`` plays every cell
against a real app over PostgreSQL, and fails for a route of the app (OpenAPI or Flask URL rule),
a payload kind or a command type without a row. ``markdown()`` renders the same table for
``docs/security.md`` (a test keeps the two equal; ``make docs``, which runs this module, rewrites
the document's copy).

A row is one request shape. Its templates name world values in braces, filled per caller:

- ``{jobId}``, ``{sessionKey}``, ``{jobStream}``: a job organisation A holds (its stream is the one
  the job's JSON names); ``{objectiveId}``, ``{objectiveStream}``: an objective A holds;
  ``{tokenStream}``: the ``tokens/<id>`` stream of one of A's tokens; ``{org}``: A's organisation.
- ``{scheduleId}``: a schedule A holds (a yearly cron, so nothing fires on its own).
- ``{claimJobId}``, ``{claimObjectiveId}``, ``{claimScheduleId}``: the id a create posts.
  Organisation B posts A's id (it knows it); every other caller posts a new one.
- ``{authOrg}``: the ``authContext.organizationId`` the caller posts: its own organisation (A for
  the system token, which acts for A).
- ``{taskId}``, ``{watchdogTick}``, ``{missingObjectiveId}``: new values, never held by anyone.
- ``{failedJobId}``: a job of A's that failed for good (what a replay takes).
- ``{archivedJobId}``: a job A held, which the archiving pass has since moved out (a tombstone
  keeps its id: A gets 410 with its summary, B the unknown id's 404).
- ``{operationId}``: the idempotency key of a bulk operation A ran (a cancel of one of its sessions).

B's answer for A's ids is compared with its answer for ids no one holds (status and body, the
ids themselves and timestamps masked): B must not be able to tell them apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.vocab import COMMAND_TYPES

Identity = Literal["owner", "other_org", "no_scope", "system", "anonymous"]
IDENTITIES: Final[tuple[Identity, ...]] = ("owner", "other_org", "no_scope", "system", "anonymous")
COLUMNS: Final[Mapping[Identity, str]] = {
    "owner": "owner (A)",
    "other_org": "other org (B), A's ids",
    "no_scope": "A, no scope",
    "system": "system token",
    "anonymous": "no token",
}
Csrf = Literal["valid", "missing", "foreign"]
COMMANDS: Final = "commands"
ORG_PARAM: Final = "organizationId"
# The world values that are A's: a row naming one of them is also asked by B with ids no one holds.
A_VALUES: Final[frozenset[str]] = frozenset(
    {
        "jobId",
        "sessionKey",
        "jobStream",
        "objectiveId",
        "objectiveStream",
        "tokenStream",
        "org",
        "claimJobId",
        "claimObjectiveId",
        "scheduleId",
        "claimScheduleId",
        "archivedJobId",
        "failedJobId",
        "operationId",
    }
)
PLACEHOLDER = re.compile(r"\{([A-Za-z]+)\}")


@dataclass(frozen=True)
class Row:
    """One request shape and the status each caller gets.

    ``expect`` is in ``IDENTITIES`` order. ``scope``: the owner's and B's tokens carry it (the
    no-scope column is A's token without it). ``by_id``: the system token names organisation A
    with ``?organizationId=`` (the by-id routes of the tenancy rules). ``streams``: a 200 is an
    event stream, checked by its first bytes and closed at once.
    """

    method: str
    path: str  # the route's template as the OpenAPI document writes it
    expect: tuple[int, int, int, int, int]
    case: str = ""
    kind: str | None = None
    command: str | None = None
    args: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    form: Mapping[str, str] | None = None
    csrf: Csrf | None = None
    scope: str | None = None
    by_id: bool = False
    streams: bool = False
    signin: bool = False  # the caller's own token is the form's ``token`` (no session)
    origin: str | None = None

    @property
    def key(self) -> str:
        return f"{self.method} {self.path}" + (f" [{self.case}]" if self.case else "")

    @property
    def route(self) -> tuple[str, str]:
        return self.method, self.path

    @property
    def ui(self) -> bool:
        return self.path == "/ui" or self.path.startswith("/ui/")

    def expected(self, identity: Identity) -> int:
        return self.expect[IDENTITIES.index(identity)]

    def placeholders(self) -> set[str]:
        """Every world value the request names (path, query, body)."""
        found: set[str] = set()
        path = self.path
        for name in PLACEHOLDER.findall(self.path):
            path = path.replace("{" + name + "}", self.args.get(name, "{" + name + "}"))
        _collect(path, found)
        _collect(dict(self.query), found)
        _collect(self.json, found)
        _collect(dict(self.form or {}), found)
        return found


def _collect(node: Any, found: set[str]) -> None:
    if isinstance(node, str):
        found.update(PLACEHOLDER.findall(node))
    elif isinstance(node, Mapping):
        for value in node.values():
            _collect(value, found)
    elif isinstance(node, list):
        for value in node:
            _collect(value, found)


def fill(node: Any, values: Mapping[str, str]) -> Any:
    """``node`` with every ``{name}`` replaced by ``values[name]`` (a KeyError names a typo)."""
    if isinstance(node, str):
        return PLACEHOLDER.sub(lambda m: values[m.group(1)], node)
    if isinstance(node, Mapping):
        return {k: fill(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [fill(v, values) for v in node]
    return node


# -- the rows ---------------------------------------------------------------------------------------

_AUTH = {"userId": "user-1", "organizationId": "{authOrg}"}
ENQUEUE = "/agents/{agentId}/jobs"
# Where each kind is posted (its natural agent) and whether its payload names A's objective.
_KIND_AGENT: Final[Mapping[str, str]] = {
    "factory.dispatch": "factory",
    "factory.run": "factory",
    "factory.integration.publish": "factory",
    "factory.integration.validate": "factory",
    "factory.objective.audit": "factory-control",
    "factory.objective.control": "factory-control",
    "factory.objective.watchdog": "factory-control",
    "factory.task.monitor": "factory-monitor",
    "factory.task.run": "codex",
}
_NAMES_OBJECTIVE: Final = frozenset(
    {
        "factory.integration.publish",
        "factory.integration.validate",
        "factory.objective.audit",
        "factory.objective.control",
        "factory.task.monitor",
        "factory.task.run",
    }
)
# owner, B (A's jobId and objectiveId), A without the scope, system (for A), no token.
_KIND_EXPECT: Final[Mapping[str, tuple[int, int, int, int, int]]] = {
    # A tenant for its own organisation; B's post of A's jobId makes a job of B's own.
    "factory.dispatch": (202, 202, 202, 202, 401),
    "factory.run": (202, 202, 202, 202, 401),
    # Run a command (the codex group): the `commands` scope; A's objective is foreign to B.
    "factory.integration.publish": (202, 403, 403, 202, 401),
    "factory.integration.validate": (202, 403, 403, 202, 401),
    "factory.task.run": (202, 403, 403, 202, 401),
    # Only for an objective of the poster's own organisation.
    "factory.objective.audit": (202, 403, 202, 202, 401),
    "factory.objective.control": (202, 403, 202, 202, 401),
    # The system's own kinds.
    "factory.objective.watchdog": (403, 403, 403, 202, 401),
    "factory.task.monitor": (403, 403, 403, 202, 401),
}
_RUNS_COMMAND: Final = frozenset(
    {"factory.integration.publish", "factory.integration.validate", "factory.task.run"}
)


def _kind_payload(kind: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"kind": kind}
    if kind != "factory.objective.watchdog":
        payload["authContext"] = _AUTH
    if kind in _NAMES_OBJECTIVE:
        payload["objectiveId"] = "{objectiveId}"
    if kind in _RUNS_COMMAND:
        payload["command"] = ["true"]  # publish runs one only when given one
    return payload


def _kind_rows() -> list[Row]:
    rows = []
    for kind in PAYLOAD_KINDS:
        agent = _KIND_AGENT[kind]
        names = ", A's objectiveId" if kind in _NAMES_OBJECTIVE else ""
        rows.append(
            Row(
                "POST",
                ENQUEUE,
                _KIND_EXPECT[kind],
                case=f"`{kind}` to `{agent}`{names}",
                kind=kind,
                args={"agentId": agent},
                json={"jobId": "{claimJobId}", "payload": _kind_payload(kind)},
                scope=COMMANDS if kind in _RUNS_COMMAND else None,
            )
        )
    return rows


def _run_payload(**extra: Any) -> dict[str, Any]:
    return {"kind": "factory.run", "authContext": _AUTH, **extra}


# A jobId in a shape the Factory derives (task, control, audit, monitor, watchdog tick): refused for
# everyone, so no one can take an id the system will need.
_RESERVED: Final[tuple[tuple[str, str], ...]] = (
    ("a task's id `...:p<n>:...`", "{objectiveId}:p1:pre"),
    ("a control id `...:control:...`", "{objectiveId}:control:1"),
    ("an audit id `...:audit`", "{objectiveId}:audit"),
    ("a monitor id `...:monitor`", "{objectiveId}:p1:pre:monitor"),
    ("a watchdog tick's id", "{watchdogTick}"),
    ("a schedule fire's id `<scheduleId>:<tick>`", "{scheduleId}:20300101T000000Z"),
)


def _enqueue_variants() -> list[Row]:
    rows = [
        Row(
            "POST",
            ENQUEUE,
            (202, 202, 202, 202, 401),
            case="`factory.run`, singletonMode steer on A's sessionKey",
            args={"agentId": "factory"},
            json={"sessionKey": "{sessionKey}", "singletonMode": "steer", "payload": _run_payload()},
        ),
        Row(
            "POST",
            ENQUEUE,
            (403, 403, 403, 403, 401),
            case="`factory.objective.control` for an objective no one holds",
            args={"agentId": "factory-control"},
            json={
                "payload": {
                    "kind": "factory.objective.control",
                    "authContext": _AUTH,
                    "objectiveId": "{missingObjectiveId}",
                }
            },
        ),
    ]
    for case, job_id in _RESERVED:
        rows.append(
            Row(
                "POST",
                ENQUEUE,
                (400, 400, 400, 400, 401),
                case=f"jobId {case}",
                args={"agentId": "factory"},
                json={"jobId": job_id, "payload": _run_payload()},
            )
        )
    return rows


BATCH: Final = "/jobs:batch"


def _batch_rows() -> list[Row]:
    """A batch is checked item by item as single enqueues are, before anything is written."""
    run = {"agentId": "factory", "payload": _run_payload()}
    return [
        Row(
            "POST",
            BATCH,
            (202, 202, 202, 202, 401),
            case="two `factory.run` jobs, one of A's jobId",
            json={"items": [{**run, "jobId": "{claimJobId}"}, run]},
        ),
        Row(
            "POST",
            BATCH,
            (202, 202, 403, 202, 401),
            case="an item that runs a command",
            json={
                "items": [
                    run,
                    {
                        "agentId": "codex",
                        "payload": {"kind": "factory.task.run", "authContext": _AUTH, "command": ["true"]},
                    },
                ]
            },
            scope=COMMANDS,
        ),
        Row(
            "POST",
            BATCH,
            (202, 403, 202, 202, 401),
            case="an item naming A's objectiveId",
            json={
                "items": [
                    run,
                    {"agentId": "factory-control", "payload": _kind_payload("factory.objective.audit")},
                ]
            },
        ),
    ]


def _by_id(method: str, path: str, owner: int, **kw: Any) -> Row:
    """A route on one of A's jobs or objectives: B's answer is the unknown id's 404."""
    return Row(method, path, (owner, 404, owner, owner, 401), by_id=True, **kw)


_ECHO_TASK = {"id": "first", "agentId": "test-echo", "payload": {"kind": "factory.task.run"}}
_CODEX_TASK = {
    "id": "first",
    "agentId": "codex",
    "payload": {"kind": "factory.task.run", "command": ["true"]},
}


def _objective_body(task: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "objectiveId": "{claimObjectiveId}",
        "title": "Matrix",
        "goal": "Prove the wall",
        "plan": {"tasks": [task]},
        "authContext": _AUTH,
    }


def _new_task(agent: str) -> dict[str, Any]:
    task = dict(_CODEX_TASK if agent == "codex" else _ECHO_TASK)
    task["id"] = "{taskId}"
    return task


_STREAMS: Final[tuple[tuple[str, str, tuple[int, int, int, int, int]], ...]] = (
    ("A's job stream", "{jobStream}", (200, 404, 200, 200, 401)),
    ("A's objective stream", "{objectiveStream}", (200, 404, 200, 200, 401)),
    # Token streams hold hashes and scopes: system only, whoever owns the token.
    ("A's token's `tokens/...` stream", "{tokenStream}", (404, 404, 404, 200, 401)),
)


def _api_rows() -> list[Row]:
    rows = [
        Row("GET", "/healthz", (200, 200, 200, 200, 200)),
        # A platform's health check sends no token: it gets the status alone (api/health.py).
        Row("GET", "/readyz", (200, 200, 200, 200, 200)),
        Row("GET", "/openapi.json", (200, 200, 200, 200, 401)),
        # Who the caller's own token is: every token reads its own, never another's.
        Row("GET", "/whoami", (200, 200, 200, 200, 401)),
        Row("GET", "/metrics", (403, 403, 403, 200, 401)),
        # Dispatch policies weigh organisations against each other: system tokens only, even for the
        # caller's own organisation.
        Row("GET", "/organizations/dispatch", (403, 403, 403, 200, 401)),
        Row(
            "GET",
            "/organizations/{organizationId}/dispatch",
            (403, 403, 403, 200, 401),
            case="A's",
            args={"organizationId": "{org}"},
        ),
        Row(
            "PUT",
            "/organizations/{organizationId}/dispatch",
            (403, 403, 403, 200, 401),
            case="A's",
            args={"organizationId": "{org}"},
            json={"weight": 2, "ratePerSecond": None},
        ),
        # Flask's default static route: the API has no static folder, so it serves nothing.
        Row("GET", "/static/{filename}", (404, 404, 404, 404, 401), args={"filename": "ui.css"}),
        *_kind_rows(),
        *_enqueue_variants(),
        *_batch_rows(),
        Row(
            "GET",
            "/jobs",
            (200, 200, 200, 200, 401),
            case="sessionKey of A's job",
            query={"sessionKey": "{sessionKey}"},
        ),
        Row("GET", "/jobs", (200, 403, 200, 200, 401), case="organizationId=A", query={ORG_PARAM: "{org}"}),
        _by_id("GET", "/jobs/{jobId}", 200),
        # Without ?organizationId= a system token acts for its own organisation, which holds no such job.
        Row("GET", "/jobs/{jobId}", (200, 404, 200, 404, 401), case="system token without organizationId"),
        _by_id("GET", "/jobs/{jobId}/events", 200, streams=True),
        *(
            _by_id("POST", "/jobs/{jobId}/commands", 202, case=f"type {t}", command=t, json={"type": t})
            for t in COMMAND_TYPES
        ),
        _by_id("POST", "/jobs/{jobId}/cancel", 202, json={}),
        # The dead-letter view counts the organisation the request acts in, which a system token
        # must name (403 without it).
        Row("GET", "/dead-letters", (200, 200, 200, 403, 401)),
        Row(
            "GET",
            "/dead-letters",
            (200, 403, 200, 200, 401),
            case="organizationId=A",
            query={ORG_PARAM: "{org}"},
        ),
        # A bulk action acts in the caller's organisation, which a system token must name (403
        # without it): B's filter on A's session key selects nothing of A's.
        Row(
            "POST",
            "/jobs:bulk",
            (200, 200, 200, 403, 401),
            case="dry run",
            json={"action": "replay", "filter": {}, "dryRun": True},
        ),
        Row(
            "POST",
            "/jobs:bulk",
            (200, 200, 200, 403, 401),
            case="cancel A's session",
            json={
                "action": "cancel",
                "filter": {"sessionKey": "{sessionKey}"},
                "idempotencyKey": "{sessionKey}",
            },
        ),
        Row(
            "POST",
            "/jobs:bulk",
            (200, 403, 200, 200, 401),
            case="organizationId=A",
            query={ORG_PARAM: "{org}"},
            json={"action": "replay", "filter": {}, "dryRun": True},
        ),
        Row(
            "POST",
            "/jobs:bulk",
            (200, 403, 200, 200, 401),
            case="archive A's session, organizationId=A",
            query={ORG_PARAM: "{org}"},
            json={
                "action": "archive",
                "filter": {"sessionKey": "{sessionKey}"},
                "idempotencyKey": "{sessionKey}",
            },
        ),
        # An operation's progress: its organisation's (a system token names it; without it, 403).
        _by_id("GET", "/operations/{operationId}", 200),
        Row(
            "GET",
            "/operations/{operationId}",
            (200, 404, 200, 403, 401),
            case="system token without organizationId",
        ),
        # Only an ended job is replayed: A's queued one is a 409, its failed one replays.
        _by_id("POST", "/jobs/{jobId}/replay", 409, case="a queued job", json={}),
        _by_id(
            "POST", "/jobs/{jobId}/replay", 202, case="a failed job", args={"jobId": "{failedJobId}"}, json={}
        ),
        _by_id(
            "POST",
            "/jobs/{jobId}/replay",
            410,
            case="archived job",
            args={"jobId": "{archivedJobId}"},
            json={},
        ),
        # An archived job: its id stays A's (410 with the tombstone's summary), and B cannot tell
        # it from an id no one holds.
        _by_id("GET", "/jobs/{jobId}", 410, case="archived job", args={"jobId": "{archivedJobId}"}),
        _by_id(
            "GET",
            "/jobs/{jobId}/events",
            410,
            case="archived job",
            args={"jobId": "{archivedJobId}"},
            streams=True,
        ),
        _by_id(
            "POST",
            "/jobs/{jobId}/cancel",
            410,
            case="archived job",
            args={"jobId": "{archivedJobId}"},
            json={},
        ),
        Row(
            "POST",
            ENQUEUE,
            (410, 202, 410, 410, 401),
            case="jobId of A's archived job (B: a job of its own)",
            args={"agentId": "factory"},
            json={"jobId": "{archivedJobId}", "payload": {"kind": "factory.run", "authContext": _AUTH}},
        ),
    ]
    for route, streams in (("/streams/{stream}/receipts", False), ("/streams/{stream}/events", True)):
        for case, stream, expect in _STREAMS:
            rows.append(Row("GET", route, expect, case=case, args={"stream": stream}, streams=streams))
    rows += [
        Row(
            "POST",
            "/objectives",
            (202, 202, 202, 202, 401),
            case="B posts A's objectiveId",
            json=_objective_body(_ECHO_TASK),
        ),
        Row(
            "POST",
            "/objectives",
            (202, 202, 403, 202, 401),
            case="a task that runs a command",
            json=_objective_body(_CODEX_TASK),
            scope=COMMANDS,
        ),
        Row(
            "GET",
            "/objectives",
            (200, 403, 200, 200, 401),
            case="organizationId=A",
            query={ORG_PARAM: "{org}"},
        ),
        _by_id("GET", "/objectives/{objectiveId}", 200),
        Row(
            "GET",
            "/objectives/{objectiveId}",
            (200, 404, 200, 404, 401),
            case="system token without organizationId",
        ),
        _by_id("POST", "/objectives/{objectiveId}/cancel", 202, json={}),
        _by_id("POST", "/objectives/{objectiveId}/plan", 202, json={"tasks": [_new_task("test-echo")]}),
        Row(
            "POST",
            "/objectives/{objectiveId}/plan",
            (202, 404, 403, 202, 401),
            case="a task that runs a command",
            json={"tasks": [_new_task("codex")]},
            scope=COMMANDS,
            by_id=True,
        ),
        _by_id("GET", "/objectives/{objectiveId}/events", 200, streams=True),
        *_schedule_rows(),
    ]
    return rows


def _schedule_body(job: Mapping[str, Any]) -> dict[str, Any]:
    return {"scheduleId": "{claimScheduleId}", "cron": "0 0 1 1 *", "job": dict(job)}


_RUN_TEMPLATE: Final = {"agentId": "factory", "payload": {"kind": "factory.run", "authContext": _AUTH}}
_COMMAND_TEMPLATE: Final = {
    "agentId": "codex",
    "payload": {"kind": "factory.task.run", "authContext": _AUTH, "command": ["true"]},
}
_SYSTEM_TEMPLATE: Final = {"agentId": "factory-control", "payload": {"kind": "factory.objective.watchdog"}}
SCHEDULE = "/schedules/{scheduleId}"


def _schedule_rows() -> list[Row]:
    return [
        Row(
            "POST",
            "/schedules",
            (201, 201, 201, 201, 401),
            case="B posts A's scheduleId",
            json=_schedule_body(_RUN_TEMPLATE),
        ),
        Row(
            "POST",
            "/schedules",
            (201, 201, 403, 201, 401),
            case="a template that runs a command",
            json=_schedule_body(_COMMAND_TEMPLATE),
            scope=COMMANDS,
        ),
        # Every tick posts the template with the declarer's rights: a system-only kind, system only.
        Row(
            "POST",
            "/schedules",
            (403, 403, 403, 201, 401),
            case="a template of a system-only kind (`factory.objective.watchdog`)",
            json=_schedule_body(_SYSTEM_TEMPLATE),
        ),
        Row(
            "GET",
            "/schedules",
            (200, 403, 200, 200, 401),
            case="organizationId=A",
            query={ORG_PARAM: "{org}"},
        ),
        _by_id("GET", SCHEDULE, 200),
        Row("GET", SCHEDULE, (200, 404, 200, 404, 401), case="system token without organizationId"),
        _by_id("PATCH", SCHEDULE, 200, json={"overlap": "allow"}),
        Row(
            "PATCH",
            SCHEDULE,
            (200, 404, 403, 200, 401),
            case="a template that runs a command",
            json={"job": _COMMAND_TEMPLATE},
            scope=COMMANDS,
            by_id=True,
        ),
        _by_id("DELETE", SCHEDULE, 200),
        _by_id("POST", SCHEDULE + "/pause", 200, json={}),
        _by_id("POST", SCHEDULE + "/resume", 200, json={}),
        _by_id("POST", SCHEDULE + "/trigger", 202, json={}),
        _by_id(
            "POST",
            SCHEDULE + "/backfill",
            200,
            json={"startAt": "2019-12-31T23:59:00Z", "endAt": "2020-01-01T00:01:00Z"},
        ),
        _by_id("GET", SCHEDULE + "/fires", 200),
    ]


_CSRF_CASES: Final[Mapping[Csrf, str]] = {
    "valid": "valid CSRF",
    "missing": "no CSRF",
    "foreign": "another session's CSRF",
}
_REFUSED_FORM = (403, 403, 403, 403, 401)  # a form without its session's CSRF token; no session: 401


def _ui_forms(path: str, ok: tuple[int, int, int, int, int], form: Mapping[str, str], **kw: Any) -> list[Row]:
    """A dashboard form: with its CSRF token, without one, and with another session's."""
    label = kw.pop("case", "")
    rows = []
    for csrf, text in _CSRF_CASES.items():
        case = f"{label}, {text}" if label else text
        expect = ok if csrf == "valid" else _REFUSED_FORM
        rows.append(Row("POST", path, expect, case=case, form=form, csrf=csrf, **kw))
    return rows


def _ui_rows() -> list[Row]:
    page = (200, 404, 200, 200, 302)  # a page on one of A's jobs or objectives; no session: sign in
    stream = (200, 404, 200, 200, 401)  # an event stream: no session is a 401, not a redirect
    return [
        Row("GET", "/ui/", (302, 302, 302, 302, 302)),
        Row("GET", "/ui/{rest}", (404, 404, 404, 404, 302), case="an unknown page", args={"rest": "nowhere"}),
        *_ui_forms(
            "/ui/{rest}", (404, 404, 404, 404, 401), {}, case="an unknown action", args={"rest": "nowhere"}
        ),
        Row("GET", "/ui/signin", (302, 302, 302, 302, 200)),
        Row("POST", "/ui/signin", (302, 302, 302, 302, 401), case="the caller's own token", signin=True),
        Row(
            "POST",
            "/ui/signin",
            (403, 403, 403, 403, 403),
            case="from another origin",
            signin=True,
            origin="https://evil.example",
        ),
        *_ui_forms("/ui/signout", (302, 302, 302, 302, 401), {}),
        Row("GET", "/ui/static/{filename}", (200, 200, 200, 200, 200), args={"filename": "ui.css"}),
        Row("GET", "/ui/system", (403, 403, 403, 200, 302)),
        Row("GET", "/ui/jobs", (200, 200, 200, 200, 302), case="q=A's jobId", query={"q": "{jobId}"}),
        Row(
            "GET",
            "/ui/live/jobs",
            (200, 200, 200, 200, 401),
            case="q=A's jobId",
            query={"q": "{jobId}"},
            streams=True,
        ),
        Row("GET", "/ui/jobs/{jobId}", page, by_id=True),
        Row("GET", "/ui/jobs/{jobId}", (200, 404, 200, 404, 302), case="system token without organizationId"),
        Row("GET", "/ui/jobs/{jobId}/fragment", page, by_id=True),
        Row("GET", "/ui/jobs/{jobId}/events", stream, by_id=True, streams=True),
        *_ui_forms("/ui/jobs/{jobId}/cancel", (303, 404, 303, 303, 401), {"reason": ""}, by_id=True),
        *(
            row
            for t in ("steer", "follow_up")
            for row in _ui_forms(
                "/ui/jobs/{jobId}/commands",
                (303, 404, 303, 303, 401),
                {"type": t, "payload": "", "reason": ""},
                case=f"type {t}",
                command=t,
                by_id=True,
            )
        ),
        # Abort is the cancel button: this form refuses it (400 naming type and the allowed two).
        Row(
            "POST",
            "/ui/jobs/{jobId}/commands",
            (400, 404, 400, 400, 401),
            case="type abort, valid CSRF",
            command="abort",
            form={"type": "abort", "payload": "", "reason": ""},
            csrf="valid",
            by_id=True,
        ),
        # Bulk actions on a filter: in the session's organisation, which a system session names with
        # the Organisation filter (org); B's filter on A's session key selects nothing of A's.
        Row(
            "GET",
            "/ui/jobs/bulk",
            (200, 200, 200, 403, 302),
            case="cancel A's session: the dry run",
            query={"action": "cancel", "session": "{sessionKey}"},
        ),
        Row(
            "GET",
            "/ui/jobs/bulk",
            (200, 403, 200, 200, 302),
            case="org=A",
            query={"action": "cancel", "session": "{sessionKey}", "org": "{org}"},
        ),
        *_ui_forms(
            "/ui/jobs/bulk",
            (303, 303, 303, 403, 401),
            {"action": "cancel", "session": "{sessionKey}", "key": "{sessionKey}"},
            case="cancel A's session",
        ),
        *_ui_forms(
            "/ui/jobs/bulk",
            (303, 403, 303, 303, 401),
            {"action": "cancel", "session": "{sessionKey}", "key": "{sessionKey}", "org": "{org}"},
            case="cancel A's session, org=A",
        ),
        Row("GET", "/ui/operations/{operationId}", page, by_id=True),
        Row(
            "GET",
            "/ui/operations/{operationId}",
            (200, 404, 200, 403, 302),
            case="system token without organizationId",
        ),
        Row("GET", "/ui/operations/{operationId}/fragment", page, by_id=True),
        Row("GET", "/ui/operations/{operationId}/events", stream, by_id=True, streams=True),
        *_ui_forms("/ui/operations/{operationId}/next", (303, 404, 303, 303, 401), {}, by_id=True),
        # A system session sees a prompt to name the organisation until it does.
        Row("GET", "/ui/dead-letters", (200, 200, 200, 200, 302)),
        Row("GET", "/ui/dead-letters", (200, 403, 200, 200, 302), case="org=A", query={"org": "{org}"}),
        Row("GET", "/ui/objectives", (200, 200, 200, 200, 302)),
        Row("GET", "/ui/objectives/{objectiveId}", page, by_id=True),
        Row(
            "GET",
            "/ui/objectives/{objectiveId}",
            (200, 404, 200, 404, 302),
            case="system token without organizationId",
        ),
        Row("GET", "/ui/objectives/{objectiveId}/fragment", page, by_id=True),
        Row("GET", "/ui/objectives/{objectiveId}/events", stream, by_id=True, streams=True),
        Row("GET", "/ui/schedules", (200, 200, 200, 200, 302)),
        Row("GET", "/ui/schedules/{scheduleId}", page, by_id=True),
        Row(
            "GET",
            "/ui/schedules/{scheduleId}",
            (200, 404, 200, 404, 302),
            case="system token without organizationId",
        ),
    ]


ROWS: Final[tuple[Row, ...]] = (*_api_rows(), *_ui_rows())


# -- the document -----------------------------------------------------------------------------------


def _cell(row: Row, identity: Identity) -> str:
    status = str(row.expected(identity))
    if identity == "system" and row.by_id:
        return f"{status} (`?{ORG_PARAM}=A`)"
    return status


def markdown() -> str:
    """The matrix as ``docs/security.md`` carries it, one line per row of ``ROWS``."""
    head = ["route", "case", "needs", *(COLUMNS[i] for i in IDENTITIES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in ROWS:
        cells = [f"`{row.method} {row.path}`", row.case, f"`{row.scope}`" if row.scope else ""]
        cells += [_cell(row, i) for i in IDENTITIES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


DOC: Final = Path(__file__).resolve().parents[2] / "docs" / "security.md"
DOC_START: Final = "<!-- authz-matrix:start -->\n"
DOC_END: Final = "\n<!-- authz-matrix:end -->"


def documented(text: str) -> str:
    """The matrix as the document ``text`` carries it (between the two markers)."""
    if DOC_START not in text or DOC_END not in text:
        raise ValueError(f"no {DOC_START.strip()} ... {DOC_END.strip()} section")
    return text.split(DOC_START, 1)[1].split(DOC_END, 1)[0]


def write_doc(path: Path = DOC) -> None:
    """Replace the document's copy of the matrix with ``markdown()`` (``make docs``)."""
    text = path.read_text()
    old = DOC_START + documented(text) + DOC_END
    path.write_text(text.replace(old, DOC_START + markdown() + DOC_END, 1))


if __name__ == "__main__":
    write_doc()
