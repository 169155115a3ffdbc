"""What a failing end-to-end test's report carries from the processes' logs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from devharness import processes
from devharness.processes import active_notable_lines


def test_warnings_and_errors_from_anywhere_in_a_log_are_reported_after_the_tail_scrolled_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [
        "2026-12-06 03:00:00,000 INFO    web gunicorn.access: GET /healthz 200",
        "2026-12-06 03:00:01,000 WARNING web receipt.api: storage unavailable: too many clients already",
        *[f"2026-12-06 03:00:02,{i:03d} INFO    web gunicorn.access: GET /x 200" for i in range(200)],
        "2026-12-06 03:00:03,000 ERROR   web receipt.api: unexpected error handling request",
    ]
    quiet = SimpleNamespace(name="beat", log=lambda: lines[0] + "\n")
    web = SimpleNamespace(name="web", log=lambda: "\n".join(lines) + "\n")
    monkeypatch.setattr(processes, "ACTIVE", [SimpleNamespace(procs=[quiet, web])])
    assert active_notable_lines().splitlines() == [f"web: {lines[1]}", f"web: {lines[-1]}"]
    assert active_notable_lines(limit=1) == f"web: {lines[-1]}"
    monkeypatch.setattr(processes, "ACTIVE", [])
    assert active_notable_lines() == ""
