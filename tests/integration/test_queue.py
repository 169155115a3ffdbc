"""Queue operations on every backend, with projection == fold asserted after every operation.

The ``q`` fixture wraps ``Queue`` so that after *each* call every job in the database is
re-folded from its receipts and compared with its projection row
(``assert_projection_equals_fold``); no test can forget to check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.errors import SINGLETON_CANCEL_REASON, ConflictError, JobNotFound, ValidationError
from app.jobs.ids import qualify
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest, validate_enqueue
from app.jobs.vocab import JOB_STREAM_PREFIX, job_id_of, job_stream
from app.storage import store
from app.storage.db import db_now, parse_iso, receipts
from app.storage.queue import Queue, decode_cursor, validate_status_filter
from tests.support.databases import assert_projection_equals_fold
from tests.support.queue_ops import complete, lease, settle_canceled

ORG_A = "org-a"
ORG_B = "org-b"
LONG = 600_000


def payload(org: str = ORG_A, kind: str = "factory.task.run", **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "authContext": {"userId": "u1", "organizationId": org}, **extra}


def req(agent: str = "codex", org: str = ORG_A, **body: Any) -> EnqueueRequest:
    body.setdefault("payload", payload(org))
    return validate_enqueue(agent, body)


def check_all(engine: Engine) -> None:
    with engine.connect() as conn:
        ids = [job_id_of(s) for s in store.streams(conn, JOB_STREAM_PREFIX)]
    for job_id in ids:
        assert_projection_equals_fold(engine, job_id)


class CheckedQueue:
    """A Queue whose every operation is followed by projection == fold for every job."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._queue, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                check_all(self._queue.engine)

        return call


@pytest.fixture
def q(engine: Engine) -> Any:
    return CheckedQueue(queue_for(engine))


def stream_of(engine: Engine, job_id: str) -> list[store.StoredReceipt]:
    with engine.connect() as conn:
        return store.read_stream(conn, job_stream(job_id))


def types_of(engine: Engine, job_id: str) -> list[str]:
    return [r.type for r in stream_of(engine, job_id)]


def receipt_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(receipts)).scalar_one())


def job_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(store.streams(conn, JOB_STREAM_PREFIX))


def wait_for_db_clock_past(engine: Engine, moment: str | None, timeout_s: float = 5.0) -> None:
    """Bounded poll of the *database* clock until it is strictly after ``moment``."""
    target = parse_iso(moment)
    assert target is not None
    deadline = time.monotonic() + timeout_s
    while True:
        with engine.connect() as conn:
            if db_now(conn) > target:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"database clock did not pass {moment} within {timeout_s}s")
        time.sleep(0.001)


def leased_job(q: Any, *, worker: str = "w1", lease_ms: int = LONG, **body: Any) -> Job:
    job = q.enqueue(req(**body)).job
    out = lease(q, job.id, worker, lease_ms)
    assert out.applied
    leased: Job = out.job
    return leased


def running_job(q: Any, *, worker: str = "w1", lease_ms: int = LONG, **body: Any) -> Job:
    job = leased_job(q, worker=worker, **body)
    out = q.heartbeat(job.id, worker, job.attempt, lease_ms)
    assert out.applied and out.job.status == "running"
    running: Job = out.job
    return running


# -- enqueue ------------------------------------------------------------------------------------


def test_enqueue_defaults(q: Any, engine: Engine) -> None:
    request = req()
    assert (request.lane, request.singleton_mode, request.max_attempts) == ("collect", "allow", 2)
    result = q.enqueue(request)
    job = result.job
    assert result.created and not result.steered
    assert (job.status, job.attempt, job.lane, job.singleton_mode, job.max_attempts, job.lease) == (
        "queued",
        0,
        "collect",
        "allow",
        2,
        None,
    )
    assert job.organization_id == ORG_A and job.agent_id == "codex" and job.seq == 1
    [r] = stream_of(engine, job.id)
    assert r.type == "job.enqueued" and r.seq == 1
    assert r.body["lane"] == "collect" and r.body["maxAttempts"] == 2 and r.body["singletonMode"] == "allow"
    assert job.created_at == r.at


