"""``receipt logs [ROLE] [-f]``: read the per-role log files ``receipt up`` writes.

One role prints that role's file; no role prints every role's, each line prefixed with its role.
``-f`` keeps following (new lines as they are written, a restarted run's new file included)
until Ctrl-C. Reads plain files only: it works whether or not ``receipt up`` is running.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from app.config import Settings
from app.ops.supervisor import log_dir

FOLLOW_POLL_S = 0.25


def log_files(settings: Settings, role: str | None) -> dict[str, Path]:
    """The log file of ``role`` (or of every role that has one), by role name."""
    folder = log_dir(settings)
    if role is not None:
        return {role: folder / f"{role}.log"}
    return {p.stem: p for p in sorted(folder.glob("*.log"))}


def show(
    settings: Settings,
    role: str | None,
    *,
    follow: bool,
    lines: int,
    out: TextIO,
    keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Print the last ``lines`` lines of each file, then (``follow``) whatever is appended."""
    files = log_files(settings, role)
    missing = [name for name, path in files.items() if not path.exists()]
    if not files or (role is not None and missing):
        where = files[role] if role is not None else log_dir(settings)
        out.write(f"no logs at {where}: start the system with `receipt up` (RECEIPT_HOME={settings.home})\n")
        return 1
    width = max(len(name) for name in files)

    def emit(name: str, line: str) -> None:
        out.write(line if role is not None else f"{name:>{width}} | {line}")

    offsets: dict[str, int] = {}
    for name, path in files.items():
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in deque(fh, maxlen=lines):
                emit(name, line)
            offsets[name] = fh.tell()
    out.flush()
    while follow and keep_going():
        time.sleep(FOLLOW_POLL_S)
        for name, path in files.items():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < offsets[name]:
                offsets[name] = 0  # a new run replaced the file: read it from the start
            if size == offsets[name]:
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(offsets[name])
                for line in fh:
                    emit(name, line)
                offsets[name] = fh.tell()
        out.flush()
    return 0
