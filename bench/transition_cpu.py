"""Client CPU of a job's own transactions, in-process: enqueue, lease (the worker's first write), settle.

    .venv/bin/python -m bench.transition_cpu [--jobs 600] [--rounds 2]

On a fresh PostgreSQL database (the benchmark server, dropped afterwards) one ``Queue`` enqueues
``--jobs`` no-op jobs with explicit ids, then leases them all, then settles them all, timing each
phase with ``time.process_time`` (this process only: Python, SQLAlchemy, psycopg2 — not the
server) and the wall clock. The ledger is written synchronously, as tools and tests do. Run it in
two checkouts alternately (``PYTHONPATH=<checkout>``) to compare commits side by side.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from app.composition import queue_for
from app.storage.queue import AttemptStart
from bench.runtime_bench import fresh_database

WARM = 20


def body(job_id: str) -> dict[str, object]:
    return {
        "jobId": job_id,
        "payload": {"kind": "factory.run", "authContext": {"userId": "bench", "organizationId": "bench"}},
    }


def one_round(n: int) -> dict[str, tuple[float, float]]:
    from app.jobs.validation import validate_enqueue
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade

    with fresh_database("transition_cpu") as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            queue = queue_for(engine)
            for i in range(WARM):  # pools, compiled statements, imports
                key = queue.enqueue(validate_enqueue("factory", body(f"warm-{i}"))).job.id
                start = queue.start_attempt(key, "w", 1, lambda _job: 60_000)
                queue.settle_attempt(key, "w", 1, result=None, known=start.known)

            def timed(step: Callable[[int], object]) -> tuple[float, float]:
                cpu, wall = time.process_time(), time.perf_counter()
                for i in range(n):
                    step(i)
                return (time.process_time() - cpu) * 1000 / n, (time.perf_counter() - wall) * 1000 / n

            # Job keys are organisation-qualified; the settlement uses the head its lease wrote, as a
            # worker does.
            keys: list[str] = []
            starts: list[AttemptStart] = []

            def lease_ms(_job: object) -> int:
                return 60_000

            return {
                "enqueue": timed(
                    lambda i: keys.append(queue.enqueue(validate_enqueue("factory", body(f"t-{i}"))).job.id)
                ),
                "lease": timed(lambda i: starts.append(queue.start_attempt(keys[i], "w", 1, lease_ms))),
                "settle": timed(
                    lambda i: queue.settle_attempt(keys[i], "w", 1, result=None, known=starts[i].known)
                ),
            }
        finally:
            engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    rounds = [one_round(args.jobs) for _ in range(args.rounds)]
    print(f"per transaction, {args.jobs} jobs, medians of {args.rounds} rounds (client CPU / wall, ms):")
    for phase in rounds[0]:
        cpu = statistics.median(r[phase][0] for r in rounds)
        wall = statistics.median(r[phase][1] for r in rounds)
        print(f"  {phase:8s} cpu {cpu:.3f}  wall {wall:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
