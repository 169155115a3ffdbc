"""Plans: a launch request checked completely before anything is written.

A plan is data — ``{"tasks": [...]}`` — validated into frozen values here, so it can be diffed,
replayed and reasoned about without running anything (Hatchet declares ``parents`` up front; Oban
Pro names ``deps`` per job). Every rejection is a ``ValidationError`` naming the offending field:
a cycle (named task by task), an unknown dependency, a duplicate task id, an empty plan, more than
``MAX_PLAN_TASKS`` tasks, a kind that belongs to the objective machinery, or a task payload that
the job validation itself refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.factory.vocab import (
    DEFAULT_FAILURE_POLICY,
    DEFAULT_TASK_AGENT,
    DEFAULT_TASK_KIND,
    EXECUTION_PATHS,
    FAILURE_POLICIES,
    FIRST_PHASE,
    FORBIDDEN_TASK_KINDS,
    GOAL_MAX,
    MAX_PLAN_TASKS,
    OBJECTIVE_ID_PATTERN,
    TASK_ID_PATTERN,
    TITLE_MAX,
)
from app.jobs.errors import ValidationError
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.validation import validate_auth_context, validate_enqueue

OBJECTIVE_FIELDS = ("objectiveId", "title", "goal", "plan", "failurePolicy", "authContext")
PLAN_FIELDS = ("tasks",)
TASK_FIELDS = ("id", "agentId", "payload", "dependsOn", "maxAttempts", "executionPath")
# Set on every task payload by the objective; a plan may not supply them.
STAMPED_FIELDS = ("authContext", "objectiveId", "taskId", "phase", "inputs")


@dataclass(frozen=True)
class TaskSpec:
    """One task of a plan, defaults applied; ``payload`` is the plan's, before stamping."""

    id: str
    agent_id: str
    kind: str
    payload: Mapping[str, Any]
    depends_on: tuple[str, ...]
    max_attempts: int | None
    execution_path: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agentId": self.agent_id,
            "kind": self.kind,
            "payload": {**self.payload, "kind": self.kind},
            "dependsOn": list(self.depends_on),
            "maxAttempts": self.max_attempts,
            "executionPath": self.execution_path,
        }


@dataclass(frozen=True)
class ObjectiveSpec:
    """A validated launch: the objective's fields and its plan in the order given."""

    objective_id: str | None
    title: str
    goal: str
    failure_policy: str
    auth_context: Mapping[str, Any]
    tasks: tuple[TaskSpec, ...]

    @property
    def organization_id(self) -> str | None:
        org = self.auth_context.get("organizationId")
        return org if isinstance(org, str) else None


