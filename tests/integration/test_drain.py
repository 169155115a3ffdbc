"""What a process does beside its attempts when it shuts down: the web's event streams drain
(``api.watch.StreamPoller.drain``, ``api.sse``), and the driver hands back wake-ups it took
(``delivery.dispatch``). On every backend where a database is involved; the wake list is a double."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from api import sse
from api.watch import StreamPoller
from app.ops.shutdown import PROCESS
from app.storage.queue import Queue
from delivery import dispatch, listeners

from .runtime_support import enqueue

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

TIMING = sse.Timing(poll_ms=50, max_seconds=30, heartbeat_seconds=30)


def test_draining_ends_an_open_stream_at_once_with_a_retry_hint(engine: Engine, queue: Queue) -> None:
    job = enqueue(queue, "test-drain")
    poller = StreamPoller(engine, 50)
    frames: Iterator[str] = sse.follow(engine, poller, job.stream, 0, "job", TIMING)
    assert next(frames).startswith("retry:")
    first = next(frames)
    assert first.startswith("id: 1\nevent: job")  # every state from the start is sent first
    assert poller.drain() == 1  # one open follower told to reconnect
    rest = list(frames)  # ends now, not at max_seconds
    assert rest == [sse.DRAINING] and sse.DRAINING.startswith(f"retry: {sse.DRAIN_RETRY_MS}\n")
    # A stream that starts while draining ends the same way, at once (without sending what the
    # next process will).
    late = list(sse.follow(engine, poller, job.stream, 1, "job", TIMING))
    assert late[-1] == sse.DRAINING and not any(f.startswith("id:") for f in late)


class Wakes:
    def __init__(self, batch: list[str]) -> None:
        self.batch = batch
        self.stopped_listening = False

    def listen(self, count: int, block_s: float = 1.0, *, queues: Sequence[str] = ()) -> list[str]:
        batch, self.batch = self.batch, []
        return batch

    def take(self, count: int, queues: Sequence[str] = ()) -> list[str]:
        return []

    def adopt(self, queues: Sequence[str]) -> int:
        return 0

    def stop_listening(self, queues: Sequence[str] = ()) -> list[str]:
        self.stopped_listening = True
        return []


class Delivery:
    def __init__(self) -> None:
        self.woken: list[list[str]] = []

    def wake_ids(self, ids: list[str]) -> None:
        self.woken.append(list(ids))


@pytest.fixture
def shutting_down() -> Iterator[None]:
    PROCESS.begin(1_000)
    try:
        yield
    finally:
        PROCESS.reset()


def _runtime(batch: list[str]) -> Any:
    return SimpleNamespace(wakes=Wakes(batch), delivery=Delivery(), passes={}, looks={})


@pytest.mark.usefixtures("shutting_down")
def test_a_stopping_driver_hands_back_the_wake_ups_it_took_instead_of_claiming_them() -> None:
    rt = _runtime([])
    assert dispatch.drain_wakes(rt, ["org/a", "org/b"]) == []  # nothing claimed, nothing sent
    assert rt.delivery.woken == [["org/a", "org/b"]] and rt.wakes.stopped_listening


@pytest.mark.usefixtures("shutting_down")
def test_the_wake_listener_hands_back_a_batch_that_arrives_as_it_stops() -> None:
    rt = _runtime(["org/c"])
    listener = listeners.WakeListener(rt)
    listener._run()  # returns: the batch went back and the listener stopped
    assert rt.delivery.woken == [["org/c"]]