@pytest.mark.parametrize(("given", "stored"), [(0, 1), (-3, 1), (1, 1), (5, 5), (8, 8), (9, 8), (99, 8)])
def test_enqueue_clamps_max_attempts(q: Any, engine: Engine, given: int, stored: int) -> None:
    job = q.enqueue(req(maxAttempts=given)).job
    assert job.max_attempts == stored
    assert stream_of(engine, job.id)[0].body["maxAttempts"] == stored


@pytest.mark.parametrize("lane", ["chat", "collect", "steer", "follow_up"])
def test_enqueue_accepts_every_lane(q: Any, lane: str) -> None:
    assert q.enqueue(req(lane=lane)).job.lane == lane


def test_enqueue_is_idempotent_on_an_explicit_job_id(q: Any, engine: Engine) -> None:
    first = q.enqueue(req(jobId="job-1", lane="chat"))
    assert first.created
    # The client's id is unique within its organisation: the key carries the organisation.
    key = qualify(ORG_A, "job-1")
    assert first.job.id == key and first.job.client_id == "job-1"
    again = q.enqueue(req(jobId="job-1", lane="steer", payload=payload(kind="factory.run"), maxAttempts=7))
    assert not again.created and again.job == first.job  # unchanged, not the second request's values
    # Still idempotent after the job moved on: the existing job comes back as it is now.
    leased = lease(q, key, "w1", LONG).job
    before = receipt_count(engine)
    third = q.enqueue(req(jobId="job-1"))
    assert not third.created and third.job == leased
    assert receipt_count(engine) == before
    assert types_of(engine, key) == ["job.enqueued", "job.leased"]  # exactly one job.enqueued
    assert job_count(engine) == 1
    assert q.find(ORG_A, "job-1") == leased


def test_the_same_job_id_in_another_organisation_is_another_job(q: Any, engine: Engine) -> None:
    """Org B's jobId is its own: the same id org A holds makes B a new job, and A's is untouched."""
    a_job = q.enqueue(req(jobId="shared-id")).job
    a_leased = lease(q, a_job.id, "w1", LONG).job
    b = q.enqueue(req(org=ORG_B, jobId="shared-id", lane="chat"))
    assert b.created and b.job.id == qualify(ORG_B, "shared-id") != a_job.id
    assert b.job.organization_id == ORG_B and b.job.status == "queued" and b.job.lane == "chat"
    assert q.get(a_job.id) == a_leased  # A's job is exactly as it was
    assert q.find(ORG_A, "shared-id") == a_leased and q.find(ORG_B, "shared-id") == b.job
    assert q.find("org-c", "shared-id") is None
    assert q.find(ORG_B, a_job.id) is None  # a key is never a client id: no way into A's job
    assert types_of(engine, a_job.id) == ["job.enqueued", "job.leased"]
    assert job_count(engine) == 2


def test_enqueue_without_job_id_creates_distinct_jobs(q: Any, engine: Engine) -> None:
    a, b = q.enqueue(req()).job, q.enqueue(req()).job
    assert a.id != b.id and job_count(engine) == 2


# -- singleton modes ----------------------------------------------------------------------------


def test_singleton_cancel_stops_every_active_job_on_the_session(q: Any, engine: Engine) -> None:
    queued = q.enqueue(req(sessionKey="s1")).job
    leased = leased_job(q, sessionKey="s1")
    running = running_job(q, sessionKey="s1")
    done = running_job(q, sessionKey="s1")
    complete(q, done.id, "w1", 1, {"ok": True})
    other_session = q.enqueue(req(sessionKey="s2")).job
    no_session = q.enqueue(req()).job
    mark = receipt_count(engine)

    result = q.enqueue(req(sessionKey="s1", singletonMode="cancel"))

    assert result.created and result.job.status == "queued"
    assert set(result.canceled) == {queued.id} and set(result.aborted) == {leased.id, running.id}
    got = {j: q.get(j) for j in (queued.id, leased.id, running.id, done.id, other_session.id, no_session.id)}
    assert got[queued.id].status == "canceled" and got[queued.id].error == SINGLETON_CANCEL_REASON
    canceled_receipt = stream_of(engine, queued.id)[-1]
    assert canceled_receipt.type == "job.canceled" and canceled_receipt.body["reason"] == "singleton cancel"
    for job_id in (leased.id, running.id):
        job = got[job_id]
        assert job.status in ("leased", "running") and job.abort_requested  # only the worker stops it
        last = stream_of(engine, job_id)[-1]
        assert last.type == "queue.command"
        assert (last.body["type"], last.body["reason"]) == ("abort", "singleton cancel")
    assert got[done.id].status == "completed" and types_of(engine, done.id)[-1] == "job.completed"
    assert got[other_session.id].status == "queued" and len(stream_of(engine, other_session.id)) == 1
    assert got[no_session.id].status == "queued" and len(stream_of(engine, no_session.id)) == 1
    # The stops are written before the new job.
    with engine.connect() as conn:
        written = (
            conn.execute(select(receipts.c.stream).where(receipts.c.id > mark).order_by(receipts.c.id))
            .scalars()
            .all()
        )
    assert written[-1] == job_stream(result.job.id) and len(written) == 4


