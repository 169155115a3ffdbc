"""A bulk replay of many failed jobs: exactly one linked new job each, none more when retried.

    .venv/bin/python -m bench.bulk_replay_bench [--jobs 100000] [--page 1000] [--template NAME]

One fresh PostgreSQL database, migrated to head, dropped at the end (``--template NAME``: a copy of
the database NAME, seeded the first time and kept, so the seeding is not redone for every run).
``--jobs`` failed jobs of one organisation (``job.enqueued`` + a non-retryable ``job.failed``,
hash-chained) are written through the project's bulk path (``projection.insert_new``) and analysed.
Then the bulk replay runs as ``POST /jobs:bulk`` runs it (``bulk_actions.run_page`` on the API
process's queue, ``--page`` jobs a call, resumed with each answer's cursor) and prints the
bookkeeping rate (jobs replayed per second: each one's ``job.enqueued`` with ``replayOf``, the
source's ``job.replayed``, the projection rows, the audit receipts). Checks that fail the run:
exactly ``--jobs`` new jobs, each ``replayOf`` a distinct source whose ``replayedAs`` names it; the
whole request sequence retried with the same key writes nothing; a page redone below the audit (as
if the process died before recording it) creates no job. Target (issue 35): >= 1 000 jobs/s.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from app.composition import build_queue
from app.config import Settings
from app.factory.hooks import Ledger
from app.jobs.ids import qualify
from app.jobs.vocab import job_stream
from app.ops import bulk_actions
from app.storage import projection, search, store
from app.storage.db import jobs, make_engine, receipts, transaction
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from bench.runtime_bench import PG_ADMIN_URL, fresh_database, log
from bench.search_bench import START
from devharness.databases import autocommit, pg_url_for

ORG = "org-bulk"
FILTER = search.JobFilter(status="failed", tag=("run", "bench"))


def seed(engine: Engine, total: int, chunk: int = 5000) -> None:
    from datetime import timedelta

    from app.jobs.reducer import fold

    for first in range(0, total, chunk):
        page = []
        for i in range(first, min(total, first + chunk)):
            key = qualify(ORG, f"failed-{i:08d}")
            body = {
                "jobId": key,
                "agentId": "factory",
                "lane": "collect",
                "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG}},
                "sessionKey": None,
                "singletonMode": "allow",
                "maxAttempts": 2,
                "tags": {"run": "bench"},
            }
            failed = {"error": "command exited with 1", "retryable": False, "status": "failed"}
            at = START + timedelta(seconds=i)
            chained = store.chain(
                job_stream(key), 0, [("job.enqueued", body), ("job.failed", failed)], prev_hash=None, at=at
            )
            job = fold(chained.receipts())
            assert job is not None
            page.append((job, chained))
        with transaction(engine) as conn:
            projection.insert_new(conn, page)
    log(f"seeded {total} failed jobs")


def run(queue: Queue, key: str, page: int) -> tuple[bulk_actions.Progress, int]:
    cursor = None
    calls = 0
    while True:
        progress = bulk_actions.run_page(
            queue,
            organization_id=ORG,
            key=key,
            action="replay",
            f=FILTER,
            by={"bench": True},
            cursor=cursor,
            limit=page,
        )
        calls += 1
        if progress.done:
            return progress, calls
        cursor = progress.next_cursor


def prepare(engine: Engine, total: int) -> None:
    """Migrate, seed ``total`` failed jobs and analyse, as a deployment's autovacuum would."""
    upgrade(engine)
    seed(engine, total)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # What autovacuum does to a table this size within a minute: without statistics the
        # planner joins the tag rows to the failed jobs by scanning one for each of the other.
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
        conn.exec_driver_sql("VACUUM ANALYZE job_tags")


def seeded_template(name: str, total: int) -> None:
    """The database ``name`` holding ``total`` seeded failed jobs: made and seeded the first time,
    then kept (a run copies it: ``CREATE DATABASE ... TEMPLATE``)."""
    admin = make_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        if exists is None:
            autocommit(admin, f"CREATE DATABASE {name}")
        engine = make_engine(pg_url_for(name, admin.url.render_as_string(hide_password=False)))
        try:
            upgrade(engine)
            have = count(engine, select(func.count()).select_from(jobs))
            if have == 0:
                prepare(engine, total)
            elif have != total:
                raise SystemExit(f"{name} holds {have} jobs, not {total}: drop it or name another")
        finally:
            engine.dispose()
    finally:
        admin.dispose()


def count(engine: Engine, q: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(q).scalar_one())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=bulk_actions.BULK_PAGE_MAX)
    parser.add_argument(
        "--template",
        default=None,
        help="a database to seed once and keep; each run replays in a fresh copy of it",
    )
    args = parser.parse_args(argv)
    if args.template is not None:
        seeded_template(args.template, args.jobs)
    with fresh_database("bulk_bench", template=args.template) as url:
        engine = make_engine(url)
        # The queue of the API process that answers POST /jobs:bulk: every hook, ledger rows written
        # by its background thread, metrics observed.
        queue = build_queue(Settings.from_env(), engine=engine)
        try:
            if args.template is None:
                prepare(engine, args.jobs)
            started = time.perf_counter()
            progress, calls = run(queue, "bench-op", args.page)
            seconds = time.perf_counter() - started
            # The durable ledger's rows trail the receipts on the writer's thread (best effort, beside
            # receipts): the time until the last of them is written, too.
            ledger = queue.hook(Ledger)
            if ledger is not None and ledger.writer is not None:
                ledger.writer.flush()
            with_ledger = time.perf_counter() - started
            replays = count(engine, select(func.count()).select_from(jobs).where(jobs.c.status == "queued"))
            linked = count(
                engine,
                select(func.count(func.distinct(jobs.c.state["replayOf"].as_string()))).where(
                    jobs.c.status == "queued"
                ),
            )
            sources = count(
                engine, select(func.count()).select_from(receipts).where(receipts.c.type == "job.replayed")
            )
            print(
                f"bulk replay of {args.jobs} failed jobs: {calls} calls of {args.page}, {seconds:.1f} s, "
                f"{args.jobs / seconds:.0f} jobs/s bookkeeping (target >= 1000); "
                f"the ledger's rows written {with_ledger:.1f} s from the start "
                f"({args.jobs / with_ledger:.0f} jobs/s)"
            )
            print(f"new jobs {replays}, distinct replayOf {linked}, job.replayed receipts {sources}")
            ok = replays == linked == sources == args.jobs == progress.affected
            before = count(engine, select(func.count()).select_from(receipts))
            again, _ = run(queue, "bench-op", args.page)
            after = count(engine, select(func.count()).select_from(receipts))
            print(f"the same requests retried: repeated={again.replayed}, receipts written {after - before}")
            ok = ok and after == before and again.replayed
            # A page redone below the audit (the process died before recording it): no new job.
            with engine.connect() as conn:
                first_page = search.list_jobs(conn, search.Scope(ORG), FILTER, limit=args.page)
            bulk_actions._apply(queue, "replay", "bench-op", first_page, None, None)
            redone = count(engine, select(func.count()).select_from(jobs).where(jobs.c.status == "queued"))
            print(f"a page redone without its audit: new jobs {redone - replays}")
            ok = ok and redone == replays
            print("checks:", "ok" if ok else "FAILED")
            return 0 if ok else 1
        finally:
            queue.close()
            engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
