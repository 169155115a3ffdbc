"""Replanning end to end: real gunicorn, workers and beat on PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.factory.vocab import task_job_id
from tests.e2e.test_objectives import ALL, FACTORY_ENV, get, launch, task, wait_objective
from tests.support.processes import Harness
from tests.support.stack import Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]


@pytest.fixture
def rstack(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(harness, pg_database_url, tmp_path / "home", **FACTORY_ENV)
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


def test_a_replan_mid_flight_aborts_the_old_phase_and_completes_the_new_one(
    rstack: Stack, tmp_path: Path
) -> None:
    rstack.start(*ALL)
    gate = tmp_path / "never"  # A runs until something stops it
    oid = launch(rstack, [task("A", gate=str(gate)), task("B", ["A"])])
    a = task_job_id(oid, 1, "A")
    rstack.wait_running(a, timeout=60)
    r = rstack.http.post(
        rstack.url(f"/objectives/{oid}/plan"),
        json={"tasks": [task("C"), task("D", ["C"])], "reason": "new approach"},
        headers=rstack.headers(),
        timeout=30,
    )
    assert r.status_code == 202, r.text
    assert r.json()["objective"]["phase"] == 2
    obj = wait_objective(rstack, oid, "completed", timeout=120)
    assert obj["phase"] == 2
    assert {t["id"]: (t["phase"], t["status"]) for t in obj["tasks"]} == {
        "A": (1, "canceled"),
        "B": (1, "canceled"),
        "C": (2, "completed"),
        "D": (2, "completed"),
    }
    # The running job got an abort command with the spec's reason, and stopped.
    receipts = rstack.receipts(a)
    aborts = [x for x in receipts if x.type == "queue.command" and x.body.get("type") == "abort"]
    assert [x.body.get("reason") for x in aborts] == ["phase superseded"]
    assert rstack.status(a) == "canceled"
    assert not [x for x in receipts if x.type == "job.completed"]
    d = get(rstack, oid)["tasks"][-1]
    assert d["id"] == "D" and d["result"]["inputs"]["C"]["task"] == "C"
