"""Worker routing (spec: "Actual Resonate routing, however, is decided agent-id first and kind second")."""

from __future__ import annotations

import pytest

from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, QUEUES, Route, route
from app.jobs.vocab import WORKER_GROUPS, WorkerGroup


@pytest.mark.parametrize(
    ("agent_id", "kind", "group", "queue"),
    [
        # job.agentId === "codex" -> receipt-codex (whatever the kind: agent id is checked first)
        pytest.param(
            "codex", "factory.task.run", "codex", "receipt-codex", id="agent codex -> receipt-codex"
        ),
        pytest.param("codex", "factory.run", "codex", "receipt-codex", id="agent codex wins over any kind"),
        pytest.param(
            "codex", "factory.objective.control", "codex", "receipt-codex", id="agent codex before kind"
        ),
        # kind startsWith "factory.integration." -> receipt-codex
        pytest.param(
            "factory",
            "factory.integration.publish",
            "codex",
            "receipt-codex",
            id="factory.integration.* -> receipt-codex",
        ),
        pytest.param(
            "factory-monitor",
            "factory.integration.validate",
            "codex",
            "receipt-codex",
            id="factory.integration.validate -> receipt-codex",
        ),
        pytest.param(
            "factory-control",
            "factory.integration.validate",
            "codex",
            "receipt-codex",
            id="integration prefix is checked before factory-control",
        ),
        pytest.param(
            "nobody",
            "factory.integration.publish",
            "codex",
            "receipt-codex",
            id="integration prefix applies to unknown agents too",
        ),
        # job.agentId === "factory-control" -> receipt-control
        pytest.param(
            "factory-control",
            "factory.objective.control",
            "control",
            "receipt-control",
            id="agent factory-control -> receipt-control",
        ),
        pytest.param(
            "factory-control",
            "factory.run",
            "control",
            "receipt-control",
            id="agent factory-control routes any non-integration kind to control",
        ),
        # otherwise -> receipt-chat
        pytest.param("factory", "factory.run", "chat", "receipt-chat", id="otherwise -> receipt-chat"),
        pytest.param(
            "factory",
            "factory.dispatch",
            "chat",
            "receipt-chat",
            id="factory.dispatch on agent factory lands on chat",
        ),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            "chat",
            "receipt-chat",
            id="agent factory-monitor -> receipt-chat",
        ),
        pytest.param(
            "nobody",
            "factory.run",
            "chat",
            "receipt-chat",
            id="unknown agent id is routed to chat like any other",
        ),
        pytest.param(
            "Codex", "factory.task.run", "chat", "receipt-chat", id="agent ids compare exactly (case)"
        ),
        pytest.param(
            "factory", "factory.integration", "chat", "receipt-chat", id="prefix needs the trailing dot"
        ),
    ],
)
def test_routing_follows_the_spec_order(agent_id: str, kind: str, group: str, queue: str) -> None:
    """Spec: codex agent -> codex; factory.integration.* -> codex; factory-control -> control;
    otherwise chat."""
    result = route(agent_id, kind)
    assert (result.worker_group, result.queue) == (group, queue)


@pytest.mark.parametrize(
    ("agent_id", "kind", "contract_group", "agrees"),
    [
        pytest.param(
            "factory",
            "factory.dispatch",
            "control",
            False,
            id="factory.dispatch on factory: routed chat, contract names control",
        ),
        pytest.param(
            "factory-control", "factory.dispatch", "control", True, id="factory.dispatch on factory-control"
        ),
        pytest.param("factory", "factory.run", "chat", True, id="factory.run on factory"),
        pytest.param("factory-control", "factory.objective.control", "control", True, id="objective control"),
        pytest.param("factory-control", "factory.objective.watchdog", "control", True, id="watchdog"),
        pytest.param("codex", "factory.task.run", "codex", True, id="task run on codex"),
        pytest.param("factory", "factory.integration.publish", "codex", True, id="integration publish"),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            "control",
            False,
            id="task monitor on factory-monitor: routed chat, contract control",
        ),
        pytest.param("codex", "factory.objective.audit", "control", False, id="audit posted to codex"),
    ],
)
def test_disagreement_with_the_kind_contract_is_data(
    agent_id: str, kind: str, contract_group: str, agrees: bool
) -> None:
    """Spec: "These two do not always agree ... Treat this as an ambiguity" — exposed, never resolved."""
    result = route(agent_id, kind)
    assert result.contract_worker_group == contract_group
    assert result.agrees is agrees


@pytest.mark.parametrize(
    ("agent_id", "kind", "group"),
    [
        ("factory", "bogus.kind", "chat"),
        ("codex", "bogus.kind", "codex"),
        ("factory-control", "bogus.kind", "control"),
        ("factory", "factory.integration.bogus", "codex"),
    ],
)
def test_unknown_kind_still_routes_with_no_contract(agent_id: str, kind: str, group: WorkerGroup) -> None:
    """Routing needs only the agent id and kind; an unknown kind has no contract to agree with."""
    assert route(agent_id, kind) == Route(
        worker_group=group, queue=QUEUES[group], contract_worker_group=None, agrees=False
    )


def test_factory_dispatch_disagreement_to_json() -> None:
    """Spec: "A `factory.dispatch` job posted to agent id `factory` lands on the chat group"."""
    assert route("factory", "factory.dispatch").to_json() == {
        "workerGroup": "chat",
        "queue": "receipt-chat",
        "contractWorkerGroup": "control",
        "agreesWithContract": False,
    }


def test_queue_names() -> None:
    """Spec group names: receipt-chat, receipt-codex, receipt-control, receipt-driver (+ beat's
    maintenance)."""
    assert dict(QUEUES) == {"chat": "receipt-chat", "codex": "receipt-codex", "control": "receipt-control"}
    assert set(QUEUES) == set(WORKER_GROUPS)
    assert DRIVER_QUEUE == "receipt-driver"
    assert MAINTENANCE_QUEUE == "receipt-maintenance"
    assert len({*QUEUES.values(), DRIVER_QUEUE, MAINTENANCE_QUEUE}) == 5


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
@pytest.mark.parametrize("agent_id", ["factory", "factory-control", "factory-monitor", "codex", "unknown"])
def test_every_job_routes_to_a_worker_queue(agent_id: str, kind: str) -> None:
    """Every (agent id, kind) pair lands on exactly one of the three worker queues."""
    result = route(agent_id, kind)
    assert result.queue == QUEUES[result.worker_group]
    assert result.agrees is (result.contract_worker_group == result.worker_group)
