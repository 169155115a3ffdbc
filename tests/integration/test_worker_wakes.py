"""Worker processes take wake-ups themselves (``RECEIPT_WORKER_WAKES``, default enabled): a worker's
listener waits on the lists of the worker queues it consumes, runs the scan and runs what it claims
on its own free slots, with no worker message. A job's wake-up goes to its queue's list while a
worker listens there, else to the driver's; a worker that stops hands its lists to the driver, and
the driver takes over the list of a queue whose last listener died (``delivery/wakes.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import pytest
import redis
from sqlalchemy.engine import Engine

from app.jobs.routing import DISPATCH_TASK, EXECUTE_BATCH_TASK, EXECUTE_TASK, QUEUES
from app.jobs.vocab import AGENT_CODEX, AGENT_FACTORY_CONTROL
from app.storage.delivery import driver_task_id
from delivery import fetches, listeners, wakes
from workers import attempts

from .runtime_support import enqueue, local_worker_runtime, wait_until

pytestmark = pytest.mark.one_backend

CHAT = QUEUES["chat"]
CODEX = QUEUES["codex"]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    try:
        yield c
    finally:
        c.close()


def test_a_jobs_wake_up_reaches_only_a_worker_that_consumes_its_queue(
    pg_engine: Engine, redis_url: str, client: redis.Redis
) -> None:
    """A chat worker and a codex worker listen; the driver listens on its own list. A chat job's and
    a codex job's wake-ups go to their own queue's list and send no message; a control job's, whose
    queue no worker listens to, goes to the driver's list."""
    rt, sent = local_worker_runtime(pg_engine, redis_url)
    chat, codex, driver = (wakes.WakeList(redis_url) for _ in range(3))
    assert chat.listen(10, 0.01, queues=[CHAT]) == []
    assert codex.listen(10, 0.01, queues=[CODEX]) == []
    assert driver.listen(10, 0.01) == []
    assert 0 < client.pttl(chat.queue_listening_key(CHAT)) <= wakes.LISTENING_TTL_MS
    on_chat = enqueue(rt.queue, "factory")
    on_codex = enqueue(rt.queue, AGENT_CODEX, kind="factory.integration.publish")
    on_control = enqueue(rt.queue, AGENT_FACTORY_CONTROL, kind="factory.objective.control")
    assert sent.named(DISPATCH_TASK) == []  # every list had its listener: no message at all
    assert chat.listen(10, 0.01, queues=[CHAT]) == [on_chat.id]
    assert codex.listen(10, 0.01, queues=[CODEX]) == [on_codex.id]
    assert driver.listen(10, 0.01) == [on_control.id]
    assert client.llen(wakes.IDS_KEY) == 0


def test_a_stopping_worker_hands_its_list_to_the_driver_and_pushes_go_there_again(
    redis_url: str, client: redis.Redis
) -> None:
    worker, driver = wakes.WakeList(redis_url), wakes.WakeList(redis_url)
    assert worker.listen(10, 0.01, queues=[CHAT]) == []
    assert driver.push(["j1", "j2"], [CHAT, CHAT]) is False  # the chat worker is woken by the push
    assert worker.stop_listening([CHAT]) == ["j1", "j2"]  # what its list held, for the driver
    assert client.exists(worker.queue_listening_key(CHAT), worker.queue_ids_key(CHAT)) == 0
    assert driver.push(["j3"], [CHAT]) is True  # nobody listens for chat, nor on the driver's list
    assert driver.disarm_and_take(10) == ["j3"]


def test_a_drivers_listener_takes_over_the_list_of_a_queue_whose_last_worker_died(
    pg_engine: Engine, redis_url: str, client: redis.Redis
) -> None:
    """A worker killed between a push and its wait leaves ids on its queue's list; once its key
    lapses (LISTENING_TTL_MS) the driver's listener moves them onto its own list and scans them."""
    rt, _sent = local_worker_runtime(pg_engine, redis_url)
    wl = wakes.WakeList(redis_url)
    client.set(wl.queue_listening_key(CHAT), b"1", px=wakes.LISTENING_TTL_MS)
    client.rpush(wl.queue_ids_key(CHAT), "@" + CHAT)  # a place freed: the cheapest id to scan
    assert wl.adopt([CHAT]) == 0  # a worker still listens there: its list stays
    client.delete(wl.queue_listening_key(CHAT))  # its key lapsed
    listener = listeners.WakeListener(rt)
    listener.start()
    try:
        wait_until(lambda: listener.adopted == 1, what="the driver's listener took the list over")
        wait_until(lambda: client.llen(wakes.IDS_KEY) == 0, what="the driver took the wake-up")
        assert client.exists(wl.queue_ids_key(CHAT)) == 0
    finally:
        listener.stop()


