"""Enqueue throughput through the real HTTP stack against the raw receipt append rate, same run.

    .venv/bin/python bench/http_enqueue_bench.py [--appends 3000] [--requests 3000] [--concurrency 16]
        [--rate-limit 1000000/minute] [--py-spy profile.txt]

1. Creates a fresh PostgreSQL database (``postgres@127.0.0.1:5432``, trust auth) and migrates it.
2. Raw append rate: ``app.storage.store.append`` of ``job.enqueued``-shaped receipts, one transaction
   each, one client — the foundation's floor for "one durable write".
3. Starts gunicorn (``api/gunicorn_conf.py``: gevent workers) on 127.0.0.1 with authentication
   on and a real token, then a load generator **in a second process** (keep-alive
   connections, bounded in count and time) posts enqueues.
4. Prints raw appends/s, HTTP enqueues/s, their ratio (target >= 0.5), p50/p99 latency, the CPU
   gunicorn (master and workers, from ``/proc``) spent per request over the measured run, and
   the wake-up publisher's broker (``api/wake.py``); then stops gunicorn by PID and
   drops the database.

``--py-spy FILE`` samples gunicorn's workers with py-spy (the ``bench`` extra) during the measured
run and writes the folded stacks there (``--format raw``; render with any flame-graph tool, or
sum the leaf frames).

Every request goes to loopback only, and every loop is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.runtime_bench import tree_cpu  # noqa: E402
from devharness.databases import new_database  # noqa: E402  (after the path is set)
from devharness.waiting import free_port, wait_for  # noqa: E402

PG_ADMIN_URL = os.environ.get(
    "RECEIPT_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("RECEIPT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
ORG = "bench-org"
TIME_LIMIT_SECONDS = 120.0


def _payload(i: int) -> dict[str, Any]:
    return {
        "kind": "factory.run",
        "authContext": {"userId": f"user-{i % 50}", "organizationId": ORG},
        "prompt": "summarise the quarterly numbers",
        "n": i,
    }


# -- load generator (runs in its own process) ---------------------------------------------------


def load_generator(
    host: str, port: int, token: str, requests: int, concurrency: int, deadline_s: float
) -> dict[str, Any]:
    """POST ``requests`` enqueues over ``concurrency`` keep-alive connections; return timings."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    counter = iter(range(requests))
    deadline = time.monotonic() + deadline_s
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            while time.monotonic() < deadline:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                body = json.dumps({"payload": _payload(i)})
                start = time.perf_counter()
                conn.request("POST", "/agents/factory/jobs", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
                    statuses[response.status] = statuses.get(response.status, 0) + 1
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"wall": wall, "latencies": latencies, "statuses": statuses}


# -- orchestration ---------------------------------------------------------------------------------


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {proc.returncode}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    wait_for(healthy, timeout, what="gunicorn to become healthy", ignore=(OSError,))


def raw_append_rate(engine: Any, count: int, tag: str) -> float:
    from app.storage import store
    from app.storage.db import transaction

    start = time.perf_counter()
    for i in range(count):
        body = {
            "jobId": f"raw-{tag}-{i}",
            "agentId": "factory",
            "lane": "collect",
            "payload": _payload(i),
            "sessionKey": None,
            "singletonMode": "allow",
            "maxAttempts": 2,
        }
        with transaction(engine) as conn:
            store.append(conn, f"jobs/raw-{tag}-{i}", 0, "job.enqueued", body)
    return count / (time.perf_counter() - start)


