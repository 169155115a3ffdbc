"""A filtered job list at a million jobs: the first page's latency, per filter.

    .venv/bin/python -m bench.search_bench [--jobs 1000000] [--reps 200] [--seed sql|real]
        [--keep DATABASE]

One PostgreSQL database migrated to head: a fresh one dropped at the end, or ``--keep NAME`` (made
and seeded the first time, reused while it holds ``--jobs`` jobs, so the measurement can be
repeated without seeding again). Ten organisations, five kinds, two tags each (``customer`` one of
97, ``batch`` one per 10 000 jobs), 30 % of the jobs on agent ``test-echo``, one in five failed
(non-retryable) with one of a few command exits (``--seed sql``: and one in 5 000, all of the
measured organisation's, with a rare error); creation times spread over 30 days.

``--seed real`` writes each job through the project's own bulk path (``projection.insert_new``:
its hash-chained receipts folded by the reducer, then its projection row; 906 s for a million on
the bench machine). ``--seed sql`` (the default) writes the same ``jobs`` rows -- the state the
fold gives, the same distributions -- from one ``INSERT ... SELECT`` over ``generate_series`` per
chunk, without receipts (no list reads them), so a million takes minutes; ``job_tags`` is filled
by its trigger either way, as for every writer.

Then, for each filter, the first page (50 jobs, newest first) is read ``--reps`` times through
``Queue.list_jobs`` (the query behind ``GET /jobs``) and through ``GET /jobs`` on the Flask app
in-process (token check, schema, JSON), rounds alternated; p50 and p95 printed.
Target: p95 <= 50 ms for every filter (issue 35).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs.ids import qualify
from app.jobs.reducer import fold
from app.jobs.vocab import job_stream
from app.storage import projection, store, tokens
from app.storage.db import jobs, make_engine, transaction
from app.storage.migrate import upgrade
from app.storage.search import JobFilter
from bench.runtime_bench import PG_ADMIN_URL, fresh_database, log
from devharness.databases import autocommit, pg_url_for

ORGS = [f"org-{i}" for i in range(10)]
KINDS = [
    "factory.run",
    "factory.task.run",
    "factory.dispatch",
    "factory.integration.validate",
    "factory.objective.audit",
]
ERRORS = ["command exited with 1", "command exited with 2", "timeout after 600 s", "No handler for agent 'x'"]
# One job in RARE_EVERY fails with RARE_ERROR (``--seed sql``): all of them organisation 3's.
RARE_EVERY, RARE_AT, RARE_ERROR = 5000, 3, "disk full on /var/lib/receipt"
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


def _array(values: list[str]) -> str:
    quoted = (v.replace("'", "''") for v in values)
    return "ARRAY[" + ", ".join(f"'{v}'" for v in quoted) + "]"


# The rows ``job_of`` folds to, written by the database: the same columns, state and distributions
# (drawn from ``random()`` after ``setseed``, so a chunk is the same every run, not ``job_of``'s own
# draws). The state's keys are ``Job.to_json``'s; ``--seed real`` and a test compare the two.
SEED_SQL = f"""
INSERT INTO jobs (id, organization_id, agent_id, lane, kind, status, session_key, attempt, max_attempts,
    lease_worker_id, lease_attempt, lease_expires_at, abort_requested, created_at, updated_at,
    status_changed_at, available_at, last_seq, last_hash, state, tags, error_text)
SELECT id, org, agent, 'collect', kind, status, NULL, 0, 2, NULL, NULL, NULL, false, created, created,
    created, NULL, seq, encode(sha256(convert_to(id, 'UTF8')), 'hex'),
    jsonb_build_object(
        'id', id, 'agentId', agent, 'lane', 'collect', 'status', status,
        'payload', jsonb_build_object(
            'kind', kind, 'authContext', jsonb_build_object('userId', 'u', 'organizationId', org)),
        'sessionKey', NULL, 'singletonMode', 'allow', 'maxAttempts', 2, 'attempt', 0, 'lease', NULL,
        'abortRequested', false, 'commands', '[]'::jsonb, 'progress', NULL,
        'result', CASE WHEN failed THEN '{{"status": "failed"}}'::jsonb END, 'error', error,
        'createdAt', at_text, 'updatedAt', at_text, 'availableAt', NULL, 'stream', 'jobs/' || id,
        'seq', seq, 'enqueuedBy', NULL, 'tags', tags),
    tags, error
