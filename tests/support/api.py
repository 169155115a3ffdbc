"""The API under test in-process: an app over a given engine, tokens for two organisations and a
system identity, helpers to post jobs and count receipts, and a reader for Server-Sent Events.

No broker: ``on_dispatchable`` is a recording list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from werkzeug.test import TestResponse

from api.app import create_app
from api.context import EXTENSION, ApiState
from app.config import Settings
from app.jobs.ids import qualify
from app.jobs.reducer import Job
from app.storage import tokens
from app.storage.db import receipts
from app.storage.queue import Queue
from tests.support.queue_ops import closed_with_engine, lease

ORG_A = "org-a"
ORG_B = "org-b"
WORKER = "worker-1"
# A task of the plan ``Api.objective`` launches (agent test-echo: tests.factory_support runs it).
ONE_TASK = {"id": "A", "agentId": "test-echo", "payload": {"kind": "factory.task.run"}}
LEASE_MS = 60_000


def as_posted(job: dict[str, Any]) -> dict[str, Any]:
    """A job as read, without what only a read adds (``waiting``, why a queued job waits, derived
    when asked): comparable with the job an enqueue answered."""
    return {k: v for k, v in job.items() if k != "waiting"}


def json_of(response: TestResponse) -> Any:
    """The response's JSON body, asserted present (Werkzeug types ``.json`` as optional)."""
    data = response.json
    assert data is not None, response.get_data(as_text=True)
    return data


def key(job: Mapping[str, Any]) -> str:
    """The storage key of a job (or objective) from its API JSON: the id its organisation knows it
    by, qualified with that organisation. Queue and storage calls take keys; HTTP takes client ids."""
    return qualify(job["organizationId"], job["id"])


def auth_context(org: str = ORG_A, user: str = "user-1", **extra: Any) -> dict[str, Any]:
    return {"userId": user, "organizationId": org, **extra}


def payload(kind: str = "factory.run", org: str | None = ORG_A, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": kind, **extra}
    if org is not None:
        body["authContext"] = auth_context(org)
    return body


@dataclass
class Api:
    """One app under test and the things tests reach for."""

    app: Flask
    client: FlaskClient
    engine: Engine
    queue: Queue
    woken: list[Job]
    secrets: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> ApiState:
        value: ApiState = self.app.extensions[EXTENSION]
        return value

    def headers(self, who: str = "a", **extra: str) -> dict[str, str]:
        """Authorization for ``a`` (org A), ``b`` (org B) or ``system``."""
        return {"Authorization": f"Bearer {self.secrets[who]}", **extra}

    def enqueue(self, who: str = "a", agent: str = "factory", **body: Any) -> TestResponse:
        body.setdefault("payload", payload(org=ORG_B if who == "b" else ORG_A))
        return self.client.post(f"/agents/{agent}/jobs", json=body, headers=self.headers(who))

    def job(self, who: str = "a", **body: Any) -> dict[str, Any]:
        """Enqueue and return the job JSON (asserting 202)."""
        response = self.enqueue(who, **body)
        assert response.status_code == 202, response.json
        job: dict[str, Any] = json_of(response)["job"]
        return job

    def objective(self, who: str = "a", **body: Any) -> dict[str, Any]:
        """Launch an objective of one task (``body`` overrides) and return its JSON (asserting 202)."""
        body.setdefault("title", "An objective")
        body.setdefault("goal", "Give a job something to name")
        body.setdefault("plan", {"tasks": [ONE_TASK]})
        response = self.client.post("/objectives", json=body, headers=self.headers(who))
        assert response.status_code == 202, response.json
        objective: dict[str, Any] = json_of(response)["objective"]
        return objective

    def receipt_count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(receipts)).scalar_one())

    def lease_and_start(self, job_id: str) -> int:
        """Lease as ``WORKER`` and heartbeat (leased → running); returns the attempt."""
        leased = lease(self.queue, job_id, WORKER, LEASE_MS)
        assert leased.applied
        attempt = leased.job.attempt
        assert self.queue.heartbeat(job_id, WORKER, attempt, LEASE_MS).applied
        return attempt


def build_api(engine: Engine, settings: Settings) -> Api:
    woken: list[Job] = []
    app = create_app(settings, engine=engine, on_dispatchable=woken.extend)
    app.extensions[EXTENSION].sse_heartbeat_seconds = 60.0
    api = Api(app, app.test_client(), engine, app.extensions[EXTENSION].queue, woken)
    closed_with_engine(api.queue)
    api.secrets["a"] = tokens.create(engine, ORG_A)[1]
    api.secrets["b"] = tokens.create(engine, ORG_B)[1]
    api.secrets["system"] = tokens.create(engine, "ops", system=True)[1]
    return api


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    # A deployment that runs commands (RECEIPT_CODEX_COMMANDS=enabled), so the scope rules are
    # what a command post meets; `codex_commands=False` is the deployment that runs none.
    values: dict[str, Any] = {
        "home": str(tmp_path / "home"),
        "sse_poll_ms": 10,
        "sse_max_seconds": 3,
        "codex_commands": True,
    }
    values.update(overrides)
    return Settings(**values)


def idle_loops() -> dict[str, Any]:
    """Settings under which no recovery loop falls due while a test runs.

    An in-process API has no worker beside it, so no loop ever runs: /readyz (rightly) calls each
    one overdue three of its periods after the API was built, and a test slowed by a loaded
    machine would read 503. Intervals of ten minutes and the watchdog's cron off keep it ready."""
    from app.ops import loop_registry

    idle: dict[str, Any] = {declared.attr: 600_000 for declared in loop_registry.interval_settings()}
    idle["objective_watchdog_enabled"] = False
    return idle


# -- Server-Sent Events -------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One parsed SSE frame (a comment-only frame has ``comment`` set and nothing else)."""

    id: int | None = None
    event: str | None = None
    data: Any = None
    comment: str | None = None
    retry: int | None = None


def parse_frame(text: str) -> Frame:
    fields: dict[str, Any] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "":
            fields["comment"] = value
        elif name == "id":
            fields["id"] = int(value)
        elif name == "event":
            fields["event"] = value
        elif name == "data":
            fields["data"] = json.loads(value)
        elif name == "retry":
            fields["retry"] = int(value)
    return Frame(**fields)


class EventReader:
    """Pull frames from a streaming test response one at a time (the server runs lazily)."""

    def __init__(self, response: TestResponse) -> None:
        self.response = response
        self._chunks = iter(response.response)
        self._buffer = ""
        self.ended = False

    def next_frame(self) -> Frame | None:
        """The next frame, or None when the server ended the stream."""
        while "\n\n" not in self._buffer:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self.ended = True
                return None
            self._buffer += chunk.decode() if isinstance(chunk, bytes) else str(chunk)
        text, self._buffer = self._buffer.split("\n\n", 1)
        return parse_frame(text)

    def next_event(self) -> Frame | None:
        """The next frame that carries an event (skipping retry and heartbeat frames)."""
        while True:
            frame = self.next_frame()
            if frame is None or frame.event is not None:
                return frame

    def rest(self) -> list[Frame]:
        """Every remaining event frame until the server ends the stream."""
        out = []
        while (frame := self.next_event()) is not None:
            out.append(frame)
        return out

    def close(self) -> None:
        self.response.close()
