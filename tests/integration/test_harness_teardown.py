"""A test harness that kills at its end leaves no process behind, a supervisor's children included."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from devharness.processes import harness_at, pid_alive
from devharness.waiting import wait_for

# A process that notes a SIGTERM and carries on (a drain that would hold a graceful stop for its
# whole grace), and starts a child in a session of its own, as `receipt up`'s supervisor does, then
# prints the child's pid.
SUPERVISOR = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: print("TERM", flush=True))
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
print(child.pid, flush=True)
while True:
    signal.pause()
"""


def _child_pid(log: Path) -> int:
    found: list[int] = []

    def printed() -> bool:
        text = log.read_text().strip()
        if text:
            found.append(int(text.splitlines()[0]))
        return bool(found)

    wait_for(printed, 30, interval=0.02, what="the supervisor's child pid")
    return found[0]


def test_kill_at_end_kills_every_process_and_its_own_session_children_without_waiting_out_a_drain(
    tmp_path: Path,
) -> None:
    with harness_at(tmp_path / "logs", grace=30, kill_at_end=True) as h:
        proc = h.start("supervisor", [sys.executable, "-c", SUPERVISOR], dict(os.environ))
        child = _child_pid(proc.log_path)
        assert pid_alive(child)
        h.stop_all()
        # Killed outright: never asked to stop, so no drain was waited for.
        assert not proc.alive() and proc.popen.returncode == -signal.SIGKILL
        assert "TERM" not in proc.log()
        assert proc.stopped
        wait_for(lambda: not pid_alive(child), 10, interval=0.02, what="the child in its own session gone")


def test_without_kill_at_end_the_harness_still_stops_gracefully_first(tmp_path: Path) -> None:
    with harness_at(tmp_path / "logs", grace=30) as h:
        # It waits for a signal, and SIGTERM's default action ends it.
        proc = h.start("waiter", [sys.executable, "-c", "import signal; signal.pause()"], dict(os.environ))
        h.stop_all()
        assert proc.popen.returncode == -signal.SIGTERM
