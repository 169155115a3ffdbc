"""What idle event streams cost the database: statements per second with N open, idle streams.

    .venv/bin/python -m bench.sse_idle_bench [--streams 100] [--seconds 20] [--root PATH]

1. Creates a fresh PostgreSQL database (``postgres@127.0.0.1:5432``, trust auth), migrates it, sets
   ``log_statement = 'all'`` on it, and enqueues ``--streams`` jobs (nothing runs them: their
   streams stay idle).
2. Starts gunicorn (``api/gunicorn_conf.py``: gevent) with **one** worker process from ``--root``
   (default: this checkout; point it at another checkout, e.g. ``git archive main``, to measure
   that code on the same setup), and opens one ``GET /jobs/<id>/events`` per job on raw sockets,
   each read up to its first event (so every follower is subscribed and idle).
3. Counts, for ``--seconds``, the statements the server logged under that database name (this
   script's own connections do not log), and prints statements/s and per stream per second.

The server log is found as ``bench.compare`` finds it (``BENCH_PG_LOG`` overrides). Everything runs
on loopback; gunicorn is stopped by PID and the database dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.composition import queue_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import STATEMENT, server_log_path  # noqa: E402  (after the path is set)

# The same database and Redis as the HTTP enqueue bench.
from bench.http_enqueue_bench import ORG, PG_ADMIN_URL, REDIS_URL  # noqa: E402
from devharness.databases import new_database  # noqa: E402
from devharness.processes import descendants_of  # noqa: E402
from devharness.waiting import free_port, wait_for  # noqa: E402


def open_stream(port: int, token: str, job_id: str) -> socket.socket:
    """An event stream left open after its first event (the follower is then idle)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        (
            f"GET /jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    )
    seen = b""
    while b"\nevent: job" not in seen:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"stream {job_id} closed early: {seen[:300]!r}")
        seen += chunk
    if b" 200 " not in seen.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"stream {job_id} refused: {seen[:300]!r}")
    return sock


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its descendants (the gunicorn worker), from /proc."""
    total = 0
    for p in (pid, *descendants_of(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def _listening(port: int) -> Any:
    def check() -> bool:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True

    return check


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout gunicorn runs")
    args = parser.parse_args()

    from sqlalchemy import text

    from app.jobs.validation import validate_enqueue
    from app.storage import tokens
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade

    admin = make_engine(PG_ADMIN_URL)
    cleanup = contextlib.ExitStack()
    db_url = cleanup.enter_context(new_database(admin, "receipt_sse_bench"))
    database = db_url.rsplit("/", 1)[1]
    engine = make_engine(db_url, connect_args={"options": "-c log_statement=none"})
    gunicorn: subprocess.Popen[bytes] | None = None
    sockets: list[socket.socket] = []
    try:
        upgrade(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"ALTER DATABASE {database} SET log_statement = 'all'"))
        _, token = tokens.create(engine, ORG)
        queue = queue_for(engine)
        auth: dict[str, Any] = {"userId": "bench", "organizationId": ORG}
        job_ids = [
            queue.enqueue(
                validate_enqueue("bench", {"payload": {"kind": "factory.run", "authContext": auth}})
            ).job.id
            for _ in range(args.streams)
        ]
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "REDIS_URL": REDIS_URL,
            "RECEIPT_AUTH": "enabled",
            "RECEIPT_HOME": tempfile.mkdtemp(prefix="receipt-sse-bench-"),
            "RECEIPT_SSE_MAX_STREAMS_PER_TOKEN": str(args.streams + 10),
            "RECEIPT_SSE_MAX_STREAMS_PER_PROCESS": str(args.streams + 10),
            "RECEIPT_SSE_MAX_SECONDS": str(int(args.seconds) + 120),
            "WEB_CONCURRENCY": "1",
            "GUNICORN_LOG_LEVEL": "warning",
            "PYTHONPATH": str(args.root),
        }
        gunicorn = subprocess.Popen(
            [
                *(sys.executable, "-m", "gunicorn", "-c", str(args.root / "api" / "gunicorn_conf.py")),
                *("-b", f"127.0.0.1:{port}", "api.wsgi:app"),
            ],
            cwd=args.root,
            env=env,
        )
        wait_for(_listening(port), 30, what="gunicorn to listen", ignore=(OSError,))
        sockets = [open_stream(port, token, job_id) for job_id in job_ids]
        time.sleep(1.0)  # every follower past its first read
        path = server_log_path(engine)
        if path is None or not path.exists():
            print("the server log is not readable here: statements not counted")
            return 1
        offset = path.stat().st_size
        cpu_before = cpu_seconds(gunicorn.pid)
        time.sleep(args.seconds)
        cpu = cpu_seconds(gunicorn.pid) - cpu_before
        with path.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode("utf-8", "replace").splitlines()
        statements = [m for m in map(STATEMENT.search, lines) if m and m.group(1) == database]
        rate = len(statements) / args.seconds
        print(
            f"{args.streams} idle event streams, one gunicorn gevent worker, {args.seconds:g} s, "
            f"code from {args.root}:\n"
            f"  {len(statements)} statements = {rate:.1f} statements/s "
            f"({rate / args.streams:.2f} per stream per second); "
            f"API CPU {100 * cpu / args.seconds:.1f} % of a core"
        )
        kinds: dict[str, int] = {}
        for m in statements:
            head = " ".join(m.group(2).split()[:3])[:40]
            kinds[head] = kinds.get(head, 0) + 1
        for head, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"    {n / args.seconds:7.1f}/s  {head}")
        return 0
    finally:
        for sock in sockets:
            sock.close()
        if gunicorn is not None:
            gunicorn.terminate()
            try:
                gunicorn.wait(30)
            except subprocess.TimeoutExpired:
                gunicorn.kill()
        engine.dispose()
        cleanup.close()
        admin.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
