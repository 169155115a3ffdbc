"""Fair dispatch end to end (docs/dispatch.md) with real processes on PostgreSQL and Redis: one
organisation's backlog does not hold another's job behind it, and a limit-1 concurrency key never
runs two attempts at once, through a worker SIGKILLed mid-attempt. Every count comes from the
receipts; every wait is on an event, bounded."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from sqlalchemy import func, select

from app.storage import tokens
from app.storage.db import jobs
from bench.soak import SOAK_KEY, key_overlaps
from devharness import handlers
from devharness.waiting import wait_for
from tests.support.stack import ORG, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

OTHER = "e2e-other-org"


def item(org: str, agent: str, **extra: Any) -> dict[str, Any]:
    payload = {
        "kind": "factory.run",
        "authContext": {"userId": "u", "organizationId": org},
        **extra.pop("p", {}),
    }
    return {"agentId": agent, "payload": payload, **extra}


def test_a_backlog_of_one_organisation_does_not_hold_another_s_job_behind_it(stack: Stack) -> None:
    # One chat worker with two slots: the backlog cannot drain in less than ~10 s.
    stack.start("web", "driver", "beat")
    stack.start_worker("worker-chat", RECEIPT_RESONATE_EXECUTE_CONCURRENCY="2")
    backlog = [item(ORG, handlers.SLEEP, p={"seconds": 0.1}) for _ in range(200)]
    r = requests.post(stack.url("/jobs:batch"), json={"items": backlog}, headers=stack.headers(), timeout=60)
    assert r.status_code == 202, r.text
    _info, other_token = tokens.create(stack.engine, OTHER)
    b = requests.post(
        stack.url(f"/agents/{handlers.ECHO}/jobs"),
        json={k: v for k, v in item(OTHER, handlers.ECHO).items() if k != "agentId"},
        headers={"Authorization": f"Bearer {other_token}"},
        timeout=30,
    )
    assert b.status_code == 202, b.text
    theirs = b.json()["job"]
    done = stack.wait_terminal(stack.key(theirs["id"], OTHER), timeout=60)
    assert done.status == "completed"
    with stack.engine.connect() as conn:
        left = conn.execute(
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.organization_id == ORG, jobs.c.status == "queued")
        ).scalar_one()
    # The other organisation's job ran at one of the next free places, not after the backlog.
    assert left >= 150, f"only {left} of the backlog still queued when the other organisation's job ended"


def test_a_limit_1_key_never_runs_two_attempts_at_once_through_a_worker_kill(stack: Stack) -> None:
    stack.start("web", "driver", "beat")
    stack.start_worker("worker-chat", name="chat")
    stack.start_worker("worker-chat", name="chat2")
    ids = []
    for n in range(12):
        body = item(ORG, handlers.SLEEP, p={"seconds": 0.5, "progress": True})
        body.update(jobId=f"serial-{n}", concurrencyKey=SOAK_KEY, concurrencyLimit=1)
        del body["agentId"]
        r = requests.post(
            stack.url(f"/agents/{handlers.SLEEP}/jobs"), json=body, headers=stack.headers(), timeout=30
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["job"]["id"])
    # Wait for an attempt that runs in the first worker, then kill that worker mid-attempt.
    victim = stack.procs["chat"]

    def running_in_victim() -> bool:
        for job_id in ids:
            job = stack.job(stack.key(job_id))
            progress = job.progress if job is not None and job.status == "running" else None
            if isinstance(progress, dict) and progress.get("pid") == victim.pid:
                return True
        return False

    wait_for(running_in_victim, 60, what="an attempt running in the first worker")
    stack.harness.kill(stack.procs.pop("chat"))
    for job_id in ids:
        stack.wait_terminal(job_id, timeout=120)
    streams = {job_id: stack.receipts(job_id) for job_id in ids}
    overlaps, attempts = key_overlaps(streams)
    assert attempts >= len(ids) and overlaps == []