def test_singleton_cancel_with_nothing_active_just_enqueues(q: Any, engine: Engine) -> None:
    result = q.enqueue(req(sessionKey="s", singletonMode="cancel"))
    assert result.created and result.canceled == () and result.aborted == ()
    assert receipt_count(engine) == 1


def test_singleton_steer_goes_to_the_most_recent_active_job(q: Any, engine: Engine) -> None:
    older = q.enqueue(req(sessionKey="s1")).job
    wait_for_db_clock_past(engine, older.created_at)  # "most recent" is by database time
    newer = leased_job(q, sessionKey="s1")
    jobs_before = job_count(engine)
    steer_payload = payload(prompt="change of plan")

    result = q.enqueue(req(sessionKey="s1", singletonMode="steer", payload=steer_payload))

    assert result.steered and not result.created and result.job.id == newer.id
    assert job_count(engine) == jobs_before  # no new job
    last = stream_of(engine, newer.id)[-1]
    assert last.type == "queue.command"
    assert last.body["type"] == "steer" and last.body["payload"] == steer_payload
    assert last.body["fromSessionKey"] == "s1" and last.body["fromEnqueue"] is True
    [cmd] = result.job.pending_commands
    assert cmd.type == "steer" and cmd.payload == steer_payload
    assert cmd.extra == {"fromSessionKey": "s1", "fromEnqueue": True}
    assert result.job.status == "leased" and result.job == q.get(newer.id)
    assert len(stream_of(engine, older.id)) == 1  # the older job is not touched


def test_singleton_steer_with_no_active_job_creates_one(q: Any, engine: Engine) -> None:
    finished = q.enqueue(req(sessionKey="s1")).job
    q.cancel(finished.id, "done with it")
    result = q.enqueue(req(sessionKey="s1", singletonMode="steer"))
    assert result.created and not result.steered and result.job.id != finished.id
    assert types_of(engine, finished.id) == ["job.enqueued", "job.canceled"]


def test_lease_expiry_is_evaluated_before_the_steer_scan(q: Any, engine: Engine) -> None:
    """A dead worker's running job cannot swallow a steer: its lease expires first."""
    dead = running_job(q, lease_ms=1, sessionKey="s1", maxAttempts=2)
    wait_for_db_clock_past(engine, dead.lease.expires_at if dead.lease else None)

    result = q.enqueue(req(sessionKey="s1", singletonMode="steer", payload=payload(prompt="p")))

    # The job went back to the queue (an attempt is left), so the steer waits for the next worker.
    assert types_of(engine, dead.id)[-2:] == ["job.lease_expired", "queue.command"]
    assert result.steered and result.job.id == dead.id
    assert result.job.status == "queued" and result.job.lease is None
    assert [c.type for c in result.job.pending_commands] == ["steer"]
    assert lease(q, dead.id, "w2", LONG).job.pending_commands[0].payload == payload(prompt="p")


def test_expired_job_with_no_attempt_left_does_not_take_the_steer(q: Any, engine: Engine) -> None:
    dead = running_job(q, lease_ms=1, sessionKey="s1", maxAttempts=1)
    wait_for_db_clock_past(engine, dead.lease.expires_at if dead.lease else None)

    result = q.enqueue(req(sessionKey="s1", singletonMode="steer"))

    assert result.created and not result.steered and result.job.id != dead.id
    assert types_of(engine, dead.id)[-1] == "job.lease_expired"
    failed = q.get(dead.id)
    assert failed.status == "failed" and failed.result == {"status": "lease_lost"}
    assert failed.commands == ()


