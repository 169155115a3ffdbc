"""The payload kinds, each declared once: its contract, the agent whose handler runs it, its row of
the lease table and its routing.

Everything about a kind derives from its ``Kind`` below:

- the payload vocabulary the API and the enqueue validator accept (``PAYLOAD_KINDS``), and which
  kinds need an ``authContext``;
- its contract (``contract_for``; worker group, durable workflow, lifecycle flags, who may post it,
  whether it runs a command: ``app.jobs.privilege``);
- its delivery: ``app.jobs.routing`` reads ``route`` (the kind's own routing, after the agent id
  ``codex``), ``app.jobs.timing`` its ``lease`` row;
- its handler: the worker side binds one function per kind with ``@handles(kinds.X)``
  (``workers/kinds.py``), checked complete when a worker builds its registry, and the built-in
  agents dispatch through this table (``workers/registry.py``);
- the Factory's names for the kinds it enqueues (``app/factory``), and the plan rule that keeps the
  objective machinery's kinds out of plans (``plan_task``).

So adding a kind is one declaration here plus its handler (docs/design.md has the worked
example). The spec's vocabulary is closed: ``tests/unit/test_kinds.py`` holds these to its nine.
Pure: no I/O; the settings a lease row names are read by ``app.jobs.timing``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from app.jobs.contracts import CommandUse, DurableWorkflow, KindContract, PostedBy
from app.jobs.errors import ValidationError
from app.jobs.vocab import (
    AGENT_CODEX,
    AGENT_FACTORY,
    AGENT_FACTORY_CONTROL,
    AGENT_FACTORY_MONITOR,
    WorkerGroup,
)

# The payload field and value that select the task monitor's lease row (spec: "factory-monitor
# running factory.task.monitor with executionPath of computer").
EXECUTION_PATH_FIELD: Final = "executionPath"
COMPUTER_EXECUTION_PATH: Final = "computer"


@dataclass(frozen=True)
class LeaseRow:
    """A kind's own row of the spec's lease table ("Leases, timeouts and heartbeats").

    It applies to a job of the kind posted to the kind's own agent and, with ``when``, whose payload
    field ``when[0]`` holds ``when[1]``. The lease is then the larger of ``JOB_LEASE_MS`` and the
    ``Settings`` field ``floor``; the ``Settings`` field ``execution_timeout_cap``, when set, may
    lower the execution timeout (never raise it).
    """

    floor: str
    when: tuple[str, str] | None = None
    execution_timeout_cap: str | None = None

    def matches(self, payload: Mapping[str, Any]) -> bool:
        return self.when is None or payload.get(self.when[0]) == self.when[1]


@dataclass(frozen=True)
class Kind:
    """One payload kind, declared once.

    ``agent`` is the one agent id whose handler runs it (a job of the kind posted to another agent
    is refused by that agent's handler, non-retryably). ``route`` is the worker group the kind
    itself sends a job to whatever its agent id, unless the agent id is ``codex`` (spec: routing is
    "agent-id first and kind second"). ``plan_task``: whether an objective's plan may hold a task of
    this kind (the objective machinery's own kinds may not).
    """

    name: str
    agent: str
    contract: KindContract
    lease: LeaseRow | None = None
    route: WorkerGroup | None = None
    plan_task: bool = True


def declare(
    name: str,
    *,
    agent: str,
    worker_group: WorkerGroup,
    durable_workflow: DurableWorkflow | None = None,
    has_durable_activity: bool = False,
    objective_scoped: bool = False,
    reconcile: bool = False,
    live_execution: bool = False,
    terminal_objective_audit: bool = False,
    requires_auth_context: bool = True,
    command: CommandUse = "never",
    posted_by: PostedBy = "tenant",
    lease: LeaseRow | None = None,
    route: WorkerGroup | None = None,
    plan_task: bool = True,
) -> Kind:
    """A ``Kind`` from one flat declaration (the contract's fields beside the kind's own)."""
    contract = KindContract(
        kind=name,
        worker_group=worker_group,
        durable_workflow=durable_workflow,
        has_durable_activity=has_durable_activity,
        objective_scoped=objective_scoped,
        reconcile_objective_on_terminal_or_expired_lease=reconcile,
        live_execution=live_execution,
        terminal_objective_audit=terminal_objective_audit,
        requires_auth_context=requires_auth_context,
        command=command,
        posted_by=posted_by,
    )
    return Kind(name, agent, contract, lease=lease, route=route, plan_task=plan_task)


# -- the kinds, in the spec's order. Where the spec is silent the choices are ours; each says why. --

# Spec: the factory.dispatch contract names control (routing on agent "factory" says chat).
# Not objective-scoped: a dispatch may create the objective it acts on.
DISPATCH: Final = declare("factory.dispatch", agent=AGENT_FACTORY, worker_group="control")

# A chat-started run: its own durable "run" workflow, streamed live to the chat.
RUN: Final = declare(
    "factory.run", agent=AGENT_FACTORY, worker_group="chat", durable_workflow="run", live_execution=True
)

# Integration runs in a workspace (codex): spec routing sends every factory.integration.* job there.
# Its end must be reacted to by the objective. Publish runs a command only when given one;
# otherwise it POSTs the objective's results to the deployment's publish URL. It does not set
# terminalObjectiveAudit: its settlement never ends its objective (only a control step does, after
# recording it), and the control step that ends an objective queues the audit under the control
# kind's flag, so a flag here could only ask for an audit every ended objective already gets.
PUBLISH: Final = declare(
    "factory.integration.publish",
    agent=AGENT_CODEX,
    worker_group="codex",
    objective_scoped=True,
    reconcile=True,
    live_execution=True,
    command="when_given",
    route="codex",
)
# Validate runs its command through the codex command runner.
VALIDATE: Final = declare(
    "factory.integration.validate",
    agent=AGENT_CODEX,
    worker_group="codex",
    objective_scoped=True,
    reconcile=True,
    live_execution=True,
    command="always",
    route="codex",
)

# The audit only observes: reconciling on its end would loop audit -> control -> audit.
# A tenant may ask for its own objective's audit again (it is appended once): never another's.
AUDIT: Final = declare(
    "factory.objective.audit",
    agent=AGENT_FACTORY_CONTROL,
    worker_group="control",
    objective_scoped=True,
    posted_by="objective-owner",
    plan_task=False,
)
# Control *is* the objective's durable workflow. It does not reconcile on its own end (that would
# re-enqueue itself forever); the outbox redrive and watchdog recover it instead. Control is the
# only kind whose run ends an objective, so it is the one that sets terminalObjectiveAudit: the
# step that ends an objective queues its audit. A control step is idempotent: a tenant may nudge
# its own objective, never another's.
CONTROL: Final = declare(
    "factory.objective.control",
    agent=AGENT_FACTORY_CONTROL,
    worker_group="control",
    durable_workflow="objective-control",
    objective_scoped=True,
    terminal_objective_audit=True,
    posted_by="objective-owner",
    # Spec lease row: factory-control running factory.objective.control -> max(JOB_LEASE_MS,
    # FACTORY_CONTROL_JOB_LEASE_MS); FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS may lower the timeout.
    lease=LeaseRow(
        "factory_control_job_lease_ms", execution_timeout_cap="factory_control_job_execution_timeout_ms"
    ),
    plan_task=False,
)
# Cron-driven scan over all objectives: not scoped to one, and (spec) the only kind without an
# authContext. It scans every organisation's objectives: the system's own job.
WATCHDOG: Final = declare(
    "factory.objective.watchdog",
    agent=AGENT_FACTORY_CONTROL,
    worker_group="control",
    requires_auth_context=False,
    posted_by="system",
    plan_task=False,
)
# The Factory derives a monitor for each computer-path task itself; a tenant has no reason to.
MONITOR: Final = declare(
    "factory.task.monitor",
    agent=AGENT_FACTORY_MONITOR,
    worker_group="control",
    objective_scoped=True,
    reconcile=True,
    live_execution=True,
    posted_by="system",
    # Spec lease row: factory-monitor running factory.task.monitor with executionPath computer ->
    # max(JOB_LEASE_MS, CODEX_JOB_LEASE_MS).
    lease=LeaseRow("codex_job_lease_ms", when=(EXECUTION_PATH_FIELD, COMPUTER_EXECUTION_PATH)),
)
# Spec: only factory.task.run sets hasDurableActivity. Its handler runs the payload's argv.
TASK_RUN: Final = declare(
    "factory.task.run",
    agent=AGENT_CODEX,
    worker_group="codex",
    has_durable_activity=True,
    objective_scoped=True,
    reconcile=True,
    live_execution=True,
    command="always",
)

_DECLARED: Final = (DISPATCH, RUN, PUBLISH, VALIDATE, AUDIT, CONTROL, WATCHDOG, MONITOR, TASK_RUN)

KINDS: Final[Mapping[str, Kind]] = MappingProxyType({k.name: k for k in _DECLARED})
if len(KINDS) != len(_DECLARED):  # pragma: no cover - guards an edit that declares a kind twice
    raise AssertionError("a payload kind is declared twice")

# -- derived ---------------------------------------------------------------------------------------
# The payload kinds the API accepts, in declaration order.
PAYLOAD_KINDS: Final[tuple[str, ...]] = tuple(KINDS)
# Every kind except these needs an authContext with userId and organizationId.
KINDS_WITHOUT_AUTH_CONTEXT: Final[frozenset[str]] = frozenset(
    k.name for k in _DECLARED if not k.contract.requires_auth_context
)
# The agent ids with built-in handlers (spec, "The trap": exactly four), in first-declared order.
HANDLED_AGENT_IDS: Final[tuple[str, ...]] = tuple(dict.fromkeys(k.agent for k in _DECLARED))
CONTRACTS: Final[Mapping[str, KindContract]] = MappingProxyType({k.name: k.contract for k in _DECLARED})


def settings_read() -> frozenset[str]:
    """The ``Settings`` fields the lease rows name (read with ``getattr`` by ``app.jobs.timing``)."""
    fields: set[str] = set()
    for kind in _DECLARED:
        if kind.lease is not None:
            fields.add(kind.lease.floor)
            if kind.lease.execution_timeout_cap is not None:
                fields.add(kind.lease.execution_timeout_cap)
    return frozenset(fields)


def kind_of(name: str) -> Kind:
    """The declaration of a payload kind; an unknown kind is a ValidationError naming every kind."""
    try:
        return KINDS[name]
    except KeyError:
        # DESIGN: an unknown kind is rejected before anything is written, naming the valid kinds.
        raise ValidationError("kind", f"unknown payload kind {name!r}", allowed=PAYLOAD_KINDS) from None


def contract_for(name: str) -> KindContract:
    """The contract of a payload kind; an unknown kind is a ValidationError naming every kind."""
    return kind_of(name).contract
