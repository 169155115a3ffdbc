"""What one ``/metrics`` scrape costs as the ``jobs`` projection grows.

    .venv/bin/python bench/metrics_scrape_bench.py [--sizes 1000,10000,100000] [--scrapes 15]

1. Creates a fresh PostgreSQL database (``postgres@127.0.0.1:5432``, trust auth) and migrates it.
2. Fills the ``jobs`` projection with synthetic rows (bulk INSERTs: statuses, lanes, 20 agent ids and
   every kind alike) — only the grouped count is measured, so no receipts are written.
3. For each size, times ``app.ops.metrics.exposition`` (the grouped count, the ``loop_runs`` read,
   the process metrics, the text rendering) ``--scrapes`` times and prints the median and the worst.
4. Drops the database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get(
    "RECEIPT_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
BATCH = 5_000


def fill(engine: object, start: int, stop: int) -> None:
    from app.jobs.kinds import PAYLOAD_KINDS
    from app.jobs.vocab import LANES, STATUSES
    from app.storage.db import jobs, transaction

    now = datetime.now(UTC)
    for base in range(start, stop, BATCH):
        rows: list[dict[str, object]] = []
        for i in range(base, min(stop, base + BATCH)):
            rows.append(
                {
                    "id": f"bench-{i}",
                    "organization_id": f"org-{i % 7}",
                    "agent_id": f"agent-{i % 20}",
                    "lane": LANES[i % len(LANES)],
                    "kind": PAYLOAD_KINDS[i % len(PAYLOAD_KINDS)],
                    "status": STATUSES[i % len(STATUSES)],
                    "session_key": None,
                    "attempt": 1,
                    "max_attempts": 2,
                    "abort_requested": False,
                    "created_at": now,
                    "updated_at": now,
                    "status_changed_at": now,
                    "last_seq": 1,
                    "last_hash": "0" * 64,
                    "state": {},
                }
            )
        with transaction(engine) as conn:  # type: ignore[arg-type]
            conn.execute(jobs.insert(), rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--scrapes", type=int, default=15)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    from sqlalchemy import text

    from app.ops.metrics import exposition
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade

    name = f"receipt_bench_{uuid.uuid4().hex[:10]}"
    admin = make_engine(PG_ADMIN_URL)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    engine = make_engine(PG_ADMIN_URL.rpartition("/")[0] + "/" + name)
    try:
        upgrade(engine)
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        print(f"{'projection rows':>16} {'median ms':>10} {'worst ms':>9} {'bytes':>7}")
        filled = 0
        for size in sizes:
            fill(engine, filled, size)
            filled = size
            with engine.begin() as conn:
                conn.execute(text("ANALYZE jobs"))
            timings = []
            body = b""
            for _ in range(args.scrapes):
                started = time.perf_counter()
                body, _ = exposition(engine)
                timings.append((time.perf_counter() - started) * 1000)
            print(f"{size:>16,} {statistics.median(timings):>10.1f} {max(timings):>9.1f} {len(body):>7,}")
    finally:
        engine.dispose()
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
