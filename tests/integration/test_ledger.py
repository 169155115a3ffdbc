"""The durable ledger on a real database (SQLite and Postgres): rows derived from receipts, written
after commit and best effort (an injected failure leaves jobs and objectives unaffected), rebuilt
exactly by ``receipt rebuild-ledger``, summarised by ``GET /objectives/<id>``; a ``run`` workflow
read from its job's row, never written."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.factory import ledger, service
from app.factory.hooks import Ledger
from app.factory.plan import validate_objective
from app.jobs.ids import qualify
from app.jobs.validation import EnqueueRequest
from app.storage.db import durable_activities, durable_workflows, jobs
from app.storage.queue import Queue
from tests.factory_support import DIAMOND, drain, plan
from tests.support.queue_ops import complete, lease

AUTH = {"userId": "u1", "organizationId": "org-a"}


def launch(queue: Queue, oid: str) -> str:
    """Launch org-a's objective ``oid``; returns its key (the ledger's rows name objectives by it)."""
    body = {"objectiveId": oid, "title": "t", "goal": "g", "plan": plan(DIAMOND)}
    obj = service.launch(
        queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher()
    ).objective
    assert obj.id == qualify("org-a", oid)
    return obj.id


def rows(engine: Engine) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ledger's workflows (stored and read from jobs) and activities."""
    with engine.connect() as conn:
        flows = ledger.workflows(conn)
        acts = [
            dict(r._mapping)
            for r in conn.execute(
                select(durable_activities).order_by(durable_activities.c.job_id, durable_activities.c.attempt)
            )
        ]
    return flows, acts


def test_an_objective_leaves_one_control_workflow_and_one_activity_per_task_attempt(queue: Queue) -> None:
    key = launch(queue, "lg-1")
    drain(queue)
    flows, acts = rows(queue.engine)
    assert [(f["id"], f["name"], f["status"], f["objective_id"]) for f in flows] == [
        ("objective-control:org-a/lg-1", "objective-control", "completed", key)
    ]
    assert flows[0]["steps"] >= 1 and flows[0]["ended_at"] is not None
    assert flows[0]["organization_id"] == "org-a"
    assert [(a["job_id"], a["attempt"], a["status"]) for a in acts] == [
        (f"org-a/lg-1:p1:{t}", 1, "completed") for t in ("A", "B", "C", "D")
    ]
    for a in acts:
        # Rows name the objective by its key, so another organisation's "lg-1" never mixes in.
        assert a["kind"] == "factory.task.run" and a["objective_id"] == key and a["worker_id"]
        assert a["duration_ms"] is not None and a["duration_ms"] >= 0 and a["ended_at"] >= a["started_at"]
    # Only factory.task.run has activities: control and audit jobs ran but have none.
    assert {a["kind"] for a in acts} == {"factory.task.run"}


def test_a_factory_run_job_is_its_own_run_workflow(queue: Queue) -> None:
    body = {"kind": "factory.run", "authContext": AUTH, "goal": "no plan: refused"}
    job = queue.enqueue(EnqueueRequest(agent_id="factory", payload=body, job_id="run-1")).job
    drain(queue)
    flows, _ = rows(queue.engine)
    run = next(f for f in flows if f["id"] == "run:org-a/run-1")
    assert (run["name"], run["job_id"], run["status"], run["steps"]) == ("run", job.id, "failed", 1)


def test_a_ledger_write_failure_never_fails_the_mutation_and_rebuild_repairs_it(
    queue: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_engine: Engine, _job_id: str) -> None:
        raise RuntimeError("ledger database is down")

    monkeypatch.setattr(ledger, "sync_job", broken)
    key = launch(queue, "lg-2")
    with caplog.at_level(logging.ERROR, logger="receipt.ledger"):
        drain(queue)
    obj = service.get(queue.engine, key)
    assert obj is not None and obj.status == "completed"  # the objective is unaffected
    job = queue.get(f"{key}:p1:D")
    assert job is not None and job.status == "completed" and job.attempt == 1  # and so is each job
    assert rows(queue.engine) == ([], [])
    assert "durable ledger write for job org-a/lg-2:p1:A failed" in caplog.text
    monkeypatch.undo()
    counts = ledger.rebuild(queue.engine)
    assert counts["activities"] == 4 and counts["workflows"] == 1
    flows, acts = rows(queue.engine)
    assert flows[0]["status"] == "completed" and [a["status"] for a in acts] == ["completed"] * 4
    assert flows[0]["objective_id"] == key and {a["objective_id"] for a in acts} == {key}


