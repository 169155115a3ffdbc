"""Chaos soak: the production shape under compound faults, with the safety figures at the end.

    python -m bench.soak                       # 5 000 jobs at 15/s, every fault, a private Postgres
    python -m bench.soak --jobs 1500 --rate 15
    python -m bench.soak --bulk 50              # the plain jobs posted 50 a batch (POST /jobs:batch)
    make soak                                   # the same as the first line

It starts gunicorn (web), the driver, two chat workers, control, codex and beat on a fresh
database and a private redis-server (the e2e harness, ``tests/support/``), posts N jobs at a
steady rate with explicit jobIds (clients retry a failed POST with the same jobId), and meanwhile
injects faults, each logged with its time: SIGKILL a random chat worker every few seconds and
restart it; kill the driver and beat (and restart them); FLUSHALL; kill redis-server and restart
it empty; restart Postgres. Postgres is restarted only when the soak runs its **own** instance
(``initdb``/``pg_ctl`` on a free port, as the ``postgres`` user when run as root): the machine's
shared cluster is never touched.

Then it waits for every job to be terminal and prints: posted vs existing jobs, % terminal, jobs
with 0 or more than one terminal receipt, receipts written by a superseded attempt, attempts of
the limit-1 concurrency key that ran at once (the ``keyed`` part of the mix), ``receipt
verify``, client POST errors, time from the last fault to all-terminal, p50/p99 enqueue→terminal,
and the attempts histogram. ``Report.violations()`` lists every broken safety target.

Extension points: ``MIX`` (what is posted: add an objective entry once objectives exist) and
``FAULTS`` (what is broken). Each is a name → function table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import requests
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from app.config import normalise_database_url
from app.jobs.ids import qualify
from app.jobs.reducer import reduce
from app.jobs.vocab import TERMINAL_STATUSES, job_stream
from app.storage import store
from app.storage.db import jobs, make_engine, parse_iso
from app.storage.migrate import upgrade
from devharness import handlers
from devharness.processes import PYTHON, REPO_ROOT, Harness, base_env
from devharness.stack import ORG, Stack, make_stack
from devharness.waiting import free_port

TERMINAL_TYPES = ("job.completed", "job.failed", "job.canceled")
FENCED_TYPES = ("job.heartbeat", "job.progress", "job.released", *TERMINAL_TYPES)


# -- what is posted ----------------------------------------------------------------------------------


@dataclass
class Client:
    """An HTTP client that retries a failed POST with the same jobId (the idempotency contract)."""

    stack: Stack
    errors: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    retry_for_s: float = 120.0

    def post(self, path: str, body: dict[str, Any], *job_ids: str) -> dict[str, Any] | None:
        """POST ``body`` until it is accepted, or for ``retry_for_s``; then its jobs are lost."""
        deadline = time.monotonic() + self.retry_for_s
        while True:
            try:
                r = requests.post(self.stack.url(path), json=body, headers=self.stack.headers(), timeout=15)
                if r.status_code in (200, 202):
                    data: dict[str, Any] = r.json()
                    return data
                self.errors[f"HTTP {r.status_code}"] += 1
            except requests.RequestException as exc:
                self.errors[type(exc).__name__] += 1
            if time.monotonic() > deadline:
                self.lost.extend(job_ids)
                return None
            time.sleep(0.5)


def _body(job_id: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    payload = {"kind": "factory.run", "authContext": {"userId": "soak", "organizationId": ORG}, **payload}
    return {"jobId": job_id, "payload": payload, **extra}


def success_item(job_id: str) -> dict[str, Any]:
    return {"agentId": handlers.ECHO, **_body(job_id, {"message": job_id})}


# Every keyed job shares one concurrency key with limit 1: through every fault, no two of its
# attempts may ever run at once (``key_overlaps``, read from the receipts).
SOAK_KEY = "soak-serial"


def keyed_item(job_id: str) -> dict[str, Any]:
    return {
        "agentId": handlers.SLEEP,
        **_body(job_id, {"seconds": 0.2}, concurrencyKey=SOAK_KEY, concurrencyLimit=1),
    }


def retryable_failure_item(job_id: str) -> dict[str, Any]:
    # Fails retryably on every attempt: ends `failed` after maxAttempts (3).
    return {"agentId": handlers.FAIL, **_body(job_id, {}, maxAttempts=3)}


def _post_item(item_of: Callable[[str], dict[str, Any]]) -> Callable[[Client, str], None]:
    def post(c: Client, job_id: str) -> None:
        item = item_of(job_id)
        c.post(f"/agents/{item.pop('agentId')}/jobs", item, job_id)

    return post


def post_batch(c: Client, items: list[tuple[str, dict[str, Any]]]) -> None:
    """One ``POST /jobs:batch``, retried whole with the same jobIds (re-posting writes nothing)."""
    c.post("/jobs:batch", {"items": [item for _, item in items]}, *(job_id for job_id, _ in items))


def post_steer(c: Client, job_id: str) -> None:
    # A running job on a session key, then a steer enqueue (its own jobId) aimed at it.
    session = f"s-{job_id}"
    c.post(f"/agents/{handlers.SLEEP}/jobs", _body(job_id, {"seconds": 1.0}, sessionKey=session), job_id)
    steer_id = f"{job_id}-steer"
    c.post(
        f"/agents/{handlers.SLEEP}/jobs",
        _body(steer_id, {"seconds": 1.0, "text": "steer"}, sessionKey=session, singletonMode="steer"),
        steer_id,
    )


def post_cancel(c: Client, job_id: str) -> None:
    c.post(f"/agents/{handlers.SLEEP}/jobs", _body(job_id, {"seconds": 2.0}), job_id)
    for _ in range(3):
        with contextlib.suppress(requests.RequestException):
            r = requests.post(
                c.stack.url(f"/jobs/{job_id}/cancel"),
                json={"reason": "soak"},
                headers=c.stack.headers(),
                timeout=15,
            )
            if r.status_code in (202, 409):  # 409: it had already ended
                return
        time.sleep(0.5)


# name -> (weight, post function, its bulk item or None). An entry with a bulk item is posted in
# ``POST /jobs:batch`` batches when the soak runs with ``--bulk``; the others always one by one.
MIX: dict[str, tuple[int, Callable[[Client, str], None], Callable[[str], dict[str, Any]] | None]] = {
    "success": (70, _post_item(success_item), success_item),
    "retryable_failure": (10, _post_item(retryable_failure_item), retryable_failure_item),
    "keyed": (5, _post_item(keyed_item), keyed_item),
    "steer": (10, post_steer, None),
    "cancel": (10, post_cancel, None),
}


# -- what is broken ----------------------------------------------------------------------------------


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port (initdb + pg_ctl), restartable at will."""

    def __init__(self, root: Path) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if not bins:
            raise SystemExit("no /usr/lib/postgresql/*/bin/pg_ctl: install postgresql to run the soak")
        self.bin = bins[-1].parent
        self.root = root
        self.data = root / "pgdata"
        self.port = free_port()
        self.log = root / "postgres.log"
        self.user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *argv: str) -> None:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        if not self.data.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if self.user:
                shutil.chown(self.root, self.user)
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")

    def restart(self) -> None:
        # Immediate mode: every connection dies at once, as in a crash.
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.start()

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        admin = make_engine(self.url("postgres"))
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        return self.url(name)


