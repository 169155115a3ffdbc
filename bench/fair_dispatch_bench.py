"""Noisy neighbour: how long organisation B's single quick job takes alone, and right after
organisation A posts a burst of quick jobs, on one deployment over HTTP.

    .venv/bin/python -m bench.fair_dispatch_bench [--rounds 3] [--burst 3000] [--batch 500]

A deployment (web, driver, one chat worker, beat) on a fresh PostgreSQL database and its own
redis-server, production timings; two organisations with their own tokens. Each round, alternated:
B's job alone (post, then the time to its terminal receipt, read from the job's own receipts);
then A's burst (``--burst`` jobs in ``POST /jobs:batch`` requests of ``--batch``), B's job posted
right after the first batch is accepted, B's time measured the same way, and A's burst drained
before the next round. Prints every round, the medians and the ratio B-behind-A / B-alone
(issue 30's targets: within 5x behind 3 000, within 10x behind 30 000), with the load average.
Every wait is bounded; every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ORG_A, ORG_B = "bench-org-a", "bench-org-b"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="RECEIPT_NAME=VALUE",
        help="a setting for Receipt's processes (repeatable)",
    )
    args = parser.parse_args()
    malformed = [s for s in args.setting if "=" not in s or not s.startswith("RECEIPT_")]
    if malformed:
        parser.error(f"--setting: {', '.join(malformed)}: give RECEIPT_<NAME>=<value>")
    settings = dict(s.split("=", 1) for s in args.setting)

    import requests
    from sqlalchemy import select

    from app.jobs.ids import qualify
    from app.storage import tokens
    from app.storage.db import jobs, make_engine, receipts
    from app.storage.migrate import upgrade
    from bench.runtime_bench import fresh_database
    from devharness import handlers
    from devharness.processes import harness_at
    from devharness.stack import make_stack
    from devharness.waiting import wait_for

    with (
        fresh_database("receipt_fairbench") as db_url,
        tempfile.TemporaryDirectory() as tmp,
        harness_at(Path(tmp) / "logs") as harness,
    ):
        engine = make_engine(db_url)
        upgrade(engine)
        # A's burst is the subject: the write limit per organisation (20 000 a minute) would refuse
        # most of a 30 000 burst.
        stack = make_stack(
            harness, db_url, Path(tmp) / "home", RECEIPT_RATE_LIMIT_WRITES="disabled", **settings
        )
        stack.timings = {}  # production defaults throughout
        _a, token_a = tokens.create(engine, ORG_A)
        _b, token_b = tokens.create(engine, ORG_B)
        http = requests.Session()

        def body(org: str) -> dict[str, Any]:
            return {
                "payload": {"kind": "factory.run", "authContext": {"userId": "bench", "organizationId": org}}
            }

        def post_one(org: str, token: str) -> str:
            r = http.post(
                stack.url(f"/agents/{handlers.ECHO}/jobs"),
                json=body(org),
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            assert r.status_code == 202, r.text
            return str(r.json()["job"]["id"])

        def post_batch(n: int) -> None:
            items = [{"agentId": handlers.ECHO, **body(ORG_A)} for _ in range(n)]
            r = http.post(
                stack.url("/jobs:batch"),
                json={"items": items},
                headers={"Authorization": f"Bearer {token_a}"},
                timeout=120,
            )
            assert r.status_code == 202, r.text

        def took_s(org: str, client_id: str) -> float:
            """From the job's job.enqueued to its terminal receipt, on the database clock."""
            stream = f"jobs/{qualify(org, client_id)}"

            def ended() -> Any:
                with engine.connect() as conn:
                    rows = conn.execute(
                        select(receipts.c.type, receipts.c.at)
                        .where(receipts.c.stream == stream)
                        .order_by(receipts.c.seq)
                    ).all()
                if rows and rows[-1].type in ("job.completed", "job.failed", "job.canceled"):
                    return (rows[-1].at - rows[0].at).total_seconds()
                return None

            return float(wait_for(ended, args.timeout, interval=0.01, what=f"{org}'s job to end"))

        def drained() -> bool:
            # The first unfinished job, not a count: polled every 50 ms against a 30 000-job line,
            # a count would load the database the bench is measuring.
            with engine.connect() as conn:
                left = conn.execute(
                    select(jobs.c.id).where(jobs.c.status.in_(("queued", "leased", "running"))).limit(1)
                ).first()
            return left is None

        alone: list[float] = []
        behind: list[float] = []
        bursts: list[float] = []
        try:
            stack.start("web", "driver", "chat", "beat")
            post_one(ORG_B, token_b)  # warm-up
            wait_for(drained, args.timeout, what="the warm-up to end")
            print(
                f"# fair dispatch bench: {args.rounds} rounds, burst {args.burst} in batches of {args.batch}"
            )
            for r in range(args.rounds):
                alone.append(took_s(ORG_B, post_one(ORG_B, token_b)))
                began = time.monotonic()
                post_batch(min(args.batch, args.burst))
                b_id = post_one(ORG_B, token_b)
                sent = min(args.batch, args.burst)
                while sent < args.burst:
                    n = min(args.batch, args.burst - sent)
                    post_batch(n)
                    sent += n
                behind.append(took_s(ORG_B, b_id))
                wait_for(drained, args.timeout, interval=0.05, what="A's burst to end")
                bursts.append(time.monotonic() - began)
                print(
                    f"round {r + 1}: B alone {alone[-1] * 1000:.0f} ms, B behind A's {args.burst} "
                    f"{behind[-1] * 1000:.0f} ms, A's burst ended after {bursts[-1]:.1f} s; "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        finally:
            stack.close()
    a, b = statistics.median(alone), statistics.median(behind)
    target = 5 if args.burst <= 3000 else 10
    print(
        f"median: B alone {a * 1000:.0f} ms, B behind A's {args.burst} {b * 1000:.0f} ms: {b / a:.1f}x "
        f"(target <= {target}x); A's burst {statistics.median(bursts):.1f} s "
        f"({args.burst / statistics.median(bursts):.0f} jobs/s); load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