def test_singleton_cancel_also_expires_dead_leases_first(q: Any, engine: Engine) -> None:
    dead = running_job(q, lease_ms=1, sessionKey="s1", maxAttempts=2)
    wait_for_db_clock_past(engine, dead.lease.expires_at if dead.lease else None)
    result = q.enqueue(req(sessionKey="s1", singletonMode="cancel"))
    # Expired back to queued, then canceled outright (not sent an abort nobody would read).
    assert types_of(engine, dead.id)[-2:] == ["job.lease_expired", "job.canceled"]
    assert result.canceled == (dead.id,) and result.aborted == ()


@pytest.mark.parametrize("mode", ["cancel", "steer"])
def test_session_scans_are_scoped_per_organization(q: Any, engine: Engine, mode: str) -> None:
    a_queued = q.enqueue(req(org=ORG_A, sessionKey="shared")).job
    a_running = running_job(q, org=ORG_A, sessionKey="shared")
    result = q.enqueue(req(org=ORG_B, sessionKey="shared", singletonMode=mode))
    assert result.created and not result.steered and result.canceled == () and result.aborted == ()
    assert result.job.organization_id == ORG_B
    assert types_of(engine, a_queued.id) == ["job.enqueued"]
    assert types_of(engine, a_running.id) == ["job.enqueued", "job.leased", "job.heartbeat"]
    # And org A's own singleton enqueue still sees org A's jobs (not org B's).
    again = q.enqueue(req(org=ORG_A, sessionKey="shared", singletonMode=mode))
    if mode == "steer":
        assert again.steered and again.job.id == a_running.id
    else:
        assert set(again.canceled) == {a_queued.id} and set(again.aborted) == {a_running.id}
    assert types_of(engine, result.job.id) == ["job.enqueued"]


# -- the worker's operations ----------------------------------------------------------------------


def test_lease_takes_a_queued_job_once(q: Any, engine: Engine) -> None:
    job = q.enqueue(req()).job
    out = lease(q, job.id, "w1", 30_000)
    assert out.applied
    held = out.job.lease
    assert out.job.status == "leased" and out.job.attempt == 1 and held is not None
    assert (held.worker_id, held.attempt) == ("w1", 1)
    leased_at = parse_iso(stream_of(engine, job.id)[-1].at)
    assert leased_at is not None
    assert parse_iso(held.expires_at) == leased_at + timedelta(milliseconds=30_000)  # database clock
    before = receipt_count(engine)
    second = lease(q, job.id, "w2", 30_000)
    assert not second.applied and second.job == out.job and receipt_count(engine) == before


def test_heartbeat_promotes_and_renews_only_for_the_lease_holder(q: Any, engine: Engine) -> None:
    job = leased_job(q, lease_ms=10_000)
    before = receipt_count(engine)
    for worker, attempt in (("w2", 1), ("w1", 2), ("w1", 0)):
        out = q.heartbeat(job.id, worker, attempt, LONG)
        assert not out.applied and out.job.status == "leased"
    assert receipt_count(engine) == before
    out = q.heartbeat(job.id, "w1", 1, LONG)
    assert out.applied and out.job.status == "running"
    assert out.job.lease is not None and job.lease is not None
    later, earlier = parse_iso(out.job.lease.expires_at), parse_iso(job.lease.expires_at)
    assert later is not None and earlier is not None and later > earlier
    again = q.heartbeat(job.id, "w1", 1, LONG)
    assert again.applied and again.job.status == "running"
    assert types_of(engine, job.id)[-2:] == ["job.heartbeat", "job.heartbeat"]


def test_progress_is_recorded_for_the_lease_holder_only(q: Any, engine: Engine) -> None:
    job = running_job(q)
    assert q.progress(job.id, "w1", 1, {"pct": 50}).job.progress == {"pct": 50}
    before = receipt_count(engine)
    out = q.progress(job.id, "intruder", 1, {"pct": 99})
    assert not out.applied and out.job.progress == {"pct": 50} and receipt_count(engine) == before


def test_complete(q: Any, engine: Engine) -> None:
    job = running_job(q)
    assert not complete(q, job.id, "w1", 2, {"x": 0}).applied
    out = complete(q, job.id, "w1", 1, {"answer": 42})
    assert out.applied and out.job.status == "completed" and out.job.result == {"answer": 42}
    assert out.job.lease is None and out.job.terminal
    # Terminal is absorbing: nothing further takes effect.
    before = receipt_count(engine)
    assert not lease(q, job.id, "w2", LONG).applied
    assert not q.heartbeat(job.id, "w1", 1, LONG).applied
    assert not q.fail(job.id, "w1", 1, "late", retryable=False).applied
    assert not q.cancel_queued(job.id, "x").applied
    assert not q.expire_lease(job.id).applied
    assert receipt_count(engine) == before


