"""The per-kind job contracts: worker group, durable workflow and lifecycle flags of the nine payload
kinds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from app.jobs.errors import ValidationError
from app.jobs.vocab import KINDS_WITHOUT_AUTH_CONTEXT, PAYLOAD_KINDS, PayloadKind, WorkerGroup

# The durable workflows a kind may run under (spec: "an optional durable workflow"). The spec
# names no values; these two match the ledger keys the durable layer builds: one control
# workflow per objective and one workflow per chat run.
DurableWorkflow = Literal["objective-control", "run"]
DURABLE_WORKFLOWS: Final[tuple[str, ...]] = get_args(DurableWorkflow)

# Who may post a kind over the API (the Factory and the system enqueue their own jobs directly):
# ``tenant`` — any token, for its own organisation; ``objective-owner`` — a tenant, only for an
# objective of its own organisation (``payload.objectiveId`` required); ``system`` — system tokens only.
PostedBy = Literal["tenant", "objective-owner", "system"]
POSTED_BY: Final[tuple[str, ...]] = get_args(PostedBy)


@dataclass(frozen=True)
class KindContract:
    """What a payload kind declares about where it runs and how its lifecycle touches its objective.

    Spec ("Payload kinds"): each kind declares a ``workerGroup`` of chat, codex or control, an
    optional durable workflow, and flags for durable activity, objective scoping, objective
    reconciliation on a terminal or expired lease, live execution and terminal objective audit.
    The worker group here is the *declared* one; actual delivery is decided by ``app.jobs.routing``
    and may disagree (see ``Route.agrees``).
    """

    kind: PayloadKind
    worker_group: WorkerGroup
    durable_workflow: DurableWorkflow | None
    # The job's execution is itself a durable activity in the ledger (resumable, checkpointed).
    has_durable_activity: bool
    # The payload belongs to one objective, so the job is listed and settled against it.
    objective_scoped: bool
    # When a job of this kind settles or its lease expires, the objective is reconciled (an
    # objective-control job with reason ``reconcile``) so a dead worker cannot strand it.
    reconcile_objective_on_terminal_or_expired_lease: bool
    # The job is shown as live work while leased/running (it streams progress users watch).
    live_execution: bool
    # A terminal settlement of this kind can end its objective, so it queues an objective audit.
    terminal_objective_audit: bool
    # Spec: every kind except factory.objective.watchdog requires an authContext.
    requires_auth_context: bool
    # Issue 8: a job of this kind executes a command when delivered to the codex group, so posting
    # it needs the ``commands`` scope (``app.jobs.privilege.runs_command``). Flip it on for the
    # integration kinds here, in one place, once their handlers run commands.
    runs_command: bool = False
    # Who may post it (``PostedBy``); docs/security.md's kind table is this column.
    posted_by: PostedBy = "tenant"

    def to_json(self) -> dict[str, Any]:
        """The contract in the spec's camelCase field names."""
        return {
            "kind": self.kind,
            "workerGroup": self.worker_group,
            "durableWorkflow": self.durable_workflow,
            "hasDurableActivity": self.has_durable_activity,
            "objectiveScoped": self.objective_scoped,
            "reconcileObjectiveOnTerminalOrExpiredLease": (
                self.reconcile_objective_on_terminal_or_expired_lease
            ),
            "liveExecution": self.live_execution,
            "terminalObjectiveAudit": self.terminal_objective_audit,
            "requiresAuthContext": self.requires_auth_context,
            "runsCommand": self.runs_command,
            "postedBy": self.posted_by,
        }


