"""``receipt up`` under a harness: started from its real entry point, read from its banner.

The banner's export line is the one a user pastes, so tests and benchmarks take ``RECEIPT_URL``
and ``RECEIPT_TOKEN`` from it rather than from the files behind it. The supervisor starts its
children in their own sessions; they are adopted by the harness, so they are stopped by PID even
if the supervisor fails to stop them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from devharness.processes import REPO_ROOT, Harness, Proc, descendants_of
from devharness.waiting import wait_for

EXPORT_LINE = re.compile(r"export RECEIPT_URL=(\S+) RECEIPT_TOKEN=(\S+)")
RECEIPT = REPO_ROOT / ".venv" / "bin" / "receipt"
# web, driver, chat, codex, control, beat (the Procfile minus Flower).
SUPERVISED = 6


@dataclass(frozen=True)
class Up:
    """A running ``receipt up``: its process, and what its banner told the user to export."""

    proc: Proc
    url: str
    token: str

    def env(self) -> dict[str, str]:
        return {"RECEIPT_URL": self.url, "RECEIPT_TOKEN": self.token}


def start_up(harness: Harness, env: Mapping[str, str], port: int, *, cwd: Path, timeout: float = 120) -> Up:
    """Start ``receipt up --port PORT`` and wait for its banner and its six processes."""
    assert RECEIPT.exists(), f"{RECEIPT} is not installed (make install)"
    proc = harness.start("receipt-up", [str(RECEIPT), "up", "--port", str(port)], env, cwd=cwd)
    found = wait_for(
        lambda: EXPORT_LINE.search(proc.log()) or not proc.alive(), timeout, interval=0.25, what="the banner"
    )
    assert proc.alive() and isinstance(found, re.Match), proc.tail()

    def supervised() -> list[int]:
        pids = descendants_of(proc.pid)
        return pids if len(pids) >= SUPERVISED else []

    harness.adopted.extend(wait_for(supervised, 30, what="the supervised processes"))
    return Up(proc, found.group(1), found.group(2))
