"""The dispatch pass over a worker queue's line (app/dispatch/line.py), on SQLite and PostgreSQL:
capacity from the live processes' offers, in flight counted from rows, fair turns between
organisations, priority inside a line, key limits (at the pass and at the lease), rate limits,
and why a waiting job waits."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.dispatch import line
from app.dispatch.choice import Waiting
from app.jobs.reducer import Job
from app.jobs.routing import QUEUES
from app.jobs.validation import validate_enqueue
from app.storage import concurrency_keys as keys
from app.storage.db import db_now, make_engine, transaction, worker_liveness
from app.storage.queue import Queue
from devharness.credits import offer_slots, withdraw
from tests.support.queue_ops import complete, lease

CHAT = QUEUES["chat"]
LONG_MS = 600_000


_ids = itertools.count()


def enqueue(queue: Queue, org: str, **extra: Any) -> Job:
    """A job of ``org``'s, its id in enqueue order: jobs enqueued in one clock tick (SQLite keeps
    milliseconds) join the line in id order, so the ids say which came first."""
    body = {
        "jobId": f"j{next(_ids):06d}",
        "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": org}},
        **extra,
    }
    return queue.enqueue(validate_enqueue("factory", body)).job


def finish(queue: Queue, job_id: str) -> None:
    """The job's attempt leased and completed, as a worker would: its place frees."""
    assert lease(queue, job_id, "w", LONG_MS).applied
    assert complete(queue, job_id, "w", 1).applied


def run(engine: Engine, settings: Settings | None = None, at: datetime | None = None) -> line.PassResult:
    with transaction(engine) as conn:
        return line.run_pass(conn, CHAT, settings or Settings(dispatch_lead=0), at or db_now(conn))


def sent(result: line.PassResult) -> list[str]:
    return [job.id for job, _decision in result.claimed]


@pytest.fixture
def queue(engine: Engine) -> Queue:
    return queue_for(engine)


def test_no_live_process_no_dispatch_and_the_line_says_it_is_blocked(engine: Engine, queue: Queue) -> None:
    enqueue(queue, "a")
    result = run(engine)
    assert (result.capacity.slots, result.places, sent(result)) == (0, 0, [])
    assert result.blocked and result.line_waiting
    assert result.again_in_s(1.0) == 1.0


def test_the_pass_sends_at_most_the_free_slots_plus_the_lead_per_process(
    engine: Engine, queue: Queue
) -> None:
    offer_slots(engine, slots=3)
    jobs = [enqueue(queue, "a") for _ in range(8)]
    first = run(engine, Settings(dispatch_lead=2))
    assert first.capacity == line.Capacity(3, 1, 2)
    assert sent(first) == [j.id for j in jobs[:5]]  # 3 slots + a lead of 2, oldest first
    assert sent(run(engine, Settings(dispatch_lead=2))) == []  # all five still in flight
    finish(queue, jobs[0].id)
    again = run(engine, Settings(dispatch_lead=2))
    assert sent(again) == [jobs[5].id]  # one place freed, one sent


def test_a_process_adds_a_lead_of_at_most_its_own_slots(engine: Engine, queue: Queue) -> None:
    """RECEIPT_DISPATCH_LEAD (default 8) per process, capped by the process's slots: a process
    running two long attempts at a time is never sent eight more to hold."""
    assert Settings().dispatch_lead == 8
    offer_slots(engine, slots=2)
    offer_slots(engine, slots=8)
    jobs = [enqueue(queue, "a") for _ in range(30)]
    first = run(engine, Settings())
    assert first.capacity == line.Capacity(10, 2, 2 + 8)
    assert sent(first) == [j.id for j in jobs[:20]]


def test_a_process_that_stops_taking_work_offers_no_slots(engine: Engine, queue: Queue) -> None:
    process = offer_slots(engine, slots=4)
    with transaction(engine) as conn:
        conn.execute(update(worker_liveness).where(worker_liveness.c.process_id == process).values(slots=0))
    enqueue(queue, "a")
    assert sent(run(engine)) == []
    withdraw(engine, process)


def test_a_lapsed_process_offers_nothing(engine: Engine, queue: Queue) -> None:
    process = offer_slots(engine, slots=4)
    with transaction(engine) as conn:
        lapsed = db_now(conn) - timedelta(milliseconds=Settings().worker_self_fence_ms + 1000)
        conn.execute(
            update(worker_liveness).where(worker_liveness.c.process_id == process).values(renewed_at=lapsed)
        )
    enqueue(queue, "a")
    assert run(engine).capacity == line.Capacity(0, 0)


