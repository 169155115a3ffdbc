"""The control outbox rule: which job receipts request objective control, in their own transaction.

Pure. Spec ("Payload kinds"): a kind's contract flags "objective reconciliation on a terminal or
expired lease"; the flag is read here, never a list of kinds. A job whose kind sets it, and whose
payload names an objective, requests control when its terminal receipt or its ``job.lease_expired``
is appended — in that same transaction (``app.storage.queue``), so no settlement can be lost
between the job's commit and the objective hearing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.factory.vocab import job_request_id
from app.jobs.kinds import CONTRACTS
from app.jobs.reducer import Job


def control_request_for(before: Job | None, after: Job, event_types: Sequence[str]) -> dict[str, Any] | None:
    """The ``objective.control_requested`` body a job mutation must write, or None."""
    contract = CONTRACTS.get(after.kind)
    if contract is None or not contract.reconcile_objective_on_terminal_or_expired_lease:
        return None
    objective_id = after.payload.get("objectiveId")
    if not isinstance(objective_id, str):
        return None
    if after.terminal and (before is None or not before.terminal):
        reason = "task_settled"
    elif "job.lease_expired" in event_types and before is not None and before.lease != after.lease:
        reason = "lease_expired"
    else:
        return None
    body: dict[str, Any] = {
        "requestId": job_request_id(after.id, after.seq),
        "reason": reason,
        "jobId": after.id,
    }
    task_id = after.payload.get("taskId")
    if isinstance(task_id, str):
        body["taskId"] = task_id
    return body
