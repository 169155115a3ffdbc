"""Schedules benchmark: 10 000 schedules on a one-minute cron, fired by the schedules pass.

    .venv/bin/python -m bench.schedules_bench [--schedules 10000] [--minutes 3] [--page-size 500]
                                              [--overlap allow] [--database-url URL]
                                              [--variants lanes=2,lanes=2/lead=30000]

A private throwaway PostgreSQL cluster (``--database-url`` to use another server's empty database),
migrated. ``--schedules`` schedules of ``* * * * *`` (every minute, UTC) are declared straight through
the schedules' storage seam (``storage.apply``, 500 per transaction). Then the pass runs as the
``schedules`` loop runs it in production: ``service.run_pass`` on every whole second (beat sends the
loop's ticks on the clock's seconds), in this one process, until ``--minutes`` minute ticks have fired.
No worker runs: the jobs stay queued (the pass's cost is the subject, not delivery's).

Printed per minute tick: the passes that fired it (the longest, all of them, pages, jobs created; with a
lead, several passes before the tick) and the **tick to enqueued** latency of every job made (negative:
enqueued ahead, waiting for its tick) — the job's ``job.enqueued`` time minus its tick, both on the
database clock — as p50 / p99 / max; and the time of a pass with nothing due. The first minute is the
warm-up; the steady state is every later one. The issue's targets: one pass <= 2 s at steady state,
tick to enqueued p99 <= 2 s. The cluster (or the database) is dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from app import gc_pause
from app.composition import queue_for
from app.jobs.privilege import Enqueuer
from app.schedules import service, storage
from app.schedules.spec import validate_create
from app.storage.db import db_now, iso, jobs, make_engine, transaction
from app.storage.migrate import upgrade
from app.storage.queue import Queue

ORG = "bench-org"
DECLARE_BATCH = 500
# Measured from beat's publish to the worker's task start on this machine's e2e stack (beat logs
# "Sending due task" and the driver's "received" line, a few hundredths of a second apart).
CONSUME_DELAY_S = 0.03
SYSTEM = Enqueuer(None, (), True)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """The benchmark's database: the one given, or a new one on a private throwaway cluster."""
    if url:
        yield url
        return
    from devharness.databases import new_database
    from devharness.services import private_postgres

    with private_postgres() as admin_url:
        admin = make_engine(admin_url)
        try:
            with new_database(admin, "receipt_schedbench") as db_url:
                yield db_url
        finally:
            admin.dispose()


def declare(queue: Queue, n: int, overlap: str, kind: str = "factory.run") -> None:
    template = {"agentId": "factory", "payload": {"kind": kind, "goal": "bench"}}
    for start in range(0, n, DECLARE_BATCH):
        with transaction(queue.engine) as conn:
            now = db_now(conn)
            items = []
            for i in range(start, min(n, start + DECLARE_BATCH)):
                d = validate_create(
                    {"scheduleId": f"s{i:05d}", "cron": "* * * * *", "overlap": overlap, "job": template},
                    default_auth={"userId": "bench", "organizationId": ORG},
                )
                body = {
                    "scheduleId": d.schedule_id,
                    "organizationId": ORG,
                    "spec": d.spec.to_json(),
                    "paused": False,
                    "enqueuedBy": SYSTEM.to_json(),
                    "cursor": iso(now),
                }
                items.append((None, f"{ORG}/{d.schedule_id}", [("schedule.created", body)]))
            storage.apply_many(conn, items, at=now)


def lateness_ms(queue: Queue, tick: datetime) -> list[float]:
    """Each job of ``tick``: its job.enqueued time (created_at) minus the tick, in ms."""
    suffix = tick.strftime(":%Y%m%dT%H%M%SZ")
    with queue.engine.connect() as conn:
        rows = conn.execute(select(jobs.c.created_at).where(jobs.c.id.endswith(suffix))).scalars().all()
    return [(created - tick).total_seconds() * 1000 for created in rows]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedules", type=int, default=10_000)
    p.add_argument("--minutes", type=int, default=3, help="minute ticks to fire (the first is the warm-up)")
    p.add_argument("--page-size", type=int, default=service.PAGE_SIZE_DEFAULT)
    p.add_argument("--overlap", default="allow", choices=("allow", "skip", "bufferOne", "cancelPrevious"))
    p.add_argument(
        "--kind",
        default="factory.run",
        help="the job template's kind (factory.run writes durable-ledger rows after each commit, in "
        "the background; factory.dispatch has none)",
    )
    p.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL"))
    p.add_argument(
        "--variants",
        default=f"lanes={service.LANES}",
        help="comma-separated pass configurations taken in turn, one per minute after the warm-up, each "
        "'/'-separated parts: lanes=N (the pass's threads), lead=MS (RECEIPT_SCHEDULE_LEAD_MS), gc (the "
        "cyclic collector left running); e.g. lanes=2,lanes=2/lead=30000",
    )
    args = p.parse_args(argv)
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    with database(args.database_url) as url:
        engine = make_engine(url, prepared_statements=True)
        try:
            upgrade(engine)
            # As a long-lived process builds it: the ledger's rows written off the pass's path.
            queue = queue_for(engine, ledger_in_background=True)
            t0 = time.monotonic()
            declare(queue, args.schedules, args.overlap, args.kind)
            took = time.monotonic() - t0
            print(
                f"setup: {args.schedules} schedules ('* * * * *', overlap {args.overlap}, kind {args.kind}) "
                f"in {took:.1f} s"
            )
            results = run(queue, args)
            queue.close()
        finally:
            engine.dispose()
    return report(results, args)


