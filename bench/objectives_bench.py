"""Objectives benchmark: a 999-task fan-out plus one fan-in task, and a 100-task chain.

    .venv/bin/python -m bench.objectives_bench [--fanout 999] [--runs 3] [--chain 100]

A fresh Postgres database, migrated; real processes on Redis with **default settings** —
gunicorn (the API), ``driver``, ``worker-chat`` (tasks run the ``noop`` agent of
``devharness.handlers``), ``worker-control`` (objective control) and beat. Objectives are launched
over HTTP; every figure comes from receipt times (the database clock) or /proc.

(1) Fan-out: ``--fanout`` (default 999) independent tasks and one task depending on all of them —
1 000 tasks, the largest plan allowed. Reported per
run: control jobs in total and per task (target O(1)), control-worker CPU per task, the time from
the last task's settlement (the fan-in task's ``job.completed``) to ``objective.completed``
(target p50 ≤ 1 s), and the wall time.

(2) Chain: ``--chain`` tasks, each depending on the previous one, on an otherwise idle system.
A hop is one task's ``job.completed`` → the next task's ``job.leased`` (target p50 ≤ 50 ms).

Every process started here is stopped by its PID; the database is dropped; the Redis database is
flushed before and after.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.runtime_bench import (
    RECEIPT_REDIS_DB,
    REDIS_BASE,
    STOP_GRACE_S,
    CpuMeter,
    child_env,
    flush_redis,
    fresh_database,
    percentile,
    wait_until,
)
from devharness.processes import Harness, Proc
from devharness.waiting import free_port

ORG = "bench-org"
IDLE_SAMPLE_S = 10.0
STEPS = (
    "completed -> control job enqueued",
    "control job enqueued -> leased",
    "  of which enqueued -> claimed (delivery record)",
    "control leased -> next task enqueued",
    "next task enqueued -> leased",
    "  of which enqueued -> claimed (delivery record)",
)
AGENT = "noop"


def plan_fanout(n: int) -> list[dict[str, Any]]:
    tasks = [{"id": f"t{i:04d}", "agentId": AGENT} for i in range(n)]
    return [*tasks, {"id": "fanin", "agentId": AGENT, "dependsOn": [t["id"] for t in tasks]}]


def plan_chain(n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"c{i:03d}", "agentId": AGENT, "dependsOn": [f"c{i - 1:03d}"] if i else []} for i in range(n)
    ]


def at_ms(text: str) -> float:
    from app.storage.db import parse_iso

    when = parse_iso(text)
    assert when is not None
    return when.timestamp() * 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    # 999 + the fan-in task = 1 000, the most a plan may hold.
    parser.add_argument("--fanout", type=int, default=999)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chain", type=int, default=100)
    args = parser.parse_args()
    # A SIGTERM (``timeout``, a CI runner) unwinds through the cleanup below: without this the
    # processes started here would outlive the bench and consume the next run's Redis database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import requests
    from sqlalchemy import select

    from app.factory.vocab import objective_stream, task_job_id
    from app.jobs.ids import qualify
    from app.jobs.kinds import CONTROL
    from app.storage import store, tokens
    from app.storage.db import deliveries, jobs, make_engine, objectives
    from app.storage.migrate import upgrade

    redis_url = f"{REDIS_BASE}/{RECEIPT_REDIS_DB}"
    flush_redis(RECEIPT_REDIS_DB)
    with fresh_database("receipt_objbench") as db_url, tempfile.TemporaryDirectory() as home:
        engine = make_engine(db_url)
        upgrade(engine)
        token = tokens.create(engine, ORG)[1]
        port = free_port()
        procs = Harness(Path(home) / "logs", grace=STOP_GRACE_S)
        env = child_env(
            DATABASE_URL=db_url,
            REDIS_URL=redis_url,
            RECEIPT_HOME=home,
            RECEIPT_HANDLER_MODULES="devharness.handlers",
        )
        py = sys.executable
        try:
            procs.start(
                "web",
                [
                    py,
                    "-m",
                    "gunicorn",
                    "-c",
                    "python:api.gunicorn_conf",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "api.wsgi:app",
                ],
                {**env, "WEB_CONCURRENCY": "1"},
            )
            control = procs.start("control", [py, "-m", "tasks.worker", "--role", "worker-control"], env)
            workers = [control]
            for role in ("driver", "worker-chat"):
                workers.append(procs.start(role, [py, "-m", "tasks.worker", "--role", role], env))
            procs.start("beat", [py, "-m", "tasks.beat", "--schedule", f"{home}/beat-schedule"], env)
            url = f"http://127.0.0.1:{port}"
            http = requests.Session()
            headers = {"Authorization": f"Bearer {token}"}
            wait_until(lambda: _ok(http, f"{url}/healthz"), 60, "web", procs)
            for proc in workers:
                wait_until(partial(_ready, proc), 90, f"{proc.name} ready", procs)
            time.sleep(3)  # let startup resume and the first beat ticks pass

            def launch(tasks: list[dict[str, Any]], oid: str) -> None:
                body: dict[str, Any] = {
                    "objectiveId": oid,
                    "title": oid,
                    "goal": "bench",
                    "plan": {"tasks": tasks},
                }
                r = http.post(f"{url}/objectives", json=body, headers=headers, timeout=120)
                assert r.status_code == 202, r.text

            def status(key: str) -> str | None:
                with engine.connect() as conn:
                    return conn.execute(select(objectives.c.status).where(objectives.c.id == key)).scalar()

            def claimed_ms(job_id: str) -> float:
                with engine.connect() as conn:
                    q = select(deliveries.c.created_at).where(deliveries.c.job_id == job_id)
                    return float(min(r.created_at.timestamp() * 1000 for r in conn.execute(q)))

            def stream(name: str) -> list[Any]:
                with engine.connect() as conn:
                    return store.read_stream(conn, name)

            print(
                f"# objectives bench: fan-out {args.fanout}+1 x {args.runs}, chain {args.chain}; "
                "default settings"
            )
            settle_to_done: list[float] = []
            # The control worker also runs beat's maintenance passes: measure its idle CPU rate and
            # subtract it, so "control CPU per task" is the objective's cost alone.
            idle = CpuMeter({"control": lambda: [control.pid]})
            idle.start()
            time.sleep(IDLE_SAMPLE_S)
            idle_rate = idle.stop()["control"] / IDLE_SAMPLE_S
            for run in range(args.runs):
                oid = f"fan{run}"
                key = qualify(ORG, oid)  # the objective's storage key: its jobs' and streams' prefix
                meter = CpuMeter({"control": lambda: [control.pid]})
                meter.start()
                t0 = time.monotonic()
                launch(plan_fanout(args.fanout), oid)
                wait_until(partial(_ended, status, key), 1800, f"objective {oid}", procs)
                wall = time.monotonic() - t0
                cpu = max(0.0, meter.stop()["control"] - idle_rate * wall)
                assert status(key) == "completed"
                with engine.connect() as conn:
                    q = select(jobs.c.id, jobs.c.kind, jobs.c.state).where(jobs.c.agent_id == CONTROL.agent)
                    rows = conn.execute(q).all()
                mine = [r for r in rows if r.kind == CONTROL.name and r.id.startswith(f"{key}:")]
                n_control = len(mine)
                # Each control job reports its own thread CPU (StepResult.cpuMs): the step's cost alone.
                step_cpu_ms = sum(float((r.state.get("result") or {}).get("cpuMs", 0.0)) for r in mine)
                fanin = stream(f"jobs/{task_job_id(key, 1, 'fanin')}")
                last = next(r for r in fanin if r.type == "job.completed")
                done = next(r for r in stream(objective_stream(key)) if r.type == "objective.completed")
                gap = at_ms(done.at) - at_ms(last.at)
                settle_to_done.append(gap)
                n = args.fanout + 1
                print(
                    f"fan-out run {run + 1}: {n} tasks in {wall:.1f} s; control jobs {n_control} "
                    f"({n_control / n:.3f}/task); control step CPU {step_cpu_ms / n:.2f} ms/task "
                    f"(control worker process, net of idle: {cpu * 1000 / n:.2f} ms/task); "
                    f"last settlement -> completed {gap:.0f} ms"
                )
            p50 = statistics.median(settle_to_done) if settle_to_done else float("nan")
            runs = ", ".join(f"{g:.0f}" for g in settle_to_done)
            print(f"fan-out: last settlement -> objective completed p50 {p50:.0f} ms (runs: {runs})")

            time.sleep(2)
            oid = "chain"
            key = qualify(ORG, oid)
            launch(plan_chain(args.chain), oid)
            wait_until(lambda: status(key) in ("completed", "failed"), 1800, "chain", procs)
            hops: list[float] = []
            parts: dict[str, list[float]] = {k: [] for k in STEPS}
            with engine.connect() as conn:
                q = select(jobs.c.id, jobs.c.created_at).where(jobs.c.agent_id == "factory-control")
                controls = sorted((r.created_at.timestamp() * 1000, r.id) for r in conn.execute(q))
            for i in range(1, args.chain):
                before = stream(f"jobs/{task_job_id(key, 1, f'c{i - 1:03d}')}")
                prev = next(r for r in before if r.type == "job.completed")
                after = stream(f"jobs/{task_job_id(key, 1, f'c{i:03d}')}")
                enq = next(r for r in after if r.type == "job.enqueued")
                nxt = next(r for r in after if r.type == "job.leased")
                hops.append(at_ms(nxt.at) - at_ms(prev.at))
                # The control job that ran this hop: the first one enqueued after the completion.
                cid = next(c for t, c in controls if t >= at_ms(prev.at) - 1 and c.startswith(f"{key}:"))
                ctl = stream(f"jobs/{cid}")
                c_enq = at_ms(next(r for r in ctl if r.type == "job.enqueued").at)
                c_lease = at_ms(next(r for r in ctl if r.type == "job.leased").at)
                parts["completed -> control job enqueued"].append(c_enq - at_ms(prev.at))
                parts["control job enqueued -> leased"].append(c_lease - c_enq)
                parts[STEPS[2]].append(claimed_ms(cid) - c_enq)
                parts["control leased -> next task enqueued"].append(at_ms(enq.at) - c_lease)
                parts["next task enqueued -> leased"].append(at_ms(nxt.at) - at_ms(enq.at))
                parts[STEPS[5]].append(claimed_ms(task_job_id(key, 1, f"c{i:03d}")) - at_ms(enq.at))
            print(
                f"chain of {args.chain}: hop completion -> next lease p50 {statistics.median(hops):.1f} ms, "
                f"p90 {percentile(hops, 90):.1f} ms, max {max(hops):.1f} ms"
            )
            for name, values in parts.items():
                print(f"  {name}: p50 {statistics.median(values):.1f} ms")
        finally:
            procs.stop_all()
            engine.dispose()
            flush_redis(RECEIPT_REDIS_DB)
    return 0


def _ready(proc: Proc) -> bool:
    return " ready." in proc.log()


def _ended(status: Callable[[str], str | None], oid: str) -> bool:
    return status(oid) in ("completed", "failed")


def _ok(http: Any, url: str) -> bool:
    try:
        return bool(http.get(url, timeout=2).status_code == 200)
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
