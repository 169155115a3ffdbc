"""``job.released``: a lease holder hands its attempt back uncharged (a worker shutting down).

Pure: the transition (``app/jobs/transitions.release_holder``) and the fold, with no database.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.jobs import transitions as t
from app.jobs.reducer import Job, Receipt, applies, fold
from app.jobs.times import iso

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEY = "org-a/j1"


def apply(job: Job | None, events: list[t.Event]) -> Job:
    after = job.seq if job else 0
    rs = [Receipt(f"jobs/{KEY}", after + i + 1, ty, body, at=iso(NOW)) for i, (ty, body) in enumerate(events)]
    out = fold(rs, job)
    assert out is not None
    return out


def queued(max_attempts: int = 1) -> Job:
    payload = {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "org-a"}}
    body: dict[str, Any] = {"jobId": KEY, "agentId": "factory", "lane": "collect", "payload": payload}
    return apply(None, [("job.enqueued", {"singletonMode": "allow", "maxAttempts": max_attempts, **body})])


def run(job: Job, worker: str) -> Job:
    return apply(job, t.lease_queued(job, NOW, worker, 60_000, start=True))


def test_release_by_the_holder_requeues_at_once_and_counts_it_released() -> None:
    job = run(queued(), "w1")
    events = t.release_holder(job, "w1", 1, "shutdown")
    assert events == [("job.released", {"workerId": "w1", "attempt": 1, "reason": "shutdown"})]
    after = apply(job, events)
    assert (after.status, after.lease, after.available_at) == ("queued", None, None)
    assert (after.attempt, after.released, after.charged_attempts) == (1, 1, 0)
    assert after.to_json()["released"] == 1


def test_a_released_attempt_is_not_charged_so_max_attempts_1_still_retries_a_failure() -> None:
    """maxAttempts 1: released once, the next attempt (number 2, its own fence) is the first charged
    one, and its retryable failure still ends the job failed: the budget is attempt - released."""
    job = apply(
        run(queued(max_attempts=1), "w1"), t.release_holder(run(queued(1), "w1"), "w1", 1, "shutdown")
    )
    second = run(job, "w2")
    assert second.lease is not None and second.lease.attempt == 2 and second.charged_attempts == 1
    failed = apply(second, t.settle_holder(second, NOW, "w2", 2, error="boom", status="failed"))
    assert failed.status == "failed"  # 1 charged attempt of 1


def test_charged_attempts_decide_a_retry_after_a_release() -> None:
    """maxAttempts 2, one release then a retryable failure: one charged attempt, so it retries."""
    job = run(queued(max_attempts=2), "w1")
    job = apply(job, t.release_holder(job, "w1", 1, "shutdown"))
    job = run(job, "w2")
    job = apply(job, t.settle_holder(job, NOW, "w2", 2, error="boom", status="failed", retry_delay_ms=10))
    assert job.status == "queued" and job.available_at is not None  # retryAt written: a retry follows


def test_only_the_lease_holder_may_release() -> None:
    """The fence of job.lease_expired: another worker or a superseded attempt releases nothing."""
    job = run(queued(), "w1")
    assert t.release_holder(job, "w2", 1, "shutdown") == []
    assert t.release_holder(job, "w1", 2, "shutdown") == []
    assert t.release_holder(queued(), "w1", 1, "shutdown") == []
    # A receipt written anyway (hand-edited) is inert in the fold too.
    stray = Receipt(f"jobs/{KEY}", job.seq + 1, "job.released", {"workerId": "w2", "attempt": 1})
    assert not applies(job, stray)
    assert fold([stray], job) == job.__class__(**{**job.__dict__, "seq": job.seq + 1})


def test_a_pending_abort_wins_over_a_release() -> None:
    job = run(queued(), "w1")
    job = apply(job, t.cancel(job, NOW, "c1", "stop it", cap=10))
    events = t.release_holder(job, "w1", 1, "shutdown")
    assert [ty for ty, _ in events] == ["job.canceled"]
    assert apply(job, events).status == "canceled"


def test_progress_survives_a_release_so_the_next_attempt_reads_its_checkpoint() -> None:
    job = run(queued(), "w1")
    job = apply(job, t.fenced_holder(job, "w1", 1, "job.progress", {"progress": {"step": 3}}))
    job = apply(job, t.release_holder(job, "w1", 1, "shutdown"))
    nxt = run(job, "w2")
    assert nxt.progress == {"step": 3} and nxt.lease is not None and nxt.lease.attempt == 2


def test_to_json_round_trips_released_and_omits_it_until_one_happened() -> None:
    job = run(queued(), "w1")
    assert "released" not in job.to_json()
    after = apply(job, t.release_holder(job, "w1", 1, "shutdown"))
    assert Job.from_json(after.to_json()) == after
