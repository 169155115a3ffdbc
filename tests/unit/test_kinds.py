"""The kinds table (spec: "Payload kinds"): each kind declared once, with its contract, agent and
handler, lease row and routing; and everything that derives from it."""

from __future__ import annotations

import dataclasses

import pytest

from app.config import Settings
from app.factory.vocab import DEFAULT_TASK_AGENT, DEFAULT_TASK_KIND, FORBIDDEN_TASK_KINDS
from app.jobs import kinds
from app.jobs.contracts import COMMAND_USES, DURABLE_WORKFLOWS, KindContract
from app.jobs.errors import ValidationError
from app.jobs.kinds import (
    CONTRACTS,
    HANDLED_AGENT_IDS,
    KINDS,
    KINDS_WITHOUT_AUTH_CONTEXT,
    PAYLOAD_KINDS,
    contract_for,
    kind_of,
)
from app.jobs.privilege import posting_refusal, runs_command
from app.jobs.routing import INTEGRATION_KIND_PREFIX, kind_route
from app.jobs.vocab import WORKER_GROUPS
from workers import kinds as bound
from workers.handlers import codex, factory, integration
from workers.registry import default_registry, load_handlers

# Spec, "Payload kinds": "Nine payload kinds are accepted", in the spec's order. The vocabulary is
# closed: a kind added to the table fails here, on purpose (a new kind is a deviation to write down).
SPEC_KINDS = (
    "factory.dispatch",
    "factory.run",
    "factory.integration.publish",
    "factory.integration.validate",
    "factory.objective.audit",
    "factory.objective.control",
    "factory.objective.watchdog",
    "factory.task.monitor",
    "factory.task.run",
)
# Spec, "The trap": "Exactly four agent ids have registered job handlers".
SPEC_AGENTS = ("factory", "factory-control", "factory-monitor", "codex")


def test_the_table_declares_exactly_the_spec_kinds_in_its_order() -> None:
    assert PAYLOAD_KINDS == SPEC_KINDS
    assert tuple(KINDS) == tuple(CONTRACTS) == PAYLOAD_KINDS
    assert all(KINDS[name].name == name == CONTRACTS[name].kind for name in PAYLOAD_KINDS)


# kind, workerGroup, durableWorkflow, hasDurableActivity, objectiveScoped,
# reconcileObjectiveOnTerminalOrExpiredLease, liveExecution, terminalObjectiveAudit, requiresAuthContext
EXPECTED = [
    ("factory.dispatch", "control", None, False, False, False, False, False, True),
    ("factory.run", "chat", "run", False, False, False, True, False, True),
    ("factory.integration.publish", "codex", None, False, True, True, True, False, True),
    ("factory.integration.validate", "codex", None, False, True, True, True, False, True),
    ("factory.objective.audit", "control", None, False, True, False, False, False, True),
    ("factory.objective.control", "control", "objective-control", False, True, False, False, True, True),
    ("factory.objective.watchdog", "control", None, False, False, False, False, False, False),
    ("factory.task.monitor", "control", None, False, True, True, True, False, True),
    ("factory.task.run", "codex", None, True, True, True, True, False, True),
]


@pytest.mark.parametrize("row", EXPECTED, ids=[r[0] for r in EXPECTED])
def test_every_kind_declares_its_contract(row: tuple[object, ...]) -> None:
    """Spec: "Each kind also declares a contract: a workerGroup ..., an optional durable workflow, and
    flags"."""
    # command and posted_by (not spec flags) are their own tests below.
    declared = dataclasses.replace(contract_for(str(row[0])), command="never", posted_by="tenant")
    assert declared == KindContract(*row)  # type: ignore[arg-type]
    assert [r[0] for r in EXPECTED] == list(PAYLOAD_KINDS)


# Who may post each kind over the API (docs/security.md, "Who may post each kind").
POSTED_BY = {
    "factory.dispatch": "tenant",
    "factory.run": "tenant",
    "factory.integration.publish": "tenant",
    "factory.integration.validate": "tenant",
    "factory.objective.audit": "objective-owner",
    "factory.objective.control": "objective-owner",
    "factory.objective.watchdog": "system",
    "factory.task.monitor": "system",
    "factory.task.run": "tenant",
}


