"""JSON logs around a real attempt: the handler's own lines and Celery's outcome
line carry ``jobId``, ``attempt``, ``fence``, ``workerId``, ``role`` and ``org``."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs.routing import EXECUTE_TASK
from app.ops import logs
from tasks import celery_app
from workers.handler import JobContext
from workers.runner import run_attempt

from .runtime_support import ORG, enqueue, registry_of


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    held = {name: logging.getLogger(name).level for name in (*logs.TICK_LOGGERS, logs.TICK_PASSES)}
    # Celery's per-task outcome lines are held back unless RECEIPT_LOG_TICKS=enabled: this test
    # reads one of them.
    logs.configure(
        Settings.from_env({"RECEIPT_LOG_FORMAT": "json", "RECEIPT_LOG_TICKS": "enabled"}), "worker-chat"
    )
    buf = io.StringIO()
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buf)
    yield buf
    logs.clear_job()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in held.items():
        logging.getLogger(name).setLevel(level)


def noisy(ctx: JobContext) -> Any:
    logging.getLogger("handler.noisy").info("working on it")
    return {"ok": True}


def test_every_line_of_an_attempt_carries_the_job_fields(
    sqlite_engine: Engine, json_lines: io.StringIO
) -> None:
    queue = queue_for(sqlite_engine)
    job = enqueue(queue, "test-noisy")
    fence = f"{job.id}:attempt:1"
    task = SimpleNamespace(name=EXECUTE_TASK)
    # What Celery does around the execute task: prerun, the task body, its outcome line, postrun.
    celery_app._bind_job_to_logs(task=task, args=[job.id, fence, job.id, 0])
    result = run_attempt(queue, Settings(), registry_of({"test-noisy": noisy}), job.id, 1)
    logging.getLogger("celery.app.trace").info("Task receipt.execute[%s] succeeded", fence)
    celery_app._unbind_job_from_logs()
    logging.getLogger("celery.worker").info("idle again")
    assert result.status == "completed"

    lines = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    by_message = {line["message"]: line for line in lines}
    for message in ("working on it", f"Task receipt.execute[{fence}] succeeded"):
        line = by_message[message]
        assert line["jobId"] == job.id and line["fence"] == fence and line["attempt"] == 1, line
        assert line["org"] == ORG and line["workerId"].count(":") >= 2, line
        assert line["role"] == "worker-chat"
    assert "jobId" not in by_message["idle again"]  # the pool thread does not keep the last job
