"""Group commit in isolation: a worker's concurrent transitions with and without it, side by side.

    .venv/bin/python -m bench.group_commit_bench [--jobs 2000] [--threads 8] [--rounds 3]

One process, a fresh PostgreSQL database, the composition root's queue (every hook) built twice:
``RECEIPT_GROUP_COMMIT_MAX`` 1 (each transition its own commit) and 64. Per round and setting,
``--jobs`` new jobs are enqueued and leased (not timed), then ``--threads`` threads each take a share
and, per job, write what a worker writes for a short job after its lease: a heartbeat, then the
settlement. Reported per setting, medians over the rounds (the settings alternate, the first one
rotating): transitions/s, server commits per transition (``pg_stat_database.xact_commit``, which
also counts autocommitted statements), this process's CPU ms per transition, and the mean and largest
number of transitions one commit carried.

What it shows is the completer's own effect with the handler, the broker and the other processes
taken away; ``bench/runtime_bench.py --setting RECEIPT_GROUP_COMMIT_MAX=1`` shows it end to end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.validation import validate_enqueue
from app.storage.db import make_engine
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from bench.runtime_bench import fresh_database, log

BODY = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "bench"}}}
LEASE_MS = 600_000
STATS_FLUSH_S = 11.0  # PostgreSQL 15 flushes a backend's pending counters within 10 s of idling


def leased_jobs(queue: Queue, n: int, tag: str) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 500):
        reqs = [
            validate_enqueue("factory", {**BODY, "jobId": f"{tag}-{i:06d}"})
            for i in range(start, min(n, start + 500))
        ]
        ids.extend(r.job.id for r in queue.enqueue_many(reqs))  # type: ignore[union-attr]
    for job_id in ids:
        assert queue.start_attempt(job_id, "w", 1, lambda _job: LEASE_MS).status == "started"
    return ids


def commits(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def one_round(engine: Engine, queue: Queue, ids: list[str], threads: int) -> dict[str, float]:
    errors: list[BaseException] = []

    def work(share: list[str]) -> None:
        try:
            for job_id in share:
                assert queue.heartbeat(job_id, "w", 1, LEASE_MS).applied
                assert queue.settle_attempt(job_id, "w", 1, result={}).applied
        except BaseException as exc:
            errors.append(exc)

    group = queue._group
    before_group = (group.commits, group.writes) if group else (0, 0)
    time.sleep(STATS_FLUSH_S)  # the setup's counters reach pg_stat_database first
    c0, cpu0, t0 = commits(engine), time.process_time(), time.monotonic()
    pool = [threading.Thread(target=work, args=(ids[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    if errors:
        raise errors[0]
    time.sleep(STATS_FLUSH_S)
    transitions = 2 * len(ids)
    made = commits(engine) - c0 - 1  # less the read of c0's own (autocommitted) statement
    out = {
        "per_s": transitions / seconds,
        "commits": made / transitions,
        "cpu_ms": cpu * 1000 / transitions,
        "mean_batch": 1.0,
        "largest": 1.0,
    }
    if group is not None:
        n_commits, n_writes = group.commits - before_group[0], group.writes - before_group[1]
        out["mean_batch"] = n_writes / max(1, n_commits)
        out["largest"] = float(group.largest)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.group_commit_bench")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    settings = (1, 64)
    figures: dict[int, list[dict[str, float]]] = {s: [] for s in settings}
    log(f"load average {os.getloadavg()[0]:.2f}")
    with fresh_database("group_commit_bench") as url:
        engine = make_engine(url, pool_size=args.threads + 2)
        try:
            upgrade(engine)
            queues = {s: queue_for(engine, group_commit_max=s) for s in settings}
            for r in range(args.rounds):
                order = settings if r % 2 == 0 else settings[::-1]
                for s in order:
                    ids = leased_jobs(queues[s], args.jobs, f"r{r}-g{s}")
                    got = one_round(engine, queues[s], ids, args.threads)
                    figures[s].append(got)
                    log(
                        f"round {r + 1}, RECEIPT_GROUP_COMMIT_MAX={s}: {got['per_s']:.0f} transitions/s, "
                        f"{got['commits']:.2f} commits each, {got['cpu_ms']:.2f} ms CPU each, "
                        f"mean batch {got['mean_batch']:.1f} (largest {got['largest']:.0f})"
                    )
        finally:
            engine.dispose()
    log(f"load average {os.getloadavg()[0]:.2f}")
    each = "(heartbeat + settle each)"
    print(f"\n{args.threads} threads, {args.jobs} jobs a round {each}, medians of {args.rounds} rounds")
    print("  RECEIPT_GROUP_COMMIT_MAX   transitions/s   commits/transition   CPU ms/transition   mean batch")
    for s in settings:
        med: dict[str, Any] = {k: statistics.median(f[k] for f in figures[s]) for k in figures[s][0]}
        print(
            f"  {s:<24} {med['per_s']:>13.0f}   {med['commits']:>18.2f}   {med['cpu_ms']:>17.2f}   "
            f"{med['mean_batch']:>10.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