def test_every_kind_says_who_may_post_it() -> None:
    assert {k: c.posted_by for k, c in CONTRACTS.items()} == POSTED_BY


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
def test_the_posting_rule_refuses_exactly_what_the_table_says(kind: str) -> None:
    rule = POSTED_BY[kind]
    assert posting_refusal(kind, system=True, names_objective=False) is None  # system tokens: every kind
    tenant = posting_refusal(kind, system=False, names_objective=False)
    named = posting_refusal(kind, system=False, names_objective=True)
    if rule == "system":
        assert tenant is not None and "only system tokens" in tenant and named == tenant
    elif rule == "objective-owner":
        assert tenant is not None and "payload.objectiveId" in tenant and named is None
    else:
        assert tenant is None and named is None


def test_which_kinds_run_a_command() -> None:
    """task.run and validate always run one; publish only when its payload gives one."""
    assert {k: c.command for k, c in CONTRACTS.items() if c.command != "never"} == {
        "factory.integration.publish": "when_given",
        "factory.integration.validate": "always",
        "factory.task.run": "always",
    }
    assert all(c.command in COMMAND_USES for c in CONTRACTS.values())


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
@pytest.mark.parametrize("agent_id", [*SPEC_AGENTS, "someone-else"])
def test_runs_command_is_the_kind_rule_on_the_codex_group(agent_id: str, kind: str) -> None:
    """The one function the API's scope check and the codex runner ask."""
    use = CONTRACTS[kind].command
    codex_group = agent_id == "codex" or kind.startswith(INTEGRATION_KIND_PREFIX)
    given = {"command": ["true"]}
    assert runs_command(agent_id, kind, given) is (codex_group and use != "never")
    assert runs_command(agent_id, kind, {}) is (codex_group and use == "always")


def test_only_factory_task_run_has_durable_activity() -> None:
    """Spec: "Only `factory.task.run` sets `hasDurableActivity`"."""
    assert [k for k, c in CONTRACTS.items() if c.has_durable_activity] == ["factory.task.run"]


def test_every_kind_but_the_watchdog_requires_auth_context() -> None:
    """Spec: "Every one of these except `factory.objective.watchdog` requires an `authContext`"."""
    assert [k for k, c in CONTRACTS.items() if not c.requires_auth_context] == ["factory.objective.watchdog"]
    assert {"factory.objective.watchdog"} == KINDS_WITHOUT_AUTH_CONTEXT


def test_only_control_sets_terminal_objective_audit() -> None:
    """Only a control step ends an objective, and the step that does queues its audit; a flag on any
    other kind could only ask for an audit every ended objective already gets."""
    assert [k for k, c in CONTRACTS.items() if c.terminal_objective_audit] == [kinds.CONTROL.name]


def test_factory_dispatch_contract_names_control() -> None:
    """Spec: a factory.dispatch job lands on chat "even though its kind contract names `control`"."""
    assert contract_for("factory.dispatch").worker_group == "control"


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
def test_worker_group_and_workflow_come_from_their_vocabularies(kind: str) -> None:
    """Spec: "a `workerGroup` of `chat`, `codex` or `control`, an optional durable workflow"."""
    contract = contract_for(kind)
    assert contract.kind == kind
    assert contract.worker_group in WORKER_GROUPS
    assert contract.durable_workflow is None or contract.durable_workflow in DURABLE_WORKFLOWS


@pytest.mark.parametrize("kind", ["factory.unknown", "", "FACTORY.RUN", "factory.integration."])
def test_an_unknown_kind_is_a_validation_error_naming_every_kind(kind: str) -> None:
    """DESIGN: an unknown kind is rejected "with 400 and a JSON body that names the nine valid kinds"."""
    for lookup in (contract_for, kind_of):
        with pytest.raises(ValidationError) as info:
            lookup(kind)
        assert info.value.field == "kind"
        assert info.value.allowed == list(PAYLOAD_KINDS)


def test_to_json_uses_the_spec_camel_case_names() -> None:
    """Spec flag names: hasDurableActivity, objectiveScoped,
    reconcileObjectiveOnTerminalOrExpiredLease, ..."""
    assert contract_for("factory.task.run").to_json() == {
        "kind": "factory.task.run",
        "workerGroup": "codex",
        "durableWorkflow": None,
        "hasDurableActivity": True,
        "objectiveScoped": True,
        "reconcileObjectiveOnTerminalOrExpiredLease": True,
        "liveExecution": True,
        "terminalObjectiveAudit": False,
        "requiresAuthContext": True,
        "command": "always",
        "postedBy": "tenant",
    }


