"""Worker processes take wake-ups themselves (``RECEIPT_WORKER_WAKES``, default enabled): a worker's
listener runs the scan and runs what it claims for a queue it consumes on its own free slots, with
no worker message; while a worker listens a driver's listener stands back and takes nothing, and it
listens again once the last worker listener withdraws its key (``delivery/wakes.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import pytest
import redis
from sqlalchemy.engine import Engine

from app.jobs.routing import DISPATCH_TASK, EXECUTE_BATCH_TASK, EXECUTE_TASK, QUEUES
from app.storage.delivery import driver_task_id
from delivery import fetches, listeners, wakes
from workers import attempts

from .runtime_support import enqueue, local_worker_runtime, wait_until

pytestmark = pytest.mark.one_backend

CHAT = QUEUES["chat"]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    try:
        yield c
    finally:
        c.close()


def test_a_driver_stands_back_while_a_worker_listens_and_listens_again_once_it_stops(
    redis_url: str, client: redis.Redis
) -> None:
    worker, driver = wakes.WakeList(redis_url), wakes.WakeList(redis_url)
    assert driver.listen(10, 0.01) == []  # no worker listens: the driver's wait takes ids as before
    assert worker.listen(10, 0.01, worker=True) == []
    assert 0 < client.pttl(wakes.WORKERS_KEY) <= wakes.LISTENING_TTL_MS  # renewed before each wait
    assert driver.push(["j1"]) is False  # a listener is woken by the push: no message
    assert driver.listen(10, 0.01) is None  # a worker listens: the driver takes nothing
    assert client.lrange(wakes.IDS_KEY, 0, -1) == [b"j1"]
    assert worker.listen(10, 0.01, worker=True) == ["j1"]
    worker.push(["j2"])
    worker.stop_listening(worker=True)  # the worker withdraws both keys ...
    assert client.exists(wakes.WORKERS_KEY, wakes.LISTENING_KEY) == 0
    assert driver.listen(10, 0.01) == ["j2"]  # ... and the driver's next wait takes the ids


def test_a_driver_listener_thread_leaves_the_ids_to_a_worker_until_its_key_lapses(
    pg_engine: Engine, redis_url: str, client: redis.Redis
) -> None:
    rt, _sent = local_worker_runtime(pg_engine, redis_url)
    client.set(wakes.WORKERS_KEY, b"1", px=wakes.LISTENING_TTL_MS)
    client.rpush(wakes.IDS_KEY, "@" + CHAT)
    listener = listeners.WakeListener(rt)
    listener.start()
    try:
        wait_until(lambda: listener.stood_back >= 2, what="the driver's listener stood back twice")
        assert client.lrange(wakes.IDS_KEY, 0, -1) == [f"@{CHAT}".encode()]
        client.delete(wakes.WORKERS_KEY)  # the last worker listener stopped (or its key lapsed)
        wait_until(lambda: client.llen(wakes.IDS_KEY) == 0, what="the driver took the wake-up")
    finally:
        listener.stop()


def test_a_worker_listener_runs_a_woken_job_here_with_no_message(
    pg_engine: Engine, redis_url: str, client: redis.Redis
) -> None:
    rt, sent = local_worker_runtime(pg_engine, redis_url)
    recorder = fetches.recorder_for(rt.app)  # a worker process's, made when it starts
    assert recorder is not None
    runs = attempts.LocalRuns(rt, [CHAT])
    listener = listeners.WakeListener(replace(rt, local=runs), worker=True)
    listener.start()
    try:
        wait_until(lambda: client.exists(wakes.WORKERS_KEY) == 1, what="the worker listens")
        job = enqueue(rt.queue, "factory")
        wait_until(lambda: rt.queue.get(job.id).status == "completed", what="the job completed")  # type: ignore[union-attr]
        # No wake-up message, no worker message: the push woke this process, which ran the job.
        assert sent.named(DISPATCH_TASK) == []
        assert sent.named(EXECUTE_TASK) == [] and sent.named(EXECUTE_BATCH_TASK) == []
        assert runs.runs == 1
        # Held as this consumer's fetch, so its death would leave the delivery lost for the redrive.
        held = client.get(fetches.FETCH_PREFIX + driver_task_id(job.id, 0))
        assert held == f"{fetches.WORKER} {recorder.consumer}".encode()
        assert rt.local is None  # the runtime's own passes (the refill) still send messages
    finally:
        listener.stop()
        runs.stop(10)
    assert client.exists(wakes.WORKERS_KEY) == 0


def test_a_worker_listener_sends_what_its_free_slots_do_not_take(
    pg_engine: Engine, redis_url: str, client: redis.Redis
) -> None:
    """One slot is always left for a message already waiting: with two free, one job runs here and
    the other leaves as a worker message for whichever process has a place."""
    rt, sent = local_worker_runtime(pg_engine, redis_url)
    took = rt.slots.take(6, 0)
    assert took == 6 and rt.slots.free == 2
    runs = attempts.LocalRuns(rt, [CHAT])
    view = replace(rt, local=runs)
    try:
        first, second = enqueue(rt.queue, "factory"), enqueue(rt.queue, "factory")
        batch = wakes.WakeList(redis_url).listen(10, 0.01, worker=True)
        assert batch is not None and sorted(batch) == sorted([first.id, second.id])
        from delivery.dispatch import drain_wakes

        started = drain_wakes(view, batch)
        assert sorted(started) == sorted([first.id, second.id])
        assert len(sent.attempt_fences()) == 1 and runs.runs == 1
    finally:
        runs.stop(10)
        rt.slots.give(took)


@pytest.mark.parametrize("setting", ["enabled", "disabled"])
def test_a_worker_process_starts_its_listener_by_the_setting_and_stops_it_at_shutdown(
    pg_engine: Engine, redis_url: str, client: redis.Redis, setting: str
) -> None:
    from tasks import celery_app

    rt, _sent = local_worker_runtime(pg_engine, redis_url, RECEIPT_WORKER_WAKES=setting)
    assert rt.settings.worker_wakes is (setting == "enabled")
    worker = SimpleNamespace(app=rt.app, concurrency=8)
    celery_app._start_refill(sender=worker)
    try:
        listener = getattr(rt.app, "receipt_worker_listener", None)
        if setting == "disabled":
            assert listener is None and rt.app.receipt_local_runs is None
            return
        assert listener is not None and listener.worker
        assert isinstance(listener.rt.local, attempts.LocalRuns) and listener.rt.local.queues == {CHAT}
        assert rt.local is None  # RECEIPT_DELIVERY_LOCAL stays off: the refill's passes send
        wait_until(lambda: client.exists(wakes.WORKERS_KEY) == 1, what="the worker listens")
    finally:
        celery_app._stop_refill(sender=worker)
    assert client.exists(wakes.WORKERS_KEY) == 0  # withdrawn: a driver listens again at once
    assert rt.app.receipt_local_runs.reserve(CHAT, 1) == 0  # stopped: keeps nothing


def test_a_worker_listener_stops_taking_wake_ups_as_soon_as_its_process_begins_shutting_down(
    pg_engine: Engine, redis_url: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ops.shutdown import Shutdown

    rt, _sent = local_worker_runtime(pg_engine, redis_url)
    runs = attempts.LocalRuns(rt, [CHAT])
    listener = listeners.WakeListener(replace(rt, local=runs), worker=True)
    stopping = Shutdown()
    monkeypatch.setattr(listeners, "PROCESS", stopping)
    listener.start()
    try:
        wait_until(lambda: client.exists(wakes.WORKERS_KEY) == 1, what="the worker listens")
        stopping.begin(5_000)  # SIGTERM: the grace has begun, the attempts may still finish
        wait_until(lambda: not listener._thread.is_alive(), what="the listener to stop")
        assert client.exists(wakes.WORKERS_KEY, wakes.LISTENING_KEY) == 0  # a driver listens again
        client.rpush(wakes.IDS_KEY, "j")
        assert client.lrange(wakes.IDS_KEY, 0, -1) == [b"j"]  # nobody here takes it any more
    finally:
        listener.stop()
        runs.stop(10)


@pytest.mark.parametrize("why", ["a driver's listener", "a single slot"])
def test_a_process_starts_no_worker_listener_beside_a_drivers_or_with_a_single_slot(
    pg_engine: Engine, redis_url: str, why: str
) -> None:
    """A driver process's own listener takes its wake-ups. A single slot is the one always left for
    a message already waiting (LEAVE_FOR_MESSAGES): such a process could run nothing it claimed."""
    from tasks import celery_app

    rt, _sent = local_worker_runtime(pg_engine, redis_url)
    assert attempts.LEAVE_FOR_MESSAGES == 1
    if why == "a driver's listener":
        rt.app.receipt_wake_listener = True
    worker = SimpleNamespace(app=rt.app, concurrency=1 if why == "a single slot" else 8)
    celery_app._start_refill(sender=worker)
    try:
        assert getattr(rt.app, "receipt_worker_listener", None) is None
    finally:
        celery_app._stop_refill(sender=worker)
