"""The Factory's vocabularies, ids and exact strings, each defined once."""

from __future__ import annotations

import hashlib
import re
from typing import Final, Literal, get_args

from app.jobs.kinds import KINDS, TASK_RUN

ObjectiveStatus = Literal["active", "completed", "failed", "canceled"]
OBJECTIVE_STATUSES: Final[tuple[str, ...]] = get_args(ObjectiveStatus)
TERMINAL_OBJECTIVE_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "canceled"})

TaskStatus = Literal["pending", "queued", "running", "completed", "failed", "canceled", "skipped"]
TASK_STATUSES: Final[tuple[str, ...]] = get_args(TaskStatus)

FailurePolicy = Literal["failFast", "continue"]
FAILURE_POLICIES: Final[tuple[str, ...]] = get_args(FailurePolicy)
DEFAULT_FAILURE_POLICY: Final = "failFast"

# Every receipt type on an ``objectives/<id>`` stream (listed in docs/factory.md).
ObjectiveEventType = Literal[
    "objective.launched",
    "objective.replanned",
    "objective.control_requested",
    "objective.control_consumed",
    "objective.tasks_queued",
    "objective.task_settled",
    "objective.tasks_skipped",
    "objective.tasks_canceled",
    "objective.failing",
    "objective.cancel_requested",
    "objective.completed",
    "objective.failed",
    "objective.canceled",
    "objective.audited",
]
OBJECTIVE_EVENT_TYPES: Final[tuple[str, ...]] = get_args(ObjectiveEventType)

# Why a control request was written (the cause in the same transaction, or a recovery pass).
ControlReason = Literal[
    "launch", "task_settled", "lease_expired", "cancel", "resume", "redrive", "reconcile", "replan"
]
CONTROL_REASONS: Final[tuple[str, ...]] = get_args(ControlReason)
# Requests that need a look at every unfinished task, not only the ones they name.
BROAD_REASONS: Final[frozenset[str]] = frozenset(
    {"launch", "cancel", "resume", "redrive", "reconcile", "replan"}
)
# A replan's earlier phases are stopped with this reason (queued jobs canceled, running
# ones sent an abort command; never-started tasks canceled).
PHASE_SUPERSEDED: Final = "phase superseded"

# Plan defaults and bounds (a task is factory.task.run on its agent, codex, unless the plan says
# otherwise; at most 1 000 tasks).
DEFAULT_TASK_KIND: Final = TASK_RUN.name
DEFAULT_TASK_AGENT: Final = TASK_RUN.agent
MAX_PLAN_TASKS: Final = 1000
# A task may not be one of these kinds: they belong to the objective machinery itself (the kinds
# table's ``plan_task``).
FORBIDDEN_TASK_KINDS: Final[tuple[str, ...]] = tuple(k for k, d in KINDS.items() if not d.plan_task)
EXECUTION_PATHS: Final[tuple[str, ...]] = ("local", "computer")
FIRST_PHASE: Final = 1

# Control is idempotent and cheap to redo: give it every attempt the clamp allows.
CONTROL_MAX_ATTEMPTS: Final = 8
# A control request whose jobs all failed for good gets at most this many further jobs.
MAX_CONTROL_GENERATIONS: Final = 8

# The receipts that move an objective's control workflow (the durable ledger's row): its launch,
# each step that consumed requests, and its end. The audit and new requests are not its moves.
CONTROL_MOVES: Final[frozenset[str]] = frozenset(
    {
        "objective.launched",
        "objective.control_consumed",
        "objective.completed",
        "objective.failed",
        "objective.canceled",
    }
)

OBJECTIVE_STREAM_PREFIX: Final = "objectives/"
# Objective and task ids become parts of job ids (at most 128 characters): keep both short, and
# without ':' (the separator of derived job ids).
OBJECTIVE_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,55}")
TASK_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,55}")
TITLE_MAX: Final = 256
GOAL_MAX: Final = 20_000


def no_objective_message(objective_id: str) -> str:
    """The reducer's invariant error for an event on an objective that does not exist."""
    return f"Invariant: no objective for {objective_id}"


def objective_stream(objective_id: str) -> str:
    return OBJECTIVE_STREAM_PREFIX + objective_id


def objective_id_of(stream: str) -> str:
    return stream[len(OBJECTIVE_STREAM_PREFIX) :] if stream.startswith(OBJECTIVE_STREAM_PREFIX) else stream


def task_job_id(objective_id: str, phase: int, task_id: str) -> str:
    """The deterministic job id of a task in a phase: a repeated control step never makes a second job."""
    return f"{objective_id}:p{phase}:{task_id}"


def control_job_id(objective_id: str, request_seq: int, generation: int = 0) -> str:
    """The control job for the oldest pending request (its stream seq); later generations only after
    a control job failed for good. Requests arriving while that job waits share it (coalescing)."""
    base = f"{objective_id}:control:{request_seq}"
    return base if generation == 0 else f"{base}:g{generation}"


def audit_job_id(objective_id: str) -> str:
    return f"{objective_id}:audit"


def job_request_id(job_id: str, job_seq: int) -> str:
    """A control request caused by a job receipt is named after it, so it can be written only once."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:12]
    return f"job-{digest}-{job_seq}"
