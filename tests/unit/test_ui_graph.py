"""The objective graph layout: layers by dependency depth, colours by status, robust to bad plans."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from api.ui import graph


def task(task_id: str, *deps: str, status: str = "pending", **extra: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "agentId": "codex",
        "kind": "factory.task.run",
        "dependsOn": list(deps),
        "status": status,
        "jobId": None,
        "attempt": None,
        "result": None,
        "error": None,
        **extra,
    }


def objective(*tasks: dict[str, Any], status: str = "active") -> dict[str, Any]:
    return {
        "id": "obj-1",
        "title": "Ship it",
        "goal": "g",
        "status": status,
        "phase": 1,
        "failurePolicy": "failFast",
        "tasks": list(tasks),
        "audit": None,
        "createdAt": "2026-01-01T00:00:00.000000Z",
        "updatedAt": "2026-01-01T00:00:00.000000Z",
    }


DIAMOND = objective(
    task("A", status="completed", jobId="obj-1:1:A", attempt=1),
    task("B", "A", status="running", attempt=1),
    task("C", "A", status="failed", attempt=2),
    task("D", "B", "C", status="pending"),
)


def test_a_diamond_is_three_layers_and_every_edge_points_right() -> None:
    layout = graph.layout(DIAMOND)
    layer = {n.id: n.layer for n in layout.nodes}
    assert layer == {"A": 0, "B": 1, "C": 1, "D": 2}
    x = {n.id: n.x for n in layout.nodes}
    for edge in layout.edges:
        assert x[edge.source] < x[edge.target]
    assert {(e.source, e.target) for e in layout.edges} == {("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")}
    assert layout.unplaced == []


def test_nodes_are_coloured_by_status_and_edges_from_completed_tasks_are_satisfied() -> None:
    layout = graph.layout(DIAMOND)
    fills = {n.id: (n.fill, n.stroke) for n in layout.nodes}
    assert fills["A"] == graph.COLOURS["completed"]
    assert fills["B"] == graph.COLOURS["running"]
    assert fills["C"] == graph.COLOURS["failed"]
    assert fills["D"] == graph.COLOURS["pending"]
    satisfied = {(e.source, e.target): e.satisfied for e in layout.edges}
    assert satisfied[("A", "B")] and satisfied[("A", "C")]
    assert not satisfied[("B", "D")]
    by_id = {n.id: n for n in layout.nodes}
    assert by_id["A"].job_id == "obj-1:1:A"
    assert by_id["C"].attempt == 2


def test_every_task_status_has_its_own_colour() -> None:
    assert set(graph.COLOURS) == set(graph.TASK_STATUSES)
    assert len(set(graph.COLOURS.values())) == len(graph.TASK_STATUSES)
    assert graph.colour("made-up") == graph.UNKNOWN_COLOUR


def test_depth_is_the_longest_chain_not_the_shortest() -> None:
    # A → B → C and A → C: C sits after B, not beside it.
    layout = graph.layout(objective(task("A"), task("B", "A"), task("C", "A", "B")))
    assert {n.id: n.layer for n in layout.nodes} == {"A": 0, "B": 1, "C": 2}


def test_an_edge_that_skips_a_layer_runs_beside_the_task_in_it() -> None:
    layout = graph.layout(objective(task("A"), task("B", "A"), task("C", "A", "B")))
    by_id = {n.id: n for n in layout.nodes}
    skip = next(e for e in layout.edges if (e.source, e.target) == ("A", "C"))
    # One waypoint: a straight run across layer 1, in a row of its own (not B's).
    assert skip.path.count(" L") == 1
    run_y = int(skip.path.split(" L")[1].split(",")[1].split()[0])
    assert run_y != by_id["B"].y + graph.NODE_H // 2
    assert layout.height >= 2 * graph.NODE_H  # the waypoint took a slot in the column
    assert [n.id for n in layout.nodes] == ["A", "B", "C"]  # waypoints are not tasks


def test_a_cycle_or_unknown_dependency_is_drawn_not_fatal() -> None:
    layout = graph.layout(objective(task("A"), task("B", "C"), task("C", "B"), task("D", "A", "ghost")))
    assert sorted(layout.unplaced) == ["B", "C"]
    layer = {n.id: n.layer for n in layout.nodes}
    assert layer["D"] == 1
    assert layer["B"] == layer["C"] == 2  # the extra, last layer
    assert layout.width > 0 and layout.height > 0


def test_malformed_tasks_are_skipped_and_duplicates_drawn_once() -> None:
    messy = {"tasks": [task("A"), task("A", status="failed"), {"id": 7}, "nonsense", {"no": "id"}]}
    layout = graph.layout(messy)
    assert [n.id for n in layout.nodes] == ["A"]
    assert graph.layout({"tasks": None}).nodes == []
    assert graph.layout({}).width == 0


def test_barycentre_keeps_children_next_to_their_parent() -> None:
    # Two independent chains: each child should sit in its parent's row.
    layout = graph.layout(objective(task("P1"), task("P2"), task("c2", "P2"), task("c1", "P1")))
    y = {n.id: n.y for n in layout.nodes}
    assert y["c1"] == y["P1"]
    assert y["c2"] == y["P2"]


def test_counts_and_progress() -> None:
    counts = graph.status_counts(DIAMOND)
    assert counts == {
        "pending": 1,
        "queued": 0,
        "running": 1,
        "completed": 1,
        "failed": 1,
        "canceled": 0,
        "skipped": 0,
    }
    assert graph.progress(DIAMOND) == (2, 4)


@given(st.lists(st.lists(st.integers(min_value=0, max_value=30), max_size=4), min_size=1, max_size=30))
def test_any_dag_places_every_task_with_edges_rightwards(parents: list[list[int]]) -> None:
    # Task i may only depend on tasks before it, so the plan is acyclic by construction.
    tasks = [task(f"t{i}", *sorted({f"t{p}" for p in ps if p < i})) for i, ps in enumerate(parents)]
    layout = graph.layout(objective(*tasks))
    assert layout.unplaced == []
    assert len(layout.nodes) == len(tasks)
    layer = {n.id: n.layer for n in layout.nodes}
    for edge in layout.edges:
        assert layer[edge.source] < layer[edge.target]
    positions = {(n.x, n.y) for n in layout.nodes}
    assert len(positions) == len(tasks)  # no two tasks on top of each other
    for n in layout.nodes:
        assert n.x + graph.NODE_W <= layout.width and n.y + graph.NODE_H <= layout.height
