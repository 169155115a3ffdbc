"""Who is calling, and what they may touch: Bearer tokens and organisation scoping.

Every endpoint but the probes needs ``Authorization: Bearer <token>`` (``/readyz`` answers its
status without one, and its details with one: ``api/health.py``). A token belongs to one
organisation; a system token may act for any. With ``RECEIPT_AUTH=disabled`` a request without
credentials acts as an anonymous identity that may act for every organisation but is *not* a
system identity and holds no scopes (disabling auth never grants system or commands
rights); every response carries a warning header.

Scopes: posting a job that would run a command needs the ``commands`` scope or a
system token (``app.jobs.privilege``); without it the POST is a 403 naming the scope.

Scoping rule used everywhere: a job is visible only to its own organisation (and to system
identities); anything else answers exactly as an unknown job would, so existence never leaks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flask import g, request
from sqlalchemy.engine import Engine

from api import inputs
from api.context import read_connection, state
from api.errors import (
    COMMANDS_DISABLED,
    FORBIDDEN,
    INVALID_TOKEN,
    MISSING_SCOPE,
    UNAUTHORIZED,
    ApiError,
    forbidden,
)
from api.schemas import ORGANIZATION_PARAM, SCOPE_ORGANIZATION_PARAM
from app.factory.vocab import DEFAULT_TASK_AGENT, DEFAULT_TASK_KIND
from app.jobs.errors import ValidationError
from app.jobs.kinds import DISPATCH, RUN
from app.jobs.privilege import COMMANDS_SCOPE, Enqueuer, posting_refusal, runs_command
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest
from app.storage import tokens

AUTH_WARNING_HEADER = "X-Receipt-Warning"
AUTH_WARNING = "authentication disabled"
_BEARER = "bearer "
_CHALLENGE = 'Bearer realm="receipt"'
CODEX_COMMANDS_SETTING = "RECEIPT_CODEX_COMMANDS"


@dataclass(frozen=True)
class Identity:
    """The caller: an organisation, whether it is a system identity, its scopes and its token."""

    organization_id: str | None
    system: bool
    token_id: str | None = None
    scopes: tuple[str, ...] = ()
    # The anonymous identity of RECEIPT_AUTH=disabled: every organisation, but no system rights.
    any_organization: bool = False

    @property
    def all_organizations(self) -> bool:
        return self.system or self.any_organization

    def may_act_for(self, organization_id: str | None) -> bool:
        """System identities act for anyone; others only for their own organisation."""
        if self.all_organizations:
            return True
        return organization_id is not None and organization_id == self.organization_id

    def may_see(self, job: Job) -> bool:
        return self.may_act_for(job.organization_id)

    def enqueuer(self) -> Enqueuer:
        """What ``job.enqueued`` records about this caller."""
        return Enqueuer(token_id=self.token_id, scopes=self.scopes, system=self.system)


ANONYMOUS = Identity(organization_id=None, system=False, token_id=None, any_organization=True)


def listing_scope(requested: str | None) -> dict[str, Any]:
    """Which organisations a list answers for: the one ``?organizationId=`` names (403 unless this
    caller may act for it), every one for a caller of all organisations who names none, or the
    caller's own."""
    identity = current()
    if requested is not None and not identity.may_act_for(requested):
        raise forbidden("organizationId is not the organisation of this token")
    if identity.all_organizations:
        return {"organization_id": requested, "all_organizations": requested is None}
    return {"organization_id": identity.organization_id, "all_organizations": False}


def _unauthorized(code: str, message: str) -> ApiError:
    challenge = _CHALLENGE if code == UNAUTHORIZED else f'{_CHALLENGE}, error="invalid_token"'
    return ApiError(401, code, message, headers={"WWW-Authenticate": challenge})


def authenticate(engine: Engine, *, auth_disabled: bool) -> Identity:
    """Resolve the request's credentials; raises a 401 ``ApiError`` when they are missing or bad."""
    header = request.headers.get("Authorization")
    if header is None or not header.strip():
        if auth_disabled:
            return ANONYMOUS
        raise _unauthorized(UNAUTHORIZED, "authentication required: send Authorization: Bearer <token>")
    if not header[: len(_BEARER)].lower() == _BEARER:
        raise _unauthorized(INVALID_TOKEN, "the Authorization header must use the Bearer scheme")
    return identity_for(engine, header[len(_BEARER) :].strip())


def identity_for(engine: Engine, secret: str) -> Identity:
    """Who a token secret stands for; raises the 401 ``ApiError`` when it stands for no one.

    The one rule from a secret to an identity: the API's Bearer header and the dashboard's
    cookie (``api.ui.session``) both go through it.
    """
    # Tokens are URL-safe base64: anything else cannot match, and must not reach SQL (NULs).
    if not secret or len(secret) > 256 or not secret.isascii() or not secret.isprintable():
        raise _unauthorized(INVALID_TOKEN, "the token is not valid")

    def read(secret: str) -> tokens.TokenInfo | None:
        with read_connection(engine) as conn:
            return tokens.lookup(conn, secret)

    info = state().token_cache.lookup(secret, read)
    if info is None:
        raise _unauthorized(INVALID_TOKEN, "the token is not valid (unknown or revoked)")
    if info.expired(datetime.now(UTC)):
        raise _unauthorized(INVALID_TOKEN, "the token has expired")
    return Identity(info.organization_id, info.system, info.id, info.scopes)


def current() -> Identity:
    """The identity ``authenticate`` established for this request."""
    identity: Identity = g.identity
    return identity


