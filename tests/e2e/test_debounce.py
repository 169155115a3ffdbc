"""Debounce end to end with real processes (gunicorn, the driver, a chat worker, beat) on PostgreSQL
and Redis: a burst of debounced enqueues of one key runs one job; every other ends ``canceled`` with
reason ``debounced`` and never reaches a worker. Every count comes from the receipts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from app.jobs.flow import DEBOUNCED_REASON, REPLACED_BY_FIELD
from devharness import handlers
from tests.support.stack import ORG, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

BURST = 20
WINDOW_MS = 2_000


def test_a_burst_of_debounced_enqueues_runs_exactly_one_job(stack: Stack) -> None:
    stack.start("web", "driver", "chat", "beat")
    url = stack.url(f"/agents/{handlers.ECHO}/jobs")

    def post(n: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "jobId": f"burst-{n}",
            "payload": {
                "kind": "factory.run",
                "message": n,
                "authContext": {"userId": "u", "organizationId": ORG},
            },
            "debounce": {"key": "reindex", "windowMs": WINDOW_MS},
        }
        # One connection per request: the posts race each other on the server, as a burst does.
        r = requests.post(url, json=body, headers=stack.headers(), timeout=30)
        assert r.status_code == 202, r.text
        job: dict[str, Any] = r.json()["job"]
        return job

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        posted = list(pool.map(post, range(BURST)))
    assert all(job["availableAt"] is not None for job in posted)

    ended = {job["id"]: stack.wait_terminal(job["id"], timeout=60) for job in posted}
    completed = [job_id for job_id, job in ended.items() if job.status == "completed"]
    canceled = [job_id for job_id, job in ended.items() if job.status == "canceled"]
    assert len(completed) == 1 and len(canceled) == BURST - 1, {k: v.status for k, v in ended.items()}
    [survivor] = completed
    assert ended[survivor].result["echo"] == int(survivor.removeprefix("burst-"))
    replaced_by = {}
    for job_id in canceled:
        types = stack.types(job_id)
        # Replaced while it waited: never leased, never delivered to a worker.
        assert types == ["job.enqueued", "job.canceled"], (job_id, types)
        last = stack.receipts(job_id)[-1]
        assert last.body["reason"] == DEBOUNCED_REASON and ended[job_id].error == DEBOUNCED_REASON
        replaced_by[job_id] = last.body[REPLACED_BY_FIELD]
    # The replacements chain through the whole burst, from the first job kept to the job that ran.
    [head] = set(replaced_by) - set(replaced_by.values())
    chain = [head]
    while chain[-1] in replaced_by:
        chain.append(replaced_by[chain[-1]])
    assert chain[-1] == survivor and sorted(chain) == sorted(ended)
    run = stack.types(survivor)
    assert run.count("job.leased") == 1 and run[-1] == "job.completed"
