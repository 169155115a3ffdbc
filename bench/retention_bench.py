"""Retention at scale: archive every finished job of a long history, and what that costs the hot path.

    .venv/bin/python -m bench.retention_bench [--finished 100000] [--queued 10000] [--small-queued 1000]
        [--page-size 500] [--reps 40]

Two fresh PostgreSQL databases seeded by ``bench/scale.py``'s loader (the real receipts, hash
chains, projection rows and delivery records, bulk-loaded with COPY):

* **small** — no history, ``--small-queued`` queued jobs;
* **large** — ``--finished`` completed jobs and ``--queued`` queued ones, over the last 30 days.

Then, on the large one, the archiving pass (``app.retention.archive.run_pass``, the loop's own
body) archives every finished job to a directory sink, with a 30-day window judged 31 days from
now (so every finished job is eligible and no queued one is), ``--page-size`` streams a segment.
Reported:

* the archive rate: streams, receipts and compressed bytes per second, and pages;
* the database before, right after the pass, after ``VACUUM`` (what autovacuum does by itself:
  the space becomes reusable, ``pgstattuple``'s free space), and after ``VACUUM FULL`` (what
  giving it back to the operating system takes: an exclusive lock, a rewrite) — the size of
  ``receipts``, ``jobs``, ``deliveries`` and the tombstones, tables plus indexes;
* the hot queries of ``bench/scale.py`` (enqueue, dispatch scan and claim, due retries, redrive,
  lease expiry, list, job read), median ms on the large database against the small one, before,
  *during* the pass (timed on this thread while the pass runs on another) and after it;
* ``verify_archive`` (what ``receipt verify --archive`` runs) over the result, and ``verify_tombstones``
  (what ``receipt verify`` adds on the live database), with their times.

The machine's load average is printed beside the figures: on a shared machine above 3 they are
indicative only.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.retention import archive, verify
from app.retention.policy import Policy
from app.retention.sink import DirectorySink
from app.storage.db import db_now, make_engine
from app.storage.migrate import upgrade
from bench.runtime_bench import fresh_database, log
from bench.scale import check_sample, operations, seed, time_ops

TABLES = ("receipts", "jobs", "deliveries", "archived_streams")
MiB = 2**20


def sizes(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        out = {
            t: int(conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar_one()) for t in TABLES
        }
        out["database"] = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    return out


def free_space(engine: Engine) -> dict[str, int]:
    """Bytes of each table's pages free for new rows (``pgstattuple``: dead tuples not counted)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
        return {
            t: int(conn.execute(text(f"SELECT free_space FROM pgstattuple('{t}')")).scalar_one())
            for t in TABLES[:3]
        }


def vacuum(engine: Engine, full: bool = False) -> float:
    started = time.monotonic()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for t in TABLES:
            conn.execute(text(f"VACUUM FULL ANALYZE {t}" if full else f"VACUUM (ANALYZE) {t}"))
    return time.monotonic() - started


def print_sizes(title: str, s: dict[str, int], per: int) -> None:
    parts = ", ".join(f"{t} {s[t] / MiB:.1f}" for t in TABLES)
    print(
        f"  {title:<28} database {s['database'] / MiB:8.1f} MiB  ({parts} MiB; "
        f"{s['database'] / max(per, 1):.0f} B/job)"
    )