def scope_organization(requested: str | None) -> str:
    """The organisation a by-id route acts in: the caller's own, or the one it names.

    Naming another organisation is a system identity's right (403 for any other); an identity with
    no organisation of its own (``RECEIPT_AUTH=disabled``) must name one.
    """
    identity = current()
    if requested is None:
        if identity.organization_id is None:
            raise ValidationError(
                "organizationId", "is required: this identity has no organisation of its own"
            )
        return identity.organization_id
    if not identity.may_act_for(requested):
        raise forbidden("organizationId is not the organisation of this token")
    return requested


def scoped_organization() -> str:
    """The organisation this request's by-id route acts in (``scope_organization``).

    API routes declare it (``Operation(scoped=True)`` validates ``?organizationId=``); the
    dashboard's pages take the same parameter, checked here against the same schema.
    """
    org: str | None = g.get("scope_organization")
    if org is None:
        requested = request.args.get(ORGANIZATION_PARAM)
        if requested is not None:
            inputs.check(requested, SCOPE_ORGANIZATION_PARAM, root=ORGANIZATION_PARAM)
        org = g.scope_organization = scope_organization(requested)
    return org


# Why a route over many jobs refuses a system token that names no organisation (``Operation.named``).
SYSTEM_MUST_NAME = "is required for a system token: name the organisation this acts in"


def unnamed_organization() -> ApiError:
    """The refusal of an identity of every organisation that names none on a route over many jobs:
    a 403 (the request is well formed; this caller may not act without naming where), naming the
    parameter, so an action on a filter never falls on the system token's own organisation."""
    return ApiError(403, FORBIDDEN, f"{ORGANIZATION_PARAM} {SYSTEM_MUST_NAME}", {"field": ORGANIZATION_PARAM})


def named_organization() -> str:
    """The organisation a dashboard view over many jobs acts in (a bulk action, its progress, the
    dead letters): ``scoped_organization``, except that an identity of every organisation must name
    it (``?organizationId=``), as an API route declared ``named`` requires."""
    if current().all_organizations and request.args.get(ORGANIZATION_PARAM) is None:
        raise unnamed_organization()
    return scoped_organization()


def require_enqueue_allowed(identity: Identity, agent_id: str, req: EnqueueRequest) -> None:
    """403 unless the caller may post this kind (its ``posted_by`` rule), to this agent, for this
    organisation. Whether a named objective is the organisation's own is ``api.jobs``' read."""
    kind = str(req.payload["kind"])
    refusal = posting_refusal(
        kind, system=identity.system, names_objective=isinstance(req.payload.get("objectiveId"), str)
    )
    if refusal is not None:
        raise forbidden(refusal)
    if not identity.may_act_for(req.organization_id):
        raise forbidden("payload.authContext.organizationId is not the organisation of this token")
    require_command_scope(identity, agent_id, kind, req.payload)
    if not state().settings.codex_commands:
        for task_agent, task_kind, task_payload in _explicit_plan_tasks(kind, req.payload):
            if runs_command(task_agent, task_kind, task_payload):
                raise _commands_disabled(
                    f"a {kind} job whose plan holds a {task_kind} task for agent {task_agent!r} "
                    "runs a command"
                )


def _explicit_plan_tasks(
    kind: str, payload: Mapping[str, Any]
) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """The (agent, kind, payload) of each task a ``factory.dispatch`` (``payload.objective.plan``) or
    ``factory.run`` (``payload.plan``, ``payload.goal.plan``: app/factory/planner.py) job names
    outright; malformed ones are left to the launch's own validation."""
    plan: Any = None
    if kind == DISPATCH.name and isinstance(payload.get("objective"), Mapping):
        plan = payload["objective"].get("plan")
    elif kind == RUN.name:
        goal = payload.get("goal")
        plan = goal.get("plan", payload.get("plan")) if isinstance(goal, Mapping) else payload.get("plan")
    tasks = plan.get("tasks") if isinstance(plan, Mapping) else None
    for task in tasks if isinstance(tasks, list) else []:
        task_payload = task.get("payload") if isinstance(task, Mapping) else None
        task_payload = {} if task_payload is None else task_payload
        if not isinstance(task, Mapping) or not isinstance(task_payload, Mapping):
            continue
        agent = task.get("agentId") or DEFAULT_TASK_AGENT
        task_kind = task_payload.get("kind", DEFAULT_TASK_KIND)
        if isinstance(agent, str) and isinstance(task_kind, str):
            yield agent, task_kind, task_payload


def _commands_disabled(what: str) -> ApiError:
    return ApiError(
        403,
        COMMANDS_DISABLED,
        f"{what}, and this deployment runs none: its operator may set {CODEX_COMMANDS_SETTING}=enabled",
        {"setting": CODEX_COMMANDS_SETTING},
    )


def require_command_scope(identity: Identity, agent_id: str, kind: str, payload: Mapping[str, Any]) -> None:
    """403 when a job of ``kind`` for ``agent_id`` with ``payload`` runs a command and either this
    deployment runs none (``commands_disabled``: refused here rather than accepted and failed when
    the codex handler refuses it) or the caller may not run commands (``missing_scope``)."""
    if not runs_command(agent_id, kind, payload):
        return
    if not state().settings.codex_commands:
        raise _commands_disabled(f"a {kind} job for agent {agent_id!r} runs a command")
    if not identity.enqueuer().may_run_commands:
        raise ApiError(
            403,
            MISSING_SCOPE,
            f"a {kind} job for agent {agent_id!r} runs a command: it needs a token with the "
            f"{COMMANDS_SCOPE!r} scope (or a system token)",
            {"scope": COMMANDS_SCOPE},
        )
