"""The spec's vocabularies, each defined exactly once (spec: "Lanes and statuses", "Lifecycle receipts")."""

from __future__ import annotations

from typing import Final, Literal, get_args

Lane = Literal["chat", "collect", "steer", "follow_up"]
LANES: Final[tuple[str, ...]] = get_args(Lane)
DEFAULT_LANE: Final = "collect"

Status = Literal["queued", "leased", "running", "completed", "failed", "canceled"]
STATUSES: Final[tuple[str, ...]] = get_args(Status)
ACTIVE_STATUSES: Final[frozenset[str]] = frozenset({"queued", "leased", "running"})
LEASED_STATUSES: Final[frozenset[str]] = frozenset({"leased", "running"})
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "canceled"})

EventType = Literal[
    "job.enqueued",
    "job.leased",
    "job.heartbeat",
    "job.progress",
    "job.completed",
    "job.failed",
    "job.canceled",
    "queue.command",
    "queue.command.consumed",
    "job.lease_expired",
    # Beyond the spec's ten (docs/deviations.md): the lease holder hands its attempt back uncharged.
    "job.released",
    # Beyond the spec (docs/deviations.md): a terminal job records the job that replays it.
    "job.replayed",
    # Beyond the spec (docs/deviations.md): a terminal job records the bulk archive that moves its
    # stream out (the last receipt its archived chain holds).
    "job.archived",
]
EVENT_TYPES: Final[tuple[str, ...]] = get_args(EventType)

# A bulk action on the jobs a filter selects (``app.ops.bulk_actions``), audited as receipts of an
# ``operations/<organizationId>/<idempotencyKey>`` stream: who, the filter, the count, each page.
BulkAction = Literal["cancel", "replay", "archive"]
BULK_ACTIONS: Final[tuple[str, ...]] = get_args(BulkAction)
OperationEventType = Literal["operation.started", "operation.page"]
OPERATION_EVENT_TYPES: Final[tuple[str, ...]] = get_args(OperationEventType)
OPERATION_STREAM_PREFIX: Final = "operations/"

CommandType = Literal["steer", "follow_up", "abort"]
COMMAND_TYPES: Final[tuple[str, ...]] = get_args(CommandType)
CommandLane = Literal["steer", "follow_up"]
COMMAND_LANES: Final[tuple[str, ...]] = get_args(CommandLane)

SingletonMode = Literal["allow", "cancel", "steer"]
SINGLETON_MODES: Final[tuple[str, ...]] = get_args(SingletonMode)
DEFAULT_SINGLETON_MODE: Final = "allow"

# The payload kinds are declared in ``app.jobs.kinds`` (one declaration each). The authContext of a
# kind that requires one (its ``requires_auth_context``) carries these fields:
AUTH_CONTEXT_REQUIRED: Final[tuple[str, ...]] = ("userId", "organizationId")
AUTH_CONTEXT_OPTIONAL: Final[tuple[str, ...]] = (
    "workspaceId",
    "receiptConnectGatewayUrl",
    "sessionId",
    "source",
)

WorkerGroup = Literal["chat", "codex", "control"]
WORKER_GROUPS: Final[tuple[str, ...]] = get_args(WorkerGroup)

FailureStatus = Literal[
    "settlement_conflict",
    "stale_attempt",
    "lease_lost",
    "terminal_state",
    "canceled",
    "execution_timeout",
    "failed",
]
FAILURE_STATUSES: Final[tuple[str, ...]] = get_args(FailureStatus)

# How one delivery (a driver pass) ended: what ``drive()`` returns and ``deliveries.outcome`` stores.
DeliveryOutcome = Literal[
    "dispatched",  # the worker message was sent under the attempt fence
    "terminal_state",  # the job is already completed/failed/canceled (or gone)
    "stale_active_lease",  # a lease past its deadline: that attempt failed as lease_lost
    "active_lease",  # a live lease: another attempt is running
    "canceled",  # an abort was pending: the queued job was canceled
    "backoff",  # a retry still backing off: the due-retries pass starts it later
    "send_failed",  # the driver or worker message could not be sent
    "fetcher_lost",  # the process that fetched its message died before acting on it (delivery/fetches.py)
    "unfetched",  # its message was sent, nobody fetched it and its queue is empty (delivery/fetches.py)
    "concurrency_limited",  # its concurrency key was full at the lease: the job waits in its line again
]
DELIVERY_OUTCOMES: Final[tuple[str, ...]] = get_args(DeliveryOutcome)

# Why a lease holder handed its attempt back with ``job.released`` (not a failure: nothing is charged).
ReleaseReason = Literal["shutdown"]
RELEASE_REASONS: Final[tuple[str, ...]] = get_args(ReleaseReason)

# How one worker attempt ended: completed, released (handed back uncharged), or one of the spec's
# failure statuses.
AttemptStatus = Literal["completed", "released"] | FailureStatus

MAX_ATTEMPTS_DEFAULT: Final = 2
MAX_ATTEMPTS_MIN: Final = 1
MAX_ATTEMPTS_MAX: Final = 8


# Spec: each job's receipts live on the stream ``jobs/<jobId>``.
JOB_STREAM_PREFIX: Final = "jobs/"


def job_stream(job_id: str) -> str:
    """The stream a job's receipts live on: ``jobs/<jobId>``."""
    return f"{JOB_STREAM_PREFIX}{job_id}"


def is_job_stream(stream: str) -> bool:
    return stream.startswith(JOB_STREAM_PREFIX)


def job_id_of(stream: str) -> str:
    """The job id of a ``jobs/<jobId>`` stream (any other stream name is returned unchanged)."""
    return stream[len(JOB_STREAM_PREFIX) :] if is_job_stream(stream) else stream


# The agent ids with built-in handlers (spec, "The trap": exactly four), each spelled once; the
# kinds table (``app.jobs.kinds``) says which kinds each runs, and routing and the lease table name
# two of them (spec: "Actual Resonate routing", "Leases, timeouts and heartbeats").
AGENT_FACTORY: Final = "factory"
AGENT_FACTORY_CONTROL: Final = "factory-control"
AGENT_FACTORY_MONITOR: Final = "factory-monitor"
AGENT_CODEX: Final = "codex"