@dataclass
class Chaos:
    """The faults of one run, with a log of (seconds since start, what happened)."""

    stack: Stack
    pg: PrivatePostgres | None
    t0: float
    log: list[tuple[float, str]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def note(self, what: str) -> None:
        at = time.monotonic() - self.t0
        self.log.append((at, what))
        print(f"[{at:7.1f} s] fault: {what}", flush=True)

    def restart_process(self, name: str) -> None:
        proc = self.stack.procs.pop(name)
        self.stack.harness.kill(proc)
        self.note(f"SIGKILL {name} (pid {proc.pid})")
        if name == "beat":
            self.stack.start_beat(name)
        else:
            role = (
                "worker-chat" if name.startswith("chat") else name if name == "driver" else f"worker-{name}"
            )
            self.stack.start_worker(role, name)
        self.note(f"restarted {name} (pid {self.stack.procs[name].pid})")


def fault_kill_worker(c: Chaos) -> None:
    c.restart_process(c.rng.choice([n for n in c.stack.procs if n.startswith("chat")]))


def fault_kill_driver(c: Chaos) -> None:
    c.restart_process("driver")


def fault_kill_beat(c: Chaos) -> None:
    c.restart_process("beat")


def fault_flushall(c: Chaos) -> None:
    client = redis.Redis.from_url(c.stack.redis_url)
    try:
        client.flushall()
    finally:
        client.close()
    c.note("FLUSHALL")


def fault_restart_redis(c: Chaos) -> None:
    server = c.stack.redis_server
    assert server is not None
    server.kill()
    c.note("redis-server killed")
    time.sleep(1.0)  # the outage itself
    server.start()
    c.note("redis-server restarted empty")


def fault_restart_postgres(c: Chaos) -> None:
    if c.pg is None:
        c.note("postgres restart skipped (shared cluster: never restarted)")
        return
    c.pg.restart()
    c.note("postgres restarted (immediate stop + start)")


FAULTS: dict[str, Callable[[Chaos], None]] = {
    "kill_worker": fault_kill_worker,
    "kill_driver": fault_kill_driver,
    "kill_beat": fault_kill_beat,
    "flushall": fault_flushall,
    "restart_redis": fault_restart_redis,
    "restart_postgres": fault_restart_postgres,
}
FULL_SCHEDULE = (
    "kill_driver",
    "flushall",
    "restart_postgres",
    "kill_beat",
    "restart_redis",
    "restart_postgres",
)


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class Report:
    posted: int
    existing: int
    terminal: int
    zero_terminal: list[str]
    multi_terminal: list[str]
    superseded_writes: list[str]
    verify_ok: bool
    post_errors: dict[str, int]
    lost_posts: list[str]
    last_fault_to_all_terminal_s: float | None
    p50_s: float | None
    p99_s: float | None
    attempts: dict[int, int]
    faults: list[tuple[float, str]]
    statuses: dict[str, int]
    slowest: list[tuple[str, float, list[str]]] = field(default_factory=list)
    last_post_to_all_terminal_s: float | None = None
    # Processes that exited on their own (the chaos replaces those it kills, so any one found dead
    # at the end exited by itself: a crash, or a start-up check that gave up).
    unexpected_exits: list[str] = field(default_factory=list)
    # Pairs of attempts of the limit-1 key that ran at once (each ``stream#seq``), and how many of
    # its attempts ran.
    key_overlaps: list[tuple[str, str]] = field(default_factory=list)
    keyed_attempts: int = 0

    def violations(self) -> list[str]:
        out = []
        if self.key_overlaps:
            out.append(f"{len(self.key_overlaps)} overlapping attempts of the limit-1 concurrency key")
        if self.existing != self.posted:
            out.append(f"posted {self.posted} but {self.existing} exist")
        if self.terminal != self.existing:
            out.append(f"{self.existing - self.terminal} jobs not terminal")
        if self.zero_terminal:
            out.append(f"{len(self.zero_terminal)} jobs with no terminal receipt")
        if self.multi_terminal:
            out.append(f"{len(self.multi_terminal)} jobs with more than one terminal receipt")
        if self.superseded_writes:
            out.append(f"{len(self.superseded_writes)} receipts written by a superseded attempt")
        if not self.verify_ok:
            out.append("receipt verify failed")
        if self.lost_posts:
            out.append(f"{len(self.lost_posts)} POSTs lost")
        if self.unexpected_exits:
            out.append(
                f"{len(self.unexpected_exits)} unexpected process exits: {', '.join(self.unexpected_exits)}"
            )
        return out

    def text(self) -> str:
        pct = 100.0 * self.terminal / self.existing if self.existing else 0.0
        lines = [
            f"jobs posted / existing      {self.posted} / {self.existing}",
            f"terminal                    {self.terminal} ({pct:.2f} %)  {self.statuses}",
            f"0 terminal receipts         {len(self.zero_terminal)}",
            f">1 terminal receipts        {len(self.multi_terminal)}",
            f"superseded-attempt writes   {len(self.superseded_writes)}",
            f"limit-1 key overlaps        {len(self.key_overlaps)} over {self.keyed_attempts} attempts",
            f"receipt verify              {'ok' if self.verify_ok else 'FAILED'}",
            f"client POST errors          {sum(self.post_errors.values())} {dict(self.post_errors)}",
            f"lost POSTs                  {len(self.lost_posts)}",
            f"last fault -> all terminal  {_fmt(self.last_fault_to_all_terminal_s)}",
            f"last POST -> all terminal   {_fmt(self.last_post_to_all_terminal_s)}",
            f"enqueue -> terminal         p50 {_fmt(self.p50_s)}  p99 {_fmt(self.p99_s)}",
            f"attempts histogram          {dict(sorted(self.attempts.items()))}",
            f"faults                      {len(self.faults)}",
            f"unexpected process exits    {len(self.unexpected_exits)} {self.unexpected_exits}",
        ]
        for job_id, seconds, types in self.slowest:
            lines.append(f"slow: {seconds:6.1f} s {job_id} {' '.join(t.removeprefix('job.') for t in types)}")
        return "\n".join(lines)


def _fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.1f} s"


