"""Races on real PostgreSQL: 16 threads released together by a barrier, each on its own connection.

SQLite serialises every writer with BEGIN IMMEDIATE, so these races only exist on Postgres.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.ids import qualify
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import projection, store
from app.storage.db import jobs, parse_iso, receipts
from app.storage.queue import Queue
from tests.support.databases import assert_projection_equals_fold
from tests.support.queue_ops import complete, lease

THREADS = 16
T = TypeVar("T")


def race(fn: Callable[[int], T]) -> list[T]:
    """Run ``fn(i)`` on 16 threads that all start at the same barrier; re-raise any failure."""
    barrier = threading.Barrier(THREADS, timeout=30)

    def run(i: int) -> T:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(run, i) for i in range(THREADS)]
        return [f.result(timeout=60) for f in futures]


ORG = "org-1"


def body(org: str = ORG, **extra: Any) -> dict[str, Any]:
    return {
        "payload": {
            "kind": "factory.task.run",
            "authContext": {"userId": "u", "organizationId": org},
            **extra.pop("p", {}),
        },
        **extra,
    }


def types_on(engine: Engine, job_id: str) -> list[str]:
    with engine.connect() as conn:
        return [r.type for r in store.read_stream(conn, job_stream(job_id))]


def assert_stream_times_never_go_back(engine: Engine) -> None:
    with engine.connect() as conn:
        for stream in store.streams(conn):
            ats = [parse_iso(r.at) for r in store.read_stream(conn, stream)]
            times = [at for at in ats if at is not None]
            assert len(times) == len(ats), f"{stream}: a receipt without a time"
            assert times == sorted(times), f"{stream}: receipt times go backwards"


@pytest.fixture
def pg_queue(pg_engine: Engine) -> Queue:
    assert pg_engine.pool.size() >= 10  # type: ignore[attr-defined]  # 16 threads need their own connections
    return queue_for(pg_engine)


def test_sixteen_threads_leasing_one_job_yield_exactly_one_lease(pg_queue: Queue, pg_engine: Engine) -> None:
    job = pg_queue.enqueue(validate_enqueue("codex", body())).job

    outcomes = race(lambda i: lease(pg_queue, job.id, f"w{i}", 60_000))

    winners = [i for i, out in enumerate(outcomes) if out.applied]
    assert len(winners) == 1
    assert types_on(pg_engine, job.id) == ["job.enqueued", "job.leased"]
    final = pg_queue.get(job.id)
    assert final is not None and final.lease is not None
    assert final.status == "leased" and final.attempt == 1 and final.lease.worker_id == f"w{winners[0]}"
    assert all(out.job == final for out in outcomes)  # the losers re-read and saw the winner's lease
    assert_projection_equals_fold(pg_engine, job.id)
    with pg_engine.connect() as conn:
        assert store.verify(conn) == (2, None)


def test_sixteen_concurrent_enqueues_of_one_job_id_make_one_job(pg_queue: Queue, pg_engine: Engine) -> None:
    results = race(lambda i: pg_queue.enqueue(validate_enqueue("codex", body(jobId="same-job", lane="chat"))))

    assert sum(r.created for r in results) == 1
    assert {r.job.id for r in results} == {qualify(ORG, "same-job")}
    assert all(r.job == results[0].job for r in results)
    assert types_on(pg_engine, qualify(ORG, "same-job")) == ["job.enqueued"]
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(receipts)).scalar_one() == 1
    assert_projection_equals_fold(pg_engine, qualify(ORG, "same-job"))


def test_concurrent_enqueues_of_one_job_id_by_two_organisations_make_one_job_each(
    pg_queue: Queue, pg_engine: Engine
) -> None:
    """A jobId is unique within its organisation: racing orgs each get their own job, once."""
    orgs = (ORG, "org-2")
    results = race(
        lambda i: pg_queue.enqueue(validate_enqueue("codex", body(org=orgs[i % 2], jobId="shared")))
    )
    for org in orgs:
        mine = [r for r in results if r.job.organization_id == org]
        assert len(mine) == THREADS // 2 and sum(r.created for r in mine) == 1
        assert {r.job.id for r in mine} == {qualify(org, "shared")}
        assert types_on(pg_engine, qualify(org, "shared")) == ["job.enqueued"]
        assert_projection_equals_fold(pg_engine, qualify(org, "shared"))
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 2


def test_concurrent_steer_enqueues_on_one_session_reach_one_job(pg_queue: Queue, pg_engine: Engine) -> None:
    results = race(
        lambda i: pg_queue.enqueue(
            validate_enqueue("codex", body(sessionKey="sess-1", singletonMode="steer", p={"n": i}))
        )
    )

    created = [r for r in results if r.created]
    assert len(created) == 1 and sum(r.steered for r in results) == THREADS - 1
    target = created[0].job
    assert {r.job.id for r in results} == {target.id}
    with pg_engine.connect() as conn:
        on_session = conn.execute(select(jobs.c.id).where(jobs.c.session_key == "sess-1")).scalars().all()
        assert on_session == [target.id]
        stream = store.read_stream(conn, job_stream(target.id))
    assert [r.type for r in stream] == ["job.enqueued"] + ["queue.command"] * (THREADS - 1)
    creator_n = target.payload["n"]
    steered_ns = sorted(r.body["payload"]["n"] for r in stream[1:])
    assert steered_ns == sorted(set(range(THREADS)) - {creator_n})  # every other enqueue's payload, once
    assert all(
        r.body["type"] == "steer" and r.body["fromEnqueue"] is True and r.body["fromSessionKey"] == "sess-1"
        for r in stream[1:]
    )
    final = pg_queue.get(target.id)
    assert final is not None and len(final.pending_commands) == THREADS - 1
    assert_projection_equals_fold(pg_engine, target.id)
    assert_stream_times_never_go_back(pg_engine)


def test_concurrent_heartbeats_and_commands_keep_projection_equal_to_fold(
    pg_queue: Queue, pg_engine: Engine
) -> None:
    """Mixed writers on one job: every receipt lands exactly once, the chain and projection agree."""
    job = pg_queue.enqueue(validate_enqueue("codex", body())).job
    lease(pg_queue, job.id, "w1", 60_000)

    def work(i: int) -> Any:
        if i % 2:
            return pg_queue.heartbeat(job.id, "w1", 1, 60_000)
        return pg_queue.command(job.id, "follow_up", payload={"i": i})

    outcomes = race(work)

    assert all(out.applied for out in outcomes)
    types = types_on(pg_engine, job.id)
    assert types.count("job.heartbeat") == THREADS // 2 and types.count("queue.command") == THREADS // 2
    assert_projection_equals_fold(pg_engine, job.id)
    with pg_engine.connect() as conn:
        assert store.verify(conn) == (2 + THREADS, None)
    assert_stream_times_never_go_back(pg_engine)


# -- deterministic interleavings: another transaction commits just before a projection read -------


def commit_before_loading(
    monkeypatch: pytest.MonkeyPatch, job_id: str, action: Callable[[], Any]
) -> list[bool]:
    """Run ``action`` (its own transaction) the first time any transaction reads ``job_id``
    (through ``projection.load`` or ``projection.load_at_clock``, which reads the clock with it)."""
    real_load, real_load_at_clock = projection.load, projection.load_at_clock
    fired: list[bool] = []

    def fire(wanted: str) -> None:
        if wanted == job_id and not fired:
            fired.append(True)
            action()

    def load(conn: Any, wanted: str, **kwargs: Any) -> Any:
        fire(wanted)
        return real_load(conn, wanted, **kwargs)

    def load_at_clock(conn: Any, wanted: str) -> Any:
        fire(wanted)
        return real_load_at_clock(conn, wanted)

    monkeypatch.setattr(projection, "load", load)
    monkeypatch.setattr(projection, "load_at_clock", load_at_clock)
    return fired


def test_a_job_settled_during_the_session_scan_does_not_take_the_steer(
    pg_queue: Queue,
    pg_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = pg_queue.enqueue(validate_enqueue("codex", body(sessionKey="s"))).job
    lease(pg_queue, job.id, "w1", 60_000)
    other = queue_for(pg_engine)
    fired = commit_before_loading(monkeypatch, job.id, lambda: complete(other, job.id, "w1", 1, {"done": 1}))

    result = pg_queue.enqueue(validate_enqueue("codex", body(sessionKey="s", singletonMode="steer")))

    assert fired == [True]
    assert result.created and not result.steered and result.job.id != job.id
    assert types_on(pg_engine, job.id) == ["job.enqueued", "job.leased", "job.completed"]
    assert_projection_equals_fold(pg_engine, job.id)
    assert_projection_equals_fold(pg_engine, result.job.id)


def test_receipt_time_is_read_after_the_state_it_follows(
    pg_queue: Queue,
    pg_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receipt committed by another transaction while this one starts must not be newer than ours."""
    job = pg_queue.enqueue(validate_enqueue("codex", body())).job
    lease(pg_queue, job.id, "w1", 60_000)
    other = queue_for(pg_engine)
    fired = commit_before_loading(monkeypatch, job.id, lambda: other.heartbeat(job.id, "w1", 1, 60_000))

    out = pg_queue.command(job.id, "steer", payload={"x": 1})

    assert fired == [True] and out.applied
    assert types_on(pg_engine, job.id) == ["job.enqueued", "job.leased", "job.heartbeat", "queue.command"]
    assert_stream_times_never_go_back(pg_engine)
    assert_projection_equals_fold(pg_engine, job.id)


