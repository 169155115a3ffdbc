"""Where dispatch passes run under load. A worker process refills the places its attempts free
(``delivery.listeners.Refill``): the ended job's queue goes to the process's own pass, not to the
driver as a wake-up, where its line waits. A job that joins a line whose last pass found no free
place takes no pass of its own; the driver it woke looks at that line within a tenth of a second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.dispatch import line
from app.jobs.routing import DISPATCH_TASK, QUEUES
from app.storage.queue import Queue
from delivery import dispatch, listeners, wakes
from devharness.credits import offer_slots
from tests.support.queue_ops import complete, lease
from workers.runtime import Runtime

from .runtime_support import (
    Recorder,
    count_passes,
    enqueue,
    recording_runtime,
    settings_for,
    wait_until,
    with_wake_list,
)

pytestmark = pytest.mark.one_backend


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues of the dispatch passes run, in order."""
    return count_passes(monkeypatch)


CHAT = QUEUES["chat"]
LONG_MS = 600_000


def refilling_runtime(engine: Engine, redis_url: str, slots: int) -> tuple[Runtime, Recorder]:
    """A runtime whose client has the wake list, as a worker process on a Redis broker; one live
    process offering ``slots`` and no lead, so a line forms past them."""
    rt, sent, _ = recording_runtime(engine, settings_for(redis_url, RECEIPT_DISPATCH_LEAD="0"), offer=False)
    offer_slots(engine, slots=slots)
    return with_wake_list(rt, redis_url), sent


@pytest.fixture
def refill_rt(pg_engine: Engine, redis_url: str) -> Iterator[tuple[Runtime, Recorder]]:
    yield refilling_runtime(pg_engine, redis_url, slots=1)


def finish(queue: Queue, job_id: str) -> None:
    """The job's attempt leased and completed, as a worker would: its place frees."""
    assert lease(queue, job_id, "w", LONG_MS).applied
    assert complete(queue, job_id, "w", 1).applied


def attempts_sent(sent: Recorder) -> list[str]:
    return [fence.split(":attempt:")[0] for fence in sent.attempt_fences()]


def test_an_ended_attempt_refills_its_place_in_its_own_process_and_wakes_no_driver(
    refill_rt: tuple[Runtime, Recorder],
) -> None:
    rt, sent = refill_rt
    assert rt.wakes is not None
    first, second = enqueue(rt.queue, "factory"), enqueue(rt.queue, "factory")
    assert rt.wakes.take(10) == [first.id, second.id]  # the driver's part, taken here by hand
    dispatch.dispatch_queue(rt, CHAT)  # one slot: the first is sent, the second waits (line marked)
    assert attempts_sent(sent) == [first.id]
    refill = listeners.Refill(rt, [CHAT])
    refill.start()
    try:
        wait_until(lambda: refill.passes >= 1, what="the start's pass")  # no place: sends nothing
        sent.clear()
        finish(rt.queue, first.id)
        wait_until(lambda: attempts_sent(sent) == [second.id], what="the second job sent")
    finally:
        refill.stop()
    # The freed place went to the process's own pass: nothing on the wake list, no wake-up message.
    assert rt.wakes.take(10) == []
    assert sent.named(DISPATCH_TASK) == []


def test_a_process_that_starts_fills_its_new_places_at_once(pg_engine: Engine, redis_url: str) -> None:
    rt, sent = refilling_runtime(pg_engine, redis_url, slots=0)
    job = enqueue(rt.queue, "factory")
    dispatch.dispatch_queue(rt, CHAT)  # no place anywhere: the line waits, marked
    assert attempts_sent(sent) == []
    offer_slots(pg_engine, slots=1)  # a process comes up
    refill = listeners.Refill(rt, [CHAT])
    refill.start()
    try:
        wait_until(lambda: attempts_sent(sent) == [job.id], what="the waiting job sent")
    finally:
        refill.stop()


def test_a_freed_place_where_no_line_waits_costs_no_pass(
    refill_rt: tuple[Runtime, Recorder], passes: list[str]
) -> None:
    rt, sent = refill_rt
    job = enqueue(rt.queue, "factory")
    dispatch.dispatch_queue(rt, CHAT)  # sent; nothing left in the line: no mark
    assert attempts_sent(sent) == [job.id]
    refill = listeners.Refill(rt, [CHAT])
    refill.start()
    try:
        wait_until(lambda: refill.served >= 1, what="the start's ask answered")
        served = refill.served
        finish(rt.queue, job.id)
        wait_until(lambda: refill.served > served, what="the ask answered")
    finally:
        refill.stop()
    assert passes == [CHAT]  # the test's own pass; the refill ran none