def test_the_table_is_immutable() -> None:
    """Kinds and contracts are domain values: frozen dataclasses in read-only mappings."""
    contract = contract_for("factory.run")
    with pytest.raises(dataclasses.FrozenInstanceError):
        contract.worker_group = "codex"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        kinds.RUN.agent = "codex"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CONTRACTS["factory.run"] = contract  # type: ignore[index]
    with pytest.raises(TypeError):
        KINDS["factory.run"] = kinds.RUN  # type: ignore[index]


# -- agents and handlers ------------------------------------------------------------------------------

AGENT_OF = {
    "factory.dispatch": "factory",
    "factory.run": "factory",
    "factory.integration.publish": "codex",
    "factory.integration.validate": "codex",
    "factory.objective.audit": "factory-control",
    "factory.objective.control": "factory-control",
    "factory.objective.watchdog": "factory-control",
    "factory.task.monitor": "factory-monitor",
    "factory.task.run": "codex",
}


def test_each_kind_names_the_agent_that_runs_it_and_the_agents_are_the_spec_four() -> None:
    assert {k: d.agent for k, d in KINDS.items()} == AGENT_OF
    assert sorted(HANDLED_AGENT_IDS) == sorted(SPEC_AGENTS)
    assert default_registry().agent_ids() == tuple(sorted(SPEC_AGENTS))


def test_every_kind_is_bound_to_its_handler_once() -> None:
    load_handlers()
    assert bound.unbound() == []
    assert {
        "factory.dispatch": factory.dispatch,
        "factory.run": factory.run,
        "factory.integration.publish": integration.publish,
        "factory.integration.validate": integration.validate,
        "factory.objective.audit": factory.audit,
        "factory.objective.control": factory.control,
        "factory.objective.watchdog": factory.watchdog,
        "factory.task.monitor": factory.follow_task,
        "factory.task.run": codex.run_command,
    } == bound.HANDLERS


def test_handles_refuses_a_second_handler_and_a_kind_the_table_does_not_declare() -> None:
    load_handlers()
    before = dict(bound.HANDLERS)
    with pytest.raises(ValueError, match="already has a handler"):
        bound.handles(kinds.RUN)(factory.dispatch)
    with pytest.raises(ValueError, match="is not a kind of"):
        bound.handles(dataclasses.replace(kinds.RUN, name="factory.other"))(factory.run)
    # A look-alike of a declared kind is not the declaration either.
    with pytest.raises(ValueError, match="is not a kind of"):
        bound.handles(dataclasses.replace(kinds.RUN, agent="codex"))(factory.run)
    assert before == bound.HANDLERS


# -- routing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
def test_each_kinds_route_is_the_spec_prefix_rule(kind: str) -> None:
    """Spec: `job.payload.kind startsWith "factory.integration."` -> receipt-codex; no other kind
    routes by itself."""
    expected = "codex" if kind.startswith(INTEGRATION_KIND_PREFIX) else None
    assert KINDS[kind].route == expected == kind_route(kind)


# -- timing -----------------------------------------------------------------------------------------


def test_the_kinds_own_lease_rows_are_control_and_the_computer_path_monitor() -> None:
    """Spec lease table: rows for factory-control running factory.objective.control and for
    factory-monitor running factory.task.monitor on the computer path (codex's row is the agent's)."""
    rows = {k: d.lease for k, d in KINDS.items() if d.lease is not None}
    assert rows == {
        "factory.objective.control": kinds.LeaseRow(
            "factory_control_job_lease_ms", execution_timeout_cap="factory_control_job_execution_timeout_ms"
        ),
        "factory.task.monitor": kinds.LeaseRow("codex_job_lease_ms", when=("executionPath", "computer")),
    }
    assert kinds.settings_read() == {
        "factory_control_job_lease_ms",
        "factory_control_job_execution_timeout_ms",
        "codex_job_lease_ms",
    }
    fields = {f.name for f in dataclasses.fields(Settings)}
    for row in rows.values():
        assert row.floor in fields
        assert row.execution_timeout_cap is None or row.execution_timeout_cap in fields


# -- the Factory's names derive from the table ------------------------------------------------------


def test_a_plan_may_not_hold_the_objective_machinerys_kinds() -> None:
    assert set(FORBIDDEN_TASK_KINDS) == {
        "factory.objective.audit",
        "factory.objective.control",
        "factory.objective.watchdog",
    }
    assert (DEFAULT_TASK_KIND, DEFAULT_TASK_AGENT) == ("factory.task.run", "codex")
