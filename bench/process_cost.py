"""What each process of a Receipt deployment spends per job: CPU and voluntary context switches.

    .venv/bin/python -m bench.process_cost [--system receipt-python] [--jobs 2000] [--clients 8]
                                           [--rounds 3] [--setting RECEIPT_<NAME>=<value> ...]
                                           [--py-spy GROUP=FILE.svg ...]

Deploys Receipt as ``bench.compare`` does (a fresh database, gunicorn, a driver, a ``worker-chat``
running the no-op agent, a private redis-server), sends a burst of ``--jobs`` jobs from the
producer process (``--clients`` threads; ``receipt-http`` posts them to gunicorn) and waits until
all are done. Per round and process group it prints:

- **CPU ms per job** (``/proc``: user + system, the group's process tree; PostgreSQL: the backends
  of the deployment's database);
- **voluntary context switches per job** (every thread of the group): each one is a thread that
  blocked and was woken again — a database or Redis round trip, a hand-off between threads, a wait
  for the GIL. On this 2-core VM a wake-up across cores costs 60-80 µs of CPU on each side
  (``bench/README.md``, "Hops"), so this count explains much of the CPU;
- each group's CPU **relative to the producer's**: the producer does the same work whatever the
  setting or tree under test, so the ratio cancels the machine's drift between rounds (every
  process of a run slows together by up to 40 % here within minutes).

``--py-spy worker=/tmp/worker.svg`` also samples that group's first process and its children with
``py-spy record --gil`` (CPU held with the GIL, idle threads left out) through the last round's
burst and writes the flame graph there (collapsed stacks for a ``.txt`` file). py-spy pauses the
process to sample it, so that round's figures are the sampled process's, not a clean measure.

The medians over the rounds close the output. To compare two trees, run it from each checkout in
turn (rounds alternated by hand): only figures of one sitting compare. Bounded: every wait has a
timeout, the deployment is stopped and its database dropped at exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.compare import deploy, produce, wait_done
from bench.runtime_bench import log
from bench.systems import BY_NAME, RECEIPT_SETTINGS
from devharness.processes import Harness

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=10).stdout
    except subprocess.TimeoutExpired:
        out = ""
    found = [pid]
    for child in out.split():
        found += _tree(int(child))
    return found


def _sample(pids: list[int]) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of these processes, every thread counted."""
    cpu, switches = 0.0, 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            for tid in os.listdir(f"/proc/{pid}/task"):
                for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches"):
                        switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a process or thread that ended meanwhile
    return cpu, switches


def _py_spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    """``py-spy record`` on ``pid`` until stopped (SIGINT), bounded at ten minutes."""
    spy = Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "py-spy"
    return subprocess.Popen(
        [str(spy), "record", "--gil", "--subprocesses", "-r", "200", "-d", "600", "-o", out]
        + ["--pid", str(pid)]
        + (["--format", "raw"] if out.endswith(".txt") else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def one_round(
    system_name: str, jobs: int, clients: int, tag: str, spies: dict[str, str] | None = None
) -> dict[str, tuple[float, float]]:
    """{group: (CPU ms per job, voluntary switches per job)}, the producer's CPU included.
    ``spies``: {group: flame graph file} to sample with py-spy during the burst."""
    system = BY_NAME[system_name]
    with tempfile.TemporaryDirectory(prefix="receipt-process-cost-") as tmp:
        home = Path(tmp)
        harness = Harness(home / "logs")
        try:
            with deploy(system, harness, home) as dep:
                groups: dict[str, list[int]] = {}
                for name, pids_of in dep.cpu_groups.items():
                    pids = pids_of()
                    groups[name] = pids if name == "postgres" else [p for pid in pids for p in _tree(pid)]
                before = {name: _sample(pids) for name, pids in groups.items()}
                sampling = [_py_spy(groups[name][0], out) for name, out in (spies or {}).items()]
                try:
                    result = produce(dep, system, "burst", tag, jobs, clients=clients)
                    wait_done(dep, tag, jobs, result, harness)
                finally:
                    for spy in sampling:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(timeout=60)
                groups["postgres"] = dep.cpu_groups["postgres"]()  # backends opened meanwhile count too
                after = {name: _sample(pids) for name, pids in groups.items()}
        finally:
            harness.stop_all()
    figures = {
        name: (
            1000 * (after[name][0] - before[name][0]) / jobs,
            (after[name][1] - before.get(name, (0.0, 0))[1]) / jobs,
        )
        for name in groups
    }
    figures["producer"] = (1000 * float(result["cpu_s"]) / jobs, float("nan"))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="receipt-python", choices=["receipt-python", "receipt-http"])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--setting", action="append", default=[], help="RECEIPT_<NAME>=<value> (repeatable)")
    parser.add_argument(
        "--py-spy", action="append", default=[], help="GROUP=FILE.svg (or .txt): sample a group's process"
    )
    args = parser.parse_args(argv)
    spies = dict(s.split("=", 1) for s in args.py_spy if "=" in s)
    if len(spies) != len(args.py_spy):
        parser.error("--py-spy: give GROUP=FILE.svg (GROUP: worker, driver, api (gunicorn))")
    malformed = [s for s in args.setting if "=" not in s or not s.startswith("RECEIPT_")]
    if malformed:
        parser.error(f"--setting: {', '.join(malformed)}: give RECEIPT_<NAME>=<value>")
    RECEIPT_SETTINGS.update(dict(s.split("=", 1) for s in args.setting))
    rounds = []
    for r in range(args.rounds):
        last = r == args.rounds - 1
        figures = one_round(args.system, args.jobs, args.clients, f"pc{r}-", spies if last else None)
        producer = figures["producer"][0]
        total = sum(cpu for cpu, _ in figures.values())
        log(f"round {r + 1}/{args.rounds}: {total:.2f} CPU ms a job in all")
        for name, (cpu, switches) in sorted(figures.items()):
            shown = "" if switches != switches else f"  {switches:6.2f} switches"  # NaN: not sampled
            print(f"  {name:<16} {cpu:6.2f} ms  {cpu / producer:5.2f}x producer{shown}")
        rounds.append(figures)
    print(
        f"\nmedians over {len(rounds)} rounds ({args.system}, {args.jobs} jobs, {args.clients} clients"
        + (f"; {', '.join(args.setting)}" if args.setting else "")
        + "):"
    )
    for name in sorted(rounds[0]):
        cpu = statistics.median(f[name][0] for f in rounds)
        ratio = statistics.median(f[name][0] / f["producer"][0] for f in rounds)
        counted = [f[name][1] for f in rounds if f[name][1] == f[name][1]]  # NaN: not sampled
        shown = f"  {statistics.median(counted):6.2f} switches" if counted else ""
        print(f"  {name:<16} {cpu:6.2f} ms  {ratio:5.2f}x producer{shown}")
    total = statistics.median(sum(cpu for cpu, _ in f.values()) for f in rounds)
    relative = statistics.median(sum(cpu for cpu, _ in f.values()) / f["producer"][0] for f in rounds)
    print(f"  {'all':<16} {total:6.2f} ms  {relative:5.2f}x producer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
