"""Batched deliveries (``RECEIPT_DELIVERY_BATCH_MAX`` above 1) on the real database and Redis.

The driver's scan sends the attempts bound for one worker queue as ``receipt.execute_batch``
messages of up to that many items (``delivery/dispatch.py``); the worker leases a batch's items in one
statement within its process's slots, runs them on threads, and settles each as a single delivery
(``workers/attempts.py``). Every record stays per delivery: ``dispatched`` callbacks, fetch records,
delivery rows. The real processes (a worker SIGKILLed holding a batch) are tests/e2e/test_faults.py.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from app.jobs.routing import EXECUTE_BATCH_TASK, EXECUTE_TASK, QUEUES
from app.ops import metrics
from app.ops.shutdown import Shutdown
from app.storage.db import deliveries
from app.storage.delivery import driver_task_id
from app.storage.hooks import Change, Hook, Write
from app.storage.queue import Queue
from delivery import dispatch, fetches
from delivery.broker import RedisProbe
from tasks.celery_app import make_celery
from workers import attempts, loop_passes, runner
from workers.handler import JobContext
from workers.runtime import FETCH_GATED, Runtime
from workers.slots import Slots

from .runtime_support import (
    Recorder,
    RecordingCallbacks,
    enqueue,
    isolate_broker,
    recording_runtime,
    registry_of,
    settings_for,
    types_of,
    wait_until,
)

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

AGENT = "test-batch"  # no built-in handler: routed to the chat queue
CHAT = QUEUES["chat"]
BOUND_S = 10.0


class Gate:
    """A handler that records how many attempts run at once and blocks until opened."""

    def __init__(self, open_: bool = False) -> None:
        self.opened = threading.Event()
        if open_:
            self.opened.set()
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.ran: list[str] = []

    def __call__(self, ctx: JobContext) -> Any:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.ran.append(ctx.job.id)
        try:
            assert self.opened.wait(BOUND_S), "the gate never opened"
            return {"attempt": ctx.attempt}
        finally:
            with self.lock:
                self.running -= 1


def batch_runtime(
    engine: Engine,
    redis_url: str,
    handler: Any = None,
    batch_max: int = 8,
    slots: int = 8,
    gated: bool = True,
    **env: str,
) -> tuple[Runtime, Recorder, RecordingCallbacks]:
    """A worker process's runtime; ``gated``: its consumer fetches nothing while every slot is
    taken, as a Redis worker's does (``tasks/consumer.py``)."""
    settings = settings_for(redis_url, RECEIPT_DELIVERY_BATCH_MAX=str(batch_max), JOB_LEASE_MS="5000", **env)
    rt, sent, callbacks = recording_runtime(engine, settings, registry_of({AGENT: handler or Gate(True)}))
    rt.app.receipt_slots = Slots(slots)
    setattr(rt.app, FETCH_GATED, gated)
    return rt, sent, callbacks


def dispatched_items(rt: Runtime, sent: Recorder, job_ids: list[str]) -> list[list[Any]]:
    """Scan these jobs; the items of the one batch message it sends."""
    sent.clear()
    dispatch.dispatch_jobs(rt, job_ids)
    [message] = sent.named(EXECUTE_BATCH_TASK)
    sent.clear()
    items: list[list[Any]] = message.args[0]
    return items


def handed_back(reason: str) -> float:
    """This process's ``receipt_attempts_handed_back_total`` for ``reason`` so far."""
    assert reason in metrics.HAND_BACK_REASONS
    metrics.registry_metrics()
    value = REGISTRY.get_sample_value("receipt_attempts_handed_back_total", {"reason": reason})
    return value or 0.0


