"""What one ordinary batch script achieves: a single ``Client.enqueue`` loop over HTTP.

    .venv/bin/python bench/client_loop_bench.py [--seconds 30] [--wiring embedded|production|both]

Starts ``receipt up`` (embedded: SQLite and the folder broker; production: a throwaway PostgreSQL
and redis-server on free ports) in a temporary RECEIPT_HOME with the write limit off, takes the URL
and token from its banner, and enqueues one job after another from this process for ``--seconds``
(``factory.run`` to an agent without a handler, so the workers settle every job as well). Prints
enqueues per second and per minute and the latency percentiles. This is the figure the default
``RECEIPT_RATE_LIMIT_WRITES`` is chosen against (docs/security.md, "Bounds per tenant"): one such
loop must not be refused.

Every process it starts is stopped by PID; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devharness.processes import base_env, harness_at  # noqa: E402
from devharness.services import private_postgres, private_redis  # noqa: E402
from devharness.up import start_up  # noqa: E402
from devharness.waiting import free_port  # noqa: E402
from receipt.client import Client  # noqa: E402  (after the path is set)


@contextlib.contextmanager
def wiring_env(wiring: str) -> Iterator[dict[str, str]]:
    if wiring == "embedded":
        yield {}
        return
    with private_postgres() as pg, private_redis() as redis:
        yield {"DATABASE_URL": pg, "REDIS_URL": redis + "/0"}


def one_loop(url: str, token: str, seconds: float) -> tuple[int, float, list[float]]:
    client = Client(url, token=token, timeout=30, retry=None)
    latencies: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t = time.monotonic()
        client.enqueue("bench-nobody", {"kind": "factory.run", "message": str(len(latencies))})
        latencies.append(time.monotonic() - t)
    return len(latencies), time.monotonic() - started, latencies


def run(wiring: str, seconds: float) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="receipt-client-loop-") as tmp,
        wiring_env(wiring) as services,
        harness_at(Path(tmp) / "logs") as harness,
    ):
        env = base_env(RECEIPT_HOME=str(Path(tmp) / "home"), RECEIPT_RATE_LIMIT_WRITES="disabled", **services)
        up = start_up(harness, env, free_port(), cwd=Path(tmp))
        try:
            one_loop(up.url, up.token, min(3.0, seconds))  # warm-up: connections, caches, whoami
            n, elapsed, latencies = one_loop(up.url, up.token, seconds)
        except Exception:
            web_log = Path(tmp) / "home" / "logs" / "web.log"
            print(f"{wiring}: the loop failed; the web process's log ends:", file=sys.stderr)
            print("\n".join(web_log.read_text().splitlines()[-30:]), file=sys.stderr)
            print(f"{wiring}: receipt up said:\n{up.proc.tail(30)}", file=sys.stderr)
            raise
    rate = n / elapsed
    q = statistics.quantiles(latencies, n=100)
    print(
        f"{wiring:>10}: {n} enqueues in {elapsed:.1f} s = {rate:.0f}/s ({rate * 60:.0f}/minute); "
        f"p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--wiring", choices=("embedded", "production", "both"), default="both")
    args = parser.parse_args()
    for wiring in ("embedded", "production") if args.wiring == "both" else (args.wiring,):
        run(wiring, args.seconds)


if __name__ == "__main__":
    main()
