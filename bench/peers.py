"""The Procrastinate side of ``bench/compare.py``: an app with one no-op task.

``procrastinate --app=bench.peers.procrastinate_app worker --concurrency 8 --queues bench`` runs it;
the producer defers from Python (``noop.defer(tag=…)``; ``tag`` only lets the bench count its
jobs). The connector is Procrastinate's default, ``PsycopgConnector``: the worker uses its async
pool and LISTEN/NOTIFY; a synchronous ``defer`` gets the matching synchronous pool
(Procrastinate's documented set-up for a sync producer). Needs the ``bench`` extra.
"""

from __future__ import annotations

import os

import procrastinate

QUEUE = "bench"
TASK = "bench.noop"

procrastinate_app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_PROCRASTINATE_DSN", ""))
)


@procrastinate_app.task(name=TASK, queue=QUEUE)
def noop(tag: str) -> None:
    return None