def terminal_receipts(stream: list[Any]) -> list[Any]:
    """Receipts that ended the job, or tried to end it again (a retryable failure only requeues).

    Whatever its type: a ``job.lease_expired`` with no attempt left ends the job ``failed`` too.
    """
    out = []
    state = None
    for r in stream:
        before: str | None = state.status if state is not None else None
        with contextlib.suppress(Exception):  # a refused receipt still counts if it is terminal-typed
            state = reduce(state, r.to_receipt())
        ended_it = state is not None and state.terminal and before not in TERMINAL_STATUSES
        if ended_it or (r.type in TERMINAL_TYPES and before in TERMINAL_STATUSES):
            out.append(r)
    return out


def superseded_writes(stream_receipts: list[Any]) -> list[str]:
    """Fenced receipts whose (workerId, attempt) was not the active lease when they were appended."""
    bad = []
    lease: tuple[str, int] | None = None
    for r in stream_receipts:
        body = r.body
        if r.type == "job.leased":
            lease = (body["workerId"], body["attempt"])
        elif r.type in FENCED_TYPES and "workerId" in body and lease != (body["workerId"], body["attempt"]):
            bad.append(f"{r.stream}#{r.seq} {r.type}")
        if r.type in ("job.lease_expired", "job.released", *TERMINAL_TYPES):
            lease = None
    return bad