def run(queue: Queue, args: Any) -> list[dict[str, Any]]:
    """The pass every second, as the loop runs it, until ``args.minutes`` minute ticks fired.

    With a lead several passes fire one minute's ticks ahead of it: each pass is counted under the
    tick whose jobs it made (the coming minute when that is within the lead, else the current one),
    and a tick is reported once a pass after its jobs finds nothing more to do."""
    variants = args.variants.split(",")
    fired: list[dict[str, Any]] = []
    idle: list[float] = []
    open_tick: dict[str, Any] | None = None
    while len(fired) < args.minutes:
        variant = variants[max(0, len(fired) - 1) % len(variants)]
        began = time.monotonic()
        with queue.engine.connect() as conn:
            now = db_now(conn)
        with pass_configured(variant) as (lanes, lead_ms):
            totals = service.run_pass(queue, page_size=args.page_size, lanes=lanes, lead_ms=lead_ms)
        elapsed_ms = (time.monotonic() - began) * 1000
        if totals.created:
            # Every schedule is on the same minute cron: the pass fired the coming minute (ahead)
            # or the one it began in.
            floor = now.replace(second=0, microsecond=0)
            ceiling = floor + timedelta(minutes=1)
            tick = ceiling if (ceiling - now).total_seconds() * 1000 <= lead_ms else floor
            if open_tick is None or open_tick["tick"] != tick:
                open_tick = {"tick": tick, "passes": [], "pages": 0, "created": 0, "variant": variant}
            open_tick["passes"].append(elapsed_ms)
            open_tick["pages"] += totals.pages
            open_tick["created"] += totals.created
        elif open_tick is not None:
            fired.append(close(queue, open_tick, idle))
            open_tick, idle = None, []
        else:
            idle.append(elapsed_ms)
        # The next pass on the clock's next whole second, as beat sends the schedules loop's ticks
        # (``Every(on_the_second=True)``), plus the hop from beat through the broker to a worker.
        time.sleep(1 - time.time() % 1 + CONSUME_DELAY_S)
    return fired


def close(queue: Queue, t: dict[str, Any], idle: list[float]) -> dict[str, Any]:
    late = lateness_ms(queue, t["tick"])
    passes = t["passes"]
    result = {
        **t,
        "passMs": max(passes),
        "jobs": len(late),
        "lateness": late,
        "idleMs": statistics.median(idle) if idle else None,
    }
    early = sum(1 for x in late if x < 0)
    print(
        f"tick {t['tick']:%H:%M} [{t['variant']}]: {len(passes)} passes (longest {max(passes):.0f} ms, "
        f"all {sum(passes):.0f} ms), {t['pages']} pages, {t['created']} jobs ({early} before the tick); "
        f"tick->enqueued p50 {quantile(late, 0.5):.0f} ms, p99 {quantile(late, 0.99):.0f} ms, "
        f"max {max(late):.0f} ms",
        flush=True,
    )
    return result


@contextlib.contextmanager
def pass_configured(variant: str) -> Iterator[tuple[int, int]]:
    """A variant: ``/``-separated parts, ``lanes=N`` (the pass's threads), ``lead=MS`` (ticks decided
    that far ahead) and ``gc`` (the collector's pause undone), e.g. ``lanes=2/lead=30000``."""
    lanes, lead_ms, gc = service.LANES, 0, False
    for part in variant.split("/"):
        key, _, value = part.partition("=")
        if key == "lanes" and value.isdigit():
            lanes = int(value)
        elif key == "lead" and value.isdigit():
            lead_ms = int(value)
        elif part == "gc":
            gc = True
        else:
            raise SystemExit(f"--variants: {variant!r}: parts are lanes=N, lead=MS and gc")
    if not gc:
        yield lanes, lead_ms
        return
    paused = gc_pause.paused
    gc_pause.paused = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield lanes, lead_ms
    finally:
        gc_pause.paused = paused


def report(results: list[dict[str, Any]], args: Any) -> int:
    variants = args.variants.split(",")
    if len(variants) > 1:
        for v in variants:
            mine = [r for r in results[1:] if r["variant"] == v]
            if mine:
                late_v = [x for r in mine for x in r["lateness"]]
                longest = [r["passMs"] for r in mine]
                print(
                    f"  [{v}] {len(mine)} ticks: longest pass {statistics.median(longest):.0f} "
                    f"ms median, {max(longest):.0f} ms max; tick->enqueued "
                    f"p99 {quantile(late_v, 0.99):.0f} ms"
                )
    steady = results[1:] or results
    pass_ms = [r["passMs"] for r in steady]
    late = [x for r in steady for x in r["lateness"]]
    idle = [r["idleMs"] for r in results if r["idleMs"] is not None]
    load = os.getloadavg()
    print(
        f"steady state ({len(steady)} ticks of {args.schedules} schedules, page {args.page_size}): "
        f"longest pass {statistics.median(pass_ms):.0f} ms median, {max(pass_ms):.0f} ms max; "
        f"tick->enqueued p50 {quantile(late, 0.5):.0f} ms, p99 {quantile(late, 0.99):.0f} ms, "
        f"max {max(late):.0f} ms (negative: enqueued before its tick, waiting for it)"
    )
    if idle:
        print(f"a pass with nothing due: {statistics.median(idle):.1f} ms median")
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    every_job = all(r["jobs"] == args.schedules for r in results)
    ok = max(pass_ms) <= 2000 and quantile(late, 0.99) <= 2000 and every_job
    print("one job per schedule per tick:", every_job, "; pass <= 2 s and p99 <= 2 s:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
