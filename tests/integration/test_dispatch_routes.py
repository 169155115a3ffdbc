"""A scan finds the lines of the jobs it was woken for from their rows (``delivery.dispatch.queues_of``,
``projection.load_routes``: one statement, prepared once on PostgreSQL whatever the batch's size).
A queued row written without its ``worker_queue`` gets it back from its agent and kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sqlalchemy import select, update

from app.jobs.routing import queue_for
from app.storage import projection
from app.storage.db import jobs
from app.storage.queue import Queue
from delivery.dispatch import queues_of

from .runtime_support import enqueue


def test_the_woken_jobs_lines_come_from_their_rows_and_a_missing_one_is_written_back(queue: Queue) -> None:
    chat = enqueue(queue, "factory", kind="factory.run")
    task = enqueue(queue, "factory")
    with queue.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == task.id).values(worker_queue=None))
    rt: Any = SimpleNamespace(engine=queue.engine)
    expected = {queue_for(chat.agent_id, chat.kind), queue_for(task.agent_id, task.kind)}
    assert queues_of(rt, [chat.id, task.id, "no-such-job"]) == expected
    with queue.engine.connect() as conn:
        written = conn.execute(select(jobs.c.worker_queue).where(jobs.c.id == task.id)).scalar_one()
        routes = projection.load_routes(conn, [task.id, chat.id])
    assert written == queue_for(task.agent_id, task.kind)
    assert sorted(routes) == sorted(
        [
            (chat.id, chat.agent_id, chat.kind, "queued", queue_for(chat.agent_id, chat.kind)),
            (task.id, task.agent_id, task.kind, "queued", written),
        ]
    )
