"""What a payload kind's contract is: its worker group, durable workflow and lifecycle flags.

The contracts themselves are columns of the kinds table (``app.jobs.kinds``), one declaration per
kind; this module holds the shape they share and the vocabularies of its columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from app.jobs.vocab import WorkerGroup

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

# Whether a job of a kind executes a command when the codex group runs it: ``never``; ``always``;
# ``when_given`` — only when its payload carries ``command`` (``app.jobs.privilege.runs_command``,
# the one place that decides, for the API's scope check and the worker alike).
CommandUse = Literal["never", "always", "when_given"]
COMMAND_USES: Final[tuple[str, ...]] = get_args(CommandUse)
# The payload field holding a command's argv.
COMMAND_FIELD: Final = "command"


@dataclass(frozen=True)
class KindContract:
    """What a payload kind declares about where it runs and how its lifecycle touches its objective.

    Spec ("Payload kinds"): each kind declares a ``workerGroup`` of chat, codex or control, an
    optional durable workflow, and flags for durable activity, objective scoping, objective
    reconciliation on a terminal or expired lease, live execution and terminal objective audit.
    The worker group here is the *declared* one; actual delivery is decided by ``app.jobs.routing``
    and may disagree (see ``Route.agrees``).
    """

    kind: str
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
    # The job's run can end its objective, and the step that does queues the objective's audit.
    terminal_objective_audit: bool
    # Spec: every kind except factory.objective.watchdog requires an authContext.
    requires_auth_context: bool
    # Whether the job executes a command (``CommandUse``); posting one that does needs the
    # ``commands`` scope.
    command: CommandUse = "never"
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
            "command": self.command,
            "postedBy": self.posted_by,
        }