# -- idempotent enqueue under concurrent identical posts ---------------------------------------------


def test_concurrent_identical_steer_posts_leave_exactly_one_steer_and_the_same_answer(
    pg_queue: Queue, pg_engine: Engine
) -> None:
    target = pg_queue.enqueue(validate_enqueue("codex", body(sessionKey="sess-i", singletonMode="steer"))).job
    same = body(sessionKey="sess-i", singletonMode="steer", jobId="steer-once", p={"text": "go left"})
    results = race(lambda i: pg_queue.enqueue(validate_enqueue("codex", same)))
    assert {(r.job.id, r.created, r.steered) for r in results} == {(target.id, False, True)}
    steers = [t for t in types_on(pg_engine, target.id) if t == "queue.command"]
    assert len(steers) == 1  # sixteen identical posts, one command
    [command] = pg_queue.get(target.id).commands  # type: ignore[union-attr]
    assert command.extra["fromJobId"] == "steer-once" and command.payload["text"] == "go left"
    # Re-posted later, after the target has ended: still the same answer, still one steer.
    pg_queue.cancel(target.id, "done")
    again = pg_queue.enqueue(validate_enqueue("codex", same))
    assert (again.job.id, again.created, again.steered) == (target.id, False, True)
    assert types_on(pg_engine, target.id).count("queue.command") == 1
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar() == 1  # no job "steer-once"


