"""How long a saturated threads worker without prefetch takes to run a burst of short tasks.

With every slot busy the Redis transport stops polling; it must resume within a tick of a slot
freeing, not after its one-second idle poll. Prints the burst's time against the ideal (rounds x
task time); a stall per round shows as about a second a round.

    .venv/bin/python -m bench.prefetch_stall_bench [--redis redis://127.0.0.1:6379/14] [--tasks 30]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

from celery.contrib.testing.worker import start_worker

from app.config import Settings
from app.jobs.routing import QUEUES
from tasks.celery_app import make_celery

TASK_S = 0.05
SLOTS = 2


def one_burst(redis_url: str, tasks_n: int) -> float:
    app = make_celery(Settings.from_env({"REDIS_URL": redis_url}))
    # A private key prefix: no other consumer on this Redis database can take these messages.
    app.conf.broker_transport_options = {
        **dict(app.conf.broker_transport_options or {}),
        "global_keyprefix": f"bench-{uuid.uuid4().hex[:12]}:",
    }
    app.conf.worker_send_task_events = False  # events would wake the loop and hide a stall
    app.conf.task_send_sent_event = False
    finished = threading.Semaphore(0)

    def short() -> None:
        threading.Event().wait(TASK_S)
        finished.release()

    app.task(name="bench.short", shared=False)(short)
    with start_worker(
        app,
        pool="threads",
        concurrency=SLOTS,
        perform_ping_check=False,
        queues=[QUEUES["chat"]],
        loglevel="WARNING",
        shutdown_timeout=15,
    ):
        started = time.monotonic()
        for _ in range(tasks_n):
            app.send_task("bench.short", queue=QUEUES["chat"])
        for _ in range(tasks_n):
            if not finished.acquire(timeout=120):
                raise SystemExit("a task did not finish within 120 s")
        elapsed = time.monotonic() - started
    app.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ideal = args.tasks / SLOTS * TASK_S
    times = [one_burst(args.redis, args.tasks) for _ in range(args.rounds)]
    median = statistics.median(times)
    print(
        f"{args.tasks} x {TASK_S * 1000:.0f} ms tasks on {SLOTS} threads: median {median:.2f} s "
        f"(rounds {', '.join(f'{t:.2f}' for t in times)}; ideal {ideal:.2f} s, a stall per round "
        f"~{args.tasks / SLOTS:.0f} s)"
    )


if __name__ == "__main__":
    main()
