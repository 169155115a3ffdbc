"""A worker process runs what its own refill pass claims for its free slots itself
(``RECEIPT_DELIVERY_LOCAL``, ``workers.attempts.LocalRuns``): no broker message for those attempts,
each recorded as fetched by this consumer first, so its death leaves them lost for the redrive; the
rest of the pass leaves as messages, and one free slot is always left for them; nothing is kept once
the process is shutting down; a pass whose messages fail to leave gives the reserved slots back and
runs nothing here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy.engine import Engine

from app.jobs.routing import EXECUTE_BATCH_TASK, EXECUTE_TASK, QUEUES
from app.ops.shutdown import Shutdown
from app.storage.delivery import driver_task_id
from delivery import dispatch, fetches
from workers import attempts
from workers.runtime import Runtime

from .runtime_support import Recorder, enqueue, local_worker_runtime, wait_until

pytestmark = pytest.mark.one_backend

CHAT = QUEUES["chat"]


@pytest.fixture
def local_rt(pg_engine: Engine, redis_url: str) -> Iterator[tuple[Runtime, Recorder, attempts.LocalRuns]]:
    """A worker runtime on a Redis broker whose pass may keep attempts for its own slots: two places
    offered to the line, no lead; this process has the role's slots (more than two) free."""
    rt, sent = local_worker_runtime(pg_engine, redis_url)
    local = attempts.LocalRuns(rt, [CHAT])
    rt.local = local
    recorder = fetches.recorder_for(rt.app)
    assert recorder is not None
    try:
        yield rt, sent, local
    finally:
        local.stop(10)


def fences(sent: Recorder) -> list[str]:
    return sent.attempt_fences()


def test_a_pass_keeps_what_it_claims_for_its_free_slots_and_sends_no_message(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns], redis_url: str
) -> None:
    rt, sent, local = local_rt
    jobs = [enqueue(rt.queue, "factory") for _ in range(2)]
    free = rt.slots.free
    started = dispatch.dispatch_queue(rt, CHAT)
    assert sorted(started) == sorted(j.id for j in jobs)
    assert fences(sent) == [] and sent.named(EXECUTE_TASK) == [] and sent.named(EXECUTE_BATCH_TASK) == []
    assert local.runs == 1
    wait_until(lambda: all(rt.queue.get(j.id).status == "completed" for j in jobs), what="both completed")  # type: ignore[union-attr]
    wait_until(lambda: rt.slots.free == free, what="the slots given back")
    # Recorded as this consumer's fetch before they ran, as a fetched message's attempts are.
    client = redis.Redis.from_url(redis_url)
    try:
        recorder = fetches.recorder_for(rt.app)
        assert recorder is not None
        for job in jobs:
            value = client.get(fetches.FETCH_PREFIX + driver_task_id(job.id, 0))
            assert value == f"{fetches.WORKER} {recorder.consumer}".encode()
    finally:
        client.close()


def test_past_its_free_slots_the_rest_of_the_pass_leaves_as_messages(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns],
) -> None:
    rt, sent, local = local_rt
    jobs = [enqueue(rt.queue, "factory") for _ in range(2)]
    taken = rt.slots.take(rt.slots.free - 2, 0)  # two left free: one to keep, one for messages
    try:
        dispatch.dispatch_queue(rt, CHAT)
        assert local.runs == 1
        assert [f.split(":attempt:")[0] for f in fences(sent)] == [jobs[1].id]
        wait_until(lambda: rt.queue.get(jobs[0].id).status == "completed", what="the kept one completed")  # type: ignore[union-attr]
    finally:
        rt.slots.give(taken)


def test_the_last_free_slot_is_left_for_a_message_already_waiting(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns],
) -> None:
    """LEAVE_FOR_MESSAGES = 1: another organisation's job claimed earlier, waiting in the broker,
    gets a slot at the consumer's next fetch, not after the attempts this process keeps."""
    rt, _sent, local = local_rt
    assert attempts.LEAVE_FOR_MESSAGES == 1
    taken = rt.slots.take(rt.slots.free - 1, 0)
    try:
        assert rt.slots.free == 1
        assert local.reserve(CHAT, 1) == 0
        assert rt.slots.free == 1
    finally:
        rt.slots.give(taken)
    assert local.reserve(CHAT, 100) == rt.slots.capacity - 1
    local.release(rt.slots.capacity - 1)


def test_nothing_is_kept_once_the_process_is_shutting_down_or_for_a_queue_it_does_not_consume(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns], monkeypatch: pytest.MonkeyPatch
) -> None:
    _rt, _sent, local = local_rt
    assert local.reserve(QUEUES["codex"], 1) == 0
    stopping = Shutdown()
    stopping.begin(5000)
    monkeypatch.setattr(attempts, "PROCESS", stopping)
    assert local.reserve(CHAT, 1) == 0
    monkeypatch.undo()
    assert local.reserve(CHAT, 1) == 1
    local.release(1)


def test_nothing_is_kept_for_a_queue_whose_consumer_an_operator_cancelled(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns],
) -> None:
    """``celery control cancel_consumer``: the process stops reading the queue, and takes no work of
    it by a pass of its own either (its claims leave as messages, for the processes still reading)."""
    rt, _sent, local = local_rt
    queues = rt.app.amqp.queues
    queues.select([CHAT, QUEUES["codex"]])  # this test's own app: nothing to restore
    assert local.reserve(CHAT, 1) == 1
    local.release(1)
    queues.deselect(CHAT)  # what the cancel does to the consumer's queues
    assert local.reserve(CHAT, 1) == 0


def test_a_pass_whose_messages_fail_gives_the_reserved_slots_back_and_runs_nothing_here(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, _sent, local = local_rt
    jobs = [enqueue(rt.queue, "factory") for _ in range(2)]
    rt.slots.take(rt.slots.free - 2, 0)  # one kept here, one sent
    free = rt.slots.free

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise ConnectionError("the broker went away")

    monkeypatch.setattr(dispatch, "send_items", broken)
    with pytest.raises(ConnectionError):
        dispatch.dispatch_queue(rt, CHAT)
    assert rt.slots.free == free
    assert local.runs == 0
    assert all(rt.queue.get(j.id).status == "queued" for j in jobs)  # type: ignore[union-attr]


def test_slots_held_for_items_that_cannot_run_are_given_back(
    local_rt: tuple[Runtime, Recorder, attempts.LocalRuns],
) -> None:
    """``execute_batch(held=n)``: a held slot whose item does not run here (its fence names another
    job) is returned at once, not kept until the process ends."""
    rt, _sent, _local = local_rt
    free = rt.slots.free
    assert rt.slots.take(2, 0) == 2
    out = attempts.execute_batch(
        rt, [["job-a", "job-b:attempt:1", "job-a", 0], ["job-c", "job-d:attempt:1", "job-c", 0]], held=2
    )
    assert [item["status"] for item in out["items"]] == ["stale_attempt", "stale_attempt"]
    assert rt.slots.free == free
