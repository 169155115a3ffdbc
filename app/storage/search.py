"""Finding jobs: one filter, its SQL, and the keyset pager every job list uses (the API's
``GET /jobs``, the CLI through it, the dashboard, the bulk actions and the dead-letter view).

A filter always carries its scope: one organisation, or every organisation for a system identity
(which may narrow to one). Nothing here can widen a scope; ``conditions`` starts from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, false, func, not_, or_, select, true
from sqlalchemy.engine import Connection

from app.jobs.delay import parse_run_at
from app.jobs.errors import ValidationError
from app.jobs.kinds import KINDS, PAYLOAD_KINDS
from app.jobs.reducer import Job
from app.jobs.routing import INTEGRATION_KIND_PREFIX
from app.jobs.tags import TAG_KEY_MAX, TAG_VALUE_MAX, parse_tag_filter
from app.jobs.validation import AGENT_ID_MAX, SESSION_KEY_MAX
from app.jobs.vocab import AGENT_CODEX, AGENT_FACTORY_CONTROL, LANES, STATUSES, WORKER_GROUPS
from app.storage import keyset
from app.storage.db import ERROR_TEXT_LENGTH, as_utc, has_tag, iso, job_tags, jobs


@dataclass(frozen=True)
class Scope:
    """Whose jobs a reader sees: one organisation, or all of them (system identities)."""

    organization_id: str | None
    all_organizations: bool = False


@dataclass(frozen=True)
class JobFilter:
    """What a list, a count or a bulk action selects; ``None`` means "any". ``text`` matches
    inside the job id; ``error_prefix`` the start of its error's text; ``created_after`` is
    inclusive and ``created_before`` exclusive. ``organization_id`` narrows a system scope."""

    status: str | None = None
    agent_id: str | None = None
    lane: str | None = None
    worker_group: str | None = None
    text: str | None = None
    organization_id: str | None = None
    session_key: str | None = None
    kind: str | None = None
    tag: tuple[str, str] | None = None
    error_prefix: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """The filter as the API spells it (what an audit receipt records), unset fields left out."""
        values: Mapping[str, Any] = {
            "status": self.status,
            "agentId": self.agent_id,
            "lane": self.lane,
            "workerGroup": self.worker_group,
            "text": self.text,
            "organizationId": self.organization_id,
            "sessionKey": self.session_key,
            "kind": self.kind,
            "tag": f"{self.tag[0]}:{self.tag[1]}" if self.tag else None,
            "errorPrefix": self.error_prefix,
            "createdAfter": iso(self.created_after) if self.created_after else None,
            "createdBefore": iso(self.created_before) if self.created_before else None,
        }
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None
    # Each job's stream head as the page read it (its last receipt's hash, when its status last
    # changed): what a bulk action appends after without reading the jobs again.
    heads: dict[str, tuple[str, datetime]] = field(default_factory=dict)


def worker_group_condition(group: str) -> ColumnElement[bool]:
    """SQL for "this job routes to ``group``": the order of ``app.jobs.routing.worker_group_for``.

    Routing is agent id first, kind second (a declared kind's ``route``; the spec's prefix for one
    no one declared); the condition for each group excludes the earlier rules, so every job matches
    exactly one group (a test compares it with the function).
    """
    agent = jobs.c.agent_id
    is_codex = or_(agent == AGENT_CODEX, _kind_routes_to("codex"))
    by_kind = or_(*(_kind_routes_to(g) for g in WORKER_GROUPS))
    if group == "codex":
        return is_codex
    if group == "control":
        return and_(
            not_(is_codex), or_(_kind_routes_to(group), and_(not_(by_kind), agent == AGENT_FACTORY_CONTROL))
        )
    if group == "chat":
        return and_(
            not_(is_codex), or_(_kind_routes_to(group), and_(not_(by_kind), agent != AGENT_FACTORY_CONTROL))
        )
    return false()


def _kind_routes_to(group: str) -> ColumnElement[bool]:
    """SQL for ``app.jobs.routing.kind_route(kind) == group``."""
    kind = jobs.c.kind
    declared = [name for name, k in KINDS.items() if k.route == group]
    condition: ColumnElement[bool] = kind.in_(declared) if declared else false()
    if group == "codex":
        undeclared = and_(kind.not_in(list(KINDS)), kind.startswith(INTEGRATION_KIND_PREFIX, autoescape=True))
        condition = or_(condition, undeclared)
    return condition


def conditions(
    conn: Connection, scope: Scope, f: JobFilter, *, with_status: bool = True
) -> list[ColumnElement[bool]]:
    """The WHERE of ``f`` within ``scope`` (``with_status`` False: every filter but the status)."""
    where: list[ColumnElement[bool]] = []
    if not scope.all_organizations:
        where.append(jobs.c.organization_id == scope.organization_id)
    elif f.organization_id is not None:
        where.append(jobs.c.organization_id == f.organization_id)
    if with_status and f.status is not None:
        where.append(jobs.c.status == f.status)
    if f.agent_id is not None:
        where.append(jobs.c.agent_id == f.agent_id)
    if f.lane is not None:
        where.append(jobs.c.lane == f.lane)
    if f.worker_group is not None:
        where.append(worker_group_condition(f.worker_group))
    if f.text:
        where.append(jobs.c.id.contains(f.text, autoescape=True))
    if f.session_key is not None:
        where.append(jobs.c.session_key == f.session_key)
    if f.kind is not None:
        where.append(jobs.c.kind == f.kind)
    if f.tag is not None:
        where.append(_tagged(conn, scope, f))
    if f.error_prefix:
        where.append(jobs.c.error_text.startswith(f.error_prefix, autoescape=True))
    if f.created_after is not None:
        where.append(jobs.c.created_at >= f.created_after)
    if f.created_before is not None:
        where.append(jobs.c.created_at < f.created_before)
    return where or [true()]


def one_organization(scope: Scope, f: JobFilter) -> tuple[bool, str | None]:
    """Whether ``f`` within ``scope`` selects one organisation's jobs, and which."""
    if not scope.all_organizations:
        return True, scope.organization_id
    return f.organization_id is not None, f.organization_id


