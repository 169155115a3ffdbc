"""How long the dashboard's pages take to build over a PostgreSQL database with many jobs.

    .venv/bin/python bench/dashboard_bench.py [--jobs 20000] [--filler 200000] [--runs 20]

1. Creates a fresh PostgreSQL database (``postgres@127.0.0.1:5432``, trust auth) and migrates it.
2. Enqueues ``--jobs`` jobs through the queue (two organisations, four agents, all lanes), settles
   a tenth of them, then bulk-inserts ``--filler`` receipts on one stream so the system page's
   "last hour" scan reads its full window (200 000 receipts).
3. Renders each page in-process (Flask test client, system token, no HTTP) ``--runs`` times and
   prints p50 / p95 per page. The system page's broker probe is replaced by a constant: it measures
   the database reads, not Celery's 1 s broadcast.
4. Drops the database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from api.app import create_app  # noqa: E402
from api.ui.system import BrokerReport  # noqa: E402
from api.ui.system_views import PROBE_EXTENSION  # noqa: E402
from app.composition import queue_for  # noqa: E402
from app.config import Settings  # noqa: E402
from app.jobs.validation import validate_enqueue  # noqa: E402
from app.storage import tokens  # noqa: E402
from app.storage.db import db_now, make_engine, receipts, transaction  # noqa: E402
from app.storage.migrate import upgrade  # noqa: E402
from app.storage.queue import Queue  # noqa: E402

PG_ADMIN_URL = os.environ.get(
    "RECEIPT_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
AGENTS = ("factory", "codex", "factory-control", "other")
LANES = ("chat", "collect", "steer", "follow_up")


class ConstantProbe:
    def report(self) -> BrokerReport:
        return BrokerReport("redis", [], None, 0, [])


def seed(queue: Queue, jobs: int) -> list[str]:
    ids = []
    for i in range(jobs):
        org = "org-a" if i % 2 else "org-b"
        body = {
            "lane": LANES[i % 4],
            "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": org}, "n": i},
        }
        result = queue.enqueue(validate_enqueue(AGENTS[i % 4], body))
        ids.append(result.job.id)
        if i % 10 == 0:
            queue.cancel(result.job.id, "bench")
    return ids


def filler(engine: Any, count: int) -> None:
    with transaction(engine) as conn:
        at = db_now(conn)
        batch = []
        for seq in range(1, count + 1):
            batch.append(
                {
                    "stream": "bench/filler",
                    "seq": seq,
                    "type": "bench.filler",
                    "body": {},
                    "at": at,
                    "hash": "0" * 64,
                }
            )
            if len(batch) == 10_000:
                conn.execute(receipts.insert(), batch)
                batch = []
        if batch:
            conn.execute(receipts.insert(), batch)


def timed(client: Any, path: str, runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.95) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--filler", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    admin = make_engine(PG_ADMIN_URL)
    name = f"receipt_dash_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    engine = make_engine(url)
    try:
        upgrade(engine)
        started = time.perf_counter()
        queue = queue_for(engine)
        ids = seed(queue, args.jobs)
        filler(engine, args.filler)
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        print(
            f"seeded {args.jobs} jobs and {args.filler} filler receipts "
            f"in {time.perf_counter() - started:.1f} s"
        )

        with tempfile.TemporaryDirectory() as home:
            app = create_app(
                Settings(home=home, database_url=url), engine=engine, on_dispatchable=lambda jobs: None
            )
            app.extensions[PROBE_EXTENSION] = ConstantProbe()
            client = app.test_client()
            _info, secret = tokens.create(engine, "ops", system=True)
            assert client.post("/ui/signin", data={"token": secret}).status_code == 302
            middle = ids[len(ids) // 2]
            pages = [
                ("jobs, first page + counts (all organisations)", "/ui/jobs"),
                ("jobs, one organisation", "/ui/jobs?org=org-a"),
                ("jobs, status=canceled", "/ui/jobs?status=canceled"),
                ("jobs, worker group codex", "/ui/jobs?group=codex"),
                ("jobs, text in jobId", f"/ui/jobs?q={middle[-6:]}"),
                ("a job's page (timeline)", f"/ui/jobs/{middle}"),
                ("system page (database reads)", "/ui/system"),
            ]
            print(f"\n| page | p50 ms | p95 ms |   ({args.runs} runs each, in-process)")
            print("|---|---|---|")
            for label, path in pages:
                p50, p95 = timed(client, path, args.runs)
                print(f"| {label} | {p50:.1f} | {p95:.1f} |")
    finally:
        engine.dispose()
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


if __name__ == "__main__":
    main()