FROM (
    SELECT *, 'org-' || (i % {len(ORGS)}) || '/job-' || lpad(i::text, 8, '0') AS id,
        to_char(created AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at_text,
        CASE WHEN failed THEN 'failed' ELSE 'queued' END AS status,
        CASE WHEN failed THEN 2 ELSE 1 END AS seq,
        CASE WHEN i % {RARE_EVERY} = {RARE_AT} THEN '{RARE_ERROR}'
            WHEN failed THEN ({_array(ERRORS)})[1 + floor(r5 * {len(ERRORS)})::int] END AS error
    FROM (
        SELECT i, 'org-' || (i % {len(ORGS)}) AS org,
            CASE WHEN r1 < 0.3 THEN 'test-echo' ELSE 'factory' END AS agent,
            ({_array(KINDS)})[1 + floor(r2 * {len(KINDS)})::int] AS kind,
            jsonb_build_object('batch', 'b' || (i / 10000), 'customer', 'c' || floor(r3 * 97)::int) AS tags,
            r4 < 0.2 OR i % {RARE_EVERY} = {RARE_AT} AS failed, r5,
            :start + (:span * i / :total) * interval '1 second' AS created
        FROM (
            SELECT i, random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r5
            FROM generate_series(:first, :last) AS i
        ) AS draws
    ) AS job
) AS row
"""


def seed_sql(engine: Engine, total: int, chunk: int) -> float:
    """``total`` jobs written by ``SEED_SQL``, ``chunk`` a statement (and a transaction)."""
    started = time.perf_counter()
    statement = text(SEED_SQL)
    for first in range(0, total, chunk):
        last = min(total, first + chunk) - 1
        with transaction(engine) as conn:
            conn.execute(text("SELECT setseed(:s)"), {"s": (first // chunk % 1000) / 1000})
            conn.execute(
                statement,
                {"first": first, "last": last, "total": total, "start": START, "span": SPAN.total_seconds()},
            )
        log(f"seeded {last + 1} / {total}")
    return time.perf_counter() - started


@contextmanager
def bench_database(keep: str | None) -> Iterator[str]:
    """A fresh database dropped at the end, or the database ``keep`` (made if missing, kept)."""
    if keep is None:
        with fresh_database("search_bench") as url:
            yield url
        return
    from app.storage.db import make_engine as engine_of

    admin = engine_of(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": keep}).first()
        if exists is None:
            autocommit(admin, f"CREATE DATABASE {keep}")
        yield pg_url_for(keep, admin.url.render_as_string(hide_password=False))
    finally:
        admin.dispose()


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
    "tag, none match": (JobFilter(tag=("customer", "c999")), {"tag": "customer:c999"}),
    "errorPrefix alone (1 in 20)": (
        JobFilter(error_prefix="timeout after"),
        {"errorPrefix": "timeout after"},
    ),
    "time range (oldest day)": (
        JobFilter(created_after=START, created_before=START + timedelta(days=1)),
        {"createdAfter": "2026-01-01T00:00:00Z", "createdBefore": "2026-01-02T00:00:00Z"},
    ),
    "errorPrefix rare (1 in 500)": (JobFilter(error_prefix="disk full"), {"errorPrefix": "disk full"}),
    "errorPrefix, none match": (JobFilter(error_prefix="segfault"), {"errorPrefix": "segfault"}),
    "status=failed + errorPrefix rare": (
        JobFilter(status="failed", error_prefix="disk full"),
        {"status": "failed", "errorPrefix": "disk full"},
    ),
    "status=running (none)": (JobFilter(status="running"), {"status": "running"}),
    "lane=chat (none)": (JobFilter(lane="chat"), {"lane": "chat"}),
}
# Filters a system token runs: every organisation at once, or one it names (``organizationId``).
SYSTEM_FILTERS: dict[str, tuple[JobFilter, dict[str, str]]] = {
    "system: every organisation": (JobFilter(), {}),
    "system: status=failed, every org": (JobFilter(status="failed"), {"status": "failed"}),
    "system: tag, every org": (JobFilter(tag=("customer", "c42")), {"tag": "customer:c42"}),
    "system: tag, org named": (
        JobFilter(tag=("customer", "c42"), organization_id=ORGS[3]),
        {"tag": "customer:c42", "organizationId": ORGS[3]},
    ),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=None, help="jobs a seeding transaction writes")
    parser.add_argument("--seed", choices=("sql", "real"), default="sql")
    parser.add_argument("--keep", default=None, help="a database to seed once and reuse (kept)")
    args = parser.parse_args(argv)
    from api.app import create_app

    with bench_database(args.keep) as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            with engine.connect() as conn:
                count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
            if count == 0:
                if args.seed == "real":
                    seconds = seed(engine, args.jobs, args.chunk or 5_000)
                else:
                    seconds = seed_sql(engine, args.jobs, args.chunk or 100_000)
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
                    conn.exec_driver_sql("VACUUM ANALYZE jobs")
                    conn.exec_driver_sql("VACUUM ANALYZE job_tags")
                how = "projection.insert_new" if args.seed == "real" else "INSERT ... SELECT"
                print(f"seeded {count} jobs in {seconds:.1f} s ({count / seconds:.0f} jobs/s, {how})")
            else:
                print(f"reusing {args.keep}: {count} jobs")
            assert count == args.jobs, f"{count} jobs in the database, --jobs {args.jobs}"
            queue = queue_for(engine)
            org = ORGS[3]
            _, secret = tokens.create(engine, org)
            _, system_secret = tokens.create(engine, "system", system=True)
            app = create_app(Settings.from_env(), engine=engine, on_dispatchable=lambda _jobs: None)
            client = app.test_client()
            cases = {
                **{n: (f, p, False) for n, (f, p) in FILTERS.items()},
                **{n: (f, p, True) for n, (f, p) in SYSTEM_FILTERS.items()},
            }
            timings: dict[str, dict[str, list[float]]] = {n: {"query": [], "http": []} for n in cases}

            def query_op(f: JobFilter, system: bool) -> Callable[[], int]:
                if system:
                    return lambda: len(queue.list_jobs(all_organizations=True, where=f, limit=50).jobs)
                return lambda: len(queue.list_jobs(organization_id=org, where=f, limit=50).jobs)

            def http_op(params: dict[str, str], system: bool) -> Callable[[], int]:
                headers = {"Authorization": f"Bearer {system_secret if system else secret}"}

                def run() -> int:
                    response = client.get("/jobs", query_string={**params, "limit": "50"}, headers=headers)
                    assert response.status_code == 200, response.get_data(as_text=True)
                    return len(response.get_json()["jobs"])

                return run

            for f, params, system in cases.values():  # warm each plan once
                query_op(f, system)()
                http_op(params, system)()
            for _ in range(args.reps):
                for name, (f, params, system) in cases.items():
                    for label, op in (("query", query_op(f, system)), ("http", http_op(params, system))):
                        started = time.perf_counter()
                        op()
                        timings[name][label].append((time.perf_counter() - started) * 1000)
            print(f"\nfirst page of 50 at {count} jobs ({args.reps} reps each, ms):")
            print(
                f"{'filter':34} {'query p50':>10} {'query p95':>10} {'http p50':>10} {'http p95':>10}  rows"
            )
            worst = 0.0
            for name, (f, _params, system) in cases.items():
                q, h = timings[name]["query"], timings[name]["http"]
                rows = query_op(f, system)()
                worst = max(worst, percentile(h, 0.95))
                print(
                    f"{name:34} {statistics.median(q):10.2f} {percentile(q, 0.95):10.2f} "
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