def _tag_rows(organization_id: str | None, tag: tuple[str, str]) -> list[ColumnElement[bool]]:
    """The ``job_tags`` rows of one organisation's jobs tagged ``key: value``: one range of
    ``ix_job_tags_org_tag_created``."""
    key, value = tag
    return [job_tags.c.organization_id == organization_id, job_tags.c.key == key, job_tags.c.value == value]


def _tagged(conn: Connection, scope: Scope, f: JobFilter) -> ColumnElement[bool]:
    """SQL for "the job carries ``f.tag``": the jobs of its ``job_tags`` range when the filter is
    within one organisation; across organisations (a system identity naming none), the ``jobs.tags``
    test (``db.has_tag``)."""
    assert f.tag is not None
    one, org = one_organization(scope, f)
    if not one:
        return has_tag(conn, *f.tag)
    return jobs.c.id.in_(select(job_tags.c.job_id).where(*_tag_rows(org, f.tag)))


def page_query(conn: Connection, scope: Scope, f: JobFilter, cursor: str | None, limit: int) -> Select[Any]:
    """The query of a page: each job's state, created_at and id, newest first, ``limit`` rows and
    one more (``cursor.newest_first``).

    A tag filter within one organisation walks that tag's ``job_tags`` rows newest first (their
    index holds them in page order) and joins each to its job for the other filters, so the first
    page reads about as many rows as the tag's newest jobs it needs, not every job of the tag."""
    one, org = one_organization(scope, f)
    head = (jobs.c.last_hash, jobs.c.status_changed_at)
    if f.tag is None or not one:
        plain = select(jobs.c.state, jobs.c.created_at, jobs.c.id, *head).where(*conditions(conn, scope, f))
        return keyset.newest_first(plain, jobs.c.created_at, jobs.c.id, cursor, limit)
    t = job_tags.c
    tagged = (
        select(jobs.c.state, t.created_at, t.job_id.label("id"), *head)
        .select_from(job_tags.join(jobs, jobs.c.id == t.job_id))
        .where(*_tag_rows(org, f.tag), *conditions(conn, scope, replace(f, tag=None)))
    )
    return keyset.newest_first(tagged, t.created_at, t.job_id, cursor, limit)


def list_jobs(
    conn: Connection, scope: Scope, f: JobFilter, *, limit: int = 50, cursor: str | None = None
) -> JobPage:
    """A page of jobs, newest first; ``next_cursor`` continues after its last job (None: the end)."""
    rows, next_cursor = keyset.page(conn.execute(page_query(conn, scope, f, cursor, limit)).all(), limit)
    heads = {r.id: (r.last_hash, as_utc(r.status_changed_at)) for r in rows}
    return JobPage([Job.from_json(r.state) for r in rows], next_cursor, heads)


