"""The objective watchdog on a real database (SQLite and Postgres): the pass, its paging, its
timeout, the tick job and the handler. (Only a system token may post the watchdog kind:
tests/integration/api/test_enqueue.py::test_watchdog_is_system_only_and_needs_no_authcontext.)"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.factory import service, storage, sweep
from app.factory.plan import validate_objective
from app.factory.vocab import objective_stream
from app.jobs.ids import SYSTEM_ORGANIZATION, qualify
from app.storage import store
from app.storage.db import db_now, jobs, transaction
from app.storage.queue import Queue
from tests.factory_support import DIAMOND, drain, plan

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

REPO = Path(__file__).resolve().parents[2]
AUTH = {"userId": "u1", "organizationId": "org-a"}


def lost(engine: Engine, client_id: str) -> str:
    """An active objective whose control request and control job were both lost: launched with no
    fast path, then its request marked consumed as if a control step consumed it and died.
    Returns its key (org-a's ``client_id``): what the watchdog, a system job, names objectives by."""
    quiet = queue_for(engine, control_fast_path=False)
    body = {"objectiveId": client_id, "title": "t", "goal": "g", "plan": plan(DIAMOND)}
    objective_id = service.launch(
        quiet, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher()
    ).objective.id
    assert objective_id == qualify("org-a", client_id)
    with transaction(engine) as conn:
        storage.lock(conn, objective_id)
        loaded = storage.load(conn, objective_id)
        assert loaded is not None and [r.id for r in loaded.objective.pending] == ["launch"]
        storage.apply(
            conn,
            loaded,
            objective_id,
            [("objective.control_consumed", {"requestIds": ["launch"]})],
            at=db_now(conn),
        )
    return objective_id


def control_jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(jobs.c.kind == "factory.objective.control")).scalar_one()
        )


def test_a_lost_objective_is_reconciled_and_then_completes(queue: Queue) -> None:
    key = lost(queue.engine, "w-lost")
    assert control_jobs(queue.engine) == 0
    result = sweep.watchdog_pass(queue, Settings())
    assert result["reconciled"] == [{"objectiveId": key, "reason": "no_active_objective_work"}]
    assert result["scanned"] == 1 and result["timedOut"] is False
    # The request went through the outbox: a receipt on the objective stream, then its control job.
    with queue.engine.connect() as conn:
        last = store.read_stream(conn, objective_stream(key))[-1]
    assert last.type == "objective.control_requested" and last.body["reason"] == "reconcile"
    assert last.body["detail"] == {"objectiveId": key, "reason": "no_active_objective_work"}
    assert control_jobs(queue.engine) == 1
    drain(queue)
    obj = service.get(queue.engine, key)
    assert obj is not None and obj.status == "completed"
    assert sweep.watchdog_pass(queue, Settings())["reconciled"] == []


def test_an_objective_with_work_in_flight_or_control_due_is_left_alone(queue: Queue) -> None:
    body = {"objectiveId": "w-busy", "title": "t", "goal": "g", "plan": plan(DIAMOND)}
    key = service.launch(
        queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher()
    ).objective.id
    # A control job is queued (the fast path): control is due.
    assert sweep.watchdog_pass(queue, Settings())["reconciled"] == []
    drain(queue, skip_agents=("test-echo",))  # control ran; task A's job is queued
    assert service.get(queue.engine, key).status == "active"  # type: ignore[union-attr]
    result = sweep.watchdog_pass(queue, Settings())
    assert result["reconciled"] == [] and result["scanned"] == 1


def test_pages_oldest_first_within_the_scan_limit(queue: Queue) -> None:
    keys = [lost(queue.engine, f"w-page-{i}") for i in range(5)]
    result = sweep.watchdog_pass(queue, Settings(objective_watchdog_scan_limit=2))
    assert result["scanned"] == 5 and result["pages"] == 3 and result["scanLimit"] == 2
    assert [r["objectiveId"] for r in result["reconciled"]] == keys


