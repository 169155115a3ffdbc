"""The handler pool: handler threads reused across attempts, never one left unserved."""

from __future__ import annotations

import contextvars
import functools
import threading

import pytest

from workers.handler_pool import HandlerPool

WAIT_S = 10.0


def test_sequential_handlers_reuse_one_thread() -> None:
    pool = HandlerPool()
    names: list[str] = []

    def handler(i: int) -> int:
        names.append(threading.current_thread().name)
        return i

    for i in range(20):
        run = pool.submit(functools.partial(handler, i))
        run.join(WAIT_S)
        assert not run.is_alive() and run.result == i and run.error is None
    assert pool.started == 1
    assert set(names) == {"receipt-handler"}


def test_a_stuck_handler_keeps_its_thread_and_the_next_one_gets_another() -> None:
    pool = HandlerPool()
    release = threading.Event()
    stuck = pool.submit(lambda: release.wait(WAIT_S))
    stuck.join(0.05)
    assert stuck.is_alive()
    other = pool.submit(lambda: "ran")
    other.join(WAIT_S)
    assert other.result == "ran" and pool.started == 2
    release.set()
    stuck.join(WAIT_S)
    assert not stuck.is_alive()


def test_an_exception_is_the_runs_error_and_the_thread_serves_on() -> None:
    pool = HandlerPool()

    def boom() -> None:
        raise ValueError("handler failed")

    failed = pool.submit(boom)
    failed.join(WAIT_S)
    assert isinstance(failed.error, ValueError) and failed.result is None
    ok = pool.submit(lambda: 1)
    ok.join(WAIT_S)
    assert ok.result == 1 and pool.started == 1


def test_the_handler_runs_in_a_copy_of_the_submitters_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("job", default="none")
    pool = HandlerPool()
    token = var.set("job-1")
    try:
        run = pool.submit(var.get)
    finally:
        var.reset(token)
    run.join(WAIT_S)
    assert run.result == "job-1"


@pytest.mark.parametrize("burst", [5, 40])
def test_a_burst_runs_every_handler_and_at_most_keep_idle_threads_stay(burst: int) -> None:
    pool = HandlerPool(keep_idle=4)
    gate = threading.Event()

    def held(i: int) -> int:
        gate.wait(WAIT_S)
        return i

    runs = [pool.submit(functools.partial(held, i)) for i in range(burst)]
    gate.set()
    for run in runs:
        run.join(WAIT_S)
    assert [r.result for r in runs] == list(range(burst))
    assert pool.started == burst  # each was stuck at the gate when the next came
    assert pool._idle <= 4
