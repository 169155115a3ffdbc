"""The dispatch pass's cost against how many concurrency keys wait: one key against 10 000.

    .venv/bin/python -m bench.dispatch_pass_bench [--jobs 20000] [--keys 10000] [--orgs 20] [--rounds 60]

Two fresh PostgreSQL databases, migrated, each with ``--jobs`` queued jobs of ``--orgs``
organisations in one worker queue and a live process offering 16 slots: in one every job shares one
concurrency key (limit 1000), in the other the jobs spread over ``--keys`` distinct keys. Each round
runs one pass (``app.dispatch.line.run_pass``: lock, capacity, in flight, heads, choice, claim) on
each database, alternating which goes first, inside a transaction that is rolled back, so every
round sees the same line. Prints the median and p95 per pass of each and their ratio (issue 30's
target: 10 000 keys at most 1.5x one key), with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seed(url: str, jobs: int, keys: int, orgs: int) -> None:
    from app.composition import queue_for
    from app.jobs.validation import validate_enqueue
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade
    from devharness.credits import offer_slots

    engine = make_engine(url)
    upgrade(engine)
    queue = queue_for(engine)
    page = []
    for i in range(jobs):
        org = f"org-{i % orgs}"
        body = {
            "payload": {"kind": "factory.run", "authContext": {"userId": "bench", "organizationId": org}},
            "concurrencyKey": f"key-{i % keys}",
            "concurrencyLimit": 1000,
        }
        page.append(validate_enqueue("noop", body))
        if len(page) == 1000:
            queue.enqueue_many(page)
            page = []
    if page:
        queue.enqueue_many(page)
    offer_slots(engine, slots=16)
    with engine.connect() as conn:  # as autovacuum would have, after a backlog this size arrived
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE jobs")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--orgs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()

    from app.config import Settings
    from app.dispatch.line import run_pass
    from app.jobs.routing import QUEUES
    from app.storage.db import db_now, make_engine
    from bench.runtime_bench import fresh_database

    settings = Settings()
    queue = QUEUES["chat"]
    with fresh_database("receipt_pass_one") as one_url, fresh_database("receipt_pass_many") as many_url:
        seed(one_url, args.jobs, 1, args.orgs)
        seed(many_url, args.jobs, args.keys, args.orgs)
        engines = {"1 key": make_engine(one_url), f"{args.keys} keys": make_engine(many_url)}
        took: dict[str, list[float]] = {name: [] for name in engines}
        sent: dict[str, int] = {}
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for name in order:
                with engines[name].connect() as conn:
                    tx = conn.begin()
                    began = time.perf_counter()
                    result = run_pass(conn, queue, settings, db_now(conn))
                    took[name].append((time.perf_counter() - began) * 1000)
                    sent[name] = len(result.claimed)
                    tx.rollback()
        for engine in engines.values():
            engine.dispose()
    print(
        f"# dispatch pass: {args.jobs} queued jobs of {args.orgs} organisations, 16 slots, "
        f"{args.rounds} rounds"
    )
    medians = {}
    for name, samples in took.items():
        ranked = sorted(samples)
        medians[name] = statistics.median(ranked)
        print(
            f"{name:>12}: median {medians[name]:.2f} ms, p95 {ranked[int(0.95 * (len(ranked) - 1))]:.2f} ms "
            f"per pass, {sent[name]} sent a pass"
        )
    one, many = medians["1 key"], medians[f"{args.keys} keys"]
    print(f"ratio {many / one:.2f}x (target <= 1.5x); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
