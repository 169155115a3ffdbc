"""The reducer's rules, each test naming the spec rule it checks."""

from __future__ import annotations

import pytest

from app.jobs.errors import InvariantError, no_job_message
from app.jobs.ids import qualify
from app.jobs.reducer import Job, Receipt, applies, fold, reduce
from app.jobs.vocab import job_stream

S = "jobs/j1"


def r(seq: int, type_: str, **body: object) -> Receipt:
    return Receipt(S, seq, type_, body, at=f"2026-01-01T00:00:{seq:02d}.000000Z")


def enq(max_attempts: int = 2) -> Receipt:
    return r(
        1,
        "job.enqueued",
        jobId="j1",
        agentId="codex",
        lane="collect",
        payload={"kind": "factory.task.run", "authContext": {"userId": "u", "organizationId": "o"}},
        sessionKey=None,
        singletonMode="allow",
        maxAttempts=max_attempts,
    )


def leased(seq: int = 2, worker: str = "w1", attempt: int = 1) -> Receipt:
    return r(seq, "job.leased", workerId=worker, attempt=attempt, expiresAt="2026-01-01T00:05:00.000000Z")


def folded(*rs: Receipt) -> Job:
    job = fold(rs)
    assert job is not None
    return job


def test_enqueued_job_is_queued_with_spec_defaults() -> None:
    job = folded(enq())
    assert (job.status, job.attempt, job.lease, job.organization_id) == ("queued", 0, None, "o")


def test_invariant_1_leased_ignored_unless_queued() -> None:
    """Spec: `job.leased` is ignored unless the job is currently `queued`."""
    job = folded(enq(), leased(), leased(3, worker="w2", attempt=2))
    assert job.lease is not None and job.lease.worker_id == "w1" and job.attempt == 1
    assert job.seq == 3  # the inert receipt still advances the stream position


def test_invariant_2_heartbeat_promotes_only_for_active_lease() -> None:
    """Spec: heartbeat promotes leased → running only when worker id and attempt match."""
    job = folded(enq(), leased(), r(3, "job.heartbeat", workerId="w2", attempt=1))
    assert job.status == "leased"
    job = folded(enq(), leased(), r(3, "job.heartbeat", workerId="w1", attempt=2))
    assert job.status == "leased"
    job = folded(enq(), leased(), r(3, "job.heartbeat", workerId="w1", attempt=1, expiresAt="X"))
    assert job.status == "running" and job.lease is not None and job.lease.expires_at == "X"


@pytest.mark.parametrize("type_", ["job.progress", "job.completed", "job.failed"])
def test_invariant_2_superseded_attempt_is_inert(type_: str) -> None:
    """Spec: progress, completed and failed apply the same active-lease check."""
    base = [enq(), leased(), r(3, "job.lease_expired", workerId="w1", attempt=1), leased(4, "w2", 2)]
    before = folded(*base)
    after = folded(*base, r(5, type_, workerId="w1", attempt=1, result={"x": 1}, error="e", retryable=False))
    assert after.status == before.status == "leased"
    assert (after.result, after.error, after.progress) == (before.result, before.error, before.progress)


@pytest.mark.parametrize(
    "type_",
    [
        "job.leased",
        "job.heartbeat",
        "job.progress",
        "job.completed",
        "job.canceled",
        "queue.command",
        "queue.command.consumed",
    ],
)
def test_invariant_3_event_for_missing_job_raises(type_: str) -> None:
    """Spec: an event for a job that does not exist throws `Invariant: no job for <jobId>`."""
    with pytest.raises(InvariantError) as err:
        reduce(None, r(1, type_))
    assert str(err.value) == no_job_message("j1") == "Invariant: no job for j1"


def test_invariant_3_names_an_organisations_job_by_its_qualified_id() -> None:
    """docs/deviations.md row 22: a job's stream is ``jobs/<organizationId>/<jobId>``, and the
    invariant's message carries that qualified id."""
    with pytest.raises(InvariantError) as err:
        reduce(
            None,
            Receipt(job_stream(qualify("acme", "job-123")), 1, "job.started", {}, at="2026-01-01T00:00:01Z"),
        )
    assert str(err.value) == "Invariant: no job for acme/job-123"


@pytest.mark.parametrize("type_", ["job.failed", "job.lease_expired"])
def test_invariant_3_exceptions_are_ignored(type_: str) -> None:
    """Spec: `job.failed` and `job.lease_expired` are ignored rather than fatal."""
    assert reduce(None, r(1, type_, workerId="w", attempt=1)) is None


def test_retryable_failure_requeues_and_keeps_status_out_of_result() -> None:
    job = folded(
        enq(),
        leased(),
        r(
            3,
            "job.failed",
            workerId="w1",
            attempt=1,
            error="boom",
            retryable=True,
            status="execution_timeout",
        ),
    )
    assert (job.status, job.result, job.error, job.lease) == ("queued", None, "boom", None)


def test_retryable_failure_on_last_attempt_fails_with_status_on_result() -> None:
    job = folded(
        enq(max_attempts=1),
        leased(),
        r(
            3,
            "job.failed",
            workerId="w1",
            attempt=1,
            error="boom",
            retryable=True,
            status="execution_timeout",
        ),
    )
    assert job.status == "failed" and job.result == {"status": "execution_timeout"}


def test_non_retryable_failure_copies_status_onto_result() -> None:
    job = folded(
        enq(),
        leased(),
        r(
            3,
            "job.failed",
            workerId="w1",
            attempt=1,
            error="No handler",
            retryable=False,
            status="failed",
            result={"exitCode": 3},
        ),
    )
    assert job.status == "failed" and job.result == {"exitCode": 3, "status": "failed"}


