"""The soak's safety accounting (bench/soak.py): what counts as a job's terminal receipt."""

from __future__ import annotations

from typing import Any

from app.storage.store import StoredReceipt
from bench import soak

AT = "2026-11-30T20:00:00.000000Z"
LEASE = {"workerId": "w", "attempt": 1, "expiresAt": AT}


def stream(*events: tuple[str, dict[str, Any]]) -> list[StoredReceipt]:
    return [
        StoredReceipt(i, "jobs/j", i, type_, body, AT, None, "h")
        for i, (type_, body) in enumerate(events, start=1)
    ]


ENQUEUED = (
    "job.enqueued",
    {"jobId": "j", "agentId": "a", "payload": {"kind": "factory.run"}, "maxAttempts": 1},
)


def test_a_lease_expiry_with_no_attempt_left_is_the_job_s_terminal_receipt() -> None:
    receipts = stream(
        ENQUEUED,
        ("job.leased", LEASE),
        ("job.lease_expired", {**LEASE, "error": "lease expired"}),
    )
    assert [r.type for r in soak.terminal_receipts(receipts)] == ["job.lease_expired"]


def test_a_second_terminal_receipt_is_counted() -> None:
    done = ("job.completed", {"workerId": "w", "attempt": 1, "result": {}})
    receipts = stream(ENQUEUED, ("job.leased", LEASE), done, done)
    assert len(soak.terminal_receipts(receipts)) == 2