def test_a_burst_from_one_organisation_leaves_the_next_place_to_another(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=2)
    burst = [enqueue(queue, "a") for _ in range(30)]
    assert sent(run(engine)) == [burst[0].id, burst[1].id]
    late = enqueue(queue, "b")
    finish(queue, burst[0].id)
    assert sent(run(engine)) == [late.id]  # b had nothing in flight: the freed place is b's


def test_turns_alternate_while_one_place_frees_at_a_time(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=1)
    a = [enqueue(queue, "a") for _ in range(3)]
    b = [enqueue(queue, "b") for _ in range(3)]
    order = []
    for _ in range(4):
        [job_id] = sent(run(engine))
        order.append(job_id)
        finish(queue, job_id)
    assert order == [a[0].id, b[0].id, a[1].id, b[1].id]


def test_priority_orders_a_line_and_does_not_jump_another_organisation(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=1)
    low = enqueue(queue, "a")
    high = enqueue(queue, "a", priority=5)
    assert sent(run(engine)) == [high.id]
    b = enqueue(queue, "b")
    finish(queue, high.id)
    urgent = enqueue(queue, "a", priority=10)
    assert sent(run(engine)) == [b.id]  # a's turn was last: its urgent job waits for b's
    assert urgent.id != low.id


def test_a_key_never_runs_past_its_limit_and_the_line_steps_past_it(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=8)
    keyed = [enqueue(queue, "a", concurrencyKey="api", concurrencyLimit=2) for _ in range(4)]
    free = enqueue(queue, "a")
    assert sent(run(engine)) == [keyed[0].id, keyed[1].id, free.id]
    waiting = queue.get(keyed[2].id)
    assert waiting is not None
    with engine.connect() as conn:
        why = line.waiting_reasons(conn, [waiting], Settings(), db_now(conn))
    assert why == {keyed[2].id: Waiting("concurrency", "api")}


def test_the_operator_s_prefix_limit_overrides_the_job_s_own(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=8)
    keyed = [enqueue(queue, "a", concurrencyKey="stripe:acct", concurrencyLimit=5) for _ in range(3)]
    settings = Settings(dispatch_lead=0, concurrency_limits=(("stripe:", 1),))
    assert sent(run(engine, settings)) == [keyed[0].id]


def test_a_rate_limit_admits_its_burst_then_says_when_it_admits_again(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=50)
    settings = Settings(dispatch_lead=0, rate_limits=(("api", 20.0),))
    keyed = [enqueue(queue, "a", concurrencyKey="api-calls", concurrencyLimit=100) for _ in range(6)]
    first = run(engine, settings)
    assert sent(first) == [keyed[0].id, keyed[1].id]  # a burst of a tenth of a second at 20/s
    assert first.waiting[keyed[2].id] == Waiting("rate", "api-calls")
    assert first.retry_at is not None and 0 < (first.retry_at - first.now).total_seconds() <= 0.1
    # A pass 10 ms later, before one emission interval (50 ms) has passed, sends nothing more; the
    # time is given, not read, so a slow machine cannot turn "before then" into "after then".
    assert sent(run(engine, settings, at=first.now + timedelta(milliseconds=10))) == []


def test_the_lease_refuses_a_full_key_and_leaves_the_job_queued(engine: Engine, queue: Queue) -> None:
    a = enqueue(queue, "a", concurrencyKey="serial", concurrencyLimit=1)
    b = enqueue(queue, "a", concurrencyKey="serial", concurrencyLimit=1)
    assert lease(queue, a.id, "w1", LONG_MS).applied
    [start] = queue.start_attempts([(b.id, "w2", 1)], lambda job: LONG_MS)
    assert not isinstance(start, Exception)
    assert start.status == keys.KEY_FULL
    refused = queue.get(b.id)
    assert refused is not None and (refused.status, refused.attempt) == ("queued", 0)
    complete(queue, a.id, "w1", 1)
    [again] = queue.start_attempts([(b.id, "w2", 1)], lambda job: LONG_MS)
    assert not isinstance(again, Exception) and again.status == "started"


