"""End-to-end fixtures: real gunicorn, celery workers and beat on real PostgreSQL and Redis.

The harness, the deployment (``Stack``) and the service doubles live in ``tests/support``; this
file holds only the fixtures, and attaches the tail of every process log to a failing test.
"""

from __future__ import annotations

# Some names below (noqa: F401) are re-exported for tests written before tests/support existed;
# new tests import them from tests.support.
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.support.databases import new_database
from tests.support.processes import (  # noqa: F401
    ACTIVE,
    REPO_ROOT,
    Harness,
    active_log_tails,
    active_notable_lines,
    base_env,
    descendants_of,
    harness_at,
    pid_alive,
)
from tests.support.services import TcpProxy  # noqa: F401
from tests.support.stack import ORG, Stack, make_stack, terminal_receipts, terminate_backends, worker_pid  # noqa: F401
from tests.support.waiting import free_port, wait_for  # noqa: F401

E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In each end-to-end module, the tests on the module's shared deployment run after the ones
    that start a deployment of their own: a module-scoped stack stops only when its module ends, so
    a test with its own deployment after it would run two deployments at once."""
    start = 0
    while start < len(items):
        path = items[start].path
        end = start
        while end < len(items) and items[end].path == path:
            end += 1
        if path.resolve().parent == E2E_DIR:
            items[start:end] = sorted(
                items[start:end], key=lambda item: "module_harness" in getattr(item, "fixturenames", ())
            )
        start = end


def running_elsewhere() -> list[str]:
    """The processes other harnesses still run (a deployment a test would run beside)."""
    return [f"{p.name} (pid {p.pid})" for h in ACTIVE for p in h.procs if not p.stopped and p.alive()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not (report.failed and report.when in ("setup", "call")):
        return
    notable = active_notable_lines()
    if notable:
        report.sections.append(("e2e process logs (warnings and errors)", notable))
    tails = active_log_tails()
    if tails:
        report.sections.append(("e2e process logs (tail)", tails))


@pytest.fixture(scope="module")
def module_database_url(pg_admin: Engine, pg_template: str) -> Iterator[str]:
    """A fresh migrated PostgreSQL database shared by one module's tests."""
    with new_database(pg_admin, "receipt_e2e", pg_template) as url:
        yield url


@pytest.fixture(scope="module")
def module_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    assert not running_elsewhere(), f"another deployment still runs: {running_elsewhere()}"
    with harness_at(tmp_path_factory.mktemp("e2e-logs"), kill_at_end=True) as h:
        yield h


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    # One deployment at a time: two on two cores would slow each other's timings into flakes.
    assert not running_elsewhere(), f"another deployment still runs: {running_elsewhere()}"
    with harness_at(tmp_path / "logs", kill_at_end=True) as h:
        yield h


@pytest.fixture(scope="module")
def module_stack(
    module_harness: Harness, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """web, driver, the three worker groups and beat, shared by the tests of one module."""
    stack = make_stack(module_harness, module_database_url, tmp_path_factory.mktemp("e2e-home"))
    try:
        stack.start("web", "driver", "chat", "codex", "control", "beat")
        yield stack
    finally:
        stack.close()  # first: an open keep-alive connection would hold gunicorn's graceful stop
        module_harness.stop_all()


@pytest.fixture
def stack(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    """A dedicated deployment for one destructive test; the test starts the processes it needs."""
    s = make_stack(harness, pg_database_url, tmp_path / "home")
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()