def _contract(
    kind: PayloadKind,
    worker_group: WorkerGroup,
    *,
    durable_workflow: DurableWorkflow | None = None,
    has_durable_activity: bool = False,
    objective_scoped: bool = False,
    reconcile: bool = False,
    live_execution: bool = False,
    terminal_objective_audit: bool = False,
    runs_command: bool = False,
    posted_by: PostedBy = "tenant",
) -> KindContract:
    # requires_auth_context is derived from the one vocabulary that names the exception, so the
    # contract and the enqueue validator cannot disagree.
    return KindContract(
        kind=kind,
        worker_group=worker_group,
        durable_workflow=durable_workflow,
        has_durable_activity=has_durable_activity,
        objective_scoped=objective_scoped,
        reconcile_objective_on_terminal_or_expired_lease=reconcile,
        live_execution=live_execution,
        terminal_objective_audit=terminal_objective_audit,
        requires_auth_context=kind not in KINDS_WITHOUT_AUTH_CONTEXT,
        runs_command=runs_command,
        posted_by=posted_by,
    )


# Where the spec is silent the choices below are ours; each says why.
_ALL: Final[tuple[KindContract, ...]] = (
    # Spec: the factory.dispatch contract names control (routing on agent "factory" says chat).
    # Not objective-scoped: a dispatch may create the objective it acts on.
    _contract("factory.dispatch", "control"),
    # A chat-started run: its own durable "run" workflow, streamed live to the chat.
    _contract("factory.run", "chat", durable_workflow="run", live_execution=True),
    # Integration runs checks in a workspace (codex); its end must be reacted to by the objective.
    _contract(
        "factory.integration.publish",
        "codex",
        # Issue 10: publish may run a command (the codex runner), so posting it needs `commands`.
        runs_command=True,
        objective_scoped=True,
        reconcile=True,
        live_execution=True,
        # Publishing is the last step of a delivery objective, so its settlement is audited.
        terminal_objective_audit=True,
    ),
    _contract(
        "factory.integration.validate",
        "codex",
        # Issue 10: validate runs a command through the codex runner.
        runs_command=True,
        objective_scoped=True,
        reconcile=True,
        live_execution=True,
    ),
    # The audit only observes: reconciling on its end would loop audit -> control -> audit.
    # A tenant may ask for its own objective's audit again (it is appended once): never another's.
    _contract("factory.objective.audit", "control", objective_scoped=True, posted_by="objective-owner"),
    # Control *is* the objective's durable workflow. It does not reconcile on its own end (that
    # would re-enqueue itself forever); the outbox redrive and watchdog recover it instead. Control
    # is what moves an objective to a terminal state, so its settlement is audited.
    _contract(
        "factory.objective.control",
        "control",
        durable_workflow="objective-control",
        objective_scoped=True,
        terminal_objective_audit=True,
        # A control step is idempotent: a tenant may nudge its own objective, never another's.
        posted_by="objective-owner",
    ),
    # Cron-driven scan over all objectives: not scoped to one, and the only kind without authContext.
    # It scans every organisation's objectives: the system's own job.
    _contract("factory.objective.watchdog", "control", posted_by="system"),
    # The Factory derives a monitor for each computer-path task itself; a tenant has no reason to.
    _contract(
        "factory.task.monitor",
        "control",
        objective_scoped=True,
        reconcile=True,
        live_execution=True,
        posted_by="system",
    ),
    # Spec: only factory.task.run sets hasDurableActivity. Its handler runs a command (the codex
    # handler's argv), hence runs_command, like the two integration kinds.
    _contract(
        "factory.task.run",
        "codex",
        has_durable_activity=True,
        runs_command=True,
        objective_scoped=True,
        reconcile=True,
        live_execution=True,
    ),
)

CONTRACTS: Final[Mapping[str, KindContract]] = MappingProxyType({c.kind: c for c in _ALL})

if tuple(CONTRACTS) != PAYLOAD_KINDS:  # pragma: no cover - guards an edit that drops a kind
    raise AssertionError("CONTRACTS must declare exactly the nine payload kinds, in vocabulary order")


def contract_for(kind: str) -> KindContract:
    """The contract of a payload kind; an unknown kind is a ValidationError naming the nine."""
    try:
        return CONTRACTS[kind]
    except KeyError:
        # DESIGN: an unknown kind is rejected before anything is written, naming the valid kinds.
        raise ValidationError("kind", f"unknown payload kind {kind!r}", allowed=PAYLOAD_KINDS) from None
