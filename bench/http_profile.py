"""Where the API's CPU goes per ``POST /agents/<id>/jobs`` and ``GET /jobs/<id>``, in-process.

    .venv/bin/python -m bench.http_profile [--requests 2000] [--rate-limit disabled] [--profile]
        [--top 40] [--setting RECEIPT_TOKEN_CACHE_MS=0 ...]

Builds the app with ``api.app.create_app`` over a fresh PostgreSQL database (``postgres@127.0.0.1``,
trust auth), the real wake-up publisher on ``RECEIPT_BENCH_REDIS_URL`` and a real token, and
calls its WSGI callable directly (no test client, no socket: what gunicorn calls). It prints
the CPU (``time.process_time``, medians of interleaved rounds) per request for:

- ``enqueue only``: ``Queue.enqueue`` plus the wake-up publish, called from Python — the floor
  the HTTP layer adds to;
- ``POST``: the full request through Flask (auth, the write limit, validation, serialisation);
- ``GET``: ``GET /jobs/<id>`` of a job just posted.

``--profile`` runs the POSTs again under cProfile and prints the top functions by own time and
by cumulative time, in CPU time. Every loop is bounded; the database is dropped at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The same database, Redis and request body as the HTTP enqueue bench.
from bench.http_enqueue_bench import ORG, PG_ADMIN_URL, REDIS_URL  # noqa: E402
from bench.http_enqueue_bench import _payload as _payload  # noqa: E402
from devharness.databases import new_database  # noqa: E402  (after the path is set)

ROUNDS = 5


def _environ(method: str, path: str, token: str, body: bytes = b"") -> dict[str, Any]:
    """A WSGI environ as gunicorn builds it (a fresh one per request: the app mutates it)."""
    return {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8080",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8080",
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "HTTP_ACCEPT": "*/*",
        "CONTENT_TYPE": "application/json" if body else "",
        "CONTENT_LENGTH": str(len(body)) if body else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def _call(app: Callable[..., Iterable[bytes]], environ: dict[str, Any]) -> tuple[str, bytes]:
    status: list[str] = []

    def start_response(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        status.append(s)

    chunks = app(environ, start_response)
    try:
        data = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return status[0], data


def _cpu_ms_per(count: int, fn: Callable[[int], None]) -> float:
    start = time.process_time()
    for i in range(count):
        fn(i)
    return (time.process_time() - start) * 1000 / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--rate-limit", default="disabled", help="RECEIPT_RATE_LIMIT_WRITES (default disabled)"
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        help="a setting for the app, as its environment variable (repeatable), e.g. RECEIPT_TOKEN_CACHE_MS=0",
    )
    parser.add_argument("--profile", action="store_true", help="profile the POSTs with cProfile")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    from api.app import create_app
    from api.auth import Identity
    from app.config import Settings
    from app.jobs.validation import validate_enqueue
    from app.storage import tokens
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade

    admin = make_engine(PG_ADMIN_URL)
    with contextlib.ExitStack() as cleanup:
        db_url = cleanup.enter_context(new_database(admin, "receipt_prof"))
        cleanup.callback(admin.dispose)
        engine = make_engine(db_url)
        cleanup.callback(engine.dispose)
        upgrade(engine)
        home = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="receipt-prof-"))
        settings = Settings.from_env(
            {
                "DATABASE_URL": db_url,
                "REDIS_URL": REDIS_URL,
                "RECEIPT_HOME": home,
                "RECEIPT_RATE_LIMIT_WRITES": args.rate_limit,
                **dict(setting.split("=", 1) for setting in args.setting),
            }
        )
        app = create_app(settings, engine=engine)
        queue = app.extensions["receipt"].queue
        # Before the engine and the database go: the ledger writer's last batch, then its thread.
        cleanup.callback(queue.close)
        info, token = tokens.create(engine, ORG)
        enqueuer = Identity(info.organization_id, info.system, info.id, info.scopes).enqueuer()
        posted: list[str] = []

        def enqueue_only(i: int) -> None:
            queue.enqueue(validate_enqueue("factory", {"payload": _payload(i)}), enqueued_by=enqueuer)

        def post(i: int) -> None:
            body = json.dumps({"payload": _payload(i)}).encode()
            status, data = _call(app, _environ("POST", "/agents/factory/jobs", token, body))
            if not status.startswith("202"):
                raise RuntimeError(f"POST answered {status}: {data[:300]!r}")
            if len(posted) < args.requests:
                posted.append(json.loads(data)["job"]["id"])

        def get(i: int) -> None:
            status, data = _call(app, _environ("GET", f"/jobs/{posted[i % len(posted)]}", token))
            if not status.startswith("200"):
                raise RuntimeError(f"GET answered {status}: {data[:300]!r}")

        for fn in (enqueue_only, post, get):  # warm-up: imports, pools, compiled schemas
            for i in range(50):
                fn(i)
        n = args.requests
        # Interleaved rounds, medians: a shared machine's load drifts, and all three see the same.
        per_round = max(1, n // ROUNDS)
        figures: dict[str, list[float]] = {"only": [], "post": [], "get": []}
        for _ in range(ROUNDS):
            figures["only"].append(_cpu_ms_per(per_round, enqueue_only))
            figures["post"].append(_cpu_ms_per(per_round, post))
            figures["get"].append(_cpu_ms_per(per_round, get))
        only, full, read = (statistics.median(figures[k]) for k in ("only", "post", "get"))
        print(f"enqueue only (Python):  {only:6.2f} ms CPU per job")
        print(f"POST /agents/<id>/jobs: {full:6.2f} ms CPU per request (HTTP layer {full - only:.2f} ms)")
        print(f"GET /jobs/<id>:         {read:6.2f} ms CPU per request")
        print(
            f"medians of {ROUNDS} interleaved rounds of {per_round}; rate limit {args.rate_limit}; auth on; "
            f"WSGI callable called directly; load average {os.getloadavg()[0]:.2f}"
        )
        if args.profile:
            # CPU time, not wall time: the database's and Redis's round trips do not count.
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for i in range(n):
                post(i)
            profiler.disable()
            for order in ("tottime", "cumulative"):
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(args.top)
                print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