def test_concurrent_identical_cancel_posts_cancel_once_and_create_one_job(
    pg_queue: Queue, pg_engine: Engine
) -> None:
    old = pg_queue.enqueue(validate_enqueue("codex", body(sessionKey="sess-c", singletonMode="cancel"))).job
    same = body(sessionKey="sess-c", singletonMode="cancel", jobId="cancel-once")
    results = race(lambda i: pg_queue.enqueue(validate_enqueue("codex", same)))
    assert {r.job.id for r in results} == {qualify(ORG, "cancel-once")}
    assert sum(r.created for r in results) == 1
    assert types_on(pg_engine, old.id) == ["job.enqueued", "job.canceled"]
    assert types_on(pg_engine, qualify(ORG, "cancel-once")) == ["job.enqueued"]


def test_concurrent_identical_allow_posts_create_one_job(pg_queue: Queue, pg_engine: Engine) -> None:
    same = body(sessionKey="sess-a", jobId="allow-once")
    results = race(lambda i: pg_queue.enqueue(validate_enqueue("codex", same)))
    assert {r.job.id for r in results} == {qualify(ORG, "allow-once")} and sum(
        r.created for r in results
    ) == 1
    assert types_on(pg_engine, qualify(ORG, "allow-once")) == ["job.enqueued"]
    assert_projection_equals_fold(pg_engine, qualify(ORG, "allow-once"))
