"""An objective's task graph laid out for a server-rendered SVG: layers by dependency depth.

Pure: an objective dict in the shape of ``GET /objectives/<id>`` in, coordinates out. A task's
layer is the length of the longest dependency chain leading to it, so every edge points
rightwards; inside a layer, tasks are ordered by the mean position of their dependencies
(one barycentre pass), which keeps fan-in edges short without a layout library, and an edge
that skips layers takes an empty slot in each layer it crosses (Sugiyama's dummy nodes). Nothing here
needs a browser or a network: the page is drawn offline by the template.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

# The Factory's vocabularies: task statuses and objective statuses.
TASK_STATUSES = ("pending", "queued", "running", "completed", "failed", "canceled", "skipped")
OBJECTIVE_STATUSES = ("active", "completed", "failed", "canceled")
TERMINAL_TASK_STATUSES = frozenset({"completed", "failed", "canceled", "skipped"})

# Fill and stroke per task status (the legend and the SVG use the same table).
COLOURS: Mapping[str, tuple[str, str]] = {
    "pending": ("#f1f3f5", "#adb5bd"),
    "queued": ("#e7f0ff", "#4c7bd9"),
    "running": ("#fff4d6", "#d99a00"),
    "completed": ("#e3f6e8", "#2f9e44"),
    "failed": ("#fde8e8", "#d6336c"),
    "canceled": ("#e9ecef", "#495057"),
    "skipped": ("#f8f9fa", "#ced4da"),
}
UNKNOWN_COLOUR = ("#ffffff", "#868e96")

# Waypoint slots are named with NUL, which no task id holds (the API refuses it in any string).
_WAYPOINT = "\x00"
NODE_W = 176
NODE_H = 46
GAP_X = 64
GAP_Y = 18
MARGIN = 12


@dataclass(frozen=True)
class Node:
    id: str
    status: str
    agent_id: str
    kind: str
    layer: int
    x: int
    y: int
    fill: str
    stroke: str
    job_id: str | None
    attempt: int | None


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    # A cubic Bézier from the source's right edge to the target's left edge (SVG path data).
    path: str
    # The edge is "live" when its source completed: the dependency is satisfied.
    satisfied: bool


@dataclass(frozen=True)
class Layout:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    # Task ids whose dependencies could not all be placed (a cycle or an unknown id); drawn last.
    unplaced: list[str]


def colour(status: str) -> tuple[str, str]:
    return COLOURS.get(status, UNKNOWN_COLOUR)


def _tasks(objective: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tasks = objective.get("tasks")
    if not isinstance(tasks, Sequence) or isinstance(tasks, str):
        return []
    seen: set[str] = set()
    out: list[Mapping[str, Any]] = []
    for t in tasks:
        # A duplicate id is drawn once (the server refuses such plans; the page must not break).
        if isinstance(t, Mapping) and isinstance(t.get("id"), str) and t["id"] not in seen:
            seen.add(t["id"])
            out.append(t)
    return out


def _deps(task: Mapping[str, Any]) -> list[str]:
    deps = task.get("dependsOn")
    if not isinstance(deps, Sequence) or isinstance(deps, str):
        return []
    return [d for d in deps if isinstance(d, str)]


def layers(tasks: Sequence[Mapping[str, Any]]) -> tuple[dict[str, int], list[str]]:
    """Each task's depth (longest chain of dependencies before it), and the tasks left unplaced.

    Kahn's algorithm over known ids: a dependency on an unknown id is ignored for depth (the
    server refuses such plans; a page must still draw whatever it is given), and tasks on a
    cycle are never freed, so they are returned as unplaced instead of looping.
    """
    ids = [str(t["id"]) for t in tasks]
    known = set(ids)
    deps = {str(t["id"]): [d for d in _deps(t) if d in known and d != t["id"]] for t in tasks}
    children: dict[str, list[str]] = {i: [] for i in ids}
    waiting = {i: len(set(deps[i])) for i in ids}
    for i in ids:
        for d in set(deps[i]):
            children[d].append(i)
    depth: dict[str, int] = {}
    ready = deque(i for i in ids if waiting[i] == 0)
    for i in ready:
        depth[i] = 0
    while ready:
        current = ready.popleft()
        for child in children[current]:
            depth[child] = max(depth.get(child, 0), depth[current] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    unplaced = [i for i in ids if waiting[i] > 0]
    return depth, unplaced


def layout(objective: Mapping[str, Any]) -> Layout:
    """Place every task of ``objective``; unplaced tasks go in one extra layer at the end."""
    tasks = _tasks(objective)
    by_id = {str(t["id"]): t for t in tasks}
    depth, unplaced = layers(tasks)
    last = max(depth.values(), default=-1) + 1
    for i in unplaced:
        depth[i] = last
    columns: dict[int, list[str]] = {}
    for t in tasks:
        columns.setdefault(depth[str(t["id"])], []).append(str(t["id"]))

    # An edge that skips layers gets a waypoint in each layer it crosses (a slot no task takes),
    # so it runs between tasks instead of through them; each slot's predecessor is the slot
    # before it, which is what the ordering below pulls it towards.
    preds: dict[str, list[str]] = {}
    waypoints: dict[tuple[str, str], list[str]] = {}
    for t in tasks:
        target = str(t["id"])
        preds[target] = []
        for source in _deps(t):
            if source not in depth or source == target:
                continue
            previous = source
            chain = []
            for layer in range(depth[source] + 1, depth[target]):
                slot = f"{_WAYPOINT}{source}{_WAYPOINT}{target}{_WAYPOINT}{layer}"
                columns[layer].append(slot)
                preds[slot] = [previous]
                chain.append(slot)
                previous = slot
            waypoints[(source, target)] = chain
            preds[target].append(previous)

    row: dict[str, float] = {}
    for layer in sorted(columns):
        members = columns[layer]
        if layer > 0:
            # Barycentre ordering: sit each task near the mean row of its dependencies.
            order = {task_id: index for index, task_id in enumerate(members)}

            def key(task_id: str, order: dict[str, int] = order) -> tuple[float, int]:
                parents = [row[d] for d in preds.get(task_id, ()) if d in row]
                mean = sum(parents) / len(parents) if parents else float("inf")
                return (mean, order[task_id])

            members.sort(key=key)
        for index, task_id in enumerate(members):
            row[task_id] = index

    nodes: list[Node] = []
    position: dict[str, tuple[int, int]] = {}
    for layer, members in sorted(columns.items()):
        for index, task_id in enumerate(members):
            x = MARGIN + layer * (NODE_W + GAP_X)
            y = MARGIN + index * (NODE_H + GAP_Y)
            position[task_id] = (x, y)
            if task_id.startswith(_WAYPOINT):
                continue
            t = by_id[task_id]
            status = str(t.get("status") or "pending")
            fill, stroke = colour(status)
            attempt = t.get("attempt")
            nodes.append(
                Node(
                    id=task_id,
                    status=status,
                    agent_id=str(t.get("agentId") or ""),
                    kind=str(t.get("kind") or ""),
                    layer=layer,
                    x=x,
                    y=y,
                    fill=fill,
                    stroke=stroke,
                    job_id=t.get("jobId") if isinstance(t.get("jobId"), str) else None,
                    attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
                )
            )

    edges: list[Edge] = []
    for t in tasks:
        target = str(t["id"])
        for source in _deps(t):
            if source not in position or source == target:
                continue
            stops = [source, *waypoints.get((source, target), []), target]
            sx, sy = position[source]
            path = f"M{sx + NODE_W},{sy + NODE_H // 2}"
            for here, there in pairwise(stops):
                hx, hy = position[here]
                tx, ty = position[there]
                x1, y1 = hx + NODE_W, hy + NODE_H // 2
                x2, y2 = tx, ty + NODE_H // 2
                bend = max((x2 - x1) // 2, 16)
                path += f" C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
                if there != target:
                    path += f" L{x2 + NODE_W},{y2}"  # straight through the waypoint's slot
            satisfied = str(by_id[source].get("status")) == "completed"
            edges.append(Edge(source, target, path, satisfied))

    width = MARGIN * 2 + (last + (1 if unplaced else 0)) * (NODE_W + GAP_X) - GAP_X if nodes else 0
    tallest = max((len(m) for m in columns.values()), default=0)
    height = MARGIN * 2 + tallest * (NODE_H + GAP_Y) - GAP_Y if nodes else 0
    return Layout(nodes, edges, max(width, 0), max(height, 0), unplaced)


def status_counts(objective: Mapping[str, Any]) -> dict[str, int]:
    """Tasks per status, every status of the vocabulary present (zeros included)."""
    counts = dict.fromkeys(TASK_STATUSES, 0)
    for t in _tasks(objective):
        status = str(t.get("status") or "pending")
        counts[status] = counts.get(status, 0) + 1
    return counts


def progress(objective: Mapping[str, Any]) -> tuple[int, int]:
    """(tasks settled for good, tasks in all): what the page's progress bar shows."""
    tasks = _tasks(objective)
    done = sum(1 for t in tasks if str(t.get("status")) in TERMINAL_TASK_STATUSES)
    return done, len(tasks)