def ratios(title: str, medians: dict[str, dict[str, float]]) -> float:
    columns = "median ms on the small, then the large database, and large / small"
    print(f"  hot queries {title}: {columns} (target <= 2.0)")
    worst = 0.0
    for name in medians["small"]:
        s, lg = medians["small"][name], medians["large"][name]
        worst = max(worst, lg / s)
        print(f"    {name:<42} {s:8.2f} {lg:8.2f} {lg / s:6.2f}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention_bench")
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--small-queued", type=int, default=1_000)
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--budget-s", type=float, default=120)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument(
        "--duty-percent",
        type=int,
        default=int(Settings.from_env({}).archive_duty_percent),
        help="the pass's RECEIPT_ARCHIVE_DUTY_PERCENT (default: the setting's default; 100 = no rest)",
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    with ExitStack() as stack:
        engines: dict[str, Engine] = {}
        plans: dict[str, Any] = {}
        for name, finished, queued in (
            ("small", 0, args.small_queued),
            ("large", args.finished, args.queued),
        ):
            url = stack.enter_context(fresh_database(f"retention_{name}"))
            engine = make_engine(url)
            stack.callback(engine.dispose)
            upgrade(engine)
            log(f"{name}: seeding {finished} finished + {queued} queued jobs")
            plans[name] = seed(engine, finished, queued, rng)
            check_sample(engine, rng, plans[name])
            engines[name] = engine
        large = engines["large"]
        total = len(plans["large"])
        ops = {
            name: operations(
                engines[name], queue_for(engines[name]), len(plans[name]), plans[name].queued_ids(), rng
            )
            for name in engines
        }
        for o in ops.values():
            for fn in o.values():
                fn()
        before_sizes = sizes(large)
        log("timing the hot queries before the pass")
        before = time_ops(ops, args.reps, time.monotonic() + args.budget_s)

        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="receipt-archive-")))
        sink = DirectorySink(folder)
        result: dict[str, Any] = {}

        def run() -> None:
            started = time.monotonic()
            try:
                result["totals"] = archive.run_pass(
                    large,
                    sink,
                    Policy(days=30),
                    page_size=args.page_size,
                    clock=lambda conn: db_now(conn) + timedelta(days=31),
                    duty_percent=args.duty_percent,
                )
            except BaseException as exc:  # reported below, never swallowed
                result["error"] = exc
            result["seconds"] = time.monotonic() - started

        log(
            f"archiving {args.finished} finished jobs, {args.page_size} a segment, "
            f"working {args.duty_percent} % of the time, "
            "timing the hot queries meanwhile"
        )
        load_during = os.getloadavg()
        worker = threading.Thread(target=run, name="archive-pass")
        worker.start()
        during_samples: list[dict[str, dict[str, float]]] = []
        while worker.is_alive():
            during_samples.append(time_ops(ops, 3, time.monotonic() + 30))
        worker.join()
        if "error" in result:
            raise result["error"]
        totals: archive.Totals = result["totals"]
        seconds: float = result["seconds"]
        # Each round timed every operation a few times; the figure is the median over the rounds.
        during = (
            {
                db: {op: statistics.median(r[db][op] for r in during_samples) for op in before[db]}
                for db in before
            }
            if during_samples
            else before
        )
        after_pass = sizes(large)
        log("VACUUM (ANALYZE)")
        vacuum_s = vacuum(large)
        after_vacuum = sizes(large)
        reusable = free_space(large)
        log("timing the hot queries after the pass")
        after = time_ops(ops, args.reps, time.monotonic() + args.budget_s)
        log("verify --archive")
        t0 = time.monotonic()
        with large.connect() as conn:
            report = verify.verify_archive(sink, conn)
        verify_s = time.monotonic() - t0
        t0 = time.monotonic()
        with large.connect() as conn:
            live = verify.verify_tombstones(conn)
        live_s = time.monotonic() - t0
        log("VACUUM FULL")
        full_s = vacuum(large, full=True)
        after_full = sizes(large)

        print()
        print(
            f"Retention benchmark: large = {args.finished} finished + {args.queued} queued jobs; small = "
            f"{args.small_queued} queued; {os.cpu_count()} CPUs; load average before "
            f"{load_before[0]:.1f}, when the pass started {load_during[0]:.1f}, at the end "
            f"{os.getloadavg()[0]:.1f}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        )
        print(
            f"  archive pass ({args.duty_percent} % duty): {totals.streams} streams ({totals.receipts} "
            f"receipts) in {seconds:.1f} s = "
            f"{totals.streams / seconds:.0f} streams/s, {totals.receipts / seconds:.0f} receipts/s; "
            f"{len(totals.segments)} segments, {totals.bytes / MiB:.1f} MiB compressed "
            f"({totals.bytes / max(totals.streams, 1):.0f} B/job), {totals.skipped} left in place"
        )
        print_sizes("before", before_sizes, total)
        print_sizes("right after the pass", after_pass, total)
        print_sizes(f"after VACUUM ({vacuum_s:.0f} s)", after_vacuum, total)
        print(
            "  reusable free space after VACUUM: "
            + ", ".join(f"{t} {reusable[t] / MiB:.1f} MiB" for t in reusable)
        )
        print_sizes(f"after VACUUM FULL ({full_s:.0f} s)", after_full, total)
        worst = [
            ratios("before the pass", before),
            ratios(f"during the pass ({len(during_samples)} rounds)", during),
        ]
        worst.append(ratios("after the pass and VACUUM", after))
        print(f"  worst ratio before / during / after: {worst[0]:.2f} / {worst[1]:.2f} / {worst[2]:.2f}")
        print(
            f"  verify --archive: {'ok' if report.ok else 'BROKEN'}: {report.receipts} receipts of "
            f"{report.streams} streams in {report.segments} segments against {report.tombstones} "
            f"tombstones in {verify_s:.1f} s"
            + ("" if report.ok else f"; first problems: {report.problems[:3]}")
        )
        print(
            f"  verify (tombstones on the live database): {'ok' if live.ok else 'BROKEN'}: "
            f"{live.tombstones} tombstones in {live_s:.1f} s"
        )
        if not report.ok or not live.ok or totals.streams != args.finished:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
