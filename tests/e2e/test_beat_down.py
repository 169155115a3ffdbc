"""Recovery without beat: the processes of a beat-less deployment recover the Factory's losses.

No beat process at all: only the driver and the chat and control workers, on PostgreSQL and Redis.
Each worker's local ticker runs the loops of the queues it consumes (``app/ops/loop_registry.py``), so the
control worker runs the objective-control outbox redrive and the watchdog tick itself:

- a lost control message (an objective whose launch request is unconsumed and has no control job)
  is recovered by the outbox redrive only (the watchdog leaves an objective with control due);
- a stalled objective (its request consumed, yet no task or control job: the control step died) is
  recovered by the watchdog only (nothing else writes a request for it).

Both are set up before any process starts, so nothing but the loops can see them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.composition import queue_for
from app.factory import service, storage
from app.factory.plan import validate_objective
from app.factory.reducer import Objective
from app.factory.vocab import control_job_id, objective_stream
from app.storage import store
from app.storage.db import db_now, transaction
from devharness.handlers import TASK
from tests.support.processes import Harness
from tests.support.stack import ORG, Stack, make_stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

AUTH = {"userId": "u1", "organizationId": ORG}
BEATLESS_ENV = {
    "FACTORY_CONTROL_JOB_LEASE_MS": "6000",
    # The ticker steps in after two periods: a second or two, instead of 10 s and two minutes.
    "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS": "1000",
    "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S": "2",
    "RESONATE_STARTUP_SETTLE_MS": "300000",  # no resume pass: it would write requests of its own
}
BEATLESS = ("driver", "chat", "control")


@pytest.fixture
def beatless(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(harness, pg_database_url, tmp_path / "home", **BEATLESS_ENV)
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


def launch_without_its_control_message(stack: Stack, client_id: str) -> str:
    """Launch with no fast path: the launch request is written, its control job never is."""
    body = {
        "objectiveId": client_id,
        "title": "t",
        "goal": "g",
        "plan": {
            "tasks": [{"id": t, "agentId": TASK, "payload": {"kind": "factory.task.run"}} for t in "AB"]
        },
    }
    quiet = queue_for(stack.engine, control_fast_path=False)
    spec = validate_objective(body, auth_context=AUTH)
    return service.launch(quiet, spec, launched_by=service.system_launcher()).objective.id


def stall(stack: Stack, key: str) -> None:
    """Mark the launch request consumed as if its control step consumed it and died."""
    with transaction(stack.engine) as conn:
        storage.lock(conn, key)
        loaded = storage.load(conn, key)
        assert loaded is not None and [r.id for r in loaded.objective.pending] == ["launch"]
        storage.apply(
            conn, loaded, key, [("objective.control_consumed", {"requestIds": ["launch"]})], at=db_now(conn)
        )


def reconciles(stack: Stack, key: str) -> list[dict[str, Any]]:
    with stack.engine.connect() as conn:
        receipts = store.read_stream(conn, objective_stream(key))
    return [
        dict(r.body.get("detail") or {})
        for r in receipts
        if r.type == "objective.control_requested" and r.body.get("reason") == "reconcile"
    ]


def completed(stack: Stack, key: str) -> Objective | None:
    obj = service.get(stack.engine, key)
    return obj if obj is not None and obj.status == "completed" else None


def test_with_beat_down_a_lost_control_message_and_a_stalled_objective_are_recovered(beatless: Stack) -> None:
    lost_message = launch_without_its_control_message(beatless, "bd-lost-message")
    launch = service.get(beatless.engine, lost_message)
    assert launch is not None and [r.id for r in launch.pending] == ["launch"]
    the_control_job = control_job_id(lost_message, launch.pending[0].seq)
    assert beatless.job(the_control_job) is None
    stalled = launch_without_its_control_message(beatless, "bd-stalled")
    stall(beatless, stalled)

    beatless.start(*BEATLESS)
    assert not any(name.startswith("beat") for name in beatless.procs)

    for key in (lost_message, stalled):
        obj = wait_for(
            functools.partial(completed, beatless, key), 120, interval=0.3, what=f"{key} to complete"
        )
        assert {t.status for t in obj.tasks.values()} == {"completed"}
    # The lost message's own control job, made by the outbox redrive; no watchdog reconcile for it.
    done = beatless.job(the_control_job)
    assert done is not None and done.status == "completed"
    assert reconciles(beatless, lost_message) == []
    # The stalled objective was found by a watchdog pass, exactly once.
    assert reconciles(beatless, stalled) == [{"objectiveId": stalled, "reason": "no_active_objective_work"}]
    # Both by the control worker's ticker: no beat exists to have sent a tick.
    control = beatless.procs["control"]
    assert control.log_count("local ticker ran objective-outbox-redrive") >= 1
    assert control.log_count("local ticker ran objective-watchdog") >= 1
    assert beatless.procs["driver"].log_count("local ticker ran objective-") == 0  # not its queue
