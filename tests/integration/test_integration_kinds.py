"""``factory.integration.validate`` and ``…publish`` on codex: the same command runner as
``factory.task.run`` (real subprocesses), and publish's signed POST to a real local HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from standardwebhooks.webhooks import Webhook

from app.composition import queue_for
from app.config import Settings
from app.factory import service
from app.factory.plan import validate_objective
from app.jobs.timing import timing_for
from app.storage.queue import Queue
from tests.factory_support import drain, plan
from tests.support.queue_ops import lease
from workers.handler import HandlerError, JobContext
from workers.registry import dispatch

from .runtime_support import ORG, enqueue

# A system binary: the command's filesystem view holds the system trees, not the worker's venv.
PY = "/usr/bin/python3"
SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"  # base64 of a test secret
AUTH = {"userId": "u1", "organizationId": ORG}


def context(queue: Queue, settings: Settings, kind: str, **payload: Any) -> JobContext:
    job = enqueue(queue, "codex", kind=kind, **payload)
    timing = timing_for(job.agent_id, job.kind, job.payload, settings)
    out = lease(queue, job.id, "codex-worker", timing.lease_ms)
    assert out.applied
    return JobContext(queue, out.job, "codex-worker", 1, settings, timing.execution_timeout_ms)


ENABLED = Settings.from_env({"RECEIPT_CODEX_COMMANDS": "enabled"})


def test_validate_runs_a_command_through_the_codex_runner(sqlite_engine: Engine) -> None:
    queue = queue_for(sqlite_engine)
    ok = dispatch(context(queue, ENABLED, "factory.integration.validate", command=[PY, "-c", "print('ok')"]))
    assert ok["exitCode"] == 0 and "ok" in ok["outputTail"]
    bad = context(
        queue,
        ENABLED,
        "factory.integration.validate",
        command=[PY, "-c", "print('lint: 3 errors'); raise SystemExit(2)"],
    )
    with pytest.raises(HandlerError) as failed:
        dispatch(bad)
    assert "exited with 2" in failed.value.message and "lint: 3 errors" in failed.value.message
    # The same gate as factory.task.run: off unless the deployment enables commands.
    off = context(queue, Settings(), "factory.integration.validate", command=[PY, "-c", "print(1)"])
    with pytest.raises(HandlerError, match="RECEIPT_CODEX_COMMANDS=enabled"):
        dispatch(off)


def test_publish_with_a_command_runs_it(sqlite_engine: Engine) -> None:
    queue = queue_for(sqlite_engine)
    out = dispatch(
        context(queue, ENABLED, "factory.integration.publish", command=[PY, "-c", "print('shipped')"])
    )
    assert out["exitCode"] == 0 and "shipped" in out["outputTail"]


class _Sink(http.server.BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[str]:
    _Sink.received = []
    _Sink.status = 204
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_publish_posts_the_objectives_task_results_signed(sqlite_engine: Engine, sink: str) -> None:
    queue = queue_for(sqlite_engine)
    body = {"objectiveId": "pub-1", "title": "t", "goal": "g", "plan": plan({"A": [], "B": ["A"]})}
    service.launch(queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher())
    drain(queue)
    settings = Settings(integration_publish_url=sink, integration_publish_secret=SECRET)
    ctx = context(queue, settings, "factory.integration.publish", objectiveId="pub-1")
    out = dispatch(ctx)
    assert out["published"] is True and out["status"] == 204 and out["tasks"] == 2
    [(headers, raw)] = _Sink.received
    # Standard Webhooks: the receiver verifies with the same library and secret.
    verified = Webhook(SECRET).verify(raw, headers)
    assert verified["objectiveId"] == "pub-1"
    assert [(t["id"], t["status"]) for t in verified["tasks"]] == [("A", "completed"), ("B", "completed")]
    assert verified["tasks"][1]["result"]["inputs"]["A"]["task"] == "A"
    assert headers["webhook-id"] == f"{ctx.job.id}:1"
    assert SECRET not in json.dumps(out)


def test_publish_refuses_without_configuration_and_classifies_answers(
    sqlite_engine: Engine, sink: str
) -> None:
    queue = queue_for(sqlite_engine)
    body = {"objectiveId": "pub-2", "title": "t", "goal": "g", "plan": plan({"A": []})}
    service.launch(queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher())
    drain(queue)
    with pytest.raises(HandlerError, match="RECEIPT_INTEGRATION_PUBLISH_URL") as unset:
        dispatch(context(queue, Settings(), "factory.integration.publish", objectiveId="pub-2"))
    assert unset.value.retryable is False
    settings = Settings(integration_publish_url=sink, integration_publish_secret="plain-secret")
    _Sink.status = 503
    with pytest.raises(HandlerError, match="answered 503") as down:
        dispatch(context(queue, settings, "factory.integration.publish", objectiveId="pub-2"))
    assert down.value.retryable is True
    _Sink.status = 400
    with pytest.raises(HandlerError, match="answered 400") as refused:
        dispatch(context(queue, settings, "factory.integration.publish", objectiveId="pub-2"))
    assert refused.value.retryable is False