def stamp_payload(
    task: TaskSpec,
    *,
    objective_id: str,
    phase: int,
    auth_context: Mapping[str, Any],
    inputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The task job's payload: the plan's, plus the objective's authContext, ids and phase."""
    payload = dict(task.payload)
    payload["kind"] = task.kind
    payload["authContext"] = dict(auth_context)
    payload["objectiveId"] = objective_id
    payload["taskId"] = task.id
    payload["phase"] = phase
    if task.execution_path is not None:
        payload["executionPath"] = task.execution_path
    if inputs:
        payload["inputs"] = dict(inputs)
    return payload


def _text(body: Mapping[str, Any], name: str, max_len: int, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise ValidationError(name, "is required and must be a non-empty string")
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(name, "must be a non-empty string")
    if len(value) > max_len:
        raise ValidationError(name, f"must be at most {max_len} characters")
    return value


def _task(raw: Any, index: int, auth_context: Mapping[str, Any]) -> TaskSpec:
    where = f"plan.tasks[{index}]"
    if not isinstance(raw, Mapping):
        raise ValidationError(where, "must be an object with an id")
    unknown = sorted(set(raw) - set(TASK_FIELDS))
    if unknown:
        raise ValidationError(f"{where}.{unknown[0]}", "is not a known task field", allowed=TASK_FIELDS)
    task_id = raw.get("id")
    if not isinstance(task_id, str) or not TASK_ID_PATTERN.fullmatch(task_id):
        raise ValidationError(
            f"{where}.id",
            "must be 1-56 characters of letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    agent_id = raw.get("agentId", DEFAULT_TASK_AGENT)
    if agent_id is None:
        agent_id = DEFAULT_TASK_AGENT
    payload = raw.get("payload")
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise ValidationError(f"{where}.payload", "must be an object")
    reserved = sorted(set(payload) & set(STAMPED_FIELDS))
    if reserved:
        raise ValidationError(
            f"{where}.payload.{reserved[0]}", "is set by the objective and may not be given in a plan"
        )
    kind = payload.get("kind", DEFAULT_TASK_KIND)
    if kind in FORBIDDEN_TASK_KINDS:
        raise ValidationError(
            f"{where}.payload.kind",
            f"{kind} cannot be a task: it belongs to the objective machinery",
            allowed=[k for k in _task_kinds()],
        )
    depends_on = raw.get("dependsOn")
    if depends_on is None:
        depends_on = []
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        raise ValidationError(f"{where}.dependsOn", "must be a list of task ids")
    if len(set(depends_on)) != len(depends_on):
        raise ValidationError(f"{where}.dependsOn", "names a task more than once")
    if task_id in depends_on:
        raise ValidationError(f"{where}.dependsOn", f"cycle: {task_id} -> {task_id}")
    execution_path = raw.get("executionPath")
    if execution_path is not None and execution_path not in EXECUTION_PATHS:
        raise ValidationError(f"{where}.executionPath", "is not an execution path", allowed=EXECUTION_PATHS)
    max_attempts = raw.get("maxAttempts")
    spec = TaskSpec(
        id=task_id,
        agent_id=agent_id if isinstance(agent_id, str) else "",
        kind=kind if isinstance(kind, str) else "",
        payload=dict(payload),
        depends_on=tuple(depends_on),
        max_attempts=max_attempts if isinstance(max_attempts, int) else None,
        execution_path=execution_path,
    )
    # The task's job must pass the job validation exactly as a POST /agents/<id>/jobs would, but for
    # its id: the Factory derives that (a shape no client may post), from ids already checked here.
    enqueue_body: dict[str, Any] = {
        "payload": stamp_payload(spec, objective_id="x", phase=FIRST_PHASE, auth_context=auth_context),
    }
    if max_attempts is not None:
        enqueue_body["maxAttempts"] = max_attempts
    try:
        req = validate_enqueue(agent_id, enqueue_body)
    except ValidationError as exc:
        raise ValidationError(f"{where}.{exc.field}", exc.reason, exc.allowed) from None
    return TaskSpec(
        id=spec.id,
        agent_id=req.agent_id,
        kind=spec.kind,
        payload=spec.payload,
        depends_on=spec.depends_on,
        max_attempts=req.max_attempts if max_attempts is not None else None,
        execution_path=spec.execution_path,
    )


def _task_kinds() -> list[str]:
    return [k for k in PAYLOAD_KINDS if k not in FORBIDDEN_TASK_KINDS]


def find_cycle(tasks: Sequence[TaskSpec]) -> list[str] | None:
    """A dependency cycle as a path ``[a, b, ..., a]``, or None when the plan is acyclic."""
    deps = {t.id: t.depends_on for t in tasks}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in deps:
        if state.get(root):
            continue
        # Iterative DFS (a 1 000-task chain would overflow Python's recursion limit).
        path: list[str] = [root]
        iters = [iter(deps[root])]
        state[root] = 1
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
                continue
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(deps.get(nxt, ())))
    return None


def validate_plan(raw_plan: Any, auth_context: Mapping[str, Any]) -> tuple[TaskSpec, ...]:
    """Check a plan's shape and graph; return its tasks (defaults applied) in the order given."""
    if not isinstance(raw_plan, Mapping):
        raise ValidationError("plan", 'is required and must be an object {"tasks": [...]}')
    unknown = sorted(set(raw_plan) - set(PLAN_FIELDS))
    if unknown:
        raise ValidationError(f"plan.{unknown[0]}", "is not a known plan field", allowed=PLAN_FIELDS)
    raw_tasks = raw_plan.get("tasks")
    if not isinstance(raw_tasks, list):
        raise ValidationError("plan.tasks", "is required and must be a list of tasks")
    if not raw_tasks:
        raise ValidationError("plan.tasks", "is empty: a plan needs at least one task")
    if len(raw_tasks) > MAX_PLAN_TASKS:
        raise ValidationError(
            "plan.tasks", f"has {len(raw_tasks)} tasks; at most {MAX_PLAN_TASKS} are allowed"
        )
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_tasks):
        task = _task(raw, index, auth_context)
        if task.id in seen:
            raise ValidationError(f"plan.tasks[{index}].id", f"duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    for index, task in enumerate(tasks):
        for dep in task.depends_on:
            if dep not in seen:
                raise ValidationError(
                    f"plan.tasks[{index}].dependsOn", f"task {task.id!r} depends on unknown task {dep!r}"
                )
    cycle = find_cycle(tasks)
    if cycle is not None:
        raise ValidationError("plan.tasks", "dependency cycle: " + " -> ".join(cycle))
    return tuple(tasks)


def validate_objective(body: Any, *, auth_context: Mapping[str, Any] | None = None) -> ObjectiveSpec:
    """Check a launch body (the HTTP body, or ``payload.objective`` of ``factory.dispatch``).

    ``auth_context`` is the caller's default when the body has none (the API derives it from the
    token); a body's own ``authContext`` must carry ``userId`` and ``organizationId``.
    """
    if not isinstance(body, Mapping):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(body) - set(OBJECTIVE_FIELDS))
    if unknown:
        raise ValidationError(unknown[0], "is not a known field", allowed=OBJECTIVE_FIELDS)
    objective_id = body.get("objectiveId")
    if objective_id is not None and (
        not isinstance(objective_id, str) or not OBJECTIVE_ID_PATTERN.fullmatch(objective_id)
    ):
        raise ValidationError(
            "objectiveId",
            "must be 1-56 characters of letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    title = _text(body, "title", TITLE_MAX, required=True)
    goal = _text(body, "goal", GOAL_MAX, required=True)
    policy = body.get("failurePolicy")
    if policy is None:
        policy = DEFAULT_FAILURE_POLICY
    if policy not in FAILURE_POLICIES:
        raise ValidationError("failurePolicy", "is not a failure policy", allowed=FAILURE_POLICIES)
    ctx = body.get("authContext")
    if ctx is None:
        ctx = auth_context
    if ctx is None:
        raise ValidationError("authContext", "is required and must carry userId and organizationId")
    try:
        validate_auth_context(DEFAULT_TASK_KIND, ctx)
    except ValidationError as exc:
        raise ValidationError(exc.field.replace("payload.", "", 1), exc.reason, exc.allowed) from None
    tasks = validate_plan(body.get("plan"), ctx)
    assert title is not None and goal is not None
    return ObjectiveSpec(
        objective_id=objective_id,
        title=title,
        goal=goal,
        failure_policy=str(policy),
        auth_context=dict(ctx),
        tasks=tasks,
    )