# The filter fields a request may name (the API's query of GET /jobs, a bulk action's ``filter``).
FILTER_FIELDS = (
    "status",
    "agentId",
    "lane",
    "sessionKey",
    "kind",
    "tag",
    "errorPrefix",
    "createdAfter",
    "createdBefore",
)


def parse_filter(raw: Mapping[str, Any], *, prefix: str = "") -> JobFilter:
    """A ``JobFilter`` from a request's fields (``FILTER_FIELDS``; absent or null: any). A bad value
    is a ``ValidationError`` naming ``<prefix><field>`` and what it allows; nothing else is read."""

    def text_field(name: str, max_length: int) -> str | None:
        value = raw.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > max_length:
            raise ValidationError(
                prefix + name, f"must be a non-empty string of at most {max_length} characters"
            )
        return value

    def choice(name: str, allowed: tuple[str, ...]) -> str | None:
        value = raw.get(name)
        if value is not None and value not in allowed:
            raise ValidationError(prefix + name, "is not one of the allowed values", allowed=allowed)
        return value

    unknown = sorted(k for k in raw if k not in FILTER_FIELDS)
    if unknown:
        raise ValidationError(prefix + str(unknown[0]), "is not a filter field", allowed=FILTER_FIELDS)
    tag_text = text_field("tag", TAG_KEY_MAX + 1 + TAG_VALUE_MAX)
    after = raw.get("createdAfter")
    before = raw.get("createdBefore")
    created_after = parse_run_at(after, prefix + "createdAfter") if after is not None else None
    created_before = parse_run_at(before, prefix + "createdBefore") if before is not None else None
    return JobFilter(
        status=choice("status", STATUSES),
        agent_id=text_field("agentId", AGENT_ID_MAX),
        lane=choice("lane", LANES),
        session_key=text_field("sessionKey", SESSION_KEY_MAX),
        kind=choice("kind", PAYLOAD_KINDS),
        tag=parse_tag_filter(tag_text, prefix + "tag") if tag_text is not None else None,
        error_prefix=text_field("errorPrefix", ERROR_TEXT_LENGTH),
        created_after=created_after,
        created_before=created_before,
    )


# The dead-letter view: jobs that failed for good. The fold leaves a job ``failed`` only when its
# failure was not retryable or its attempts were spent (a retryable one with attempts left is
# queued again), so the status is the whole rule.
DEAD_LETTER_STATUS = "failed"
DEAD_LETTER_GROUPS_MAX = 200
DEAD_LETTER_ERRORS_MAX = 20


@dataclass(frozen=True)
class DeadLetterGroup:
    """One agent and kind's dead letters: how many, and how many per error text (most first)."""

    agent_id: str
    kind: str
    count: int
    errors: list[tuple[str | None, int]]

    def to_json(self) -> dict[str, Any]:
        return {
            "agentId": self.agent_id,
            "kind": self.kind,
            "count": self.count,
            "errors": [{"error": e, "count": n} for e, n in self.errors],
        }


def dead_letters(conn: Connection, scope: Scope, f: JobFilter) -> list[DeadLetterGroup]:
    """Dead letters per agent and kind (most first), each with its counts by error text; ``f``
    narrows (its status is the dead letters' own). At most ``DEAD_LETTER_GROUPS_MAX`` groups and
    ``DEAD_LETTER_ERRORS_MAX`` errors each (the rest of a group's count is in ``count``)."""
    where = conditions(conn, scope, replace(f, status=DEAD_LETTER_STATUS))
    rows = conn.execute(
        select(jobs.c.agent_id, jobs.c.kind, jobs.c.error_text, func.count().label("n"))
        .where(*where)
        .group_by(jobs.c.agent_id, jobs.c.kind, jobs.c.error_text)
    ).all()
    groups: dict[tuple[str, str], list[tuple[str | None, int]]] = {}
    for agent_id, kind, error, n in rows:
        groups.setdefault((str(agent_id), str(kind)), []).append((error, int(n)))
    out = [
        DeadLetterGroup(
            agent,
            kind,
            sum(n for _e, n in errors),
            sorted(errors, key=lambda e: (-e[1], e[0] or ""))[:DEAD_LETTER_ERRORS_MAX],
        )
        for (agent, kind), errors in groups.items()
    ]
    out.sort(key=lambda g: (-g.count, g.agent_id, g.kind))
    return out[:DEAD_LETTER_GROUPS_MAX]