def test_rebuild_recreates_exactly_what_was_written(queue: Queue) -> None:
    launch(queue, "lg-3")
    drain(queue)
    before = rows(queue.engine)
    assert len(before[0]) == 1 and len(before[1]) == 4  # something to recreate
    ledger.rebuild(queue.engine)
    assert rows(queue.engine) == before


def test_the_control_row_comes_from_the_header_and_an_older_header_from_the_stream(queue: Queue) -> None:
    """A control job's ledger write reads the objective's header (one row), not its whole stream:
    the fold keeps the step count and the last move's time. A header written before it kept them
    (an upgrade mid-objective) is re-derived from the stream, so the row is the same either way."""
    from sqlalchemy import update

    from app.storage.db import objectives, transaction

    key = launch(queue, "lg-5")
    drain(queue)
    written = rows(queue.engine)[0]
    header = service.get(queue.engine, key, all_tasks=False)
    assert header is not None and header.control_steps == written[0]["steps"] >= 1
    with transaction(queue.engine) as conn:
        state = conn.execute(select(objectives.c.state).where(objectives.c.id == key)).scalar_one()
        old = {k: v for k, v in state.items() if k not in ("controlSteps", "controlMovedAt")}
        conn.execute(update(objectives).where(objectives.c.id == key).values(state=old))
        conn.execute(durable_workflows.delete())
        ledger.sync_objective(conn, key)
    assert rows(queue.engine)[0] == written


