"""Every process builds its queue in one place (``app.composition.build_queue``), so every process
obeys every queue setting: the cap the API enforces is the workers' and the resume pass's too."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import Settings
from app.factory.hooks import Ledger
from app.jobs.errors import TooManyCommands
from app.jobs.validation import validate_enqueue
from app.storage.hooks import CallbackOutbox
from app.storage.queue import Queue
from tasks.celery_app import make_celery
from tests.support.queue_ops import close_queues
from workers.runtime import get_runtime

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

CAP = 2


def steer(queue: Queue, job_id: str) -> None:
    """A worker-side steer enqueue (the path a handler or the Factory takes): no API in between."""
    payload = {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "org-a"}}
    body = {"jobId": job_id, "payload": payload, "sessionKey": "s", "singletonMode": "steer"}
    queue.enqueue(validate_enqueue("factory", body))


@pytest.mark.redis
def test_a_worker_side_enqueue_obeys_the_command_cap_the_api_obeys(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=database_url, home=str(tmp_path), redis_url=redis_url, max_commands_per_job=CAP
    )
    runtime = get_runtime(make_celery(settings))
    queue = runtime.queue
    try:
        assert queue.max_commands_per_job == CAP
        steer(queue, "first")  # creates the session's job
        for n in range(CAP):
            steer(queue, f"steer-{n}")  # each lands on it as a steer command
        with pytest.raises(TooManyCommands, match=f"RECEIPT_MAX_COMMANDS_PER_JOB={CAP}"):
            steer(queue, "one-too-many")
    finally:
        close_queues(queue.engine)
        queue.engine.dispose()


def test_the_api_and_the_resume_queue_come_from_the_same_builder(tmp_path: Path) -> None:
    from api.app import create_app
    from app import composition

    settings = Settings(home=str(tmp_path), max_commands_per_job=CAP, callback_url="http://127.0.0.1:9/cb")
    app = create_app(settings, on_dispatchable=lambda jobs: None)
    queue: Queue = app.extensions["receipt"].queue
    built = composition.build_queue(settings, engine=queue.engine, on_dispatchable=lambda jobs: None)
    try:
        for q in (queue, built):
            assert q.max_commands_per_job == CAP
            callbacks, ledger_hook = q.hook(CallbackOutbox), q.hook(Ledger)
            assert callbacks is not None and callbacks.targets == settings.callback_targets != ()
            assert ledger_hook is not None and ledger_hook.writer is not None  # in the background
            assert [type(h) for h in q.hooks] == [type(h) for h in built.hooks]
    finally:
        queue.close()
        built.close()
        queue.engine.dispose()
