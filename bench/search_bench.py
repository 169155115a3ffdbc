"""A filtered job list at a million jobs: the first page's latency, per filter.

    .venv/bin/python -m bench.search_bench [--jobs 1000000] [--reps 200] [--chunk 5000]

One fresh PostgreSQL database, migrated to head, dropped at the end. The jobs are written through
the project's own bulk path (``projection.insert_new``: each chunk's receipts and projection rows
as two ``bulk.insert`` statements), each job a real hash-chained stream folded by the reducer:
``job.enqueued`` (ten organisations, five kinds, two tags each) and, for one job in five, a
non-retryable ``job.failed`` whose error is one of a few command exits. Creation times spread
over 30 days. Then, for each filter, the first page (50 jobs, newest first) is read ``--reps``
times through ``Queue.list_jobs`` (the query behind ``GET /jobs``) and through ``GET /jobs`` on
the Flask app in-process (token check, schema, JSON), rounds alternated; p50 and p95 printed.
Target: p95 <= 50 ms for every filter (issue 35).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from app.composition import queue_for
from app.config import Settings
from app.jobs.ids import qualify
from app.jobs.reducer import fold
from app.jobs.vocab import job_stream
from app.storage import projection, store, tokens
from app.storage.db import jobs, make_engine, transaction
from app.storage.migrate import upgrade
from app.storage.search import JobFilter
from bench.runtime_bench import fresh_database, log

ORGS = [f"org-{i}" for i in range(10)]
KINDS = [
    "factory.run",
    "factory.task.run",
    "factory.dispatch",
    "factory.integration.validate",
    "factory.objective.audit",
]
ERRORS = ["command exited with 1", "command exited with 2", "timeout after 600 s", "No handler for agent 'x'"]
START = datetime(2026, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=30)


def job_of(i: int, total: int) -> tuple[Any, store.Chained]:
    """Job ``i``: its stream's receipts, chained at its creation time, and its fold."""
    # Organisation, agent, kind, tags and failure vary independently (a job's own generator).
    rng = random.Random(i)
    org = ORGS[i % len(ORGS)]
    key = qualify(org, f"job-{i:08d}")
    created = START + SPAN * (i / total)
    body = {
        "jobId": key,
        "agentId": "test-echo" if rng.random() < 0.3 else "factory",
        "lane": "collect",
        "payload": {"kind": rng.choice(KINDS), "authContext": {"userId": "u", "organizationId": org}},
        "sessionKey": None,
        "singletonMode": "allow",
        "maxAttempts": 2,
        "tags": {"customer": f"c{rng.randrange(97)}", "batch": f"b{i // 10_000}"},
    }
    events: list[tuple[str, dict[str, Any]]] = [("job.enqueued", body)]
    if rng.random() < 0.2:
        error = rng.choice(ERRORS)
        events.append(("job.failed", {"error": error, "retryable": False, "status": "failed"}))
    chained = store.chain(job_stream(key), 0, events, prev_hash=None, at=created)
    job = fold(chained.receipts())
    return job, chained


def seed(engine: Any, total: int, chunk: int) -> float:
    started = time.perf_counter()
    for first in range(0, total, chunk):
        page = [job_of(i, total) for i in range(first, min(total, first + chunk))]
        with transaction(engine) as conn:
            projection.insert_new(conn, page)
        if (first // chunk) % 20 == 0:
            log(f"seeded {first + len(page)} / {total}")
    return time.perf_counter() - started


FILTERS: dict[str, tuple[JobFilter, dict[str, str]]] = {
    "organisation only": (JobFilter(), {}),
    "status=failed": (JobFilter(status="failed"), {"status": "failed"}),
    "kind": (JobFilter(kind="factory.task.run"), {"kind": "factory.task.run"}),
    "agentId": (JobFilter(agent_id="test-echo"), {"agentId": "test-echo"}),
    "tag (1 in 97)": (JobFilter(tag=("customer", "c42")), {"tag": "customer:c42"}),
    "tag (rare: 1 batch)": (JobFilter(tag=("batch", "b3")), {"tag": "batch:b3"}),
    "status=failed + errorPrefix": (
        JobFilter(status="failed", error_prefix="command exited with 2"),
        {"status": "failed", "errorPrefix": "command exited with 2"},
    ),
    "time range (1 day)": (
        JobFilter(created_after=START + timedelta(days=10), created_before=START + timedelta(days=11)),
        {"createdAfter": "2026-01-11T00:00:00Z", "createdBefore": "2026-01-12T00:00:00Z"},
    ),
    "kind + status + tag": (
        JobFilter(kind="factory.run", status="failed", tag=("customer", "c5")),
        {"kind": "factory.run", "status": "failed", "tag": "customer:c5"},
    ),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=5_000)
    args = parser.parse_args(argv)
    from api.app import create_app

    with fresh_database("search_bench") as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            seconds = seed(engine, args.jobs, args.chunk)
            with engine.connect() as conn:
                count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
                conn.exec_driver_sql("ANALYZE jobs")
            assert count == args.jobs, count
            print(
                f"seeded {count} jobs in {seconds:.1f} s "
                f"({count / seconds:.0f} jobs/s, projection.insert_new)"
            )
            queue = queue_for(engine)
            org = ORGS[3]
            _, secret = tokens.create(engine, org)
            app = create_app(Settings.from_env(), engine=engine, on_dispatchable=lambda _jobs: None)
            client = app.test_client()
            headers = {"Authorization": f"Bearer {secret}"}
            timings: dict[str, dict[str, list[float]]] = {n: {"query": [], "http": []} for n in FILTERS}

            def query_op(f: JobFilter) -> Callable[[], int]:
                return lambda: len(queue.list_jobs(organization_id=org, where=f, limit=50).jobs)

            def http_op(params: dict[str, str]) -> Callable[[], int]:
                def run() -> int:
                    response = client.get("/jobs", query_string={**params, "limit": "50"}, headers=headers)
                    assert response.status_code == 200, response.get_data(as_text=True)
                    return len(response.get_json()["jobs"])

                return run

            for f, params in FILTERS.values():  # warm each plan once
                query_op(f)()
                http_op(params)()
            for _ in range(args.reps):
                for name, (f, params) in FILTERS.items():
                    for label, op in (("query", query_op(f)), ("http", http_op(params))):
                        started = time.perf_counter()
                        op()
                        timings[name][label].append((time.perf_counter() - started) * 1000)
            print(f"\nfirst page of 50 at {count} jobs ({args.reps} reps each, ms):")
            print(
                f"{'filter':32} {'query p50':>10} {'query p95':>10} {'http p50':>10} {'http p95':>10}  rows"
            )
            worst = 0.0
            for name, (f, _params) in FILTERS.items():
                q, h = timings[name]["query"], timings[name]["http"]
                rows = query_op(f)()
                worst = max(worst, percentile(h, 0.95))
                print(
                    f"{name:32} {statistics.median(q):10.2f} {percentile(q, 0.95):10.2f} "
                    f"{statistics.median(h):10.2f} {percentile(h, 0.95):10.2f}  {rows}"
                )
            verdict = "met" if worst <= 50 else "NOT met"
            print(f"\nworst http p95 {worst:.2f} ms: target <= 50 ms {verdict}")
            queue.close()
            return 0 if worst <= 50 else 1
        finally:
            engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
