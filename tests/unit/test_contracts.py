"""Kind contracts (spec: "Payload kinds")."""

from __future__ import annotations

import dataclasses

import pytest

from app.jobs.contracts import CONTRACTS, DURABLE_WORKFLOWS, KindContract, contract_for
from app.jobs.errors import ValidationError
from app.jobs.privilege import posting_refusal
from app.jobs.vocab import PAYLOAD_KINDS, WORKER_GROUPS

# kind, workerGroup, durableWorkflow, hasDurableActivity, objectiveScoped,
# reconcileObjectiveOnTerminalOrExpiredLease, liveExecution, terminalObjectiveAudit, requiresAuthContext
EXPECTED = [
    ("factory.dispatch", "control", None, False, False, False, False, False, True),
    ("factory.run", "chat", "run", False, False, False, True, False, True),
    ("factory.integration.publish", "codex", None, False, True, True, True, True, True),
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
    # runs_command (issue 8, not a spec flag) is its own test (test_scopes.py).
    # posted_by (who may post it, not a spec flag) is its own test below.
    declared = dataclasses.replace(contract_for(str(row[0])), runs_command=False, posted_by="tenant")
    assert declared == KindContract(*row)  # type: ignore[arg-type]


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


def test_contracts_cover_exactly_the_nine_payload_kinds() -> None:
    """Spec: "Nine payload kinds are accepted"."""
    assert tuple(CONTRACTS) == PAYLOAD_KINDS
    assert len(CONTRACTS) == 9
    assert [r[0] for r in EXPECTED] == list(PAYLOAD_KINDS)


def test_only_factory_task_run_has_durable_activity() -> None:
    """Spec: "Only `factory.task.run` sets `hasDurableActivity`"."""
    assert [k for k, c in CONTRACTS.items() if c.has_durable_activity] == ["factory.task.run"]


def test_every_kind_but_the_watchdog_requires_auth_context() -> None:
    """Spec: "Every one of these except `factory.objective.watchdog` requires an `authContext`"."""
    assert [k for k, c in CONTRACTS.items() if not c.requires_auth_context] == ["factory.objective.watchdog"]


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
def test_unknown_kind_is_a_validation_error_naming_the_nine(kind: str) -> None:
    """DESIGN: an unknown kind is rejected "with 400 and a JSON body that names the nine valid kinds"."""
    with pytest.raises(ValidationError) as info:
        contract_for(kind)
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
        "runsCommand": True,
        "postedBy": "tenant",
    }


def test_contracts_are_immutable() -> None:
    """Contracts are domain values: frozen dataclasses in a read-only mapping."""
    contract = contract_for("factory.run")
    with pytest.raises(dataclasses.FrozenInstanceError):
        contract.worker_group = "codex"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CONTRACTS["factory.run"] = contract  # type: ignore[index]
