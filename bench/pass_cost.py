"""What one dispatch pass costs when the line is short: wall time and this process's CPU per pass.

    .venv/bin/python -m bench.pass_cost [--jobs 1] [--passes 200]

A fresh PostgreSQL database, migrated, with ``--jobs`` queued jobs of one organisation and a live
process offering 16 slots; ``--passes`` passes (``app.dispatch.line.run_pass``: lock and clock,
counts, heads, choice, claim), each in a transaction rolled back so every pass sees the same line,
after 30 warm-up passes. Prints the mean wall and CPU milliseconds per pass and the load average.
The pass is on the path of every job that is not claimed directly, so its Python is the part to
watch (``bench/dispatch_pass_bench.py`` measures it against many keys and a deep line).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WARM_UP = 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()

    from app.config import Settings
    from app.dispatch.line import run_pass
    from app.jobs.routing import QUEUES
    from app.storage.db import make_engine
    from bench.dispatch_pass_bench import seed
    from bench.runtime_bench import fresh_database

    settings = Settings.from_env({})
    queue = QUEUES["chat"]
    with fresh_database("receipt_pass_cost") as url:
        seed(url, args.jobs, 1, 1)
        engine = make_engine(url)
        sent = 0
        with engine.connect() as conn:
            for i in range(WARM_UP + args.passes):
                if i == WARM_UP:
                    wall, cpu = time.perf_counter(), time.process_time()
                tx = conn.begin()
                sent = len(run_pass(conn, queue, settings).claimed)
                tx.rollback()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        engine.dispose()
    print(
        f"one pass over {args.jobs} queued job(s): {wall / args.passes * 1000:.2f} ms wall, "
        f"{cpu / args.passes * 1000:.2f} ms CPU of this process, {sent} sent a pass; "
        f"load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