def test_get_objective_includes_the_ledger_summary(sqlite_engine: Engine) -> None:
    from api.app import create_app
    from app.storage import tokens

    queue = queue_for(sqlite_engine)
    launch(queue, "lg-4")
    drain(queue)
    app = create_app(
        Settings(database_url=str(sqlite_engine.url)), engine=sqlite_engine, on_dispatchable=lambda j: None
    )
    token = tokens.create(sqlite_engine, "org-a")[1]
    r = app.test_client().get("/objectives/lg-4", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.json
    summary = r.json["objective"]["ledger"]  # type: ignore[index]
    assert [w["id"] for w in summary["workflows"]] == ["objective-control:org-a/lg-4"]
    assert summary["workflows"][0]["status"] == "completed"
    assert summary["activities"]["total"] == 4 and summary["activities"]["byStatus"] == {"completed": 4}


def test_the_cli_verb_rebuilds_the_ledger(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.ops.cli import main

    queue = queue_for(sqlite_engine)
    launch(queue, "lg-5")
    drain(queue)
    monkeypatch.setenv("DATABASE_URL", str(sqlite_engine.url))
    assert main(["rebuild-ledger"]) == 0
    assert "1 workflows and 4 activities" in capsys.readouterr().out


def stored(engine: Engine) -> list[str]:
    """The ids of the workflow rows ``durable_workflows`` holds."""
    with engine.connect() as conn:
        return list(conn.execute(select(durable_workflows.c.id).order_by(durable_workflows.c.id)).scalars())


def test_a_run_workflow_is_read_from_its_jobs_row_and_never_written(engine: Engine) -> None:
    """A ``factory.run`` job's workflow is its projection row read as one: current after every
    transition, with nothing written beside the receipt's own transaction and no writer thread
    (the ledger is off the plain job's path), and the same after a rebuild."""
    queue = queue_for(engine, ledger_in_background=True)
    assert not ledger.tracked("factory.run") and ledger.RUN_KINDS == ("factory.run",)
    body = {"kind": "factory.run", "authContext": AUTH, "goal": "g"}
    job = queue.enqueue(EnqueueRequest(agent_id="factory", payload=body, job_id="bg-1")).job

    def run() -> tuple[Any, ...]:
        row = next(f for f in rows(engine)[0] if f["id"] == "run:org-a/bg-1")
        return row["name"], row["job_id"], row["status"], row["steps"], row["ended_at"] is not None

    assert run() == ("run", job.id, "queued", 0, False)
    lease(queue, job.id, "w", 60_000, start=True)
    assert run() == ("run", job.id, "running", 1, False)
    queue.settle_attempt(job.id, "w", 1, result={"ok": True})
    assert run() == ("run", job.id, "completed", 1, True)
    assert stored(engine) == [] and ledger_hook(queue)._thread is None
    before = rows(engine)
    assert ledger.rebuild(engine)["workflows"] == 1
    assert rows(engine) == before


def test_a_run_row_an_earlier_release_wrote_is_left_unread_and_removed_by_a_rebuild(engine: Engine) -> None:
    queue = queue_for(engine)
    body = {"kind": "factory.run", "authContext": AUTH, "goal": "g", "objectiveId": "lg-old"}
    job = queue.enqueue(EnqueueRequest(agent_id="factory", payload=body, job_id="old-1")).job
    from app.storage.db import transaction

    with transaction(engine) as conn:
        conn.execute(durable_workflows.insert(), [{**ledger.run_row(job), "status": "running", "steps": 7}])
    key = qualify("org-a", "lg-old")
    with engine.connect() as conn:
        assert [(w["id"], w["status"], w["steps"]) for w in ledger.summary(conn, key)["workflows"]] == [
            ("run:org-a/old-1", "queued", 0)  # the job's own row, not the stale one
        ]
    ledger.rebuild(engine)
    assert stored(engine) == []


def test_an_objectives_summary_lists_the_runs_that_name_it_and_only_its_organisations(engine: Engine) -> None:
    queue = queue_for(engine)
    for org, job_id in (("org-a", "named-a"), ("org-b", "named-b")):
        auth = {"userId": "u", "organizationId": org}
        body = {"kind": "factory.run", "authContext": auth, "goal": "g", "objectiveId": "lg-runs"}
        queue.enqueue(EnqueueRequest(agent_id="factory", payload=body, job_id=job_id))
    body = {"kind": "factory.run", "authContext": AUTH, "goal": "g"}
    queue.enqueue(EnqueueRequest(agent_id="factory", payload=body, job_id="unnamed"))
    with engine.connect() as conn:
        listed = [w["id"] for w in ledger.summary(conn, qualify("org-a", "lg-runs"))["workflows"]]
    assert listed == ["run:org-a/named-a"]


def test_the_runs_of_an_objective_are_found_through_their_index(pg_engine: Engine) -> None:
    """PostgreSQL reads an objective's runs through ``ix_jobs_run_objective`` (migration 0017),
    whatever else the table holds: the read spells the payload's objective as the index does."""
    from sqlalchemy import text

    queue = queue_for(pg_engine)
    body = {"kind": "factory.run", "authContext": AUTH, "goal": "g", "objectiveId": "lg-ix"}
    queue.enqueue(EnqueueRequest(agent_id="factory", payload=body, job_id="ix-1"))
    with pg_engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        query = (
            select(jobs.c.state)
            .where(jobs.c.kind.in_(ledger.RUN_KINDS))
            .where(ledger._objective_named("postgresql") == "lg-ix")
        )
        compiled = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        plan = "\n".join(conn.execute(text(f"EXPLAIN {compiled}")).scalars())
        assert "ix_jobs_run_objective" in plan, plan
        assert [w["job_id"] for w in ledger.run_workflows(conn, qualify("org-a", "lg-ix"))] == ["org-a/ix-1"]


def test_closing_the_background_writer_writes_what_it_holds_and_stops_its_thread(engine: Engine) -> None:
    """A process shutting down (gunicorn's worker_exit, Celery's worker_shutdown) or a test tearing
    down its database closes the queue: the rows still gathering are written, the thread ends,
    and later transitions write their rows before returning."""
    queue = queue_for(engine, ledger_in_background=True)
    launch(queue, "lg-close")
    drain(queue)
    writer = ledger_hook(queue)
    thread = writer._thread
    queue.close()
    assert thread is not None and not thread.is_alive()
    flows, acts = rows(engine)
    assert [f["id"] for f in flows] == ["objective-control:org-a/lg-close"] and len(acts) == 4
    launch(queue, "lg-after")
    drain(queue)
    assert "objective-control:org-a/lg-after" in stored(engine)  # written before drain() returned
    queue.close()  # idempotent


def test_two_organisations_objectives_of_one_id_keep_their_own_ledger(queue: Queue) -> None:
    """The same objectiveId in two organisations is two objectives: each ledger summary holds its
    own control workflow and its own four activities, never the other's."""
    a_key = launch(queue, "lg-same")
    body = {"objectiveId": "lg-same", "title": "t", "goal": "g", "plan": plan({"X": []})}
    b_auth = {"userId": "u2", "organizationId": "org-b"}
    b_key = service.launch(
        queue, validate_objective(body, auth_context=b_auth), launched_by=service.system_launcher()
    ).objective.id
    assert b_key == qualify("org-b", "lg-same") != a_key
    drain(queue)
    with queue.engine.connect() as conn:
        a_summary, b_summary = ledger.summary(conn, a_key), ledger.summary(conn, b_key)
    assert [w["id"] for w in a_summary["workflows"]] == ["objective-control:org-a/lg-same"]
    assert [w["id"] for w in b_summary["workflows"]] == ["objective-control:org-b/lg-same"]
    assert a_summary["activities"]["total"] == 4 and b_summary["activities"]["total"] == 1
    before = rows(queue.engine)
    ledger.rebuild(queue.engine)
    assert rows(queue.engine) == before  # a rebuild from receipts keeps them apart the same way


def ledger_hook(queue: Queue) -> ledger.BackgroundWriter:
    """The queue's background ledger writer (its ledger hook's)."""
    hook = queue.hook(Ledger)
    assert hook is not None and hook.writer is not None
    return hook.writer


def test_queue_commands_pass_straight_through_and_never_touch_the_ledger(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spec: "Queue commands are a deliberate straight pass-through, so steer and follow-up never
    depend on workflow signal delivery." With the ledger failing on every write, a steer and a
    follow-up to a running ledger-tracked job are on its stream, pending for its handler, as soon as
    they return; the ledger is not called for either (it is for the job's own transitions)."""
    body = {"kind": "factory.task.run", "authContext": AUTH, "objectiveId": "lg-cmd", "argv": ["true"]}
    job_id = queue.enqueue(EnqueueRequest(agent_id="codex", payload=body, job_id="lg-cmd")).job.id
    assert ledger.tracked("factory.task.run")
    assert lease(queue, job_id, "w1", 600_000, start=True).applied
    calls: list[list[str]] = []

    def failing(_engine: Engine, changed: Any, _writer: Any = None) -> None:
        calls.append([job.id for job in changed])
        raise RuntimeError("ledger database is down")

    monkeypatch.setattr(ledger, "after_commit", failing)
    steer = queue.command(job_id, "steer", {"text": "left"})
    follow = queue.command(job_id, "follow_up", {"text": "then right"})
    assert steer.applied and follow.applied
    job = queue.get(job_id)
    assert job is not None
    assert [(c.type, c.lane) for c in job.pending_commands] == [
        ("steer", "steer"),
        ("follow_up", "follow_up"),
    ]
    assert calls == []
    # The spy is wired: the job's own completion is a ledger event, and reaches it.
    assert complete(queue, job_id, "w1", 1).applied
    assert calls == [[job_id]]