def test_two_processes_leasing_one_key_at_once_start_one_attempt(pg_engine: Engine) -> None:
    """PostgreSQL: the key's lock is held to the lease's commit, so the second sees the first."""
    queue = queue_for(pg_engine)
    jobs = [enqueue(queue, "a", concurrencyKey="serial", concurrencyLimit=1) for _ in range(8)]
    barrier = threading.Barrier(len(jobs), timeout=30)
    outcomes: list[str] = []

    def start(job: Job) -> None:
        barrier.wait()
        [answer] = queue.start_attempts([(job.id, f"w-{job.id}", 1)], lambda _job: LONG_MS)
        assert not isinstance(answer, Exception)
        outcomes.append(answer.status)

    threads = [threading.Thread(target=start, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["concurrency_limited"] * 7 + ["started"]


def test_why_a_job_waits_for_its_share(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=1)
    first, second = enqueue(queue, "a"), enqueue(queue, "a")
    later = enqueue(queue, "a", delayMs=60_000)
    run(engine)
    read = [queue.get(j.id) for j in (first, second, later)]
    with engine.connect() as conn:
        why = line.waiting_reasons(conn, [j for j in read if j is not None], Settings(), db_now(conn))
    # The first is in flight and the delayed one's time has not come: neither waits for a place.
    assert why == {second.id: Waiting("share")}


def test_shares_count_each_organisation_s_line_and_flight(engine: Engine, queue: Queue) -> None:
    offer_slots(engine, slots=2)
    for _ in range(3):
        enqueue(queue, "a")
    enqueue(queue, "b")
    run(engine)
    with engine.connect() as conn:
        [chat] = line.shares(conn, replace(Settings(), dispatch_lead=0), db_now(conn), [CHAT])
    assert (chat.slots, chat.processes, chat.places, chat.in_flight) == (2, 1, 2, 2)
    assert {(o.organization, o.in_flight, o.queued) for o in chat.organizations} == {("a", 1, 3), ("b", 1, 1)}


def test_a_prepared_pass_chooses_what_an_unprepared_one_does_past_the_servers_custom_plans(
    pg_engine: Engine, pg_database_url: str
) -> None:
    """With ``RECEIPT_DB_PREPARED_STATEMENTS=enabled`` the pass's counts and heads are prepared once
    per connection; after five custom plans the server may settle on a generic one, which must
    choose the same jobs (a full key stepped past, two organisations' turns)."""
    queue = queue_for(pg_engine)
    offer_slots(pg_engine, slots=4)
    keyed = [enqueue(queue, "a", concurrencyKey="api", concurrencyLimit=1) for _ in range(3)]
    finish(queue, keyed[0].id)
    assert lease(queue, keyed[1].id, "w", LONG_MS).applied  # the key is full now
    plain = [enqueue(queue, org) for org in ("a", "b", "a", "b")]
    prepared = make_engine(pg_database_url, prepared_statements=True)
    try:

        def chosen(engine: Engine) -> list[str]:
            with engine.connect() as conn:
                tx = conn.begin()
                result = line.run_pass(conn, CHAT, Settings(dispatch_lead=0), db_now(conn))
                statements = conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars()
                texts = [str(s) for s in statements]
                tx.rollback()
            if engine is prepared:
                assert any("WITH RECURSIVE orgs" in t for t in texts)  # the heads, prepared
                assert any("'offers'" in t for t in texts)  # the counts, prepared
            return sorted(job.id for job, _ in result.claimed)

        expected = chosen(pg_engine)
        assert keyed[2].id not in expected and len(expected) == 3
        assert set(expected) <= {j.id for j in plain}
        for _ in range(8):
            assert chosen(prepared) == expected
    finally:
        prepared.dispose()


def test_the_counts_read_each_pending_deliverys_job_by_its_key(pg_engine: Engine) -> None:
    """The pass's counts find the jobs of live pending deliveries by their primary key, whatever the
    statistics say: the line's partial index also holds the key (its last column), and a plan that
    used it walked the whole line once per pending delivery."""
    queue = queue_for(pg_engine)
    offer_slots(pg_engine, slots=10)
    for i in range(60):
        enqueue(queue, f"org-{i % 3}")
    assert len(run(pg_engine).claimed) == 10  # ten deliveries pending, their jobs still queued
    with pg_engine.connect() as conn:
        now = db_now(conn)
        params = {"queue": CHAT, "now": now, "epoch": None, "fresh": now, "like": f"% {CHAT} %", "lead": 8}
        plan = "\n".join(
            str(r) for r in conn.execute(text("EXPLAIN " + line._COUNTS_PG.text), params).scalars()
        )
    sent = plan[plan.index("deliveries") :]  # the sent part onwards: its lookup of each job
    assert "jobs_pkey on jobs" in sent
    assert "ix_jobs_line" not in sent
