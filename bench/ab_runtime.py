"""Receipt against another checkout of itself, side by side in one run: no-op jobs over HTTP.

    .venv/bin/python -m bench.ab_runtime --rounds 3 /path/to/before /path/to/after [--jobs 1000] [--idle 20]

Each checkout runs its own ``bench.runtime_bench`` deployment part (gunicorn, a driver, a chat
worker on a fresh database; 1 000 jobs posted by 4 HTTP clients, then ``--idle`` jobs one at a
time) with its own ``.venv``, in a process of its own. The checkouts take turns, the order
rotating every round so neither always runs first on a machine whose speed drifts; the medians of
the rounds are printed beside every round's figures.

Besides ``runtime_bench``'s figures (jobs/s, loaded and idle latency, CPU ms per job by process,
the median of each step) it prints how busy the dispatch places were while loaded, from the
deliveries' and receipts' times: **in flight**, the mean number of jobs between their delivery's
record (the claim) and their completion, and **waiting**, the mean number between their enqueue
and their claim. A line that waits while places stand empty shows as waiting well above zero with
in flight well below the places (slots plus the lead per process, 10 by default).

A checkout needs ``make install`` first. Every process a round starts is stopped by its PID
(``runtime_bench``'s harness), and its database dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STEPS = ("enqueue->claim", "claim->leased", "leased->started", "started->completed")


def one(argv: list[str]) -> int:
    """One round of this checkout (the working directory), as JSON on stdout."""
    sys.path.insert(0, os.getcwd())
    import bench.runtime_bench as rb
    from devharness.processes import Harness

    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--setting", action="append", default=[])
    args = parser.parse_args(argv)
    rows: dict[str, list[Any]] = {}
    steps_of = rb.segments_ms

    def keep_rows(engine: Any, prefix: str) -> list[float]:
        from sqlalchemy import text

        from app.jobs.vocab import job_stream

        with engine.connect() as conn:
            rows[prefix] = list(
                conn.execute(
                    text(
                        "SELECT e.at, d.created_at, c.at FROM receipts e "
                        "JOIN deliveries d ON d.dispatch_key = substr(e.stream, 6) AND d.generation = 0 "
                        "JOIN receipts c ON c.stream = e.stream AND c.type = 'job.completed' "
                        "WHERE e.type = 'job.enqueued' AND e.stream LIKE :p"
                    ),
                    {"p": job_stream(f"{prefix}%")},
                )
            )
        return steps_of(engine, prefix)

    rb.segments_ms = keep_rows
    rb.flush_redis(rb.RECEIPT_REDIS_DB)
    with tempfile.TemporaryDirectory(prefix="receipt-ab-") as tmp:
        figures = rb.run_receipt(args, Harness(Path(tmp) / "logs", grace=rb.STOP_GRACE_S), Path(tmp))
    loaded = next((r for p, r in rows.items() if "load-" in p), [])
    span = (max(r[2] for r in loaded) - min(r[0] for r in loaded)).total_seconds() if loaded else 0.0
    print(
        json.dumps(
            {
                "jobs/s": figures.throughput,
                "loaded p50 ms": figures.p50_ms,
                "loaded p99 ms": figures.p99_ms,
                "idle p50 ms": figures.idle_p50_ms,
                "CPU ms/job": sum(figures.cpu_ms_per_job.values()),
                "by process": figures.cpu_ms_per_job,
                "in flight": sum((r[2] - r[1]).total_seconds() for r in loaded) / span if span else 0.0,
                "waiting": sum((r[1] - r[0]).total_seconds() for r in loaded) / span if span else 0.0,
                "steps": dict(zip(STEPS, figures.load_segments, strict=False)),
            }
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["one"]:
        return one(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.ab_runtime", description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="two or more checkouts, each with its .venv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one round may take")
    args, passed = parser.parse_known_args(argv)
    trees = [c.resolve() for c in args.checkouts]
    for tree in trees:
        if not (tree / ".venv" / "bin" / "python").exists():
            parser.error(f"{tree} has no .venv: run `make install` there first")
    results: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    for n in range(args.rounds):
        order = trees[n % len(trees) :] + trees[: n % len(trees)]
        for tree in order:
            done = subprocess.run(
                [str(tree / ".venv" / "bin" / "python"), str(Path(__file__).resolve()), "one", *passed],
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=args.timeout,
                check=False,
            )
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            got = json.loads(done.stdout.strip().splitlines()[-1])
            results[tree].append(got)
            print(f"round {n + 1} {tree.name}: {_line(got)}", flush=True)
    print(f"medians of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f} at the end):")
    for tree, rounds in results.items():
        print(f"  {tree.name} ({tree}): {_line(_medians(rounds))}")
    return 0


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in rounds[0].items():
        if isinstance(value, dict):
            out[key] = {k: statistics.median(r[key][k] for r in rounds) for k in value}
        else:
            out[key] = statistics.median(r[key] for r in rounds)
    return out


def _line(f: dict[str, Any]) -> str:
    steps = " / ".join(f"{v:.1f}" for v in f["steps"].values())
    return (
        f"{f['jobs/s']:.1f} jobs/s, loaded p50 {f['loaded p50 ms']:.1f} ms (p99 {f['loaded p99 ms']:.0f}), "
        f"idle p50 {f['idle p50 ms']:.1f} ms, CPU {f['CPU ms/job']:.2f} ms/job, in flight "
        f"{f['in flight']:.1f}, waiting {f['waiting']:.1f}; steps {steps} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