def test_retryable_failure_requeues_until_attempts_run_out(q: Any, engine: Engine) -> None:
    job = running_job(q, maxAttempts=2)
    out = q.fail(job.id, "w1", 1, "flaky", retryable=True, status="execution_timeout")
    assert out.applied and out.job.status == "queued" and out.job.lease is None
    assert out.job.error == "flaky" and out.job.result is None  # status kept out of the result
    second = lease(q, job.id, "w2", LONG)
    assert second.applied and second.job.attempt == 2
    out = q.fail(job.id, "w2", 2, "flaky again", retryable=True, status="execution_timeout")
    assert out.job.status == "failed" and out.job.result == {"status": "execution_timeout"}
    assert types_of(engine, job.id).count("job.failed") == 2


def test_non_retryable_failure_copies_its_status_onto_the_result(q: Any) -> None:
    job = leased_job(q, maxAttempts=5)
    out = q.fail(job.id, "w1", 1, "No handler for agent 'x'", retryable=False, result={"exitCode": 3})
    assert out.job.status == "failed" and out.job.attempt == 1
    assert (
        out.job.result == {"exitCode": 3, "status": "failed"} and out.job.error == "No handler for agent 'x'"
    )


def test_system_failure_of_a_queued_job(q: Any, engine: Engine) -> None:
    job = q.enqueue(req()).job
    out = q.fail(job.id, None, None, "delivery exhausted", retryable=False, status="failed")
    assert out.applied and out.job.status == "failed" and out.job.result == {"status": "failed"}
    leased = leased_job(q)
    before = receipt_count(engine)
    assert not q.fail(leased.id, None, None, "not while leased", retryable=False).applied
    assert receipt_count(engine) == before


def test_cancel_queued_job_outright(q: Any, engine: Engine) -> None:
    job = q.enqueue(req()).job
    out = q.cancel(job.id, "user asked")
    assert out.applied and out.job.status == "canceled" and out.job.error == "user asked"
    assert types_of(engine, job.id) == ["job.enqueued", "job.canceled"]
    before = receipt_count(engine)
    with pytest.raises(ConflictError):
        q.cancel(job.id, "again")
    assert receipt_count(engine) == before


def test_cancel_leased_job_sends_abort_then_holder_settles(q: Any, engine: Engine) -> None:
    job = running_job(q)
    out = q.cancel(job.id, "stop")
    assert out.applied and out.job.status == "running" and out.job.abort_requested
    [cmd] = out.job.pending_commands
    assert (cmd.type, cmd.reason) == ("abort", "stop")
    assert not q.cancel_queued(job.id, "too late").applied  # only while queued
    assert not settle_canceled(q, job.id, "w9", 1, "stop").applied  # not the holder
    done = settle_canceled(q, job.id, "w1", 1, "stop")
    assert done.applied and done.job.status == "canceled" and done.job.lease is None
    assert types_of(engine, job.id)[-2:] == ["queue.command", "job.canceled"]


def test_cancel_queued_cancels_only_a_queued_job(q: Any) -> None:
    job = q.enqueue(req()).job
    q.command(job.id, "abort", reason="driver saw abort")
    out = q.cancel_queued(job.id, "abortRequested")
    assert out.applied and out.job.status == "canceled"


@pytest.mark.parametrize("ctype", ["steer", "follow_up", "abort"])
def test_commands_and_consume(q: Any, engine: Engine, ctype: str) -> None:
    job = leased_job(q)
    out = q.command(job.id, ctype, payload={"text": "hi"}, reason="r")
    [cmd] = out.job.pending_commands
    assert (cmd.type, cmd.payload, cmd.reason) == (ctype, {"text": "hi"}, "r")
    assert out.job.abort_requested is (ctype == "abort")
    assert cmd.at == stream_of(engine, job.id)[-1].at  # stamped with the database time
    consumed = q.consume_command(job.id, cmd.id)
    assert consumed.applied and consumed.job.pending_commands == () and consumed.job.commands[0].consumed
    assert consumed.job.abort_requested is (ctype == "abort")  # an abort stays requested once consumed
    before = receipt_count(engine)
    assert not q.consume_command(job.id, cmd.id).applied
    assert not q.consume_command(job.id, "cmd_unknown").applied
    assert receipt_count(engine) == before
    assert types_of(engine, job.id)[-2:] == ["queue.command", "queue.command.consumed"]


