"""Job transitions as pure functions (``app/jobs/transitions.py``): no database, the clock passed in.

Each test states the rule it checks. The receipts a transition returns are folded with the real
reducer, so a test also proves the transition and the fold agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.jobs import transitions as t
from app.jobs.errors import SINGLETON_CANCEL_REASON, ConflictError, TooManyCommands, ValidationError
from app.jobs.flow import DEBOUNCED_REASON, REPLACED_BY_FIELD
from app.jobs.reducer import Job, Receipt, fold
from app.jobs.times import iso
from app.jobs.validation import command_lane, steer_lane

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
W = "worker-1"
KEY = "org-a/j1"


def receipts(events: Sequence[t.Event], after: int = 0, at: datetime = NOW) -> list[Receipt]:
    return [
        Receipt(f"jobs/{KEY}", after + i + 1, ty, body, at=iso(at)) for i, (ty, body) in enumerate(events)
    ]


def apply(job: Job | None, events: Sequence[t.Event]) -> Job:
    folded = fold(receipts(events, job.seq if job else 0), job)
    assert folded is not None
    return folded


def queued(max_attempts: int = 2, **body: Any) -> Job:
    payload = {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "org-a"}}
    enqueued = {"jobId": KEY, "agentId": "factory", "lane": "collect", "payload": payload, **body}
    return apply(
        None, [("job.enqueued", {"singletonMode": "allow", "maxAttempts": max_attempts, **enqueued})]
    )


def running(lease_ms: int = 60_000, **kw: Any) -> Job:
    job = queued(**kw)
    return apply(job, t.lease_queued(job, NOW, W, lease_ms, start=True))


def test_lease_queued_takes_the_next_attempt_and_start_makes_it_running() -> None:
    job = queued()
    events = t.lease_queued(job, NOW, W, 1000)
    assert events == [
        ("job.leased", {"workerId": W, "attempt": 1, "expiresAt": iso(NOW + timedelta(seconds=1))})
    ]
    assert apply(job, events).status == "leased"
    assert apply(job, t.lease_queued(job, NOW, W, 1000, start=True)).status == "running"


def test_lease_queued_is_nothing_unless_queued() -> None:
    """Spec invariant 1: a lease applies only to a queued job."""
    assert t.lease_queued(running(), NOW, "worker-2", 1000) == []


def test_start_attempt_verdicts() -> None:
    """Spec step 5: lease if queued; a start-fence heartbeat for redelivered work; lease_lost when
    the fence does not match; terminal_state; stale_attempt."""
    job = queued()
    start = t.start_attempt(job, NOW, W, 1, 1000)
    assert start.status == "started" and [e[0] for e in start.events] == ["job.leased", "job.heartbeat"]
    assert t.start_attempt(job, NOW, W, 2, 1000).status == "stale_attempt"
    live = apply(job, list(start.events))
    again = t.start_attempt(live, NOW, W, 1, 1000)
    assert again.status == "started" and [e[0] for e in again.events] == ["job.heartbeat"]
    assert t.start_attempt(live, NOW, "worker-2", 1, 1000) == t.AttemptStart("lease_lost")
    done = apply(live, t.settle_holder(live, NOW, W, 1, result=1))
    assert t.start_attempt(done, NOW, W, 1, 1000) == t.AttemptStart("terminal_state")


def test_heartbeat_holder_renews_only_the_holders_lease() -> None:
    """Spec invariant 2: a heartbeat from a superseded attempt is inert."""
    job = running()
    later = NOW + timedelta(seconds=30)
    [(ty, body)] = t.heartbeat_holder(job, later, W, 1, 60_000)
    assert ty == "job.heartbeat" and body["expiresAt"] == iso(later + timedelta(seconds=60))
    assert t.heartbeat_holder(job, later, W, 2, 60_000) == []
    assert t.heartbeat_holder(job, later, "worker-2", 1, 60_000) == []


def test_settle_holder_completes_fails_or_cancels() -> None:
    job = running()
    assert apply(job, t.settle_holder(job, NOW, W, 1, result={"ok": 1})).result == {"ok": 1}
    failed = t.settle_holder(job, NOW, W, 1, error="boom", status="failed", retry_delay_ms=500)
    assert failed[0][1]["retryAt"] == iso(NOW + timedelta(milliseconds=500))
    assert apply(job, failed).status == "queued"  # a retry follows: attempt 1 of 2
    aborted = apply(job, t.cancel(job, NOW, "cmd_1", "stop", cap=10))
    assert apply(aborted, t.settle_holder(aborted, NOW, W, 1, result=1)).status == "canceled"
    assert t.settle_holder(job, NOW, "worker-2", 1, result=1) == []


def test_a_last_attempt_failure_records_no_retry_time() -> None:
    job = running(max_attempts=1)
    [(_, body)] = t.settle_holder(job, NOW, W, 1, error="boom", status="failed", retry_delay_ms=500)
    assert "retryAt" not in body
    assert apply(job, [("job.failed", body)]).status == "failed"


def test_fail_queued_and_fenced_holder() -> None:
    body = t.failure_body("lost", retryable=False, status="lease_lost")
    assert t.fail_queued(queued(), body) == [("job.failed", body)]
    assert t.fail_queued(running(), body) == []
    assert t.fenced_holder(running(), W, 1, "job.progress", {"progress": 3})[0][1]["progress"] == 3
    assert t.fenced_holder(running(), W, 2, "job.progress", {"progress": 3}) == []


def test_expire_lease_only_after_the_deadline() -> None:
    job = running(lease_ms=1000)
    assert t.expire_lease(job, NOW + timedelta(milliseconds=999)) == []
    [(ty, body)] = t.expire_lease(job, NOW + timedelta(milliseconds=1001))
    assert ty == "job.lease_expired" and body["workerId"] == W and body["attempt"] == 1
    assert t.expire_lease(queued(), NOW + timedelta(days=1)) == []


def test_commands_refuse_a_terminal_job_and_respect_the_cap() -> None:
    """RECEIPT_MAX_COMMANDS_PER_JOB: at the cap a command is refused; a cancel still gets through once."""
    job = running()
    one = apply(job, t.send_command(job, NOW, "cmd_1", "steer", {"x": 1}, None, cap=1))
    with pytest.raises(TooManyCommands, match="RECEIPT_MAX_COMMANDS_PER_JOB=1"):
        t.send_command(one, NOW, "cmd_2", "follow_up", None, None, cap=1)
    aborting = apply(one, t.cancel(one, NOW, "cmd_3", "stop", cap=1))
    assert aborting.abort_requested
    assert t.cancel(aborting, NOW, "cmd_4", "again", cap=1) == []  # already aborting, at its cap
    done = apply(job, t.settle_holder(job, NOW, W, 1, result=1))
    with pytest.raises(ConflictError, match="completed; it takes no commands"):
        t.send_command(done, NOW, "cmd_5", "steer", None, None, cap=10)
    with pytest.raises(ConflictError, match="already completed"):
        t.cancel(done, NOW, "cmd_6", None, cap=10)


def test_cancel_a_queued_job_outright_and_consume_commands_once() -> None:
    assert apply(queued(), t.cancel(queued(), NOW, "cmd_1", "no", cap=10)).status == "canceled"
    job = running()
    steered = apply(job, t.send_command(job, NOW, "cmd_1", "steer", None, None, cap=10))
    consumed = apply(steered, t.consume_command(steered, "cmd_1"))
    assert consumed.pending_commands == ()
    assert t.consume_command(consumed, "cmd_1") == []
    assert t.cancel_queued(job, "x") == [] and t.cancel_queued(queued(), "x")[0][0] == "job.canceled"


def test_archive_record_marks_an_ended_job_once_per_operation() -> None:
    """A bulk archive's receipt: only on a job that ended, once per operation (a page redone after a
    crash adds none), and the fold changes nothing but ``archivedBy``."""
    assert t.archive_record(queued(), "op-1") == [] and t.archive_record(running(), "op-1") == []
    ended = apply(queued(), t.cancel(queued(), NOW, "cmd_1", "no", cap=10))
    events = t.archive_record(ended, "op-1")
    assert events == [("job.archived", {"operationId": "op-1"})]
    archived = apply(ended, events)
    assert archived.archived_by == "op-1" and archived.status == "canceled"
    assert archived.to_json()["archivedBy"] == "op-1" and "archivedBy" not in ended.to_json()
    assert Job.from_json(archived.to_json()) == archived
    assert t.archive_record(archived, "op-1") == []
    assert t.archive_record(archived, "op-2") == [("job.archived", {"operationId": "op-2"})]


def test_singleton_cancel_cancels_queued_and_aborts_running() -> None:
    """Spec: a queued job is canceled with `singleton cancel`; a leased or running one gets an abort."""
    assert t.singleton_cancel(queued(), NOW, "cmd_1", cap=10) == [
        ("job.canceled", {"reason": SINGLETON_CANCEL_REASON})
    ]
    [(ty, body)] = t.singleton_cancel(running(), NOW, "cmd_1", cap=10)
    assert ty == "queue.command" and (body["type"], body["reason"]) == ("abort", SINGLETON_CANCEL_REASON)


def test_a_debounce_replaces_only_a_queued_job_naming_its_replacement() -> None:
    """A later enqueue of the debounce key cancels a queued job; work in flight is never stopped."""
    events = t.debounce_replace(queued(), "j2")
    assert events == [("job.canceled", {"reason": DEBOUNCED_REASON, REPLACED_BY_FIELD: "j2"})]
    replaced = apply(queued(), events)
    assert (replaced.status, replaced.error) == ("canceled", DEBOUNCED_REASON)
    leased = apply(queued(), t.lease_queued(queued(), NOW, W, 1000))
    assert leased.status == "leased" and t.debounce_replace(leased, "j2") == []
    assert t.debounce_replace(running(), "j2") == []
    assert t.debounce_replace(replaced, "j3") == []


def test_singleton_steer_carries_its_origin_and_a_repost_finds_the_steered_job() -> None:
    """Spec: the steer carries the new payload plus `fromSessionKey` and `fromEnqueue: true`."""
    job = running()
    events = t.singleton_steer(job, NOW, "cmd_1", {"kind": "factory.run"}, "s1", "posted-id", cap=10)
    [(_, body)] = events
    assert body["fromSessionKey"] == "s1" and body["fromEnqueue"] is True and body["fromJobId"] == "posted-id"
    steered = apply(job, events)
    assert t.steered_by([queued(), steered], "posted-id") is steered
    assert t.steered_by([steered], "another") is None


# -- the lane a queue command is sent on --------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "lane", "expected"),
    [
        ("steer", None, "steer"),
        ("follow_up", None, "follow_up"),
        ("steer", "follow_up", "follow_up"),
        ("follow_up", "steer", "steer"),
        ("abort", None, None),
    ],
)
def test_a_command_is_on_the_lane_it_names_or_its_types_and_an_abort_on_none(
    type_: str, lane: str | None, expected: str | None
) -> None:
    """Spec: "the queue-command lanes are steer and follow_up only"."""
    on = command_lane(type_, lane)
    assert on == expected
    job = running()
    [(ty, body)] = t.send_command(job, NOW, "cmd_1", type_, None, None, cap=10, lane=on)
    assert (
        ty == "queue.command" and body.get("lane") == expected and ("lane" in body) is (expected is not None)
    )
    (command,) = apply(job, [(ty, body)]).commands
    assert (command.type, command.lane) == (type_, expected)
    assert ("lane" in command.to_json()) is (expected is not None)


@pytest.mark.parametrize(
    ("type_", "lane", "allowed"),
    [
        ("steer", "collect", ["steer", "follow_up"]),
        ("follow_up", "chat", ["steer", "follow_up"]),
        ("abort", "steer", None),
    ],
)
def test_a_lane_outside_the_command_lanes_or_on_an_abort_is_refused(
    type_: str, lane: str, allowed: list[str] | None
) -> None:
    with pytest.raises(ValidationError) as info:
        command_lane(type_, lane)
    assert (info.value.field, info.value.allowed) == ("lane", allowed)
    with pytest.raises(ValidationError) as unknown:
        command_lane("nudge", None)
    assert unknown.value.field == "type"


@pytest.mark.parametrize(
    ("posted", "lane"),
    [("steer", "steer"), ("follow_up", "follow_up"), ("chat", "steer"), ("collect", "steer")],
)
def test_a_steer_by_enqueue_is_on_the_lane_it_was_posted_with_when_that_is_a_command_lane(
    posted: str, lane: str
) -> None:
    job = running()
    events = t.singleton_steer(
        job, NOW, "cmd_1", {"kind": "factory.run"}, "s1", None, cap=10, lane=steer_lane(posted)
    )
    [(_, body)] = events
    assert (body["type"], body["lane"], body["fromEnqueue"]) == ("steer", lane, True)
    assert apply(job, events).commands[0].lane == lane
