"""Objective watchdog benchmark: one pass over 10 000 active objectives at the default scan limit.

    .venv/bin/python -m bench.watchdog_bench [--objectives 10000] [--lost-every 10]

A fresh Postgres database, migrated. ``--objectives`` active objectives of one task each are
written straight through the Factory's storage seam (``storage.apply``, 200 per transaction): each
launched, its launch request consumed and its task queued, like an objective control has stepped.
Every objective's task job exists and is queued (``Queue.enqueue``) except every
``--lost-every``-th, whose job is missing — those are "lost" objectives the watchdog must reconcile
(``no_active_objective_work``). Then ``sweep.watchdog_pass`` runs with **default settings** (scan
limit 200, timeout 60 000 ms) and again once the lost ones have their request (the steady state:
nothing to reconcile, every objective still read). Printed: pass time, pages, objectives scanned,
reconciled, and whether the pass hit its timeout. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from app.composition import queue_for
from app.config import Settings
from app.factory import storage, sweep, watchdog
from app.factory.vocab import task_job_id
from app.jobs.validation import EnqueueRequest
from app.storage.db import db_now, make_engine, transaction
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from bench.runtime_bench import fresh_database

AUTH = {"userId": "bench", "organizationId": "bench-org"}
BATCH = 200


def launched(oid: str) -> dict[str, Any]:
    return {
        "objectiveId": oid,
        "title": "bench",
        "goal": "bench",
        "failurePolicy": "failFast",
        "authContext": AUTH,
        "launchedBy": {"tokenId": None, "scopes": [], "system": True},
        "phase": 1,
        "tasks": [
            {
                "id": "A",
                "agentId": "codex",
                "kind": "factory.task.run",
                "payload": {"kind": "factory.task.run"},
                "dependsOn": [],
                "maxAttempts": None,
                "executionPath": None,
            }
        ],
    }


def populate(queue: Queue, n: int, lost_every: int) -> int:
    lost = 0
    for start in range(0, n, BATCH):
        with transaction(queue.engine) as conn:
            at = db_now(conn)
            for i in range(start, min(n, start + BATCH)):
                oid = f"wb-{i:06d}"
                events: list[storage.Event] = [
                    ("objective.launched", launched(oid)),
                    ("objective.control_requested", {"requestId": "launch", "reason": "launch"}),
                    ("objective.control_consumed", {"requestIds": ["launch"]}),
                    (
                        "objective.tasks_queued",
                        {"phase": 1, "tasks": [{"taskId": "A", "jobId": task_job_id(oid, 1, "A")}]},
                    ),
                ]
                storage.apply(conn, None, oid, events, at=at)
        for i in range(start, min(n, start + BATCH)):
            oid = f"wb-{i:06d}"
            if i % lost_every == 0:
                lost += 1
                continue
            payload = {
                "kind": "factory.task.run",
                "authContext": AUTH,
                "objectiveId": oid,
                "taskId": "A",
                "phase": 1,
            }
            queue.enqueue(EnqueueRequest(agent_id="codex", payload=payload, job_id=task_job_id(oid, 1, "A")))
    return lost


def report(name: str, result: dict[str, Any]) -> None:
    print(
        f"{name}: pass {result['elapsedMs']} ms "
        f"(timeout {result['timeoutMs']} ms, timedOut={result['timedOut']}); "
        f"{result['scanned']} objectives in {result['pages']} pages of {result['scanLimit']}; "
        f"{len(result['reconciled'])} reconciled"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objectives", type=int, default=10_000)
    p.add_argument("--lost-every", type=int, default=10)
    args = p.parse_args(argv)
    settings = Settings()
    with fresh_database("receipt_wdbench") as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            queue = queue_for(engine, control_fast_path=False)
            t0 = time.monotonic()
            lost = populate(queue, args.objectives, args.lost_every)
            print(
                f"setup: {args.objectives} active objectives ({lost} lost) in {time.monotonic() - t0:.1f} s; "
                f"scan limit {watchdog.scan_limit(settings)}, timeout {watchdog.timeout_ms(settings)} ms"
            )
            first = sweep.watchdog_pass(queue, settings)
            report("pass 1 (reconciles the lost)", first)
            second = sweep.watchdog_pass(queue, settings)
            report("pass 2 (steady state)", second)
            ok = not first["timedOut"] and not second["timedOut"] and len(first["reconciled"]) == lost
            ok = ok and first["scanned"] == second["scanned"] == args.objectives and not second["reconciled"]
            print("within timeout, every objective scanned, every lost one reconciled:", ok)
            return 0 if ok else 1
        finally:
            engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