def test_consuming_a_command_of_a_terminal_job_is_inert(q: Any, engine: Engine) -> None:
    """Terminal states are absorbing: a command left pending at settlement stays as it was."""
    job = running_job(q)
    cmd = q.command(job.id, "follow_up", payload={"more": 1}).job.pending_commands[0]
    done = complete(q, job.id, "w1", 1, {"ok": True}).job
    before = receipt_count(engine)
    out = q.consume_command(job.id, cmd.id)
    assert not out.applied and out.job == done and receipt_count(engine) == before
    assert [c.consumed for c in q.get(job.id).commands] == [False]


def test_command_refusals_write_nothing(q: Any, engine: Engine) -> None:
    job = q.enqueue(req()).job
    before = receipt_count(engine)
    with pytest.raises(ValidationError) as err:
        q.command(job.id, "reboot")
    assert err.value.field == "type" and err.value.allowed == ["steer", "follow_up", "abort"]
    q.cancel(job.id)
    before = receipt_count(engine)
    with pytest.raises(ConflictError):
        q.command(job.id, "steer", payload={})
    assert receipt_count(engine) == before


def test_unknown_job_raises_not_found_and_writes_nothing(q: Any, engine: Engine) -> None:
    ops: list[Callable[[], Any]] = [
        lambda: lease(q, "nope", "w", 1000),
        lambda: q.heartbeat("nope", "w", 1, 1000),
        lambda: q.progress("nope", "w", 1, {}),
        lambda: complete(q, "nope", "w", 1),
        lambda: q.fail("nope", "w", 1, "e", retryable=True),
        lambda: q.cancel("nope"),
        lambda: q.command("nope", "steer"),
        lambda: q.consume_command("nope", "c"),
        lambda: q.expire_lease("nope"),
        lambda: settle_canceled(q, "nope", "w", 1, None),
        lambda: q.cancel_queued("nope", None),
    ]
    for op in ops:
        with pytest.raises(JobNotFound):
            op()
    assert receipt_count(engine) == 0 and q.get("nope") is None


def test_superseded_attempt_settlements_are_inert(q: Any, engine: Engine) -> None:
    job = running_job(q, lease_ms=1, maxAttempts=3)
    wait_for_db_clock_past(engine, job.lease.expires_at if job.lease else None)
    assert q.expire_lease(job.id).applied
    current = lease(q, job.id, "w2", LONG).job
    assert current.attempt == 2
    before = receipt_count(engine)
    stale: list[Callable[[], Any]] = [
        lambda: q.heartbeat(job.id, "w1", 1, LONG),
        lambda: q.progress(job.id, "w1", 1, {"pct": 100}),
        lambda: complete(q, job.id, "w1", 1, {"stale": True}),
        lambda: q.fail(job.id, "w1", 1, "stale", retryable=False),
        lambda: q.fail(job.id, "w1", 1, "stale", retryable=True),
        lambda: settle_canceled(q, job.id, "w1", 1, "stale"),
        # The current worker with the old attempt number is just as stale.
        lambda: complete(q, job.id, "w2", 1, {"stale": True}),
    ]
    for op in stale:
        out = op()
        assert not out.applied and out.job == current
    assert receipt_count(engine) == before  # no receipt written for a superseded attempt
    assert complete(q, job.id, "w2", 2, {"ok": 1}).job.status == "completed"


def test_expire_lease_only_after_the_deadline(q: Any, engine: Engine) -> None:
    job = leased_job(q, lease_ms=LONG)
    before = receipt_count(engine)
    assert not q.expire_lease(job.id).applied and receipt_count(engine) == before
    short = leased_job(q, lease_ms=1)
    wait_for_db_clock_past(engine, short.lease.expires_at if short.lease else None)
    out = q.expire_lease(short.id)
    assert out.applied and out.job.status == "queued" and out.job.lease is None and out.job.attempt == 1
    body = stream_of(engine, short.id)[-1].body
    assert (body["workerId"], body["attempt"]) == ("w1", 1)
    assert not q.expire_lease(short.id).applied  # already back in the queue