def test_a_worker_listener_runs_a_woken_job_here_with_no_message(
    pg_engine: Engine, redis_url: str, client: redis.Redis
) -> None:
    rt, sent = local_worker_runtime(pg_engine, redis_url)
    recorder = fetches.recorder_for(rt.app)  # a worker process's, made when it starts
    assert recorder is not None
    runs = attempts.LocalRuns(rt, [CHAT])
    listener = listeners.WakeListener(replace(rt, local=runs), queues=[CHAT])
    key = rt.wakes.queue_listening_key(CHAT)  # type: ignore[union-attr]
    freed: list[str] = []
    rt.delivery.on_freed = freed.extend  # as a worker process's refill takes its freed places
    listener.start()
    try:
        wait_until(lambda: client.exists(key) == 1, what="the worker listens")
        job = enqueue(rt.queue, "factory")
        wait_until(lambda: rt.queue.get(job.id).status == "completed", what="the job completed")  # type: ignore[union-attr]
        # No wake-up message, no worker message: the push woke this process, which ran the job.
        assert sent.named(DISPATCH_TASK) == []
        assert sent.named(EXECUTE_TASK) == [] and sent.named(EXECUTE_BATCH_TASK) == []
        assert runs.runs == 1 and freed == [CHAT]
        # Held as this consumer's fetch, so its death would leave the delivery lost for the redrive.
        held = client.get(fetches.FETCH_PREFIX + driver_task_id(job.id, 0))
        assert held == f"{fetches.WORKER} {recorder.consumer}".encode()
        assert rt.local is None  # the runtime's own passes (the refill) still send messages
    finally:
        listener.stop()
        runs.stop(10)
    assert client.exists(key) == 0


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
    wl = wakes.WakeList(redis_url)
    try:
        assert wl.listen(10, 0.01, queues=[CHAT]) == []  # the chat worker listens from here on
        first, second = enqueue(rt.queue, "factory"), enqueue(rt.queue, "factory")
        batch = wl.listen(10, 0.01, queues=[CHAT])
        assert sorted(batch) == sorted([first.id, second.id])
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
        assert listener is not None and listener.queues == (CHAT,)
        assert isinstance(listener.rt.local, attempts.LocalRuns) and listener.rt.local.queues == {CHAT}
        assert rt.local is None  # RECEIPT_DELIVERY_LOCAL stays off: the refill's passes send
        wait_until(lambda: client.exists(wakes.QUEUE_LISTENING_KEY + CHAT) == 1, what="the worker listens")
    finally:
        celery_app._stop_refill(sender=worker)
    # Withdrawn: the chat queue's wake-ups go to the driver's list again at once.
    assert client.exists(wakes.QUEUE_LISTENING_KEY + CHAT) == 0
    assert rt.app.receipt_local_runs.reserve(CHAT, 1) == 0  # stopped: keeps nothing


def test_a_worker_listener_stops_taking_wake_ups_as_soon_as_its_process_begins_shutting_down(
    pg_engine: Engine, redis_url: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ops.shutdown import Shutdown

    rt, _sent = local_worker_runtime(pg_engine, redis_url)
    runs = attempts.LocalRuns(rt, [CHAT])
    listener = listeners.WakeListener(replace(rt, local=runs), queues=[CHAT])
    stopping = Shutdown()
    monkeypatch.setattr(listeners, "PROCESS", stopping)
    key = wakes.QUEUE_LISTENING_KEY + CHAT
    listener.start()
    try:
        wait_until(lambda: client.exists(key) == 1, what="the worker listens")
        stopping.begin(5_000)  # SIGTERM: the grace has begun, the attempts may still finish
        wait_until(lambda: not listener._thread.is_alive(), what="the listener to stop")
        assert client.exists(key) == 0  # the chat queue's wake-ups go to the driver's list again
        job = enqueue(rt.queue, "factory")
        assert client.lrange(wakes.IDS_KEY, 0, -1) == [job.id.encode()]  # nobody here takes it
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
