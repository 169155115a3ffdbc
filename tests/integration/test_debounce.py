"""Debounce at enqueue, on every backend: a debounced job waits its window, and a later enqueue of
the same key in the same organisation cancels the one still queued (``debounced``, naming its
replacement) in its own transaction. Projection == fold after every operation (``q``)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.flow import DEBOUNCED_REASON, REPLACED_BY_FIELD
from app.jobs.ids import client_id_of, qualify
from app.jobs.replay import replay_request
from app.jobs.validation import EnqueueRequest, validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import store
from app.storage.db import jobs, parse_iso
from app.storage.queue import Queue
from tests.integration.test_concurrency import assert_stream_times_never_go_back
from tests.integration.test_queue import CheckedQueue
from tests.support.databases import assert_projection_equals_fold
from tests.support.queue_ops import lease

ORG_A = "org-a"
ORG_B = "org-b"
WINDOW = 60_000


def req(org: str = ORG_A, key: str = "k", window: int = WINDOW, **body: Any) -> EnqueueRequest:
    body.setdefault("payload", {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": org}})
    return validate_enqueue("factory", {"debounce": {"key": key, "windowMs": window}, **body})


@pytest.fixture
def q(engine: Engine) -> Any:
    return CheckedQueue(queue_for(engine))


def receipts_of(engine: Engine, job_id: str) -> list[store.StoredReceipt]:
    with engine.connect() as conn:
        return store.read_stream(conn, job_stream(job_id))


def queued_with_key(engine: Engine, org: str, key: str) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id).where(
                jobs.c.organization_id == org, jobs.c.debounce_key == key, jobs.c.status == "queued"
            )
        )
        return sorted(rows.scalars().all())


def test_a_debounced_job_waits_its_window_on_the_database_clock(q: Any, engine: Engine) -> None:
    job = q.enqueue(req(window=2_500)).job
    [enqueued] = receipts_of(engine, job.id)
    at, available = parse_iso(enqueued.at), parse_iso(job.available_at)
    assert at is not None and available is not None
    assert available - at == timedelta(milliseconds=2_500)
    assert enqueued.body["availableAt"] == job.available_at
    assert enqueued.body["debounce"] == {"key": "k", "windowMs": 2_500}
    assert job.status == "queued" and job.flow.debounce is not None


def test_a_later_enqueue_of_the_key_cancels_the_queued_one_and_takes_its_place(
    q: Any, engine: Engine
) -> None:
    first = q.enqueue(req(jobId="first")).job
    second = q.enqueue(req(jobId="second")).job
    replaced = q.get(first.id)
    assert (replaced.status, replaced.error) == ("canceled", DEBOUNCED_REASON)
    canceled = receipts_of(engine, first.id)[-1]
    assert canceled.type == "job.canceled"
    assert canceled.body == {"reason": DEBOUNCED_REASON, REPLACED_BY_FIELD: "second"}
    assert second.status == "queued"
    assert queued_with_key(engine, ORG_A, "k") == [second.id]
    # The cancel and the new job share one transaction and one clock.
    assert canceled.at == receipts_of(engine, second.id)[0].at


def test_other_keys_and_other_organisations_are_left_alone(q: Any, engine: Engine) -> None:
    a = q.enqueue(req(key="k")).job
    other_key = q.enqueue(req(key="other")).job
    other_org = q.enqueue(req(org=ORG_B, key="k")).job
    plain = q.enqueue(validate_enqueue("factory", {"payload": req().payload})).job
    assert [q.get(j.id).status for j in (a, other_key, other_org, plain)] == ["queued"] * 4


def test_a_leased_or_running_job_is_never_canceled_by_a_debounce(q: Any, engine: Engine) -> None:
    running = q.enqueue(req(jobId="running")).job
    assert lease(q, running.id, "w-1", 60_000, start=True).job.status == "running"
    after = q.enqueue(req(jobId="after")).job
    assert q.get(running.id).status == "running"
    assert [r.type for r in receipts_of(engine, running.id)] == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
    ]
    assert after.status == "queued"


def test_a_window_that_passed_still_leaves_a_queued_job_to_be_replaced(q: Any, engine: Engine) -> None:
    early = q.enqueue(req(jobId="early", window=1)).job
    late = q.enqueue(req(jobId="late", window=1)).job
    assert q.get(early.id).status == "canceled" and late.status == "queued"


def test_reposting_a_job_id_changes_nothing(q: Any, engine: Engine) -> None:
    first = q.enqueue(req(jobId="one")).job
    second = q.enqueue(req(jobId="two")).job
    before = {job_id: len(receipts_of(engine, job_id)) for job_id in (first.id, second.id)}
    again_one = q.enqueue(req(jobId="one"))
    again_two = q.enqueue(req(jobId="two"))
    assert (again_one.created, again_one.job.status) == (False, "canceled")
    assert (again_two.created, again_two.job.status) == (False, "queued")
    assert {job_id: len(receipts_of(engine, job_id)) for job_id in before} == before


def test_a_batch_debounces_item_by_item_in_order(q: Any, engine: Engine) -> None:
    results = q.enqueue_many(
        [req(jobId="b-1"), req(jobId="x-1", key="x"), req(jobId="b-2"), req(jobId="b-3"), req(jobId="b-3")]
    )
    assert [r.created for r in results] == [True, True, True, True, False]
    assert [q.get(qualify(ORG_A, i)).status for i in ("b-1", "b-2", "b-3", "x-1")] == [
        "canceled",
        "canceled",
        "queued",
        "queued",
    ]
    assert receipts_of(engine, qualify(ORG_A, "b-1"))[-1].body[REPLACED_BY_FIELD] == "b-2"
    assert receipts_of(engine, qualify(ORG_A, "b-2"))[-1].body[REPLACED_BY_FIELD] == "b-3"
    # A debounce across two batches: the second's item replaces the first's survivor.
    q.enqueue_many([req(jobId="b-4")])
    assert queued_with_key(engine, ORG_A, "k") == [qualify(ORG_A, "b-4")]


def test_a_singleton_cancel_that_takes_the_pending_job_first_leaves_the_debounce_nothing_to_do(
    q: Any, engine: Engine
) -> None:
    pending = q.enqueue(req(jobId="pending", sessionKey="s")).job
    result = q.enqueue(req(jobId="next", sessionKey="s", singletonMode="cancel"))
    assert result.created and result.canceled == (pending.id,)
    assert receipts_of(engine, pending.id)[-1].body == {"reason": "singleton cancel"}
    assert len(receipts_of(engine, pending.id)) == 2


def test_a_debounced_replay_replaces_the_queued_job_of_its_key(q: Any, engine: Engine) -> None:
    sources = [q.enqueue(req(jobId=f"src-{n}", key=f"s{n}")).job for n in range(3)]
    for job in sources:
        assert q.fail(job.id, None, None, "boom", retryable=False).job.status == "failed"
    pending = q.enqueue(req(jobId="pending", key="shared")).job
    # Each replay keeps its source's flow but for the key, which this test points at one key.
    items = []
    for n, job in enumerate(sources):
        replay = replay_request(job, replay_key="r", flow={"debounce": {"key": "shared", "windowMs": 5_000}})
        items.append((job.id, replay))
        assert replay.flow.debounce is not None and replay.flow.debounce.key == "shared", n
    results = q.replay_many(items)
    assert all(not isinstance(r, Exception) and r.created for r in results)
    assert q.get(pending.id).status == "canceled"
    survivors = queued_with_key(engine, ORG_A, "shared")
    last = results[-1]
    assert not isinstance(last, Exception) and survivors == [last.job.id]


def test_a_system_batch_refuses_a_debounce(queue: Queue) -> None:
    with pytest.raises(ValueError, match="debounce"):
        queue.batch(lambda b: b.enqueue_new([(req(jobId="sys"), None)]))


@pytest.mark.one_backend
def test_concurrent_enqueues_of_one_key_end_with_exactly_one_queued_job(pg_engine: Engine) -> None:
    """Sixteen threads released together (PostgreSQL: SQLite serialises every writer anyway)."""
    queue = queue_for(pg_engine)
    threads = 16
    barrier = threading.Barrier(threads, timeout=30)

    def post(n: int) -> str:
        barrier.wait()
        return queue.enqueue(req(jobId=f"race-{n}")).job.id

    with ThreadPoolExecutor(max_workers=threads) as pool:
        ids = [f.result(timeout=60) for f in [pool.submit(post, n) for n in range(threads)]]
    assert len(set(ids)) == threads
    [survivor] = queued_with_key(pg_engine, ORG_A, "k")
    replaced_by = {}
    for job_id in ids:
        assert_projection_equals_fold(pg_engine, job_id)
        job = queue.get(job_id)
        assert job is not None
        if job_id == survivor:
            assert job.status == "queued"
            continue
        last = receipts_of(pg_engine, job_id)[-1]
        assert (job.status, last.type, last.body["reason"]) == ("canceled", "job.canceled", DEBOUNCED_REASON)
        replaced_by[client_id_of(job_id)] = last.body[REPLACED_BY_FIELD]
    # Each replaced job names a later one: the chain of replacements ends at the survivor.
    at = next(iter(set(replaced_by) - set(replaced_by.values())))
    seen = [at]
    while at in replaced_by:
        at = replaced_by[at]
        seen.append(at)
    assert at == client_id_of(survivor) and len(seen) == threads
    assert_stream_times_never_go_back(pg_engine)