def test_expire_leases_expires_exactly_the_past_deadlines(q: Any, engine: Engine) -> None:
    keep = running_job(q, lease_ms=LONG)
    queued = q.enqueue(req()).job
    gone = [leased_job(q, lease_ms=1), running_job(q, lease_ms=1, maxAttempts=1)]
    for job in gone:
        wait_for_db_clock_past(engine, job.lease.expires_at if job.lease else None)
    expired = q.expire_leases()
    assert sorted(j.id for j in expired) == sorted(j.id for j in gone)
    assert {j.id: j.status for j in expired} == {gone[0].id: "queued", gone[1].id: "failed"}
    assert q.get(keep.id).status == "running" and q.get(queued.id).status == "queued"
    assert q.expire_leases() == []


# -- reads ----------------------------------------------------------------------------------------


def test_list_jobs_filters_and_pages(q: Any, engine: Engine) -> None:
    made = []
    for i in range(5):
        made.append(q.enqueue(req(lane="chat" if i % 2 else "collect", sessionKey=f"s{i % 2}")).job)
    b_job = q.enqueue(req(org=ORG_B)).job
    lease(q, made[0].id, "w1", LONG)
    page = q.list_jobs(organization_id=ORG_A, limit=2)
    seen = list(page.jobs)
    while page.next_cursor:
        page = q.list_jobs(organization_id=ORG_A, limit=2, cursor=page.next_cursor)
        seen.extend(page.jobs)
    assert sorted(j.id for j in seen) == sorted(j.id for j in made) and len(seen) == 5
    keys = [(j.created_at, j.id) for j in seen]
    assert keys == sorted(keys, reverse=True)  # newest first, no duplicates across pages
    assert [j.id for j in q.list_jobs(organization_id=ORG_B).jobs] == [b_job.id]
    assert len(q.list_jobs(all_organizations=True, limit=100).jobs) == 6
    assert [j.id for j in q.list_jobs(organization_id=ORG_A, status="leased").jobs] == [made[0].id]
    assert {j.lane for j in q.list_jobs(organization_id=ORG_A, lane="chat").jobs} == {"chat"}
    assert {j.session_key for j in q.list_jobs(organization_id=ORG_A, session_key="s1").jobs} == {"s1"}
    assert q.list_jobs(organization_id=ORG_A, agent_id="factory").jobs == []
    with pytest.raises(ValidationError):
        decode_cursor("not-a-cursor")
    with pytest.raises(ValidationError) as err:
        validate_status_filter("done")
    assert err.value.allowed == ["queued", "leased", "running", "completed", "failed", "canceled"]


def test_queued_older_than(q: Any, engine: Engine) -> None:
    job = q.enqueue(req()).job
    leased = leased_job(q)
    wait_for_db_clock_past(engine, job.created_at)
    found = q.queued_older_than(0)
    assert [j.id for j, _ in found] == [job.id] and leased.id not in {j.id for j, _ in found}
    assert found[0][1] == parse_iso(job.created_at)
    assert q.queued_older_than(3_600_000) == []


# -- validation and the dispatch hook -----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"lane": "fast", "payload": payload()},
        {"payload": {"kind": "factory.nope"}},
        {"payload": {"kind": "factory.run"}},
        {"payload": payload(), "singletonMode": "steer"},
        {"payload": payload(), "maxAttempts": "3"},
        {"payload": payload(), "jobId": "../etc"},
        {"payload": payload(), "extra": 1},
    ],
)
def test_validation_errors_write_nothing(q: Any, engine: Engine, body: dict[str, Any]) -> None:
    q.enqueue(req())
    before = receipt_count(engine)
    with pytest.raises(ValidationError):
        q.enqueue(validate_enqueue("codex", body))
    assert receipt_count(engine) == before and job_count(engine) == 1


