"""Deploy soak: long jobs through repeated rolling deploys, with the issue's targets checked at the end.

    python -m bench.deploy_soak                         # 300 jobs of 10-60 s, 3 deploys a minute apart
    python -m bench.deploy_soak --long-jobs 30 --long 5,20 --rounds 2 --interval 20   # a brief run
    make deploy-soak                                    # the first line

It starts web, driver, two chat workers, codex, control and beat (the process harness,
``devharness``) on a fresh database with the **production** lease defaults (so nothing recovers
through lease expiry within the run) and a ``RECEIPT_SHUTDOWN_GRACE_MS`` under the platform grace.
Load: ``--long-jobs`` sleeping jobs of ``--long`` seconds, arriving evenly over the deploys' span, a
stream of short ones, a few ``codex`` commands, ``--objectives`` objectives (a chain of three tasks
of ``--long`` seconds each, driven by the control worker, which is deployed too), and one follower
(``Client.follow``) on a job that lives through every deploy. Each deploy SIGTERMs every worker, the
driver and beat (the last round every process, the web and the commands included, as Heroku does),
SIGKILLs whatever is left after ``--platform-grace`` seconds, then starts the new processes. Then it
waits for every job to end and reports:

- jobs not completed (every job here completes without deploys), and objectives not completed;
- attempts charged to a deploy (``job.failed`` or ``job.lease_expired`` on a soak job) — target 0;
- overlapping executions (a fenced receipt from an attempt after the next one was leased) — target 0;
- processes the platform had to SIGKILL — target 0;
- for every hand-back, the time from the new workers being up (or the release, if later) to the job
  running again — target ≤ 5 s;
- the follower's events: lost or repeated — target 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import create_engine, select, text

from app.jobs.ids import qualify
from app.jobs.times import parse_iso
from app.jobs.vocab import TERMINAL_STATUSES
from app.storage import store
from app.storage.db import jobs, make_engine
from app.storage.migrate import upgrade
from bench.soak import SOAK_TIMINGS
from devharness import handlers
from devharness.processes import Harness, Proc, descendants_of
from devharness.stack import ORG, Stack, make_stack
from receipt.client import Client

WORKERS = {
    "chat-a": "worker-chat",
    "chat-b": "worker-chat",
    "codex": "worker-codex",
    "control": "worker-control",
}
FENCED = ("job.heartbeat", "job.progress", "job.completed", "job.failed", "job.canceled", "job.released")


@dataclass
class Deploy:
    round: int
    everything: bool
    signalled_at: float
    killed: list[str] = field(default_factory=list)
    up_at: float = 0.0


@dataclass
class Report:
    jobs: int = 0
    not_completed: int = 0
    objectives: int = 0
    objectives_not_completed: int = 0
    charged_to_deploys: int = 0
    overlaps: list[str] = field(default_factory=list)
    platform_kills: int = 0
    releases: int = 0
    rerun_delays_s: list[float] = field(default_factory=list)
    follower_events: int = 0
    follower_lost_or_repeated: int = -1
    wall_s: float = 0.0

    def text(self) -> str:
        d = sorted(self.rerun_delays_s)
        p99 = d[min(len(d) - 1, int(len(d) * 0.99))] if d else None
        return "\n".join(
            [
                f"jobs {self.jobs}, not completed {self.not_completed}, wall {self.wall_s:.0f} s",
                f"objectives {self.objectives}, not completed {self.objectives_not_completed}",
                f"attempts charged to a deploy: {self.charged_to_deploys}",
                f"overlapping executions: {len(self.overlaps)}",
                f"processes the platform SIGKILLed: {self.platform_kills}",
                f"hand-backs (job.released): {self.releases}; running again after the new workers were up: "
                + (
                    f"median {statistics.median(d):.2f} s, p99 {p99:.2f} s, max {d[-1]:.2f} s" if d else "n/a"
                ),
                f"follower: {self.follower_events} events, lost or repeated {self.follower_lost_or_repeated}",
            ]
        )

    def violations(self) -> list[str]:
        out = []
        if self.not_completed:
            out.append(f"{self.not_completed} jobs did not complete")
        if self.objectives_not_completed:
            out.append(f"{self.objectives_not_completed} objectives did not complete")
        if self.charged_to_deploys:
            out.append(f"{self.charged_to_deploys} attempts charged to deploys")
        if self.overlaps:
            out.append(f"overlaps: {self.overlaps[:5]}")
        if self.platform_kills:
            out.append(f"{self.platform_kills} processes outlived the platform grace")
        if self.rerun_delays_s and max(self.rerun_delays_s) > 5.0:
            out.append(f"a handed-back job ran again {max(self.rerun_delays_s):.1f} s after the new workers")
        if self.follower_lost_or_repeated != 0:
            out.append(f"the follower lost or repeated {self.follower_lost_or_repeated} events")
        return out


def _post(stack: Stack, agent: str, job_id: str, payload: dict[str, Any], max_attempts: int = 2) -> None:
    body: dict[str, Any] = {
        "jobId": job_id,
        "maxAttempts": max_attempts,
        "payload": {"authContext": {"userId": "soak", "organizationId": ORG}, **payload},
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the web restarts in one round: retry with the same jobId
        with contextlib.suppress(requests.RequestException):
            r = requests.post(
                stack.url(f"/agents/{agent}/jobs"), json=body, headers=stack.headers(), timeout=15
            )
            if r.status_code == 202:
                return
        time.sleep(0.5)
    raise RuntimeError(f"could not post {job_id}")


ENDED = ("completed", "failed", "canceled")


def _launch(stack: Stack, objective_id: str, seconds: list[float]) -> None:
    """An objective of a chain of tasks, each sleeping its ``seconds``; retried like ``_post``."""
    tasks: list[dict[str, Any]] = []
    for i, s in enumerate(seconds):
        task: dict[str, Any] = {
            "id": f"t{i}",
            "agentId": handlers.TASK,
            "payload": {"kind": "factory.task.run", "seconds": s},
        }
        if i:
            task["dependsOn"] = [f"t{i - 1}"]
        tasks.append(task)
    body: dict[str, Any] = {
        "objectiveId": objective_id,
        "title": "deploy soak",
        "goal": "survive deploys",
        "plan": {"tasks": tasks},
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            r = requests.post(stack.url("/objectives"), json=body, headers=stack.headers(), timeout=15)
            if r.status_code == 202:
                return
        time.sleep(0.5)
    raise RuntimeError(f"could not launch {objective_id}")


def _objective_status(stack: Stack, objective_id: str) -> str | None:
    with contextlib.suppress(requests.RequestException):
        r = requests.get(stack.url(f"/objectives/{objective_id}"), headers=stack.headers(), timeout=15)
        if r.status_code == 200:
            status: str = r.json()["objective"]["status"]
            return status
    return None


def _deploy(stack: Stack, n: int, everything: bool, platform_grace_s: float) -> Deploy:
    names = [*WORKERS, "driver", "beat", *(["web"] if everything else [])]
    old = {name: stack.procs.pop(name) for name in names}
    pids = [p.pid for p in old.values()]
    if everything:  # Heroku: every process of the dyno, the commands and their sandboxes included
        pids += [d for p in old.values() for d in descendants_of(p.pid)]
    d = Deploy(n, everything, time.time())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + platform_grace_s
    for name, proc in old.items():
        try:
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            d.killed.append(name)
            stack.harness.kill(proc)
        proc.stopped = True
    # The new release (names carry the round, so every log is kept).
    new: list[tuple[str, Proc]] = []
    for name in names:
        fresh = f"{name}@{n}"
        if name == "web":
            new.append((fresh, stack.start_web(fresh, wait=False)))
        elif name == "beat":
            new.append((fresh, stack.start_beat(fresh, wait=False)))
        else:
            new.append((fresh, stack.start_worker(WORKERS.get(name, "driver"), fresh, wait=False)))
    for fresh, proc in new:
        if fresh.startswith("web"):
            stack.wait_web()
        elif fresh.startswith("beat"):
            stack.wait_beat(proc)
        else:
            stack.wait_worker(proc)
    d.up_at = time.time()
    for fresh, _proc in new:  # later rounds find them under their plain names
        stack.procs[fresh.split("@")[0]] = stack.procs.pop(fresh)
    return d


def _analyse(stack: Stack, key_prefix: str, deploys: list[Deploy], report: Report) -> None:
    with stack.engine.connect() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.status).where(jobs.c.id.like(f"{key_prefix}%"))).all()
        report.jobs = len(rows)
        report.not_completed = sum(1 for _, status in rows if status != "completed")
        for job_id, _ in rows:
            receipts = store.read_stream(conn, f"jobs/{job_id}")
            lease: tuple[str, int] | None = None
            for i, r in enumerate(receipts):
                body = r.body
                if r.type == "job.leased":
                    lease = (body["workerId"], body["attempt"])
                elif r.type in FENCED and "workerId" in body and lease != (body["workerId"], body["attempt"]):
                    report.overlaps.append(f"{job_id}#{r.seq} {r.type}")
                if r.type in ("job.failed", "job.lease_expired"):
                    report.charged_to_deploys += 1
                if r.type == "job.released":
                    report.releases += 1
                    released_at = _ts(r.at)
                    nxt = next((x for x in receipts[i + 1 :] if x.type == "job.leased"), None)
                    ups = [d.up_at for d in deploys if d.signalled_at <= released_at + 0.5]
                    up = max(ups) if ups else released_at
                    if nxt is not None:
                        report.rerun_delays_s.append(max(0.0, _ts(nxt.at) - max(up, released_at)))
                if r.type in (
                    "job.lease_expired",
                    "job.released",
                    "job.completed",
                    "job.failed",
                    "job.canceled",
                ):
                    lease = None


def _ts(at: str) -> float:
    parsed = parse_iso(at)
    assert parsed is not None
    return parsed.timestamp()


def run(args: argparse.Namespace, workdir: Path) -> Report:
    admin = create_engine(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres", isolation_level="AUTOCOMMIT"
    )
    name = f"deploy_soak_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    harness = Harness(workdir / "logs")
    report = Report()
    t0 = time.monotonic()
    try:
        grace_ms = int(args.grace * 1000)
        # Room for every long job at once on the two chat workers: a handed-back job then waits for
        # its delivery, never for a free slot, so the rerun delay measures the hand-back alone.
        slots = args.long_jobs // 2 + 16
        env = {
            **SOAK_TIMINGS,
            "RECEIPT_SHUTDOWN_GRACE_MS": str(grace_ms),
            "RECEIPT_RESONATE_EXECUTE_CONCURRENCY": str(slots),
        }
        stack = make_stack(harness, url, workdir / "home", **env)
        stack.timings = {}  # production leases: a job can only come back promptly through a release
        try:
            stack.start("web", "driver", "chat-a", "chat-b", "codex", "control", "beat")
            rng = random.Random(args.seed)
            prefix = f"ds-{uuid.uuid4().hex[:6]}-"
            key_prefix = qualify(ORG, prefix)
            lo, hi = args.long
            # The long jobs arrive evenly over the deploys' span (the first at once), so every deploy
            # finds a share of them running, whatever their length.
            span = args.rounds * args.interval
            durations = [rng.uniform(lo, hi) for _ in range(args.long_jobs)]
            began = time.monotonic()

            def long_stream() -> None:
                for n, seconds in enumerate(durations):
                    wait = began + n * span / max(1, args.long_jobs) - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    _post(
                        stack,
                        handlers.SLEEP,
                        f"{prefix}long-{n:04d}",
                        {"kind": "factory.run", "seconds": seconds},
                        max_attempts=1,
                    )

            long_poster = threading.Thread(target=long_stream, daemon=True)
            long_poster.start()
            for n in range(args.commands):
                _post(
                    stack,
                    "codex",
                    f"{prefix}cmd-{n}",
                    {"kind": "factory.task.run", "command": ["/bin/sleep", str(int(hi))]},
                    max_attempts=1,
                )
            objectives = [f"{prefix}obj-{n}" for n in range(args.objectives)]
            for objective_id in objectives:
                _launch(stack, objective_id, [rng.uniform(lo, hi) for _ in range(3)])
            # Followed through every deploy: it waits for a gate opened after the last one.
            followed = f"{prefix}followed"
            gate = workdir / "followed.gate"
            life = args.rounds * (args.interval + 2 * args.platform_grace)
            _post(stack, handlers.GATE, followed, {"kind": "factory.run", "gate": str(gate)}, max_attempts=1)
            seen: list[int] = []
            client = Client(stack.url(""), token=stack.token, timeout=15)

            def follow() -> None:
                with contextlib.suppress(Exception):
                    for event in client.follow(followed, reconnect_delay=0.3, timeout=life * 4 + 120):
                        seen.append(event.seq)

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            stop = threading.Event()

            def short_stream() -> None:
                n = 0
                while not stop.wait(1.0 / args.short_rate):
                    with contextlib.suppress(Exception):
                        _post(
                            stack,
                            handlers.ECHO,
                            f"{prefix}short-{n:05d}",
                            {"kind": "factory.run", "message": n},
                        )
                    n += 1

            poster = threading.Thread(target=short_stream, daemon=True)
            poster.start()
            deploys: list[Deploy] = []
            for r in range(1, args.rounds + 1):
                time.sleep(args.interval)
                everything = r == args.rounds
                d = _deploy(stack, r, everything, args.platform_grace)
                deploys.append(d)
                print(
                    f"deploy {r}: {'every process' if everything else 'workers, driver, beat'}; "
                    f"SIGKILLed by the platform: {d.killed or 'none'}; new release up after "
                    f"{d.up_at - d.signalled_at:.1f} s",
                    flush=True,
                )
                report.platform_kills += len(d.killed)
            stop.set()
            poster.join(30)
            long_poster.join(120)
            gate.touch()
            deadline = time.monotonic() + args.settle
            while time.monotonic() < deadline:
                with stack.engine.connect() as conn:
                    left = conn.execute(
                        select(jobs.c.id)
                        .where(
                            jobs.c.id.like(f"{key_prefix}%"), jobs.c.status.not_in(sorted(TERMINAL_STATUSES))
                        )
                        .limit(1)
                    ).first()
                if left is None and all(_objective_status(stack, o) in ENDED for o in objectives):
                    break
                time.sleep(1)
            follower.join(30)
            _analyse(stack, key_prefix, deploys, report)
            report.objectives = len(objectives)
            report.objectives_not_completed = sum(
                1 for o in objectives if _objective_status(stack, o) != "completed"
            )
            last = stack.job(followed)
            report.follower_events = len(seen)
            if last is not None:
                report.follower_lost_or_repeated = len(set(range(1, last.seq + 1)) ^ set(seen)) + (
                    len(seen) - len(set(seen))
                )
        finally:
            stack.close()
    finally:
        harness.stop_all()
        report.wall_s = time.monotonic() - t0
        with contextlib.suppress(Exception), admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deploy_soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--long-jobs", type=int, default=300)
    parser.add_argument("--long", type=lambda s: tuple(float(x) for x in s.split(",")), default=(10.0, 60.0))
    parser.add_argument("--commands", type=int, default=4, help="codex jobs running /bin/sleep")
    parser.add_argument("--objectives", type=int, default=2, help="objectives of three chained tasks")
    parser.add_argument("--short-rate", type=float, default=5.0, help="short jobs posted per second")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between deploys")
    parser.add_argument("--platform-grace", type=float, default=10.0, help="SIGTERM to SIGKILL")
    parser.add_argument("--grace", type=float, default=8.0, help="RECEIPT_SHUTDOWN_GRACE_MS, in seconds")
    parser.add_argument("--settle", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", help="keep the processes' logs here")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        if args.workdir:
            workdir = Path(args.workdir).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="receipt-deploy-soak-")))
        if os.geteuid() == 0:
            os.chmod(workdir, 0o755)
        print(
            f"deploy soak: {args.long_jobs} jobs of {args.long[0]:.0f}-{args.long[1]:.0f} s, {args.commands} "
            f"commands, {args.objectives} objectives, short jobs at {args.short_rate}/s, "
            f"{args.rounds} deploys {args.interval:.0f} s apart, "
            f"grace {args.grace:.0f} s under a {args.platform_grace:.0f} s platform grace",
            flush=True,
        )
        report = run(args, workdir)
    print(report.text())
    violations = report.violations()
    for v in violations:
        print(f"VIOLATION: {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
