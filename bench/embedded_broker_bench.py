"""The embedded folder broker: its throughput against kombu's own, and worker crashes under bursts.

    .venv/bin/python -m bench.embedded_broker_bench transport [--messages 2000] [--rounds 5]
    .venv/bin/python -m bench.embedded_broker_bench bursts [--runs 20] [--bursts 3] [--jobs 150]

``transport``: one producer process publishes ``--messages`` Celery-sized messages (about 1.5 KB)
while one consumer process drains them, through kombu's ``filesystem`` transport (``kombu``) and
through ``delivery.folder_transport`` (``receipt``), rounds alternated (A B B A ...), each on a
fresh folder. Prints each round and the medians of messages per second (first publish to last
message consumed) and their ratio.

``bursts``: ``receipt up`` on the embedded default (SQLite and the folder broker) in a temporary
RECEIPT_HOME; ``--runs`` runs of ``--bursts`` bursts of ``--jobs`` no-op jobs posted at once
(``POST /jobs:batch``), each burst posted without waiting for the one before, each run waiting
until every job is terminal (bounded). Counts worker crashes: Celery's ``Unrecoverable error``
lines in the logs and the processes ``receipt up`` had to restart; and dead letters. Prints jobs per
second per run and the totals.

Every process it starts is stopped by PID; every wait is bounded.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BODY = "x" * 1200  # a Celery task message's body and headers are about this size
QUEUE = "bench-q"


def _connection(kind: str, folder: Path) -> Any:
    import kombu as kombu_module

    kombu: Any = kombu_module  # kombu ships no type hints

    from delivery import folder_transport

    options = {
        "data_folder_in": str(folder / "data"),
        "data_folder_out": str(folder / "data"),
        "control_folder": str(folder / "control"),
        "processed_folder": str(folder / "processed"),
        "store_processed": False,
    }
    for name in ("data", "control", "processed"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    transport: Any = folder_transport.Transport if kind == "receipt" else "filesystem"
    return kombu.Connection("filesystem://localhost/", transport=transport, transport_options=options)


def _produce(kind: str, folder: str, name: str, n: int, ready: Any, start: Any) -> None:
    import kombu as kombu_module

    kombu: Any = kombu_module  # kombu ships no type hints

    q = kombu.Queue(name, kombu.Exchange(name, type="direct"), routing_key=name)
    with _connection(kind, Path(folder)) as conn:
        producer = conn.Producer(conn.default_channel)
        q(conn.default_channel).declare()
        ready.set()
        start.wait()
        for i in range(n):
            producer.publish({"i": i, "body": BODY}, exchange=q.exchange, routing_key=name)


def transport_round(kind: str, n: int) -> tuple[float, int]:
    """(messages per second, messages lost or undecodable) for one round of ``kind``."""
    import kombu as kombu_module

    kombu: Any = kombu_module  # kombu ships no type hints

    folder = Path(tempfile.mkdtemp(prefix=f"receipt-broker-bench-{kind}-"))
    try:
        # A queue name per round: kombu keeps declared exchanges in process-wide state.
        name = f"{QUEUE}-{uuid.uuid4().hex[:8]}"
        q = kombu.Queue(name, kombu.Exchange(name, type="direct"), routing_key=name)
        ctx = mp.get_context("spawn")
        ready, start = ctx.Event(), ctx.Event()
        producer = ctx.Process(target=_produce, args=(kind, str(folder), name, n, ready, start))
        producer.start()
        got = 0
        broken = 0
        with _connection(kind, folder) as conn:
            channel = conn.default_channel
            q(channel).declare()
            if not ready.wait(60):
                raise RuntimeError("the producer process did not start")
            start.set()
            began = time.monotonic()
            deadline = began + 120
            while got + broken < n and time.monotonic() < deadline:
                try:
                    message = q(channel).get(no_ack=True)
                except ValueError:  # kombu's transport reading a half-written file
                    broken += 1
                    continue
                if message is None:
                    time.sleep(0.001)  # the consumer's poll interval, as kombu's loop would wait
                    continue
                got += 1
            elapsed = time.monotonic() - began
        producer.join(30)
        return got / elapsed, n - got
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_transport(messages: int, rounds: int) -> None:
    rates: dict[str, list[float]] = {"kombu": [], "receipt": []}
    lost: dict[str, int] = {"kombu": 0, "receipt": 0}
    for r in range(rounds):
        order = ("kombu", "receipt") if r % 2 == 0 else ("receipt", "kombu")
        for kind in order:
            rate, missing = transport_round(kind, messages)
            rates[kind].append(rate)
            lost[kind] += missing
            print(f"round {r + 1} {kind:>8}: {rate:7.0f} msg/s, {missing} lost or undecodable", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"median: kombu {med['kombu']:.0f} msg/s, receipt {med['receipt']:.0f} msg/s, "
        f"ratio receipt/kombu {med['receipt'] / med['kombu']:.2f}; lost: {lost}; "
        f"load {os.getloadavg()[0]:.1f}"
    )


def run_bursts(runs: int, bursts: int, jobs: int, timeout: float) -> None:
    from sqlalchemy import create_engine, text

    from devharness.processes import base_env, harness_at
    from devharness.up import start_up
    from devharness.waiting import free_port, wait_for
    from receipt.client import Client

    with (
        tempfile.TemporaryDirectory(prefix="receipt-bursts-") as tmp,
        harness_at(Path(tmp) / "logs") as harness,
    ):
        home = Path(tmp) / "home"
        env = base_env(RECEIPT_HOME=str(home), RECEIPT_RATE_LIMIT_WRITES="disabled")
        up = start_up(harness, env, free_port(), cwd=Path(tmp))
        client = Client(up.url, token=up.token, timeout=60, retry=None)
        engine = create_engine(f"sqlite:///{home / 'receipt.db'}")
        rates = []
        for run in range(runs):
            prefix = f"burst-{run}-{uuid.uuid4().hex[:6]}-"
            started = time.monotonic()
            for b in range(bursts):
                items = [
                    {"agentId": "noop", "jobId": f"{prefix}{b}-{i}", "payload": {"kind": "factory.run"}}
                    for i in range(jobs)
                ]
                client.enqueue_many(items)

            def terminal(prefix: str = prefix) -> bool:
                with engine.connect() as conn:
                    done = conn.execute(
                        text(
                            "SELECT count(*) FROM jobs WHERE id LIKE :p "
                            "AND status IN ('completed','failed','canceled')"
                        ),
                        {"p": "%" + prefix + "%"},
                    ).scalar()
                return int(done or 0) >= bursts * jobs

            try:
                wait_for(terminal, timeout, interval=0.2, what=f"run {run + 1}'s jobs")
            except Exception as exc:
                print(f"run {run + 1}: not every job ended within {timeout:.0f} s ({exc})", flush=True)
                continue
            elapsed = time.monotonic() - started
            rates.append(bursts * jobs / elapsed)
            print(
                f"run {run + 1}: {bursts * jobs} jobs terminal in {elapsed:.1f} s ({rates[-1]:.0f} jobs/s)",
                flush=True,
            )
        logs = home / "logs"
        unrecoverable = sum(
            p.read_text(errors="replace").count("Unrecoverable error") for p in logs.glob("*.log")
        )
        restarts = up.proc.log().count("restarting")
        dead = len(os.listdir(home / "broker" / "dead")) if (home / "broker" / "dead").exists() else 0
        print(
            f"{runs} runs x {bursts} bursts x {jobs} jobs: worker crashes {unrecoverable} "
            f"('Unrecoverable error' lines), process restarts {restarts}, dead letters {dead}; "
            f"jobs/s median {statistics.median(rates) if rates else 0:.0f}; load {os.getloadavg()[0]:.1f}"
        )


def main() -> None:
    # A SIGTERM unwinds like Ctrl-C, so the harness stops every process it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("transport")
    t.add_argument("--messages", type=int, default=2000)
    t.add_argument("--rounds", type=int, default=5)
    b = sub.add_parser("bursts")
    b.add_argument("--runs", type=int, default=20)
    b.add_argument("--bursts", type=int, default=3)
    b.add_argument("--jobs", type=int, default=150)
    b.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args()
    if args.what == "transport":
        run_transport(args.messages, args.rounds)
    else:
        run_bursts(args.runs, args.bursts, args.jobs, args.timeout)


if __name__ == "__main__":
    main()