def test_a_pass_stops_at_its_timeout(queue: Queue) -> None:
    lost(queue.engine, "w-late")
    ticks = iter([0.0, 0.0, 11.0, 11.0])  # started, first page check, then past the 10 s floor
    result = sweep.watchdog_pass(
        queue,
        Settings(objective_watchdog_timeout_ms=1, objective_watchdog_scan_limit=1),
        clock=lambda: next(ticks),
    )
    assert result["timeoutMs"] == 10_000
    assert result["timedOut"] is True and result["scanned"] == 1 and result["pages"] == 1


def test_another_organisations_control_job_for_the_same_objective_id_does_not_hide_a_lost_one(
    queue: Queue,
) -> None:
    """Control jobs are matched to objectives within their organisation: org-b's queued control
    job for its "w-same" neither stands for org-a's lost "w-same" nor is reconciled itself."""
    a_key = lost(queue.engine, "w-same")
    body = {"objectiveId": "w-same", "title": "t", "goal": "g", "plan": plan(DIAMOND)}
    b_auth = {"userId": "u2", "organizationId": "org-b"}
    b_key = service.launch(
        queue, validate_objective(body, auth_context=b_auth), launched_by=service.system_launcher()
    ).objective.id
    assert b_key == qualify("org-b", "w-same") and control_jobs(queue.engine) == 1  # org-b's, queued
    result = sweep.watchdog_pass(queue, Settings())
    assert result["scanned"] == 2
    assert result["reconciled"] == [{"objectiveId": a_key, "reason": "no_active_objective_work"}]


def test_two_beats_for_one_tick_enqueue_one_job(queue: Queue) -> None:
    tick = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    a = sweep.enqueue_tick(queue, Settings(), tick + timedelta(milliseconds=4))
    b = sweep.enqueue_tick(queue, Settings(), tick + timedelta(milliseconds=870))
    c = sweep.enqueue_tick(queue, Settings(), tick + timedelta(minutes=1, milliseconds=2))
    assert a.created and not b.created and c.created
    # The system's own job, in the reserved organisation no token can act for.
    assert a.job.id == b.job.id == "_system/watchdog:20260301T093000Z" != c.job.id
    assert a.job.agent_id == "factory-control" and a.job.kind == "factory.objective.watchdog"
    assert a.job.organization_id == SYSTEM_ORGANIZATION and a.job.client_id == "watchdog:20260301T093000Z"


def test_the_watchdog_job_runs_a_pass_and_reports_what_it_reconciled(queue: Queue) -> None:
    key = lost(queue.engine, "w-job")
    job = sweep.enqueue_tick(queue, Settings()).job
    drain(queue, skip_agents=("test-echo",))
    done = queue.get(job.id)
    assert done is not None and done.status == "completed"
    result: dict[str, Any] = done.result
    assert result["reconciled"] == [{"objectiveId": key, "reason": "no_active_objective_work"}]
    assert result["scanned"] >= 1


def test_beat_refuses_to_start_on_an_invalid_cron(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "RECEIPT_HOME": str(tmp_path),
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON": "*/5 * * *",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tasks.beat"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON='*/5 * * *' is not a standard 5-field cron" in done.stderr
    # Turned off, the same expression is never read.
    off = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.config import Settings; from tasks.celery_app import make_celery; "
            "print(sorted(make_celery(Settings.from_env()).conf.beat_schedule))",
        ],
        env={**env, "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    assert "objective-watchdog" not in off.stdout


def test_a_reconcile_is_not_written_while_a_request_is_pending(queue: Queue) -> None:
    # Two watchdog passes at once (overlapping ticks) must not both write one.
    key = lost(queue.engine, "w-twice")
    quiet = queue_for(queue.engine, control_fast_path=False)
    assert service.request(quiet, key, "reconcile", {"reason": "no_active_objective_work"})
    assert not service.request(quiet, key, "reconcile", {"reason": "no_active_objective_work"})
    obj = service.get(queue.engine, key, all_tasks=False)
    assert obj is not None and [r.reason for r in obj.pending] == ["reconcile"]
