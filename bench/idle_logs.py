"""How much an idle deployment logs: bytes per minute per process at the default log level.

    .venv/bin/python -m bench.idle_logs [--seconds 120] [--settle 15]

Starts ``receipt up`` (what ``make run`` runs: embedded SQLite and the folder broker, every
process with its default settings; its own ``RECEIPT_HOME`` in a temporary folder) from this
checkout, waits for its dev-token line, lets start-up finish for ``--settle`` seconds, then counts
for ``--seconds`` what each process appends to its log (``<home>/logs/<role>.log``) while nothing
is posted. Prints each process's start-up bytes and idle bytes per minute, the total, and whether
any log holds a library warning (gevent's ``MonkeyPatchWarning``, a Python ``Warning``). Issue
36's target: at most 1 KB per minute per idle process. ``receipt up`` is stopped with one SIGINT,
by PID, at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devharness.processes import base_env  # noqa: E402  (after the path is set)
from devharness.waiting import free_port, wait_for  # noqa: E402

TOKEN_LINE = re.compile(r"Dev token \(organization 'dev'\): (\S+)")
TARGET_BYTES_PER_MINUTE = 1024
# A line of the plain format: time, level, role, then the logger's name.
LOGGER = re.compile(r"^\S+ \S+ \S+\s+\S+ ([\w.]+): ")
WARNINGS = ("MonkeyPatchWarning", "Warning:")


def sizes(logs: Path) -> dict[str, int]:
    return {p.stem: p.stat().st_size for p in sorted(logs.glob("*.log"))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0, help="how long to count idle output")
    p.add_argument("--settle", type=float, default=15.0, help="start-up time left out of the count")
    args = p.parse_args(argv)

    receipt = ROOT / ".venv" / "bin" / "receipt"
    with tempfile.TemporaryDirectory(prefix="receipt-idle-") as tmp:
        home = Path(tmp) / "home"
        # The default settings of `make run`: none of the harness's test switches.
        env = {k: v for k, v in base_env(RECEIPT_HOME=str(home)).items() if not k.startswith("RECEIPT_")}
        env["RECEIPT_HOME"] = str(home)
        out = Path(tmp) / "up.out"
        with open(out, "wb") as sink:
            up = subprocess.Popen(
                [str(receipt), "up", "--port", str(free_port())],
                env=env,
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(
                lambda: TOKEN_LINE.search(out.read_text(errors="replace")) or up.poll() is not None,
                180,
                what="receipt up's dev token line",
            )
            if up.poll() is not None:
                print(out.read_text(errors="replace"), file=sys.stderr)
                return 1
            time.sleep(args.settle)
            logs = home / "logs"
            before = sizes(logs)
            started = time.monotonic()
            time.sleep(args.seconds)
            after = sizes(logs)
            minutes = (time.monotonic() - started) / 60
            texts = {name: (logs / f"{name}.log").read_text(errors="replace") for name in after}
            idle = {
                name: (logs / f"{name}.log").read_bytes()[before.get(name, 0) :].decode(errors="replace")
                for name in after
            }
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGINT)
                try:
                    up.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(up.pid, signal.SIGKILL)
                    up.wait(timeout=10)
    load = os.getloadavg()
    print(f"receipt up, idle {minutes * 60:.0f} s after {args.settle:.0f} s of start-up; load {load[0]:.2f}")
    print(f"{'process':<10} {'start-up B':>11} {'idle B/min':>11}  warnings")
    worst = 0.0
    for name in sorted(after):
        rate = (after[name] - before.get(name, 0)) / minutes
        worst = max(worst, rate)
        warned = [w for w in WARNINGS if w in texts[name]]
        print(f"{name:<10} {before.get(name, 0):>11} {rate:>11.0f}  {', '.join(warned) or '-'}")
    for name in sorted(after):
        lines = [(m.group(1), line) for line in idle[name].splitlines() if (m := LOGGER.match(line))]
        loggers = Counter(logger for logger, _ in lines)
        for logger, n in loggers.most_common(3):
            example = next(line for lg, line in lines if lg == logger)
            print(f"  {name}: {n} lines from {logger} while idle, e.g. {example[:150]}")
    total = sum(after[n] - before.get(n, 0) for n in after) / minutes
    print(
        f"total idle {total:.0f} B/min; worst process {worst:.0f} B/min (target <= {TARGET_BYTES_PER_MINUTE})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