# What ends an attempt that held a lease.
_ATTEMPT_ENDS = ("job.lease_expired", "job.released", *TERMINAL_TYPES)


def key_overlaps(streams: dict[str, list[Any]]) -> tuple[list[tuple[str, str]], int]:
    """The attempts of the limit-1 key's jobs as intervals, from each ``job.leased`` to the receipt
    that ended it (database clock), and every pair of them that overlapped."""
    intervals: list[tuple[float, float, str]] = []
    for stream in streams.values():
        if not stream or stream[0].type != "job.enqueued" or stream[0].body.get("concurrencyKey") != SOAK_KEY:
            continue
        began: Any = None
        for r in stream:
            if r.type == "job.leased":
                began = r
            elif r.type in _ATTEMPT_ENDS and began is not None:
                intervals.append((_at(began.at), _at(r.at), f"{began.stream}#{began.seq}"))
                began = None
        if began is not None:  # still held: it runs to now
            intervals.append((_at(began.at), float("inf"), f"{began.stream}#{began.seq}"))
    intervals.sort()
    overlaps = []
    latest: tuple[float, float, str] | None = None
    for interval in intervals:
        if latest is not None and interval[0] < latest[1]:
            overlaps.append((latest[2], interval[2]))
        if latest is None or interval[1] > latest[1]:
            latest = interval
    return overlaps, len(intervals)