def test_on_dispatchable_is_called_after_commit_with_queued_and_ended_jobs(engine: Engine) -> None:
    calls: list[tuple[list[str], list[str]]] = []

    def hook(jobs: Sequence[Job]) -> None:
        # A separate connection must already see the jobs: the hook runs after commit.
        with engine.connect() as conn:
            visible = [j.id for j in jobs if store.head(conn, job_stream(j.id)) is not None]
        calls.append(([j.status for j in jobs], visible))

    queue = queue_for(engine, on_dispatchable=hook)
    job = queue.enqueue(req()).job
    assert calls == [(["queued"], [job.id])]
    lease(queue, job.id, "w1", LONG)
    queue.heartbeat(job.id, "w1", 1, LONG)
    assert len(calls) == 1  # leasing and heartbeats make nothing dispatchable
    queue.fail(job.id, "w1", 1, "retry me", retryable=True)
    assert calls[-1] == (["queued"], [job.id])  # requeued → dispatchable again
    lease(queue, job.id, "w1", LONG)
    complete(queue, job.id, "w1", 2)
    # Its end frees a place in its worker queue: the hook hears of it, to move the line there.
    assert calls[-1] == (["completed"], [job.id]) and len(calls) == 3
    check_all(engine)


def test_on_dispatchable_failure_never_fails_the_operation(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(jobs: Sequence[Job]) -> None:
        raise RuntimeError("broker down")

    queue = queue_for(engine, on_dispatchable=hook)
    result = queue.enqueue(req(jobId="kept"))
    assert result.created and queue.get(qualify(ORG_A, "kept")) == result.job
    assert "dispatch wake-up failed" in caplog.text
    check_all(engine)


# -- delayed jobs (app.jobs.delay) ------------------------------------------------------------------


def test_a_delayed_job_is_queued_with_available_at_from_the_database_clock(q: Any, engine: Engine) -> None:
    job = q.enqueue(req(jobId="later", delayMs=60_000)).job
    created, available = parse_iso(job.created_at), parse_iso(job.available_at)
    assert job.status == "queued" and created is not None and available is not None
    assert available - created == timedelta(milliseconds=60_000)
    [enqueued] = stream_of(engine, job.id)
    assert enqueued.body["availableAt"] == job.available_at
    # Not due yet: the due-retries scan (which starts delayed jobs too) leaves it alone.
    assert [j.id for j in q.due_retries()] == []
    # Re-posting the same jobId returns it unchanged (its availableAt too).
    again = q.enqueue(req(jobId="later", delayMs=1))
    assert not again.created and again.job == job


def test_a_past_run_at_is_due_at_once(q: Any, engine: Engine) -> None:
    job = q.enqueue(req(jobId="overdue", runAt="2000-01-01T00:00:00Z")).job
    assert job.available_at == job.created_at  # clamped to the enqueue's own time
    wait_for_db_clock_past(engine, job.available_at)
    assert [j.id for j in q.due_retries()] == [job.id]


def test_a_delayed_job_becomes_due_when_the_database_clock_passes_it(q: Any, engine: Engine) -> None:
    job = q.enqueue(req(jobId="soon", delayMs=300)).job
    assert job.id not in [j.id for j in q.due_retries()]
    wait_for_db_clock_past(engine, job.available_at)
    assert [j.id for j in q.due_retries()] == [job.id]


def test_a_waiting_job_takes_commands_and_can_be_canceled(q: Any, engine: Engine) -> None:
    job = q.enqueue(req(jobId="waiting", runAt="2099-01-01T00:00:00Z")).job
    steered = q.command(job.id, "steer", {"note": "change of plan"}).job
    followed = q.command(job.id, "follow_up", {"next": 1}).job
    assert [c.type for c in followed.commands] == ["steer", "follow_up"] and steered.status == "queued"
    canceled = q.cancel(job.id, "not needed").job
    assert (canceled.status, canceled.error) == ("canceled", "not needed")
    assert types_of(engine, job.id) == ["job.enqueued", "queue.command", "queue.command", "job.canceled"]


def test_singleton_rules_apply_to_a_waiting_job_at_enqueue_time(q: Any, engine: Engine) -> None:
    waiting = q.enqueue(req(jobId="w1", sessionKey="s", runAt="2099-01-01T00:00:00Z")).job
    steered = q.enqueue(req(sessionKey="s", singletonMode="steer", payload=payload(ORG_A, note="x")))
    assert steered.steered and steered.job.id == waiting.id
    replaced = q.enqueue(req(jobId="w2", sessionKey="s", singletonMode="cancel", delayMs=60_000))
    assert replaced.created and replaced.canceled == (waiting.id,)
    assert replaced.job.available_at is not None
    assert q.get(waiting.id).status == "canceled"
