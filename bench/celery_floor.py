"""What one Celery message costs on this machine: the floor under any design that sends one per job.

    .venv/bin/python -m bench.celery_floor [--jobs 2000] [--rounds 3]

A Receipt job attempt is one Celery worker message (spec step 4: the worker RPC, its task id the
attempt fence), so Receipt's throughput can never pass what Celery alone does with the same
message. This measures that ceiling: a no-op task whose only side effect is one Redis ``INCR``
(how completion is observed — no result backend, no database), on a private redis-server, with
the worker in two pools — prefork c=2 (the issue-12 peer's pool) and threads c=8 (Receipt's
workers) — alternated per round, medians printed. Jobs/s = jobs / (first send → counter reaches
the count); CPU ms per job from ``/proc`` for the worker tree, this process's sending threads and
redis-server.

Every process started here is stopped by its PID; the redis-server is private and stopped too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery

from bench.runtime_bench import child_env, tree_cpu, wait_until
from devharness.processes import Harness
from devharness.services import RedisServer

TASK = "bench.floor.noop"
QUEUE = "bench-floor"
SENDERS = 4
WARM = 20


def floor_app(broker: str) -> Celery:
    """``celery -A bench.celery_floor:app``: one task that increments a Redis counter."""
    app = Celery("bench_floor", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    clients: dict[int, Any] = {}

    def noop(key: str) -> None:
        import redis

        client = clients.get(os.getpid())
        if client is None:
            client = clients[os.getpid()] = redis.Redis.from_url(broker)
        client.incr(key)

    app.task(name=TASK, shared=False)(noop)
    return app


app = floor_app(os.environ.get("BENCH_FLOOR_BROKER", "redis://127.0.0.1:6379/0"))


def one_run(pool: str, concurrency: int, jobs: int, home: Path) -> tuple[float, dict[str, float]]:
    import redis

    harness = Harness(home / f"logs-{pool}", grace=20)
    server = RedisServer(harness)
    try:
        server.start()
        assert server.proc is not None
        env = child_env(BENCH_FLOOR_BROKER=server.url)
        worker = harness.start(
            f"celery-{pool}",
            [sys.executable, "-m", "celery", "-A", "bench.celery_floor:app", "worker", "--pool", pool,
             "--concurrency", str(concurrency), "--queues", QUEUE, "--without-gossip",
             "--without-mingle", "--loglevel", "WARNING"],
            env,
        )  # fmt: skip
        sender = floor_app(server.url)
        counter = redis.Redis.from_url(server.url)

        def count(key: str) -> int:
            return int(counter.get(key) or 0)

        for _ in range(WARM):
            sender.send_task(TASK, args=["warm"], queue=QUEUE)
        wait_until(lambda: count("warm") >= WARM, 60, "warm-up", harness)
        worker_cpu, redis_cpu = tree_cpu(worker.pid), tree_cpu(server.proc.pid)
        send_cpu = time.process_time()
        t0 = time.monotonic()

        def send(n: int) -> None:
            for _ in range(n):
                sender.send_task(TASK, args=["n"], queue=QUEUE)

        threads = [threading.Thread(target=send, args=(jobs // SENDERS,)) for _ in range(SENDERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        send_cpu = time.process_time() - send_cpu
        wait_until(lambda: count("n") >= jobs // SENDERS * SENDERS, 300, "the burst", harness)
        span = time.monotonic() - t0
        done = jobs // SENDERS * SENDERS
        cpu = {
            "producer": send_cpu * 1000 / done,
            "worker": (tree_cpu(worker.pid) - worker_cpu) * 1000 / done,
            "redis": (tree_cpu(server.proc.pid) - redis_cpu) * 1000 / done,
        }
        return done / span, cpu
    finally:
        harness.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pools = [("prefork", 2), ("threads", 8)]
    rates: dict[str, list[float]] = {p: [] for p, _ in pools}
    cpus: dict[str, list[dict[str, float]]] = {p: [] for p, _ in pools}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as home:
        for r in range(args.rounds):
            for pool, conc in pools if r % 2 == 0 else list(reversed(pools)):
                rate, cpu = one_run(pool, conc, args.jobs, Path(home))
                rates[pool].append(rate)
                cpus[pool].append(cpu)
                print(f"round {r + 1}: {pool} c={conc}: {rate:.0f} jobs/s", flush=True)
    print(
        f"\nCelery alone, one message per no-op job ({args.jobs} per burst, {args.rounds} rounds alternated, "
        f"medians; load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end)"
    )
    for pool, conc in pools:
        parts = {k: statistics.median(c[k] for c in cpus[pool]) for k in ("producer", "worker", "redis")}
        total = sum(parts.values())
        detail = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
        print(
            f"  {pool} c={conc}: {statistics.median(rates[pool]):.0f} jobs/s; CPU ms per job {detail}; "
            f"total {total:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