def collect(
    engine: Engine,
    key_prefix: str,
    client: Client,
    posted: list[str],
    chaos: Chaos,
    all_terminal_at: float | None,
    last_post_at: float | None = None,
) -> Report:
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.status, jobs.c.attempt).where(jobs.c.id.like(f"{key_prefix}%"))
        ).all()
        streams = {row.id: store.read_stream(conn, job_stream(row.id)) for row in rows}
    zero, multi, superseded, latencies = [], [], [], []
    per_job: list[tuple[str, float, list[str]]] = []
    for row in rows:
        stream = streams[row.id]
        terminals = terminal_receipts(stream)
        if not terminals:
            zero.append(row.id)
        elif len(terminals) > 1:
            multi.append(row.id)
        superseded += superseded_writes(stream)
        if terminals and stream:
            latencies.append(_at(terminals[0].at) - _at(stream[0].at))
            per_job.append((row.id, latencies[-1], [r.type for r in stream]))
    latencies.sort()
    overlaps, keyed = key_overlaps(streams)
    verify = subprocess.run(
        [PYTHON, "-m", "app.ops.cli", "verify"],
        env=base_env(DATABASE_URL=str(engine.url.render_as_string(hide_password=False))),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    last_fault = chaos.log[-1][0] if chaos.log else None
    return Report(
        posted=len(posted),
        existing=len(rows),
        terminal=sum(r.status in TERMINAL_STATUSES for r in rows),
        zero_terminal=zero,
        multi_terminal=multi,
        superseded_writes=superseded,
        verify_ok=verify.returncode == 0,
        post_errors=dict(client.errors),
        lost_posts=client.lost,
        last_fault_to_all_terminal_s=(all_terminal_at - last_fault)
        if all_terminal_at and last_fault
        else None,
        p50_s=statistics.median(latencies) if latencies else None,
        p99_s=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None,
        attempts=dict(Counter(r.attempt for r in rows)),
        faults=chaos.log,
        statuses=dict(Counter(r.status for r in rows)),
        slowest=sorted(per_job, key=lambda j: -j[1])[:5],
        last_post_to_all_terminal_s=(all_terminal_at - last_post_at)
        if all_terminal_at and last_post_at
        else None,
        key_overlaps=overlaps,
        keyed_attempts=keyed,
        unexpected_exits=[
            f"{name} (pid {proc.pid})" for name, proc in chaos.stack.procs.items() if not proc.alive()
        ],
    )


def _at(value: Any) -> float:
    if isinstance(value, str):
        parsed = parse_iso(value)
        assert parsed is not None
        return parsed.timestamp()
    return float(value.timestamp())


SOAK_TIMINGS = {
    # Production-shaped but fast enough to recover within a run (the e2e FAST_TIMINGS plus these).
    "RECEIPT_RESONATE_EXECUTE_CONCURRENCY": "4",
    # The soak measures recovery from faults, so the limiter must never pace its clients, whatever
    # the default per-organisation write limit is (429s are retried, but they would stretch the
    # posting phase past the last fault).
    "RECEIPT_RATE_LIMIT_WRITES": "1000000/minute",
}


@contextlib.contextmanager
def deployment(
    workdir: Path,
    database_url: str | None,
    private_pg: bool,
    extra_env: dict[str, str] | None = None,
    production_leases: bool = False,
) -> Iterator[tuple[Stack, PrivatePostgres | None]]:
    pg: PrivatePostgres | None = None
    harness = Harness(workdir / "logs")
    try:
        if database_url is None:
            pg = PrivatePostgres(workdir / "pg") if private_pg else None
            if pg is None:
                raise SystemExit("give --database-url or run with a private Postgres")
            pg.start()
            database_url = pg.create_database(f"soak_{uuid.uuid4().hex[:8]}")
        engine = make_engine(normalise_database_url(database_url))
        upgrade(engine)
        engine.dispose()
        stack = make_stack(harness, database_url, workdir / "home", **{**SOAK_TIMINGS, **(extra_env or {})})
        if production_leases:
            # The leases and heartbeats a deployment runs with (5-15 min): a killed worker's jobs
            # come back through its lapsed liveness record, not through a short test lease.
            stack.timings = {}
        try:
            stack.start("web", "driver", "chat-a", "chat-b", "control", "codex", "beat")
            yield stack, pg
        finally:
            stack.close()
    finally:
        harness.stop_all()
        if pg is not None:
            pg.stop()


def run(
    stack: Stack,
    pg: PrivatePostgres | None,
    *,
    n_jobs: int,
    rate: float,
    schedule: tuple[str, ...],
    kill_every_s: tuple[float, float] = (4.0, 8.0),
    settle_timeout_s: float = 600.0,
    seed: int = 7,
    bulk: int = 0,
) -> Report:
    rng = random.Random(seed)
    prefix = f"soak-{uuid.uuid4().hex[:6]}-"
    key_prefix = qualify(ORG, prefix)  # the jobs' storage keys carry the organisation
    client = Client(stack)
    t0 = time.monotonic()
    chaos = Chaos(stack, pg, t0, rng=random.Random(seed + 1))
    posted: list[str] = []
    names = list(MIX)
    weights = [MIX[n][0] for n in names]
    posting_s = n_jobs / rate
    stop = threading.Event()

    def faults() -> None:
        # The named faults spread over the posting window; worker kills in between.
        slots = [posting_s * (i + 1) / (len(schedule) + 1) for i in range(len(schedule))]
        next_kill = t0 + rng.uniform(*kill_every_s)
        pending = list(zip(slots, schedule, strict=True))
        while not stop.is_set() and (pending or time.monotonic() - t0 < posting_s):
            now = time.monotonic()
            if pending and now - t0 >= pending[0][0]:
                _, name = pending.pop(0)
                FAULTS[name](chaos)
            elif now >= next_kill and kill_every_s[0] > 0 and now - t0 < posting_s:
                fault_kill_worker(chaos)
                next_kill = time.monotonic() + rng.uniform(*kill_every_s)
            stop.wait(0.1)

    fault_thread = threading.Thread(target=faults, name="soak-faults", daemon=True)
    fault_thread.start()
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="soak-post") as pool:
        futures = []
        batch: list[tuple[str, dict[str, Any]]] = []
        for n in range(n_jobs):
            due = t0 + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            kind = rng.choices(names, weights)[0]
            job_id = f"{prefix}{n:05d}-{kind}"
            posted.append(job_id)
            if kind == "steer":
                posted.append(f"{job_id}-steer")  # the steer's own jobId: it must NOT become a job
            _, post, item_of = MIX[kind]
            if bulk and item_of is not None:
                batch.append((job_id, item_of(job_id)))
                if len(batch) >= bulk:
                    futures.append(pool.submit(post_batch, client, batch))
                    batch = []
            else:
                futures.append(pool.submit(post, client, job_id))
        if batch:
            futures.append(pool.submit(post_batch, client, batch))
        for f in futures:
            f.result()
    last_post_at = time.monotonic() - t0
    fault_thread.join()
    stop.set()
    # A steer's jobId names no job of its own when its target was still active (it steered).
    engine = stack.engine
    deadline = time.monotonic() + settle_timeout_s
    all_terminal_at = None
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            open_jobs = conn.execute(
                select(jobs.c.id)
                .where(jobs.c.id.like(f"{key_prefix}%"), jobs.c.status.not_in(sorted(TERMINAL_STATUSES)))
                .limit(1)
            ).first()
        if open_jobs is None:
            all_terminal_at = time.monotonic() - t0
            break
        time.sleep(0.5)
    with engine.connect() as conn:
        existing = set(conn.execute(select(jobs.c.id).where(jobs.c.id.like(f"{key_prefix}%"))).scalars())
    # Steer jobIds that steered an active job are answered with that job: they are not expected to exist.
    expected = [j for j in posted if not j.endswith("-steer") or qualify(ORG, j) in existing]
    return collect(engine, key_prefix, client, expected, chaos, all_terminal_at, last_post_at)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=15.0, help="jobs posted per second")
    parser.add_argument(
        "--faults", default=",".join(FULL_SCHEDULE), help=f"comma-separated, from {sorted(FAULTS)}"
    )
    parser.add_argument(
        "--kill-every", default="4,8", help="seconds between worker SIGKILLs (min,max); 0,0 = none"
    )
    parser.add_argument(
        "--database-url", help="an existing migrated-or-empty database (Postgres is then never restarted)"
    )
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument(
        "--bulk",
        type=int,
        default=0,
        help="post the mix's plain jobs in POST /jobs:batch batches of this many (same rate); 0 = one by one",
    )
    parser.add_argument(
        "--prepared",
        action="store_true",
        help="run every process with RECEIPT_DB_PREPARED_STATEMENTS=enabled",
    )
    parser.add_argument("--workdir", help="keep the processes' logs (and the private Postgres) here")
    parser.add_argument(
        "--production-leases",
        action="store_true",
        help="the production lease and heartbeat defaults instead of the e2e harness's short ones",
    )
    args = parser.parse_args(argv)
    schedule = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in schedule if f not in FAULTS]
    if unknown:
        parser.error(f"unknown faults {unknown}; choose from {sorted(FAULTS)}")
    lo, hi = (float(x) for x in args.kill_every.split(","))
    with contextlib.ExitStack() as cleanup:
        if args.workdir:
            workdir = Path(args.workdir).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="receipt-soak-")))
        if os.geteuid() == 0:
            os.chmod(workdir, 0o755)
        extra = {"RECEIPT_DB_PREPARED_STATEMENTS": "enabled"} if args.prepared else {}
        private = args.database_url is None
        with deployment(
            workdir,
            args.database_url,
            private_pg=private,
            extra_env=extra,
            production_leases=args.production_leases,
        ) as (stack, pg):
            print(
                f"soak: {args.jobs} jobs at {args.rate}/s, faults {schedule}, worker kills every {lo}-{hi} s"
                + (", production leases" if args.production_leases else "")
                + (f", plain jobs posted {args.bulk} a batch" if args.bulk else ""),
                flush=True,
            )
            report = run(
                stack,
                pg,
                n_jobs=args.jobs,
                rate=args.rate,
                schedule=schedule,
                kill_every_s=(lo, hi),
                bulk=args.bulk,
            )
    print(report.text())
    if args.json:
        Path(args.json).write_text(json.dumps(report.__dict__, indent=2, default=str))
    violations = report.violations()
    for v in violations:
        print(f"VIOLATION: {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
