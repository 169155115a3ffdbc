"""Who may make Receipt run a command: token scopes, and who enqueued a job.

A job *runs a command* when ``runs_command`` says so: its kind's contract runs one (always, or when
the payload gives one) and routing delivers it to the codex group, whose handler executes argv.
The API's scope check and the worker's command runner ask that one function. Posting such a job
needs the ``commands`` scope or a system token; the server records the poster on ``job.enqueued``
as ``enqueuedBy``, and the codex handler re-checks that record before it starts anything, so a job
written by any other path without the right stays inert.

Pure: no I/O, no Flask. The API and the workers both ask these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from app.jobs.contracts import COMMAND_FIELD
from app.jobs.kinds import KINDS
from app.jobs.routing import worker_group_for

Scope = Literal["commands"]
# Every scope a token may carry. ``commands``: may post jobs that run a command.
TOKEN_SCOPES: Final[tuple[str, ...]] = get_args(Scope)
COMMANDS_SCOPE: Final = "commands"

# The job body field the server writes; a request carrying it is refused (never caller-supplied).
ENQUEUED_BY_FIELD: Final = "enqueuedBy"


@dataclass(frozen=True)
class Enqueuer:
    """Who enqueued a job, as the server saw it: the token, its scopes, whether it is a system token."""

    token_id: str | None
    scopes: tuple[str, ...]
    system: bool

    def to_json(self) -> dict[str, Any]:
        return {"tokenId": self.token_id, "scopes": list(self.scopes), "system": self.system}

    @classmethod
    def from_json(cls, data: Any) -> Enqueuer | None:
        """The inverse of ``to_json``; None for anything that is not a well-formed record."""
        if not isinstance(data, Mapping):
            return None
        token_id = data.get("tokenId")
        scopes = data.get("scopes")
        system = data.get("system")
        if token_id is not None and not isinstance(token_id, str):
            return None
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            return None
        if not isinstance(system, bool):
            return None
        return cls(token_id, tuple(scopes), system)

    @property
    def may_run_commands(self) -> bool:
        return self.system or COMMANDS_SCOPE in self.scopes


def runs_command(agent_id: str, kind: str, payload: Mapping[str, Any]) -> bool:
    """True when a job for ``agent_id`` with this ``payload`` of ``kind`` would execute a command."""
    declared = KINDS.get(kind)
    if declared is None or worker_group_for(agent_id, kind) != "codex":
        return False
    use = declared.contract.command
    return use == "always" or (use == "when_given" and COMMAND_FIELD in payload)


def posting_refusal(kind: str, *, system: bool, names_objective: bool) -> str | None:
    """Why a caller may not post ``kind`` (the kind's ``posted_by`` rule), or None when it may.

    Whether a named objective is the caller's own needs a read: the API checks that beside this.
    """
    declared = KINDS.get(kind)
    if declared is None or system:
        return None
    posted_by = declared.contract.posted_by
    if posted_by == "system":
        return f"only system tokens may post {kind} jobs (the system enqueues them for itself)"
    if posted_by == "objective-owner" and not names_objective:
        return f"a {kind} job must name payload.objectiveId: an objective of this organisation"
    return None


def parse_scopes(values: Iterable[str]) -> tuple[str, ...]:
    """Validated, de-duplicated, sorted scopes; an unknown one is a ValueError naming the allowed."""
    out = set()
    for value in values:
        scope = value.strip()
        if scope not in TOKEN_SCOPES:
            raise ValueError(f"unknown scope {scope!r}; allowed: {', '.join(TOKEN_SCOPES)}")
        out.add(scope)
    return tuple(sorted(out))
