"""The job timeline: one entry per receipt, heartbeats collapsed, inert receipts marked."""

from __future__ import annotations

from typing import Any

from api.ui import timeline
from app.jobs.reducer import Receipt

STREAM = "jobs/j1"


def r(seq: int, type_: str, **body: Any) -> Receipt:
    return Receipt(STREAM, seq, type_, body, at=f"2026-01-01T00:00:{seq:02d}.000000Z")


ENQUEUED = r(
    1,
    "job.enqueued",
    jobId="j1",
    agentId="factory",
    lane="collect",
    payload={"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}},
)


def test_a_full_life_in_order() -> None:
    entries, state = timeline.build(
        [
            ENQUEUED,
            r(2, "job.leased", workerId="w1", attempt=1, expiresAt="x"),
            r(3, "job.heartbeat", workerId="w1", attempt=1, expiresAt="y"),
            r(4, "job.heartbeat", workerId="w1", attempt=1, expiresAt="z"),
            r(5, "job.progress", workerId="w1", attempt=1, progress={"pct": 50}),
            r(6, "queue.command", commandId="c1", type="steer", payload={"a": 1}, reason="why", at="t"),
            r(7, "queue.command.consumed", commandId="c1"),
            r(8, "job.completed", workerId="w1", attempt=1, result={"ok": True}),
        ]
    )
    assert state is not None and state.status == "completed"
    assert [e.phase for e in entries] == [
        "enqueued",
        "lease",
        "heartbeat",
        "progress",
        "command",
        "command",
        "settlement",
    ]
    heartbeat = entries[2]
    assert heartbeat.count == 2 and heartbeat.last_seq == 4
    assert heartbeat.at is not None and heartbeat.at.endswith("03.000000Z")
    assert entries[1].attempt == 1 and entries[1].worker_id == "w1"
    assert entries[1].status_after == "leased" and heartbeat.status_after == "running"
    assert entries[3].details == {"progress": {"pct": 50}}
    assert entries[4].title == "command steer" and entries[4].details["reason"] == "why"
    assert entries[-1].details == {"result": {"ok": True}}
    assert all(e.applied for e in entries)
    assert entries[0].title == "enqueued for factory on lane collect"
    assert entries[0].details == {"kind": "factory.run"}


def test_a_retry_then_failure_names_each_attempt_and_the_error() -> None:
    entries, state = timeline.build(
        [
            ENQUEUED,
            r(2, "job.leased", workerId="w1", attempt=1),
            r(3, "job.failed", workerId="w1", attempt=1, error="flaky", retryable=True, status="failed"),
            r(4, "job.leased", workerId="w2", attempt=2),
            r(5, "job.lease_expired", workerId="w2", attempt=2, error="lease expired", expiresAt="e"),
        ]
    )
    assert state is not None and state.status == "failed"  # maxAttempts 2: the expiry was the last try
    assert entries[2].title == "failed, will retry" and entries[2].details["error"] == "flaky"
    assert entries[2].status_after == "queued"
    assert entries[3].attempt == 2 and entries[3].worker_id == "w2"
    assert entries[4].phase == "expiry" and entries[4].details["error"] == "lease expired"


def test_inert_receipts_are_kept_and_marked() -> None:
    entries, _ = timeline.build(
        [
            ENQUEUED,
            r(2, "job.leased", workerId="w1", attempt=1),
            r(3, "job.leased", workerId="w9", attempt=1),  # invariant 1: a second lease is ignored
            r(4, "job.heartbeat", workerId="w9", attempt=1),  # invariant 2: not the lease holder
            r(5, "job.heartbeat", workerId="w9", attempt=1),
            r(6, "job.heartbeat", workerId="w1", attempt=1),
        ]
    )
    assert [e.applied for e in entries] == [True, True, False, False, True]
    assert entries[3].count == 2  # inert heartbeats collapse among themselves only
    assert entries[4].count == 1 and entries[4].status_after == "running"


def test_a_stream_that_breaks_the_fold_is_shown() -> None:
    entries, state = timeline.build([r(1, "job.progress", workerId="w", attempt=1)])
    assert state is None
    assert entries[0].title == "job.progress (breaks the fold)" and not entries[0].applied
    # Invariant 3's exceptions are ignored, not fatal.
    entries, state = timeline.build([r(1, "job.failed", error="late")])
    assert state is None and entries[0].applied is False


def test_two_heartbeats_within_one_clock_tick_are_both_applied_and_collapse() -> None:
    """The holder's second beat renews to the same deadline at the same time (SQLite's clock has
    millisecond resolution): it changes nothing in the fold, yet it is applied, not inert."""
    same = "2026-01-01T00:00:03.000000Z"
    beat = {"workerId": "w1", "attempt": 1, "expiresAt": "2026-01-01T00:01:03.000000Z"}
    entries, _ = timeline.build(
        [
            ENQUEUED,
            r(2, "job.leased", **beat),
            Receipt(STREAM, 3, "job.heartbeat", beat, at=same),
            Receipt(STREAM, 4, "job.heartbeat", beat, at=same),
            Receipt(STREAM, 5, "job.heartbeat", {**beat, "workerId": "someone-else"}, at=same),
        ]
    )
    assert [(e.type, e.count, e.applied) for e in entries[2:]] == [
        ("job.heartbeat", 2, True),
        ("job.heartbeat", 1, False),
    ]


def test_a_debounced_cancel_shows_the_job_that_replaced_it() -> None:
    entries, state = timeline.build([ENQUEUED, r(2, "job.canceled", reason="debounced", replacedBy="j2")])
    assert state is not None and state.status == "canceled"
    assert entries[1].details == {"reason": "debounced", "replacedBy": "j2"}