def delivery_rows(engine: Engine, job_id: str) -> list[tuple[int, str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(deliveries).where(deliveries.c.job_id == job_id).order_by(deliveries.c.generation)
        ).all()
    return [(r.generation, r.state, r.outcome) for r in rows]


@pytest.fixture
def recorder(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[fetches.Recorder]:
    """This process as a consumer that records its fetches (as a worker process does)."""
    rec = fetches.Recorder(settings_for(redis_url))
    rec.start()
    monkeypatch.setattr(fetches, "_recorder", rec)
    try:
        yield rec
    finally:
        rec.stop()
        rec.client.close()


# -- the driver ------------------------------------------------------------------------------------


def test_a_scan_groups_its_attempts_by_worker_queue_in_messages_of_at_most_batch_max(
    engine: Engine, redis_url: str
) -> None:
    rt, sent, callbacks = batch_runtime(engine, redis_url, batch_max=3)
    chat = [enqueue(rt.queue, AGENT) for _ in range(7)]
    codex = [enqueue(rt.queue, "codex") for _ in range(2)]
    sent.clear()
    ids = [j.id for j in chat + codex]
    assert sorted(dispatch.dispatch_jobs(rt, ids)["started"]) == sorted(ids)

    batches = sent.named(EXECUTE_BATCH_TASK)
    singles = sent.named(EXECUTE_TASK)
    by_queue = sorted((m.queue, len(m.args[0])) for m in batches)
    assert by_queue == sorted([(CHAT, 3), (CHAT, 3), (QUEUES["codex"], 2)])
    # A group of one goes as the ordinary message, under its fence.
    [single] = singles
    assert single.queue == CHAT and single.task_id == f"{single.args[0]}:attempt:1"
    items = [item for m in batches for item in m.args[0]] + [single.args]
    # Every attempt exactly once, each under its own fence, delivery key and generation.
    assert sorted(items) == sorted([[i, f"{i}:attempt:1", i, 0] for i in ids])
    for m in batches:
        [first, *_] = m.args[0]
        assert m.task_id == f"{first[1]}:batch:{len(m.args[0])}"
        assert {route_queue(rt, item[0]) for item in m.args[0]} == {m.queue}
    # Every per-delivery record stays per delivery.
    assert callbacks.events() == ["dispatched"] * len(ids)
    for i in ids:
        assert delivery_rows(engine, i) == [(0, "pending", None)]


def route_queue(rt: Runtime, job_id: str) -> str:
    from app.jobs.routing import route

    job = rt.queue.get(job_id)
    assert job is not None
    return route(job.agent_id, job.kind).queue


def test_each_delivery_of_a_batch_is_recorded_sent_before_and_fetched_on_receipt(
    engine: Engine, redis_url: str, recorder: fetches.Recorder
) -> None:
    rt, sent, _ = batch_runtime(engine, redis_url)
    jobs = [enqueue(rt.queue, AGENT) for _ in range(3)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    client = redis.Redis.from_url(redis_url)
    try:
        keys = [fetches.FETCH_PREFIX + driver_task_id(item[2], item[3]) for item in items]
        assert [client.get(k) for k in keys] == [f"sent {recorder.consumer}".encode()] * 3
        # The worker's one pipelined write on fetch names every delivery of the batch.
        fetches.on_task_received(
            sender=SimpleNamespace(app=rt.app), request=SimpleNamespace(name=EXECUTE_BATCH_TASK, args=[items])
        )
        assert [client.get(k) for k in keys] == [f"worker {recorder.consumer}".encode()] * 3
    finally:
        client.close()


def test_a_batch_max_of_one_sends_one_message_per_attempt(engine: Engine, redis_url: str) -> None:
    rt, sent, _ = batch_runtime(engine, redis_url, batch_max=1)
    jobs = [enqueue(rt.queue, AGENT) for _ in range(3)]
    sent.clear()
    dispatch.dispatch_jobs(rt, [j.id for j in jobs])
    assert sent.named(EXECUTE_BATCH_TASK) == []
    assert sorted(m.args for m in sent.named(EXECUTE_TASK)) == sorted(
        [[j.id, f"{j.id}:attempt:1", j.id, 0] for j in jobs]
    )


def test_a_batch_that_cannot_be_published_settles_every_item_send_failed(
    engine: Engine, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.transport import redis as kombu_redis

    settings = settings_for(redis_url, RECEIPT_DELIVERY_BATCH_MAX="8")
    app = isolate_broker(make_celery(settings))
    rt, _sent, callbacks = recording_runtime(engine, settings, app=app)
    del app.send_task  # the real one: messages leave through the broker
    prefix = app.conf.broker_transport_options["global_keyprefix"]
    client = redis.Redis.from_url(redis_url)
    jobs = [enqueue(rt.queue, AGENT) for _ in range(3)]

    def broken(self: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(kombu_redis.PublishBatch, "flush", broken)
    try:
        with pytest.raises(ConnectionError):
            dispatch.dispatch_jobs(rt, [j.id for j in jobs])
        assert client.llen(prefix + CHAT) == 0
        for job in jobs:
            assert delivery_rows(engine, job.id) == [(0, "settled", "send_failed")]
        assert sorted(map(str, callbacks.forgotten)) == sorted(f"dispatched:{j.id}:attempt:1" for j in jobs)
        monkeypatch.undo()
        # The next pass starts the next generation of each, again as one message.
        assert sorted(dispatch.dispatch_jobs(rt, [j.id for j in jobs])["started"]) == sorted(
            j.id for j in jobs
        )
        assert client.llen(prefix + CHAT) == 1
    finally:
        client.close()


# -- the worker ------------------------------------------------------------------------------------


def test_a_batch_runs_every_attempt_and_settles_each_delivery(engine: Engine, redis_url: str) -> None:
    gate = Gate(open_=True)
    rt, sent, callbacks = batch_runtime(engine, redis_url, gate)
    jobs = [enqueue(rt.queue, AGENT) for _ in range(4)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    out = attempts.execute_batch(rt, items)
    assert [r["status"] for r in out["items"]] == ["completed"] * 4
    assert [r["fence"] for r in out["items"]] == [item[1] for item in items]
    for job in jobs:
        assert types_of(engine, job.id) == ["job.enqueued", "job.leased", "job.heartbeat", "job.completed"]
        assert delivery_rows(engine, job.id) == [(0, "settled", "completed")]
        assert callbacks.events(job.id) == ["dispatched", "completed"]
    assert rt.slots.in_use == 0


def test_the_leases_of_a_batch_are_one_transaction(engine: Engine, redis_url: str) -> None:
    rt, sent, _ = batch_runtime(engine, redis_url, Gate(open_=True))
    jobs = [enqueue(rt.queue, AGENT) for _ in range(5)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    transactions: list[tuple[str, int]] = []
    queue = rt.queue
    real_many, real_alone = queue.mutate_many, queue.mutate_alone

    def many(batch: Any, **options: Any) -> Any:
        transactions.append(("many", len(batch)))
        return real_many(batch, **options)

    def alone(job_id: str, decide: Any) -> Any:
        transactions.append(("alone", 1))
        return real_alone(job_id, decide)

    queue.mutate_many = many  # type: ignore[method-assign,assignment]
    queue.mutate_alone = alone  # type: ignore[method-assign]
    attempts.execute_batch(rt, items)
    # The five leases first, in one transaction; then each attempt's own settlement.
    assert transactions[0] == ("many", 5)
    assert all(t == ("alone", 1) for t in transactions[1:])
    for job in jobs:
        assert types_of(engine, job.id) == ["job.enqueued", "job.leased", "job.heartbeat", "job.completed"]


def test_a_refused_item_ends_as_its_single_delivery_would_and_spoils_nothing_else(
    engine: Engine, redis_url: str
) -> None:
    gate = Gate(open_=True)
    rt, sent, callbacks = batch_runtime(engine, redis_url, gate)
    aborted, terminal, ok = (enqueue(rt.queue, AGENT) for _ in range(3))
    items = dispatched_items(rt, sent, [aborted.id, terminal.id, ok.id])
    rt.queue.command(aborted.id, "abort", reason="changed my mind")  # after the send, before the lease
    rt.queue.cancel(terminal.id, "gone")  # queued: canceled outright, a terminal job
    before = types_of(engine, terminal.id)
    out = {r["fence"]: r for r in attempts.execute_batch(rt, items)["items"]}

    assert out[f"{aborted.id}:attempt:1"]["status"] == "canceled"
    assert rt.queue.get(aborted.id).error == "changed my mind"  # type: ignore[union-attr]
    assert delivery_rows(engine, aborted.id) == [(0, "settled", "canceled")]
    assert out[f"{terminal.id}:attempt:1"]["status"] == "terminal_state"
    assert types_of(engine, terminal.id) == before  # nothing written for it
    assert delivery_rows(engine, terminal.id)[0][1] == "settled"
    assert out[f"{ok.id}:attempt:1"]["status"] == "completed"
    assert gate.ran == [ok.id]  # neither refused job's handler ran
    assert callbacks.events(ok.id) == ["dispatched", "completed"]
    assert rt.slots.in_use == 0


def test_a_batch_never_runs_more_attempts_than_the_slots_and_leases_the_rest_as_they_free(
    engine: Engine, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    # A hold longer than the test: the rest wait here for this process's slots.
    rt, sent, _ = batch_runtime(engine, redis_url, gate, slots=2, RECEIPT_DELIVERY_HOLD_MS="60000")
    jobs = [enqueue(rt.queue, AGENT) for _ in range(5)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    # Enqueued after the pass, or the pass would have sent it in the same batch: it is in the line.
    single = enqueue(rt.queue, AGENT)
    groups: list[int] = []
    real = runner.lease_attempts

    def recording(queue: Any, settings: Any, attempts: Any, worker_ids: Any) -> Any:
        groups.append(len(attempts))
        return real(queue, settings, attempts, worker_ids)

    monkeypatch.setattr(attempts, "lease_attempts", recording)
    box: dict[str, Any] = {}
    batch = threading.Thread(target=lambda: box.update(batch=attempts.execute_batch(rt, items)))
    batch.start()
    wait_until(lambda: gate.running == 2, what="two attempts to run")
    assert groups == [2]  # as many as there were slots, in one statement
    # A single delivery arriving now shares the same slots: it waits, unleased.
    solo = threading.Thread(
        target=lambda: box.update(
            solo=attempts.execute(rt, single.id, f"{single.id}:attempt:1", single.id, 0)
        )
    )
    solo.start()
    assert rt.queue.get(single.id).status == "queued"  # type: ignore[union-attr]
    assert [rt.queue.get(j.id).status for j in jobs[2:]] == ["queued"] * 3  # type: ignore[union-attr]
    gate.opened.set()
    batch.join(BOUND_S)
    solo.join(BOUND_S)
    assert not batch.is_alive() and not solo.is_alive()
    assert [r["status"] for r in box["batch"]["items"]] == ["completed"] * 5
    assert box["solo"]["status"] == "completed"
    assert sum(groups) == 5
    assert gate.peak <= 2 and rt.slots.peak == 2 and rt.slots.in_use == 0


def test_items_no_slot_frees_for_within_the_hold_go_back_to_their_queue_in_one_message(
    engine: Engine, redis_url: str, recorder: fetches.Recorder
) -> None:
    """Every slot busy with a long attempt: the rest are not held behind it but handed back, so a
    process with a free slot takes them; their delivery records read "sent", not held by this one."""
    gate = Gate()
    rt, sent, _ = batch_runtime(engine, redis_url, gate, slots=1)
    jobs = [enqueue(rt.queue, AGENT) for _ in range(3)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    busy_before = handed_back("busy")
    fetches.on_task_received(
        sender=SimpleNamespace(app=rt.app), request=SimpleNamespace(name=EXECUTE_BATCH_TASK, args=[items])
    )
    keys = [fetches.FETCH_PREFIX + driver_task_id(item[2], item[3]) for item in items]
    assert recorder.client.mget(keys) == [f"worker {recorder.consumer}".encode()] * 3
    box: dict[str, Any] = {}
    batch = threading.Thread(target=lambda: box.update(out=attempts.execute_batch(rt, items, queue=CHAT)))
    batch.start()
    wait_until(lambda: sent.named(EXECUTE_BATCH_TASK), what="the rest to be handed back")
    [back] = sent.named(EXECUTE_BATCH_TASK)
    # The same attempts, under the same fences and delivery records, on the queue they came from,
    # while the first still runs.
    assert back.queue == CHAT and back.args == [items[1:]]
    assert gate.running == 1
    for job in jobs[1:]:
        assert types_of(engine, job.id) == ["job.enqueued"]
        assert delivery_rows(engine, job.id) == [(0, "pending", None)]
    assert recorder.client.mget(keys[1:]) == [f"sent {recorder.consumer}".encode()] * 2
    assert handed_back("busy") == busy_before + 2  # receipt_attempts_handed_back_total{reason="busy"}
    gate.opened.set()
    batch.join(BOUND_S)
    assert not batch.is_alive()
    assert [r["status"] for r in box["out"]["items"]] == ["completed", "handed_back", "handed_back"]
    assert rt.slots.in_use == 0


def test_a_single_delivery_that_finds_every_slot_busy_goes_back_to_its_queue_too(
    engine: Engine, redis_url: str
) -> None:
    gate = Gate()
    rt, sent, _ = batch_runtime(engine, redis_url, gate, slots=1)
    first, single = enqueue(rt.queue, AGENT), enqueue(rt.queue, AGENT)
    box: dict[str, Any] = {}
    busy = threading.Thread(
        target=lambda: box.update(busy=attempts.execute(rt, first.id, f"{first.id}:attempt:1", first.id, 0))
    )
    busy.start()
    wait_until(lambda: gate.running == 1, what="the first attempt to hold the one slot")
    fence = f"{single.id}:attempt:1"
    out = attempts.execute(rt, single.id, fence, single.id, 0, queue=CHAT)
    assert out["status"] == "handed_back"
    [back] = sent.named(EXECUTE_TASK)
    assert back.queue == CHAT and back.args == [single.id, fence, single.id, 0]
    assert types_of(engine, single.id) == ["job.enqueued"]
    gate.opened.set()
    busy.join(BOUND_S)
    assert not busy.is_alive() and box["busy"]["status"] == "completed"
    assert rt.slots.in_use == 0


def test_a_process_whose_consumer_is_not_gated_on_its_slots_keeps_what_it_fetched(
    engine: Engine, redis_url: str
) -> None:
    """The embedded folder broker's consumer fetches whatever its slots: a hand-back would come
    straight back to this process, so the attempts wait here for a slot, past the hold."""
    gate = Gate()
    rt, sent, _ = batch_runtime(engine, redis_url, gate, slots=1, gated=False, RECEIPT_DELIVERY_HOLD_MS="0")
    jobs = [enqueue(rt.queue, AGENT) for _ in range(2)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    box: dict[str, Any] = {}
    batch = threading.Thread(target=lambda: box.update(out=attempts.execute_batch(rt, items, queue=CHAT)))
    batch.start()
    wait_until(lambda: gate.running == 1, what="the first attempt to run")
    batch.join(0.5)  # well past the hold of 0 ms: a gated process would have handed the second back
    assert batch.is_alive()
    assert sent.sent == []
    gate.opened.set()
    batch.join(BOUND_S)
    assert not batch.is_alive()
    assert [r["status"] for r in box["out"]["items"]] == ["completed", "completed"]
    assert rt.slots.in_use == 0


def test_items_whose_hand_back_cannot_be_published_wait_for_a_slot_here(
    engine: Engine, redis_url: str
) -> None:
    """The broker refuses the hand-back: the attempts are still this process's, so they run here
    once a slot frees rather than being dropped."""
    gate = Gate()
    rt, sent, _ = batch_runtime(engine, redis_url, gate, slots=1, RECEIPT_DELIVERY_HOLD_MS="0")
    jobs = [enqueue(rt.queue, AGENT) for _ in range(2)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    refused = threading.Event()

    def broken(*args: Any, **kwargs: Any) -> None:
        refused.set()
        raise ConnectionError("broker down")

    rt.delivery.send = broken  # type: ignore[method-assign]
    box: dict[str, Any] = {}
    batch = threading.Thread(target=lambda: box.update(out=attempts.execute_batch(rt, items, queue=CHAT)))
    batch.start()
    assert refused.wait(BOUND_S), "the hand-back was never tried"
    gate.opened.set()
    batch.join(BOUND_S)
    assert not batch.is_alive()
    assert [r["status"] for r in box["out"]["items"]] == ["completed", "completed"]
    assert sorted(gate.ran) == sorted(j.id for j in jobs)
    assert rt.slots.in_use == 0


def test_items_not_yet_leased_at_shutdown_go_back_to_their_queue_unstarted(
    engine: Engine, redis_url: str
) -> None:
    gate = Gate()
    # A hold longer than the test: only the shutdown hands the rest back.
    rt, sent, _ = batch_runtime(engine, redis_url, gate, slots=1, RECEIPT_DELIVERY_HOLD_MS="60000")
    jobs = [enqueue(rt.queue, AGENT) for _ in range(3)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    shutdown = Shutdown()
    box: dict[str, Any] = {}
    batch = threading.Thread(
        target=lambda: box.update(out=attempts.execute_batch(rt, items, queue=CHAT, shutdown=shutdown))
    )
    batch.start()
    wait_until(lambda: gate.running == 1, what="the first attempt to run")
    shutdown.begin(60_000)  # a finish window long enough for the running attempt to complete
    wait_until(lambda: sent.named(EXECUTE_BATCH_TASK), what="the rest to be handed back")
    [back] = sent.named(EXECUTE_BATCH_TASK)
    # The same attempts, under the same fences and delivery records, on the queue they came from.
    assert back.queue == CHAT and back.args == [items[1:]]
    gate.opened.set()
    batch.join(BOUND_S)
    assert not batch.is_alive()
    assert [r["status"] for r in box["out"]["items"]] == ["completed", "handed_back", "handed_back"]
    assert handed_back("shutdown") >= 2
    for job in jobs[1:]:
        assert types_of(engine, job.id) == ["job.enqueued"]
        assert delivery_rows(engine, job.id) == [(0, "pending", None)]
    assert rt.slots.in_use == 0


class Poison(Hook):
    """Makes one job's lease fail at the database (a division by zero beside its receipts)."""

    name = "poison"

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def during(self, change: Change) -> Write | None:
        if change.after.id != self.job_id:
            return None
        return Write(lambda conn: conn.execute(text("select 1 / 0")).scalar())


def test_a_batch_whose_lease_statement_fails_leases_none_and_each_is_redelivered(
    pg_engine: Engine, redis_url: str, recorder: fetches.Recorder
) -> None:
    engine = pg_engine  # SQLite divides by zero into NULL
    gate = Gate(open_=True)
    rt, sent, _ = batch_runtime(
        engine,
        redis_url,
        gate,
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
    )
    rt.broker = RedisProbe(redis_url)
    jobs = [enqueue(rt.queue, AGENT) for _ in range(3)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    rt.queue = Queue(engine, hooks=(*rt.queue.hooks, Poison(jobs[1].id)))

    out = attempts.execute_batch(rt, items)

    # The statement rolled back whole: no item believes it leased, none ran, nothing was written.
    assert [r["status"] for r in out["items"]] == ["not_leased"] * 3
    assert all("division by zero" in r["error"] for r in out["items"])
    assert gate.ran == []
    for job in jobs:
        assert types_of(engine, job.id) == ["job.enqueued"]
    client = redis.Redis.from_url(redis_url)
    try:
        keys = [fetches.FETCH_PREFIX + driver_task_id(item[2], item[3]) for item in items]
        assert [client.get(k) for k in keys] == [fetches.FAILED.encode()] * 3
    finally:
        client.close()
    assert rt.slots.in_use == 0
    # The redrive judges each delivery lost and redelivers each, in its next pass.
    sent.clear()
    result = loop_passes.redrive_queued(rt)
    assert sorted(result["fetcherLost"]) == sorted(j.id for j in jobs)
    assert sorted(result["redriven"]) == sorted(j.id for j in jobs)
    for job in jobs:
        lost, redelivered = delivery_rows(engine, job.id)
        assert lost == (0, "settled", "fetcher_lost") and redelivered[1:] == ("pending", None)


def test_a_failed_lease_statement_with_the_database_answering_again_runs_the_redelivery(
    pg_engine: Engine, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage outage outlasting the retries: the batch answers, its slots come back, and the
    attempts the next message carries run normally."""
    from sqlalchemy.exc import OperationalError

    from app.storage import retry as retry_module

    sleeps: list[float] = []
    monkeypatch.setattr(
        runner, "retry_transient", functools.partial(retry_module.retry_transient, sleep=sleeps.append)
    )
    rt, sent, _ = batch_runtime(pg_engine, redis_url, Gate(open_=True))
    jobs = [enqueue(rt.queue, AGENT) for _ in range(2)]
    items = dispatched_items(rt, sent, [j.id for j in jobs])
    real = rt.queue.start_attempts
    calls: list[int] = []

    def down(*_a: Any, **_k: Any) -> Any:
        calls.append(1)
        raise OperationalError("select", {}, Exception("server closed the connection unexpectedly"))

    rt.queue.start_attempts = down  # type: ignore[method-assign]
    out = attempts.execute_batch(rt, items)
    assert [r["status"] for r in out["items"]] == ["not_leased"] * 2
    assert len(calls) == 5 and len(sleeps) == 4  # retried as a transient failure first
    assert rt.slots.in_use == 0
    rt.queue.start_attempts = real  # type: ignore[method-assign]
    again = attempts.execute_batch(rt, items)
    assert [r["status"] for r in again["items"]] == ["completed"] * 2
