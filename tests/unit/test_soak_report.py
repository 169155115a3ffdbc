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


def keyed(job: str, *events: tuple[str, str]) -> list[StoredReceipt]:
    """A job of the soak's limit-1 key: its receipts as (type, time) pairs after its enqueue."""
    body = {"jobId": job, "concurrencyKey": soak.SOAK_KEY, "concurrencyLimit": 1}
    return [
        StoredReceipt(i, f"jobs/{job}", i, type_, body if type_ == "job.enqueued" else LEASE, at, None, "h")
        for i, (type_, at) in enumerate((("job.enqueued", "2026-11-30T20:00:00Z"), *events), start=1)
    ]


def test_attempts_of_the_limit_1_key_that_ran_at_once_are_reported_and_back_to_back_ones_are_not() -> None:
    a = keyed("a", ("job.leased", "2026-11-30T20:00:01Z"), ("job.completed", "2026-11-30T20:00:02Z"))
    b = keyed("b", ("job.leased", "2026-11-30T20:00:02Z"), ("job.lease_expired", "2026-11-30T20:00:05Z"))
    c = keyed("c", ("job.leased", "2026-11-30T20:00:04Z"), ("job.completed", "2026-11-30T20:00:06Z"))
    overlaps, attempts = soak.key_overlaps({"a": a, "b": b, "c": c})
    assert attempts == 3
    assert overlaps == [("jobs/b#2", "jobs/c#2")]
    assert soak.key_overlaps({"a": a, "b": b}) == ([], 2)
