"""A woken job is claimed without a pass while its queue's last pass left room and no line
(``app/dispatch/fast.py``); every other job still goes through the pass."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from app.jobs.routing import EXECUTE_BATCH_TASK, EXECUTE_TASK
from app.jobs.validation import validate_enqueue
from delivery import dispatch
from devharness.credits import offer_slots
from workers.runtime import Runtime

from .runtime_support import Recorder, count_passes, enqueue, recording_runtime, settings_for, task_payload

pytestmark = pytest.mark.one_backend


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues of the dispatch passes run, in order."""
    return count_passes(monkeypatch)


def runtime(engine: Engine, redis_url: str, slots: int) -> tuple[Runtime, Recorder]:
    rt, sent, _ = recording_runtime(engine, settings_for(redis_url, RECEIPT_DISPATCH_LEAD="0"), offer=False)
    offer_slots(engine, slots=slots)
    return rt, sent


def sent_ids(sent: Recorder) -> list[str]:
    """The jobs sent to workers, in order, alone or in a batch message."""
    out: list[str] = []
    for task in sent.sent:
        if task.name == EXECUTE_TASK:
            out.append(task.args[0])
        elif task.name == EXECUTE_BATCH_TASK:
            out += [item[0] for item in task.args[0]]
    return out


def test_a_job_woken_while_its_queue_has_room_is_sent_without_a_pass(
    pg_engine: Engine, redis_url: str, passes: list[str]
) -> None:
    rt, sent = runtime(pg_engine, redis_url, slots=8)
    first = enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [first.id])  # no pass yet in this process: the first goes through one
    assert len(passes) == 1 and sent_ids(sent) == [first.id]
    second = enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [second.id])
    assert len(passes) == 1, "the second job took a pass although the first left seven places"
    assert sent_ids(sent) == [first.id, second.id]


def test_the_room_is_what_the_last_pass_left_and_a_job_past_it_takes_the_pass(
    pg_engine: Engine, redis_url: str, passes: list[str]
) -> None:
    rt, sent = runtime(pg_engine, redis_url, slots=2)
    first = enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [first.id])  # the pass sends it and leaves one place
    more = [enqueue(rt.queue, "factory") for _ in range(2)]
    dispatch.dispatch_jobs(rt, [j.id for j in more])
    # One place of room: one of the two is sent at once; the other goes through a pass, which finds
    # both places taken and leaves it waiting in the line.
    assert sent_ids(sent) == [first.id, more[0].id]
    assert len(passes) == 2
    _ran_at, last = rt.passes[passes[-1]]
    assert last.blocked and not last.claimed


def test_a_keyed_job_always_takes_the_pass(pg_engine: Engine, redis_url: str, passes: list[str]) -> None:
    rt, sent = runtime(pg_engine, redis_url, slots=8)
    first = enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [first.id])
    body = {"payload": task_payload("factory.task.run"), "concurrencyKey": "serial", "concurrencyLimit": 1}
    keyed = rt.queue.enqueue(validate_enqueue("factory", body)).job
    dispatch.dispatch_jobs(rt, [keyed.id])
    assert len(passes) == 2, "a keyed job is counted by a pass, never claimed around it"
    assert sent_ids(sent) == [first.id, keyed.id]


def test_no_room_is_trusted_once_a_line_waits(pg_engine: Engine, redis_url: str, passes: list[str]) -> None:
    rt, sent = runtime(pg_engine, redis_url, slots=1)
    jobs = [enqueue(rt.queue, "factory") for _ in range(2)]
    dispatch.dispatch_jobs(rt, [j.id for j in jobs])  # one sent, one left waiting
    assert sent_ids(sent) == [jobs[0].id] and len(passes) == 1
    offer_slots(pg_engine, slots=8)  # room appears, but the last pass left a line: no direct claim
    late = enqueue(rt.queue, "factory")
    dispatch.dispatch_jobs(rt, [late.id])
    assert len(passes) == 2
    # The pass serves the line in order: the job that waited first goes first.
    assert sent_ids(sent) == [jobs[0].id, jobs[1].id, late.id]
