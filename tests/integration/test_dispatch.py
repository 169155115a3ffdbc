"""The delivery path: driver starter and driver, then one real in-process Celery worker end to end.

Spec steps 2-4 ("Dispatch outbox", "Driver RPC", "Driver executes"). The driver-branch tests run on
every backend against a real Celery app whose ``send_task`` records; the worker test runs the real
dispatch -> driver -> execute chain through Redis with ``celery.contrib.testing.worker``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.errors import STALE_ACTIVE_LEASE_ERROR, generations_exceeded_message
from app.jobs.routing import (
    DISPATCH_TASK,
    DRIVER_QUEUE,
    DRIVER_TASK,
    EXECUTE_TASK,
    MAINTENANCE_QUEUE,
    QUEUES,
    route,
)
from app.jobs.vocab import job_stream
from app.storage.db import db_now, deliveries, parse_iso, transaction
from app.storage.delivery import redrive_key
from delivery import dispatch, listeners, wakes
from delivery.callbacks import Callbacks
from delivery.client import DeliveryClient
from devharness.credits import offer_slots
from tasks.celery_app import make_celery
from tests.support.queue_ops import lease
from workers import attempts, loop_passes
from workers.handler import JobContext
from workers.runtime import Runtime

from .runtime_support import (
    Recorder,
    RecordingCallbacks,
    enqueue,
    isolate_broker,
    receipts_of,
    recording_runtime,
    registry_of,
    settings_for,
    types_of,
    wait_lease_past_deadline,
    wait_until,
    with_wake_list,
)

LONG_MS = 600_000


@pytest.fixture
def runtime(engine: Engine, redis_url: str) -> Iterator[tuple[Runtime, Recorder, RecordingCallbacks]]:
    yield recording_runtime(engine, settings_for(redis_url, JOB_LEASE_MS="3000"))


def delivery_rows(engine: Engine, job_id: str) -> list[tuple[str, int, str, str | None]]:
    with engine.connect() as conn:
        return [
            (r.dispatch_key, r.generation, r.state, r.outcome)
            for r in conn.execute(
                select(deliveries)
                .where(deliveries.c.job_id == job_id)
                .order_by(deliveries.c.created_at, deliveries.c.generation)
            )
        ]


def started(rt: Runtime, sent: Recorder, job_id: str) -> tuple[str, int]:
    """Run the driver starter for a job and return the (dispatch key, generation) it sent."""
    decision = dispatch.start_driver(rt, job_id, job_id)
    assert decision is not None and decision.created
    [driver] = [
        t for t in sent.named(DRIVER_TASK) if t.args[0] == job_id and t.args[2] == decision.generation
    ]
    assert driver.queue == DRIVER_QUEUE
    assert driver.task_id == f"{job_id}:driver:{decision.generation}"
    sent.clear()
    return driver.args[1], driver.args[2]


def listening_runtime(engine: Engine, redis_url: str) -> tuple[Runtime, Recorder]:
    rt, sent, _ = recording_runtime(engine, settings_for(redis_url))
    return with_wake_list(rt, redis_url), sent


# -- the driver starter ------------------------------------------------------------------------------


def test_enqueue_wakes_the_scanner_with_a_small_message_of_ids(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")
    [wake] = sent.sent
    assert (wake.name, wake.args, wake.queue) == (DISPATCH_TASK, [[job.id]], DRIVER_QUEUE)


def test_scanner_pass_starts_one_driver_per_job_and_a_second_pass_sends_nothing(runtime: Any) -> None:
    rt, sent, _ = runtime
    a, b = enqueue(rt.queue, "factory"), enqueue(rt.queue, "factory")
    sent.clear()
    assert dispatch.dispatch_jobs(rt, [a.id, b.id]) == {"started": [a.id, b.id]}
    # The scan runs in the driver role, so it drives in-process: no driver hop, straight to the
    # worker message under each job's first attempt fence.
    assert sent.named(DRIVER_TASK) == []
    assert sent.attempt_fences() == sorted([f"{a.id}:attempt:1", f"{b.id}:attempt:1"])
    sent.clear()
    # Both deliveries still pending: created False, reason active_delivery, nothing sent.
    assert dispatch.dispatch_jobs(rt, [a.id, b.id]) == {"started": []}
    assert sent.sent == []


def test_coalesced_wake_ups_one_message_one_scan_one_claim_transaction(
    engine: Engine, redis_url: str
) -> None:
    """With the Redis wake list, five enqueues send one wake-up; its scan claims all five
    in one transaction (one commit) and sends their five worker messages."""
    from sqlalchemy import event

    rt, sent = listening_runtime(engine, redis_url)
    assert rt.wakes is not None
    jobs = [enqueue(rt.queue, "factory") for _ in range(5)]
    [wake] = sent.sent
    assert (wake.name, wake.args) == (DISPATCH_TASK, [[]])
    sent.clear()
    commits: list[int] = []

    def count(_conn: Any) -> None:
        commits.append(1)

    event.listen(engine, "commit", count)
    try:
        assert dispatch.dispatch_jobs(rt, []) == {"started": sorted(j.id for j in jobs)}
    finally:
        event.remove(engine, "commit", count)
    assert len(commits) == 1
    assert sent.attempt_fences() == sorted(f"{j.id}:attempt:1" for j in jobs)
    # Drained and disarmed: the next enqueue arms (and sends) a new wake-up.
    assert rt.wakes.take(10) == []
    sent.clear()
    late = enqueue(rt.queue, "factory")
    assert [t.args for t in sent.named(DISPATCH_TASK)] == [[[]]]
    assert dispatch.dispatch_jobs(rt, [])["started"] == [late.id]


def test_a_listening_driver_is_woken_by_the_push_itself_and_no_wake_up_message_is_sent(
    engine: Engine, redis_url: str
) -> None:
    """While a driver listens on the wake list, an enqueue publishes no ``receipt.dispatch``: the
    push wakes the listener, whose scan claims the job and sends its worker message. Once it stops
    (its key withdrawn), the next enqueue sends a wake-up message again."""
    import redis

    rt, sent = listening_runtime(engine, redis_url)
    assert rt.wakes is not None
    client = redis.Redis.from_url(redis_url)
    listener = listeners.WakeListener(rt)
    listener.start()
    try:
        wait_until(lambda: client.exists(rt.wakes.listening_key) if rt.wakes else False, what="listening")
        job = enqueue(rt.queue, "factory")
        wait_until(lambda: sent.named(EXECUTE_TASK), what="the worker message")
        assert sent.named(DISPATCH_TASK) == []
        assert [t.task_id for t in sent.named(EXECUTE_TASK)] == [f"{job.id}:attempt:1"]
        assert delivery_rows(engine, job.id) == [(job.id, 0, "pending", None)]
        assert listener.scans == 1
    finally:
        listener.stop()
    sent.clear()
    rt.wakes.disarm()  # armed by the pushes above, which the listener answered
    late = enqueue(rt.queue, "factory")
    assert [t.args for t in sent.named(DISPATCH_TASK)] == [[[]]]
    assert rt.wakes.take(10) == [late.id]


def test_a_dead_listener_stops_holding_messages_back_once_its_key_expires(redis_url: str) -> None:
    """A listener that dies without withdrawing its key holds wake-up messages back for at most
    the key's TTL (the queued redrive covers ids pushed meanwhile, as for a lost message)."""
    import redis

    wl = wakes.WakeList(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.set(wl.listening_key, b"1", px=200)  # a listener's key, about to expire
    assert wl.push(["a"]) is False  # a listener is taken to be blocked on the list
    wl.disarm()
    wait_until(lambda: not client.exists(wl.listening_key), what="the key to expire")
    assert wl.push(["b"]) is True
    assert client.pttl(wl.listening_key) == -2
    # listen(): renews the key (TTL LISTENING_TTL_MS), takes what is there, disarms.
    assert wl.listen(10, block_s=0.05) == ["a", "b"]
    assert 0 < client.pttl(wl.listening_key) <= wakes.LISTENING_TTL_MS
    assert not client.exists(wl.armed_key)
    assert wl.listen(10, block_s=0.05) == []


def test_the_push_script_on_the_real_server_arms_once_and_slices_a_long_push(redis_url: str) -> None:
    """The push is one Lua script (RPUSH in slices of 1 000 ids, SET NX PX, EXISTS): on
    redis-server itself, 2 500 ids land in order, the armed key carries ARMED_TTL_MS, and a script
    cache emptied by SCRIPT FLUSH (as by a restart) is filled again by the next push."""
    import redis

    wl = wakes.WakeList(redis_url)
    client = redis.Redis.from_url(redis_url)
    ids = [f"job-{n:05d}" for n in range(2_500)]
    assert wl.push(ids) is True
    assert 0 < client.pttl(wl.armed_key) <= wakes.ARMED_TTL_MS
    client.script_flush()
    assert wl.push(["last"]) is False  # armed already: the scan to come takes this one too
    assert wl.disarm_and_take(3_000) == [*ids, "last"]


def test_a_listener_on_a_redis_without_blmpop_falls_back_to_blpop_and_a_take(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BLMPOP (one blocking call per batch) is Redis 7; an older server answers "unknown command",
    and the listener then blocks with BLPOP and takes the rest of its batch in a second call."""
    import redis

    wl = wakes.WakeList(redis_url)
    calls: list[str] = []

    def no_blmpop(*_a: Any, **_k: Any) -> Any:
        calls.append("blmpop")
        raise redis.exceptions.ResponseError("unknown command 'BLMPOP', with args beginning with: ")

    monkeypatch.setattr(wl._client, "blmpop", no_blmpop)
    assert wl.push(["a", "b", "c"]) is True
    assert wl.listen(2, block_s=0.05) == ["a", "b"]
    assert wl.listen(10, block_s=0.05) == ["c"]
    assert wl.listen(10, block_s=0.05) == []
    assert calls == ["blmpop"]  # asked once; the answer is remembered


def test_starter_ignores_jobs_that_are_not_queued(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")
    rt.queue.cancel(job.id)
    sent.clear()
    assert dispatch.start_driver(rt, job.id, job.id) is None
    assert dispatch.start_driver(rt, "no-such-job", "no-such-job") is None
    assert sent.sent == []


def test_a_send_failure_settles_the_delivery_so_the_next_pass_can_retry(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")

    def broken(*_a: Any, **_k: Any) -> None:
        raise ConnectionError("broker down")

    rt.app.send_task = broken
    with pytest.raises(ConnectionError):
        dispatch.start_driver(rt, job.id, job.id)
    assert delivery_rows(rt.engine, job.id) == [(job.id, 0, "settled", "send_failed")]
    rt.app.send_task = sent
    again = dispatch.start_driver(rt, job.id, job.id)
    assert again is not None and again.generation == 1


def broker_runtime(engine: Engine, redis_url: str) -> tuple[Runtime, RecordingCallbacks, Any]:
    """A recording runtime whose worker messages really go to Redis (a private key namespace),
    and a client reading the chat queue they go to."""
    import redis

    # One message per attempt: these tests count the queue's messages as attempts.
    settings = settings_for(redis_url, RECEIPT_DELIVERY_BATCH_MAX="1")
    app = isolate_broker(make_celery(settings))
    rt, _sent, callbacks = recording_runtime(engine, settings, app=app)
    del app.send_task  # the real one: messages leave through the broker
    prefix = app.conf.broker_transport_options["global_keyprefix"]
    client = redis.Redis.from_url(redis_url)
    return rt, callbacks, lambda: client.llen(prefix + route("factory", "factory.run").queue)


def test_a_scan_batch_sends_its_worker_messages_in_one_pipeline_when_the_batch_is_claimed(
    engine: Engine, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Their worker messages go out in one pipeline. None has left while the batch is
    # still being driven; all of them have when the scan returns.
    rt, callbacks, queued = broker_runtime(engine, redis_url)
    jobs = [enqueue(rt.queue, "factory") for _ in range(3)]
    seen: list[int] = []
    real = dispatch.deliver

    def watching(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        seen.append(queued())
        return out

    monkeypatch.setattr(dispatch, "deliver", watching)
    assert sorted(dispatch.dispatch_jobs(rt, [j.id for j in jobs])["started"]) == sorted(j.id for j in jobs)
    assert seen == [0, 0, 0]
    assert queued() == 3
    assert callbacks.events() == ["dispatched"] * 3


def test_a_batch_that_cannot_be_sent_ends_every_delivery_in_it_and_forgets_its_callbacks(
    engine: Engine, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.transport import redis as kombu_redis

    rt, callbacks, queued = broker_runtime(engine, redis_url)
    jobs = [enqueue(rt.queue, "factory") for _ in range(2)]

    def broken(self: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(kombu_redis.PublishBatch, "flush", broken)
    with pytest.raises(ConnectionError):
        dispatch.dispatch_jobs(rt, [j.id for j in jobs])
    assert queued() == 0
    for job in jobs:
        assert delivery_rows(rt.engine, job.id) == [(job.id, 0, "settled", "send_failed")]
    # Each "dispatched" event was forgotten: no message left.
    assert sorted(map(str, callbacks.forgotten)) == sorted(f"dispatched:{j.id}:attempt:1" for j in jobs)
    monkeypatch.undo()
    assert sorted(dispatch.dispatch_jobs(rt, [j.id for j in jobs])["started"]) == sorted(j.id for j in jobs)
    assert queued() == 2


def test_generations_exceeded_fails_the_job_with_the_exact_message(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, "factory", max_attempts=8)
    with transaction(rt.engine) as conn:
        now = db_now(conn)
        for g in range(32):
            conn.execute(
                deliveries.insert().values(
                    dispatch_key=job.id,
                    purpose="dispatch",
                    observed="",
                    generation=g,
                    job_id=job.id,
                    task_id=f"{job.id}:driver:{g}",
                    state="settled",
                    outcome="lease_lost",
                    created_at=now,
                    deadline_at=now + timedelta(minutes=2),
                    settled_at=now,
                )
            )
    sent.clear()
    assert dispatch.start_driver(rt, job.id, job.id) is None
    failed = rt.queue.get(job.id)
    assert failed is not None
    assert failed.status == "failed"  # non-retryable despite 8 attempts allowed
    assert failed.error == generations_exceeded_message(job.id)
    assert failed.error == f"resonate delivery recovery exceeded 32 generations for {job.id}"
    assert sent.named(DRIVER_TASK) == []
    assert callbacks.events() == ["failed"]


# -- the driver's branches ---------------------------------------------------------------------------


def test_driver_on_a_terminal_job_only_settles_its_delivery(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")
    key, generation = started(rt, sent, job.id)
    rt.queue.cancel(job.id, "no longer needed")
    sent.clear()
    assert dispatch.drive(rt, job.id, key, generation) == {"outcome": "terminal_state"}
    assert sent.sent == []
    # The cancel's own transaction ended the delivery it made pointless (its outcome wins).
    assert delivery_rows(rt.engine, job.id) == [(key, generation, "settled", "canceled")]


def test_driver_on_a_live_lease_sends_nothing(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, "factory")
    key, generation = started(rt, sent, job.id)
    assert lease(rt.queue, job.id, "busy-worker", LONG_MS).applied
    before = types_of(rt.engine, job.id)
    assert dispatch.drive(rt, job.id, key, generation) == {"outcome": "active_lease"}
    assert sent.sent == []
    assert callbacks.events() == []
    assert types_of(rt.engine, job.id) == before  # the driver never leases nor fails a live lease


def test_driver_fails_a_stale_active_lease_with_the_exact_error(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, "factory", max_attempts=2)
    key, generation = started(rt, sent, job.id)
    assert lease(rt.queue, job.id, "dead-worker", 1).applied
    wait_lease_past_deadline(rt.engine, rt.queue, job.id)
    assert dispatch.drive(rt, job.id, key, generation) == {"outcome": "stale_active_lease"}
    last = receipts_of(rt.engine, job.id)[-1]
    assert last.type == "job.failed"
    assert last.body["error"] == STALE_ACTIVE_LEASE_ERROR
    assert last.body["error"] == "stale active Resonate job lost execution; retrying through Resonate driver"
    assert last.body["retryable"] is True
    requeued = rt.queue.get(job.id)
    assert requeued is not None and (requeued.status, requeued.attempt) == ("queued", 1)
    # Requeued -> the ordinary path: a wake-up for the scanner, no worker message from this pass.
    assert [t.name for t in sent.sent] == [DISPATCH_TASK]
    assert callbacks.events() == []
    assert delivery_rows(rt.engine, job.id) == [(key, generation, "settled", "stale_active_lease")]


def test_driver_stale_lease_on_the_last_attempt_fails_the_job(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, "factory", max_attempts=1)
    key, generation = started(rt, sent, job.id)
    assert lease(rt.queue, job.id, "dead-worker", 1).applied
    wait_lease_past_deadline(rt.engine, rt.queue, job.id)
    dispatch.drive(rt, job.id, key, generation)
    failed = rt.queue.get(job.id)
    assert failed is not None
    assert (failed.status, failed.error) == ("failed", STALE_ACTIVE_LEASE_ERROR)
    assert callbacks.events() == ["failed"]


def test_driver_honours_abort_requested_on_a_queued_job(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, "factory")
    key, generation = started(rt, sent, job.id)
    rt.queue.command(job.id, "abort", reason="user stop")
    assert dispatch.drive(rt, job.id, key, generation) == {"outcome": "canceled"}
    canceled = rt.queue.get(job.id)
    assert canceled is not None
    assert (canceled.status, canceled.error, canceled.attempt) == ("canceled", "user stop", 0)
    assert sent.named(EXECUTE_TASK) == []
    assert callbacks.events() == ["canceled"]


@pytest.mark.parametrize(
    ("agent", "kind", "queue_name"),
    [
        ("factory", "factory.task.run", "receipt-chat"),
        ("factory", "factory.dispatch", "receipt-chat"),  # the spec's noted disagreement with the contract
        ("codex", "factory.task.run", "receipt-codex"),
        ("factory", "factory.integration.publish", "receipt-codex"),
        ("factory-control", "factory.objective.control", "receipt-control"),
        ("factory-monitor", "factory.task.monitor", "receipt-chat"),
        ("unknown-agent", "factory.run", "receipt-chat"),
    ],
)
def test_driver_sends_the_worker_message_under_the_attempt_fence_to_the_routed_queue(
    runtime: Any,
    agent: str,
    kind: str,
    queue_name: str,
) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, agent, kind=kind)
    key, generation = started(rt, sent, job.id)
    out = dispatch.drive(rt, job.id, key, generation)
    fence = f"{job.id}:attempt:1"
    assert out == {"outcome": "dispatched", "fence": fence, "queue": queue_name}
    assert queue_name == route(agent, kind).queue
    [execute] = sent.sent
    assert (execute.name, execute.task_id, execute.queue) == (EXECUTE_TASK, fence, queue_name)
    assert execute.args == [job.id, fence, key, generation]
    # The driver never leases: the job is still queued, and its delivery still pending.
    assert types_of(rt.engine, job.id)[-1] == "job.enqueued"
    assert delivery_rows(rt.engine, job.id) == [(key, generation, "pending", None)]
    assert callbacks.events() == ["dispatched"]


def test_the_fence_names_the_next_attempt(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory", max_attempts=3)
    assert lease(rt.queue, job.id, "w", LONG_MS).applied
    assert rt.queue.fail(job.id, "w", 1, "try again", retryable=True).applied
    key, generation = started(rt, sent, job.id)
    assert dispatch.drive(rt, job.id, key, generation)["fence"] == f"{job.id}:attempt:2"


# -- one real in-process worker: dispatch -> driver -> execute through Redis -------------------------


def test_a_job_completes_through_a_real_worker(
    pg_engine: Engine, pg_database_url: str, redis_url: str
) -> None:
    from celery.contrib.testing.worker import start_worker

    settings = settings_for(redis_url, DATABASE_URL=pg_database_url, JOB_LEASE_MS="3000")
    app = isolate_broker(make_celery(settings))
    ran = threading.Event()

    def noop(ctx: JobContext) -> Any:
        ran.set()
        return {"noop": True, "attempt": ctx.attempt}

    client = DeliveryClient(app)
    queue = queue_for(pg_engine, on_dispatchable=client.wake)
    offer_slots(pg_engine, slots=4)
    app.receipt_runtime = Runtime(
        settings=settings,
        app=app,
        engine=pg_engine,
        queue=queue,
        registry=registry_of({"bench-noop": noop}),
        callbacks=Callbacks(settings),
        delivery=client,
    )
    queues = [DRIVER_QUEUE, MAINTENANCE_QUEUE, *QUEUES.values()]
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=queues,
        loglevel="WARNING",
        shutdown_timeout=15,
    ):
        job = enqueue(queue, "bench-noop")
        unknown = enqueue(queue, "nobody-home", kind="factory.run")

        def settled() -> bool:
            a, b = queue.get(job.id), queue.get(unknown.id)
            return bool(a and b and a.terminal and b.terminal)

        wait_until(settled, timeout=20, what="both jobs to settle through the worker")
    assert ran.is_set()
    done = queue.get(job.id)
    assert done is not None
    assert (done.status, done.result) == ("completed", {"noop": True, "attempt": 1})
    assert types_of(pg_engine, job.id) == ["job.enqueued", "job.leased", "job.heartbeat", "job.completed"]
    failed = queue.get(unknown.id)
    assert failed is not None
    assert (failed.status, failed.error) == ("failed", "No handler for agent 'nobody-home'")
    # Each delivery was recorded under the job id and settled by the worker's attempt.
    rows = delivery_rows(pg_engine, job.id)
    assert rows == [(job.id, 0, "settled", "completed")]


def test_a_saturated_threads_worker_without_prefetch_keeps_fetching(redis_url: str) -> None:
    """With every slot busy the transport stops polling; it must resume within a tick, not ~1 s.

    Task events are off here: they would wake the loop as a side effect and hide the stall
    (30 x 50 ms tasks on 2 threads took ~14 s instead of ~0.8 s).
    """

    from celery.contrib.testing.worker import start_worker

    app = isolate_broker(make_celery(settings_for(redis_url)))
    assert app.conf.worker_disable_prefetch is True
    app.conf.worker_send_task_events = False
    app.conf.task_send_sent_event = False
    finished = threading.Semaphore(0)

    def short() -> None:
        threading.Event().wait(0.05)
        finished.release()

    app.task(name="test.short", shared=False)(short)

    tasks_n = 30
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        queues=[QUEUES["chat"]],
        loglevel="WARNING",
        shutdown_timeout=15,
    ):
        for _ in range(tasks_n):
            app.send_task("test.short", queue=QUEUES["chat"])
        # Every task runs; how long the rounds take (ideal 15 x 50 ms, a one-second stall per round
        # ~15 s) is a figure, printed by bench/prefetch_stall_bench.py, not a timed assertion.
        for _ in range(tasks_n):
            assert finished.acquire(timeout=60)


# -- a requeue's wake-up racing its own delivery's settlement --------------------------------------


def fast_scanner(rt: Runtime, sent: Recorder) -> None:
    """Handle every dispatch wake-up the instant it is sent: the scanner winning every race."""

    def send(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        sent(name, args, kwargs, **options)
        if name == DISPATCH_TASK:
            dispatch.dispatch_jobs(rt, args[0])

    rt.app.send_task = send


def test_a_retryable_failure_is_redelivered_at_once_even_if_the_scanner_wins_the_race(runtime: Any) -> None:
    """The requeue wakes the scanner while this delivery is still pending; the retry must not wait
    for the queued redrive (min age 30 s): a new driver generation is started right away."""
    from workers.handler import HandlerError

    rt, sent, _ = runtime

    def flaky(ctx: JobContext) -> Any:
        if ctx.attempt == 1:
            raise HandlerError("upstream blip", retryable=True)
        return {"ok": True}

    rt.registry = registry_of({"factory": flaky})
    rt.settings = replace(rt.settings, retry_backoff_ms=0)  # this race is about the wake-up, not backoff
    fast_scanner(rt, sent)
    job = enqueue(rt.queue, "factory", max_attempts=2)
    [execute_msg] = sent.named(EXECUTE_TASK)
    out = attempts.execute(rt, *execute_msg.args)
    assert (out["status"], out["jobStatus"]) == ("failed", "queued")
    deliveries = [(t.task_id, t.args[3]) for t in sent.named(EXECUTE_TASK)]
    assert deliveries == [(f"{job.id}:attempt:1", 0), (f"{job.id}:attempt:2", 1)], (
        "the retry needs a second delivery generation now, not after the redrive"
    )


def test_a_stale_lease_requeue_is_redelivered_at_once_even_if_the_scanner_wins_the_race(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory", max_attempts=2)
    key, generation = started(rt, sent, job.id)
    assert lease(rt.queue, job.id, "dead-worker", 1).applied
    wait_lease_past_deadline(rt.engine, rt.queue, job.id)
    fast_scanner(rt, sent)
    assert dispatch.drive(rt, job.id, key, generation) == {"outcome": "stale_active_lease"}
    assert [(t.task_id, t.args[3]) for t in sent.named(EXECUTE_TASK)] == [
        (f"{job.id}:attempt:2", generation + 1)
    ]


# -- retry backoff ----------------------------------------------------------------------------------


def test_a_retry_backs_off_then_the_due_retries_pass_delivers_it(runtime: Any) -> None:
    """A retryable failure records retryAt = database now + RECEIPT_RETRY_BACKOFF_MS x 2^(attempt-1);
    no delivery starts before it (wake-up and redrive alike); the due-retries pass starts it after."""
    from workers.handler import HandlerError

    rt, sent, _ = runtime
    rt.settings = replace(rt.settings, retry_backoff_ms=400)

    def flaky(ctx: JobContext) -> Any:
        if ctx.attempt == 1:
            raise HandlerError("upstream blip", retryable=True)
        return {"ok": True}

    rt.registry = registry_of({"factory": flaky})
    fast_scanner(rt, sent)
    job = enqueue(rt.queue, "factory", max_attempts=2)
    [first] = sent.named(EXECUTE_TASK)
    sent.clear()
    out = attempts.execute(rt, *first.args)
    assert (out["status"], out["jobStatus"]) == ("failed", "queued")
    requeued = rt.queue.get(job.id)
    assert requeued is not None and requeued.available_at is not None
    [failed] = [r for r in read_stream_of(rt.engine, job.id) if r.type == "job.failed"]
    retry_at, failed_at = parse_iso(failed.body["retryAt"]), parse_iso(failed.at)
    assert retry_at is not None and failed_at is not None
    waited = retry_at - failed_at
    assert waited.total_seconds() * 1000 == 400
    # Backing off: the requeue's own wake-up, a redrive and the due pass all start nothing yet.
    assert sent.named(EXECUTE_TASK) == []
    assert dispatch.start_driver(rt, job.id, redrive_key(job.id, requeued.seq, "queued")) is None
    assert loop_passes.dispatch_due_retries(rt) == {"started": []}
    assert delivery_rows(rt.engine, job.id) == [(job.id, 0, "settled", "failed")]
    # Once the database clock passes retryAt, the due pass starts the next generation.
    wait_until_db_time(rt.engine, parse_iso(failed.body["retryAt"]))
    rt.settings = replace(rt.settings, retry_scan_interval_ms=0)
    assert loop_passes.dispatch_due_retries(rt) == {"started": [job.id]}
    # The due pass moves the job's line: its worker message leaves under the next attempt's fence.
    [message] = sent.named(EXECUTE_TASK)
    assert message.args == [job.id, f"{job.id}:attempt:2", job.id, 1]


def test_a_delayed_job_is_not_delivered_before_available_at_then_the_due_pass_starts_it(runtime: Any) -> None:
    """The enqueue's own wake-up and a redrive start nothing while the job waits; once the database
    clock passes availableAt, the due-retries pass starts it (within one scan)."""
    from app.jobs.validation import validate_enqueue

    rt, sent, _ = runtime
    fast_scanner(rt, sent)
    body = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}
    job = rt.queue.enqueue(validate_enqueue("factory", {**body, "delayMs": 700})).job
    assert job.status == "queued" and job.available_at is not None
    assert [t.name for t in sent.sent] == [DISPATCH_TASK]  # woken, and the scan claimed nothing
    assert delivery_rows(rt.engine, job.id) == []
    assert dispatch.start_driver(rt, job.id, redrive_key(job.id, job.seq, "queued")) is None
    rt.settings = replace(rt.settings, retry_scan_interval_ms=0)
    assert loop_passes.dispatch_due_retries(rt) == {"started": []}
    wait_until_db_time(rt.engine, parse_iso(job.available_at))
    assert loop_passes.dispatch_due_retries(rt) == {"started": [job.id]}
    [message] = sent.named(EXECUTE_TASK)
    assert message.args[1] == f"{job.id}:attempt:1"


def read_stream_of(engine: Engine, job_id: str) -> list[Any]:
    from app.storage import store

    with engine.connect() as conn:
        return store.read_stream(conn, job_stream(job_id))


def wait_until_db_time(engine: Engine, when: Any, timeout: float = 10.0) -> None:
    """Poll the database clock (bounded) until it passes ``when``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if db_now(conn) > when:
                return
        threading.Event().wait(0.05)
    raise AssertionError(f"database clock never passed {when}")