def test_lease_expired_requeues_then_fails_when_no_attempt_left() -> None:
    expired = r(3, "job.lease_expired", workerId="w1", attempt=1)
    job = folded(enq(), leased(), expired)
    assert job.status == "queued" and job.lease is None
    job = folded(enq(max_attempts=1), leased(), expired)
    assert job.status == "failed" and job.result == {"status": "lease_lost"}


def test_lease_expired_for_an_older_lease_is_inert() -> None:
    job = folded(
        enq(),
        leased(),
        r(3, "job.lease_expired", workerId="w1", attempt=1),
        leased(4, "w2", 2),
        r(5, "job.lease_expired", workerId="w1", attempt=1),
    )
    assert job.status == "leased" and job.lease is not None and job.lease.worker_id == "w2"


def test_abort_command_sets_abort_requested_and_consume_marks_it() -> None:
    job = folded(enq(), r(2, "queue.command", commandId="c1", type="abort", reason="stop"))
    assert job.abort_requested and job.pending_commands[0].type == "abort"
    job = folded(
        enq(),
        r(2, "queue.command", commandId="c1", type="steer", payload={"p": 1}),
        r(3, "queue.command.consumed", commandId="c1"),
    )
    assert not job.abort_requested and job.pending_commands == () and job.commands[0].consumed


def test_terminal_job_ignores_everything() -> None:
    done = [enq(), leased(), r(3, "job.completed", workerId="w1", attempt=1, result={"ok": 1})]
    job = folded(
        *done,
        r(4, "queue.command", commandId="c", type="abort"),
        r(5, "job.canceled", reason="x"),
        r(6, "job.failed", error="late"),
    )
    assert job.status == "completed" and job.result == {"ok": 1} and not job.abort_requested


def test_cancel_of_leased_job_needs_the_lease_holder() -> None:
    job = folded(enq(), leased(), r(3, "job.canceled", reason="x"))
    assert job.status == "leased"
    job = folded(enq(), leased(), r(3, "job.canceled", workerId="w1", attempt=1, reason="x"))
    assert job.status == "canceled"


def test_job_json_round_trips() -> None:
    job = folded(
        enq(), r(2, "queue.command", commandId="c1", type="steer", payload=1, fromEnqueue=True), leased(3)
    )
    assert Job.from_json(job.to_json()) == job


def test_retry_at_makes_the_requeued_job_unavailable_until_then_and_a_lease_clears_it() -> None:
    failed = r(
        3,
        "job.failed",
        workerId="w1",
        attempt=1,
        error="blip",
        retryable=True,
        status="failed",
        retryAt="2026-01-01T00:00:09.000000Z",
    )
    job = folded(enq(), leased(), failed)
    assert (job.status, job.available_at) == ("queued", "2026-01-01T00:00:09.000000Z")
    assert Job.from_json(job.to_json()) == job
    job = folded(enq(), leased(), failed, leased(4, "w2", 2))
    assert (job.status, job.available_at) == ("leased", None)


def test_retry_at_on_a_last_attempt_is_ignored() -> None:
    job = folded(
        enq(max_attempts=1),
        leased(),
        r(
            3,
            "job.failed",
            workerId="w1",
            attempt=1,
            error="x",
            retryable=True,
            retryAt="2026-01-01T00:00:09.000000Z",
        ),
    )
    assert (job.status, job.available_at) == ("failed", None)


def test_applies_is_the_event_rule_not_a_visible_change() -> None:
    """A lease holder's heartbeat renewing to the same deadline changes nothing but is applied;
    a superseded attempt's heartbeat is inert (invariant 2); a late failure of a missing job is inert."""
    beat = {"workerId": "w1", "attempt": 1, "expiresAt": "2026-01-01T00:01:00.000000Z"}
    state = fold([enq(), r(2, "job.leased", **beat), r(3, "job.heartbeat", **beat)])
    assert state is not None
    assert applies(state, r(4, "job.heartbeat", **beat))
    assert not applies(state, r(4, "job.heartbeat", **{**beat, "workerId": "w2"}))
    assert applies(None, enq()) and not applies(None, r(1, "job.failed", error="late"))


def test_a_command_folds_the_queue_command_lane_it_was_sent_on() -> None:
    """A steer or follow_up records its lane (steer or follow_up); anything else in the field is no
    command lane, and a receipt written before lanes were recorded folds to none, so its job's JSON
    is what it was."""
    job = folded(
        enq(),
        r(2, "queue.command", commandId="c1", type="steer", lane="follow_up"),
        r(3, "queue.command", commandId="c2", type="follow_up", lane="collect"),
        r(4, "queue.command", commandId="c3", type="steer"),
    )
    assert [c.lane for c in job.commands] == ["follow_up", None, None]
    assert [c.to_json().get("lane") for c in job.commands] == ["follow_up", None, None]
    assert ["lane" in c.to_json() for c in job.commands] == [True, False, False]
    assert Job.from_json(job.to_json()) == job


def test_tags_fold_from_job_enqueued_and_an_old_receipt_folds_unchanged() -> None:
    old = folded(enq())
    assert old.tags == {}
    assert "tags" not in old.to_json()  # a projection folded before tags existed equals its rebuild
    base = enq()
    tagged = folded(Receipt(S, 1, "job.enqueued", {**base.body, "tags": {"customer": "acme"}}, at=base.at))
    assert tagged.tags == {"customer": "acme"}
    assert Job.from_json(tagged.to_json()) == tagged
    # A hand-edited body of another shape folds to no tags (only the documented error may escape).
    odd = folded(Receipt(S, 1, "job.enqueued", {**base.body, "tags": ["x"]}, at=base.at))
    assert odd.tags == {}
