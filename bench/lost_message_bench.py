"""How long a job waits after its worker message is lost before any process fetched it, on the
default settings (production leases, redrive and lost-delivery timings).

    .venv/bin/python -m bench.lost_message_bench [--rounds 5] [--jobs 10]

A deployment (web, driver, chat worker, beat) on a fresh PostgreSQL database and its own
redis-server. Each round: the chat worker stops consuming (Celery's ``cancel_consumer``), ``--jobs``
jobs are posted and their worker messages wait in ``receipt-chat``, the key is deleted (the loss),
consuming resumes, and each job's time from the deletion to its terminal receipt is taken. Prints
every round and the p50 / p99 / max over all jobs, with the load average. Every wait is bounded;
every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHAT = "receipt-chat"


def _all_recorded(stack: Any, ids: list[str]) -> bool:
    return all(stack.deliveries(j) for j in ids)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()

    import redis

    from app.config import Settings
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade
    from bench.runtime_bench import fresh_database
    from devharness import handlers
    from devharness.processes import harness_at
    from devharness.stack import make_stack
    from devharness.waiting import wait_for
    from tasks.celery_app import make_celery

    samples: list[float] = []
    with (
        fresh_database("receipt_lostbench") as db_url,
        tempfile.TemporaryDirectory() as tmp,
        harness_at(Path(tmp) / "logs") as harness,
    ):
        upgrade(make_engine(db_url))
        stack = make_stack(harness, db_url, Path(tmp) / "home")
        stack.timings = {}  # production defaults throughout
        try:
            stack.start("web", "driver", "chat", "beat")
            app = make_celery(Settings.from_env(stack.env()))
            broker = redis.Redis.from_url(stack.redis_url)
            print(f"# lost-message bench: {args.rounds} rounds x {args.jobs} jobs, default settings")
            for r in range(args.rounds):
                assert app.control.cancel_consumer(CHAT, reply=True, timeout=5, limit=1)
                ids = [stack.post_job(handlers.ECHO)["id"] for _ in range(args.jobs)]
                wait_for(lambda: broker.llen(CHAT) >= 1, 30, what="the messages in receipt-chat")
                # Every job's delivery recorded: the scan sent all of them (batched or not).
                wait_for(partial(_all_recorded, stack, ids), 30, what="every delivery recorded")
                time.sleep(0.2)  # the scan's last pipeline: part of the set-up, not a measured wait
                broker.delete(CHAT)
                lost_at = time.monotonic()
                assert app.control.add_consumer(CHAT, reply=True, timeout=5, limit=1)
                took: list[float] = []
                pending = set(ids)
                deadline = lost_at + args.timeout
                while pending and time.monotonic() < deadline:
                    for j in list(pending):
                        if stack.status(j) in ("completed", "failed", "canceled"):
                            took.append(time.monotonic() - lost_at)
                            pending.discard(j)
                    time.sleep(0.05)
                samples += took
                print(
                    f"round {r + 1}: {len(took)}/{len(ids)} ended, median {statistics.median(took):.1f} s, "
                    f"max {max(took):.1f} s after the loss; load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            app.close()
        finally:
            stack.close()
    ranked = sorted(samples)

    def rank(p: float) -> float:  # nearest rank: a value that was measured
        return ranked[min(len(ranked) - 1, max(0, math.ceil(p * len(ranked)) - 1))]

    print(
        f"lost message -> job ended: p50 {rank(0.50):.1f} s, p99 {rank(0.99):.1f} s, max {ranked[-1]:.1f} s "
        f"over {len(samples)} jobs (target p99 <= 10 s); load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