def _start_py_spy(pid: int, path: str) -> subprocess.Popen[bytes]:
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--format",
            "raw",
            "--rate",
            "250",
            "--output",
            path,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches before the measured run starts (a start-up delay, not a sync)
    return spy


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (WEB_CONCURRENCY)")
    parser.add_argument(
        "--rate-limit",
        default="disabled",
        help="RECEIPT_RATE_LIMIT_WRITES for the server (default disabled; e.g. 1000000/minute to measure "
        "what the per-organisation limit costs with its counters in Redis)",
    )
    parser.add_argument("--py-spy", metavar="FILE", help="sample gunicorn with py-spy into FILE (raw)")
    parser.add_argument(
        "--load-generator", nargs=3, metavar=("PORT", "TOKEN", "DEADLINE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()

    if args.load_generator:
        port, token, deadline = args.load_generator
        result = load_generator(
            "127.0.0.1", int(port), token, args.requests, args.concurrency, float(deadline)
        )
        json.dump(result, sys.stdout)
        return 0

    from sqlalchemy import func, select

    from app.storage import tokens
    from app.storage.db import jobs, make_engine
    from app.storage.migrate import upgrade

    admin = make_engine(PG_ADMIN_URL)
    cleanup = contextlib.ExitStack()
    db_url = cleanup.enter_context(new_database(admin, "receipt_bench"))
    engine = make_engine(db_url)
    gunicorn: subprocess.Popen[bytes] | None = None
    try:
        upgrade(engine)
        load_before = os.getloadavg()[0]
        # Half the appends before the HTTP run and half after: on a shared machine the background
        # load drifts, and both rates should see the same conditions.
        raw_before = raw_append_rate(engine, args.appends // 2, "before")
        _, token = tokens.create(engine, ORG)

        waker = f"api.wake publisher, REDIS_URL={REDIS_URL}"

        port = free_port()
        home = tempfile.mkdtemp(prefix="receipt-bench-")
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "REDIS_URL": REDIS_URL,
            "RECEIPT_AUTH": "enabled",
            # Off by default: the bench measures the enqueue path, not the write limit (--rate-limit).
            "RECEIPT_RATE_LIMIT_WRITES": args.rate_limit,
            "RECEIPT_HOME": home,
            "WEB_CONCURRENCY": str(args.workers),
            "GUNICORN_LOG_LEVEL": "warning",
            "PYTHONPATH": str(ROOT),
        }
        gunicorn = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                str(ROOT / "api" / "gunicorn_conf.py"),
                "-b",
                f"127.0.0.1:{port}",
                "api.wsgi:app",
            ],
            cwd=ROOT,
            env=env,
        )
        _wait_healthy(port, gunicorn)

        # Warm-up (connection pools, imports) outside the measurement, then the measured run.
        spy: subprocess.Popen[bytes] | None = None
        for n in (200, args.requests):
            if n == args.requests:
                cpu_before = tree_cpu(gunicorn.pid)
                if args.py_spy:
                    spy = _start_py_spy(gunicorn.pid, args.py_spy)
            loadgen = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--requests",
                    str(n),
                    "--concurrency",
                    str(args.concurrency),
                    "--load-generator",
                    str(port),
                    token,
                    str(TIME_LIMIT_SECONDS),
                ],
                capture_output=True,
                check=True,
                timeout=TIME_LIMIT_SECONDS + 30,
            )
        cpu_ms = (tree_cpu(gunicorn.pid) - cpu_before) * 1000
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(timeout=60)
        result = json.loads(loadgen.stdout)
        raw_after = raw_append_rate(engine, args.appends - args.appends // 2, "after")
        raw_rate = (raw_before + raw_after) / 2
        with engine.connect() as conn:
            stored = conn.execute(select(func.count()).select_from(jobs)).scalar_one()

        latencies = result["latencies"]
        http_rate = len(latencies) / result["wall"]
        print(
            f"raw appends:        {raw_rate:8.0f} /s  ({args.appends} appends, 1 client, 1 transaction each; "
            f"{raw_before:.0f} before and {raw_after:.0f} after the HTTP run)"
        )
        print(
            f"HTTP enqueues:      {http_rate:8.0f} /s  ({len(latencies)} requests, {args.concurrency} "
            f"keep-alive "
            f"clients, gunicorn gevent x{args.workers}, auth on)"
        )
        print(f"gunicorn CPU:       {cpu_ms / len(latencies):8.2f} ms per request (master + workers, /proc)")
        print(f"ratio HTTP / raw:   {http_rate / raw_rate:8.2f}    (target >= 0.5)")
        print(
            f"latency p50 / p99:  {_percentile(latencies, 0.5) * 1000:6.1f} ms / "
            f"{_percentile(latencies, 0.99) * 1000:6.1f} ms "
            f"(mean {statistics.fmean(latencies) * 1000:.1f} ms)"
        )
        print(f"statuses:           {result['statuses']}; jobs stored: {stored} (incl. {200} warm-up)")
        print(f"waker:              {waker}")
        print(
            f"machine:            {os.cpu_count()} cores, load average {load_before:.2f} at start, "
            f"{os.getloadavg()[0]:.2f} at end"
        )
        ok = set(result["statuses"]) == {"202"} and stored == args.requests + 200
        return 0 if ok else 1
    finally:
        if gunicorn is not None:
            gunicorn.send_signal(signal.SIGTERM)
            try:
                gunicorn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                gunicorn.kill()
                gunicorn.wait()
        engine.dispose()
        cleanup.close()  # drops the database
        admin.dispose()


if __name__ == "__main__":
    sys.exit(main())