def test_a_refill_whose_pass_fails_hands_the_line_to_the_driver(
    refill_rt: tuple[Runtime, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, sent = refill_rt
    assert rt.wakes is not None
    first, second = enqueue(rt.queue, "factory"), enqueue(rt.queue, "factory")
    rt.wakes.take(10)
    dispatch.dispatch_queue(rt, CHAT)
    refill = listeners.Refill(rt, [CHAT])
    refill.start()
    try:
        wait_until(lambda: refill.passes >= 1, what="the start's pass")

        def broken(*_args: Any, **_kwargs: Any) -> line.PassResult:
            raise RuntimeError("the database went away")

        monkeypatch.setattr(line, "run_pass", broken)
        finish(rt.queue, first.id)
        token = wakes.QUEUE_TOKEN + CHAT
        wait_until(lambda: token in rt.wakes.take(10) if rt.wakes else False, what="the line handed over")
    finally:
        refill.stop()
    assert second.id not in attempts_sent(sent)


def test_once_stopped_an_ended_attempt_wakes_the_driver_again(refill_rt: tuple[Runtime, Recorder]) -> None:
    rt, _sent = refill_rt
    assert rt.wakes is not None
    job = enqueue(rt.queue, "factory")
    rt.wakes.take(10)
    dispatch.dispatch_queue(rt, CHAT)
    refill = listeners.Refill(rt, [CHAT])
    refill.start()
    wait_until(lambda: refill.served >= 1, what="the start's ask answered")
    refill.stop()
    assert rt.delivery.on_freed is None
    finish(rt.queue, job.id)
    assert rt.wakes.take(10) == [wakes.QUEUE_TOKEN + CHAT]


def test_a_job_that_joins_a_full_line_takes_no_pass_and_the_line_is_looked_at_soon(
    refill_rt: tuple[Runtime, Recorder], passes: list[str]
) -> None:
    rt, sent = refill_rt
    assert rt.wakes is not None
    first, second = enqueue(rt.queue, "factory"), enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [])  # one slot: the first is sent, the second waits
    third = enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [])  # this pass finds no free place: the line is marked full
    assert rt.wakes.line_marks([CHAT]) == {CHAT: wakes.LINE_FULL}
    assert (len(passes), attempts_sent(sent)) == (2, [first.id])
    fourth = enqueue(rt.queue, "factory")
    woke_at = time.monotonic()
    assert dispatch.dispatch_jobs(rt, []) == {"started": []}
    assert len(passes) == 2, "a job that joined a full line took a pass"
    assert woke_at < rt.looks[CHAT] <= time.monotonic() + dispatch.FULL_LINE_LOOK_S
    wait_until(lambda: listeners.lines_due(rt) == [CHAT], what="the look due")
    # A freed place's wake-up always takes its pass, full line or not; the pass settles the look.
    finish(rt.queue, first.id)
    assert dispatch.dispatch_jobs(rt, []) == {"started": [second.id]}
    assert CHAT not in rt.looks
    assert {third.id, fourth.id}.isdisjoint(attempts_sent(sent))  # still in the line: no place


def test_a_worker_process_that_consumes_a_worker_queue_starts_its_refill_and_stops_it(
    refill_rt: tuple[Runtime, Recorder],
) -> None:
    """The worker's signals: ready starts the refill of the queues its consumer reads (and only
    where the broker's Redis keeps the lines' marks); shutdown stops it, so ended attempts wake the
    driver again."""
    from types import SimpleNamespace

    from tasks import celery_app

    rt, _sent = refill_rt
    rt.app.amqp.queues.select([CHAT])  # what `-Q receipt-chat` makes the consumer read
    worker = SimpleNamespace(app=rt.app, concurrency=2)
    celery_app._start_refill(sender=worker)
    try:
        refill = rt.app.receipt_refill
        assert refill.queues == (CHAT,)
        assert rt.delivery.on_freed == refill.ask
    finally:
        celery_app._stop_refill(sender=worker)
    assert rt.delivery.on_freed is None


def test_without_a_wake_list_a_worker_starts_no_refill(pg_engine: Engine, redis_url: str) -> None:
    """No lines' marks to read (the embedded broker): ended attempts wake the driver, as before."""
    from types import SimpleNamespace

    from tasks import celery_app

    rt, _sent, _ = recording_runtime(pg_engine, settings_for(redis_url), offer=False)
    assert rt.wakes is None
    rt.app.amqp.queues.select([CHAT])
    celery_app._start_refill(sender=SimpleNamespace(app=rt.app, concurrency=2))
    assert getattr(rt.app, "receipt_refill", None) is None
    assert rt.delivery.on_freed is None


@pytest.mark.parametrize("local", [False, True])
def test_a_worker_runs_its_own_claims_only_with_delivery_local_enabled(
    pg_engine: Engine, redis_url: str, local: bool
) -> None:
    """RECEIPT_DELIVERY_LOCAL (default disabled): enabled, the worker's refill keeps what its own
    passes claim for its free slots (``attempts.LocalRuns``), and stops keeping at shutdown."""
    from dataclasses import replace
    from types import SimpleNamespace

    from tasks import celery_app
    from workers import attempts

    rt, _sent = refilling_runtime(pg_engine, redis_url, slots=1)
    assert rt.settings.delivery_local is False  # the default
    rt.settings = replace(rt.settings, delivery_local=local)
    rt.app.amqp.queues.select([CHAT])
    worker = SimpleNamespace(app=rt.app, concurrency=2)
    celery_app._start_refill(sender=worker)
    try:
        assert isinstance(rt.local, attempts.LocalRuns) if local else rt.local is None
    finally:
        celery_app._stop_refill(sender=worker)
    if local:
        assert rt.local is not None and rt.local.reserve(CHAT, 1) == 0  # stopped: keeps nothing
