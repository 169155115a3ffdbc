"""The previous release's processes run on the schema this checkout migrates to (docs/design.md,
"Releases are compatible both ways"; docs/runbook.md, "Releasing").

During a deploy the release phase (``receipt migrate``) runs the *new* code's migrations while the
*previous* release still serves. This test does exactly that: it checks out the previous release
(``tests/fixtures/previous_release.txt``) as a detached git worktree, migrates a fresh database with
this checkout, then runs the previous release's gunicorn, driver, chat, codex and control workers
and beat on it (with this checkout's .venv, which must satisfy its requirements): they enqueue, execute
and settle jobs and an objective, and the previous release's ``receipt verify`` passes.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from sqlalchemy.engine import Engine

from app.storage.migrate import current, upgrade
from app.storage.revisions import head
from devharness import handlers
from tests.support.processes import PYTHON, REPO_ROOT, Harness
from tests.support.stack import Stack, make_stack
from tests.support.waiting import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("e2e")]

RECORD = REPO_ROOT / "tests" / "fixtures" / "previous_release.txt"
VERSIONS = Path("app") / "storage" / "migrations" / "versions"


def recorded_commit() -> str:
    lines = [line.strip() for line in RECORD.read_text().splitlines()]
    shas = [line for line in lines if line and not line.startswith("#")]
    assert len(shas) == 1 and len(shas[0]) == 40, f"{RECORD} must hold one full commit sha"
    return shas[0]


def unmet_dependencies(root: Path) -> list[str]:
    """The requirements of the checkout at ``root`` that this .venv does not satisfy."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    unmet = []
    for spec in project["dependencies"]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            unmet.append(f"{spec} (not installed)")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            unmet.append(f"{spec} (installed: {installed})")
    return unmet


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    sha = recorded_commit()
    where = tmp_path_factory.mktemp("previous-release") / "code"
    added = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(where), sha],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert added.returncode == 0, f"cannot check out the previous release {sha}: {added.stderr}"
    try:
        unmet = unmet_dependencies(where)
        if unmet:
            pytest.fail(
                f"this .venv cannot run the previous release {sha[:12]}: {'; '.join(unmet)}. "
                "Install it in a venv of its own (docs/runbook.md, Releasing)"
            )
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(where)],
            capture_output=True,
            timeout=120,
        )


@pytest.fixture
def old_stack(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(harness, pg_database_url, tmp_path / "home")
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


# The previous release's workers load its own test handlers (same agent names as devharness's).
OLD_HANDLERS = "tests.e2e.handlers"


def _old_env(stack: Stack, code: Path) -> dict[str, str]:
    # PYTHONPATH and the working directory both name the old checkout: its modules shadow this
    # checkout's editable install (asserted below).
    return stack.env(PYTHONPATH=str(code), RECEIPT_HANDLER_MODULES=OLD_HANDLERS)


def _start(stack: Stack, code: Path, name: str, argv: list[str]) -> Any:
    env = _old_env(stack, code)
    if name == "web":
        env.update(RECEIPT_PROCESS_ROLE="api", WEB_CONCURRENCY="1")
    proc = stack.harness.start(name, argv, env, cwd=code)
    stack.procs[name] = proc
    return proc


def _old(stack: Stack, code: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args],
        cwd=code,
        env=_old_env(stack, code),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.own_database  # the previous release's processes migrate and run on it
def test_the_previous_release_runs_jobs_and_an_objective_on_the_migrated_schema(
    old_stack: Stack, previous: Path, pg_engine: Engine
) -> None:
    stack = old_stack
    # Migrated by this checkout (the release phase of the new release), to a migration the previous
    # release does not have.
    upgrade(pg_engine)
    assert current(pg_engine) == head()
    newest = sorted(p.name for p in (REPO_ROOT / VERSIONS).glob("[0-9]*.py"))[-1]
    assert not (previous / VERSIONS / newest).exists(), f"{newest} is not newer than the previous release"
    where = _old(
        stack,
        previous,
        "-c",
        "import app.ops.preflight as p, tasks.worker as w; print(p.__file__, w.__file__)",
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(f).is_relative_to(previous) for f in where.stdout.split()), where.stdout

    stack.web_port = stack.web_port or free_port()
    web = _start(
        stack,
        previous,
        "web",
        [
            PYTHON,
            "-m",
            "gunicorn",
            "-c",
            "python:api.gunicorn_conf",
            "--bind",
            f"127.0.0.1:{stack.web_port}",
            "api.wsgi:app",
        ],
    )
    workers = {
        name: _start(stack, previous, name, [PYTHON, "-m", "tasks.worker", "--role", role])
        for name, role in (
            ("driver", "driver"),
            ("chat", "worker-chat"),
            ("codex", "worker-codex"),
            ("control", "worker-control"),
        )
    }
    beat = _start(
        stack, previous, "beat", [PYTHON, "-m", "tasks.beat", "--schedule", str(stack.home / "beat-schedule")]
    )
    stack.wait_web()
    for proc in workers.values():
        stack.wait_worker(proc)
    stack.wait_beat(beat)
    assert web.alive() and all(p.alive() for p in workers.values())
    assert workers["chat"].log_count("newer than this release's") >= 1  # it said so, and ran on

    echoes = [stack.post_job(handlers.ECHO, message=f"old release {n}")["id"] for n in range(5)]
    command = stack.post_job("codex", "factory.task.run", command=["python3", "-c", "print('old')"])["id"]
    retried = stack.post_job(handlers.FAIL, max_attempts=2)["id"]
    r = stack.http.post(
        stack.url("/objectives"),
        json={
            "title": "previous release",
            "goal": "runs on the new schema",
            "plan": {
                "tasks": [
                    {"id": "A", "agentId": handlers.TASK, "payload": {"kind": "factory.task.run"}},
                    {
                        "id": "B",
                        "agentId": handlers.TASK,
                        "payload": {"kind": "factory.task.run"},
                        "dependsOn": ["A"],
                    },
                ]
            },
        },
        headers=stack.headers(),
        timeout=30,
    )
    assert r.status_code == 202, r.text
    objective = r.json()["async"]["objectiveId"]

    for job_id in echoes:
        done = stack.wait_terminal(job_id, timeout=60)
        assert (done.status, done.attempt) == ("completed", 1), done.error
    done = stack.wait_terminal(command, timeout=60)
    assert done.status == "completed" and done.result["outputTail"] == "old\n", (done.error, done.result)
    failed = stack.wait_terminal(retried, timeout=60)
    assert (failed.status, failed.attempt) == ("failed", 2)  # retried once, then settled failed

    def objective_done() -> dict[str, Any] | None:
        got = stack.http.get(stack.url(f"/objectives/{objective}"), headers=stack.headers(), timeout=15)
        obj: dict[str, Any] = got.json()["objective"]
        return obj if obj["status"] in ("completed", "failed", "canceled") else None

    obj = wait_for(objective_done, 90, interval=0.2, what="the objective to settle")
    assert obj["status"] == "completed", obj

    verified = _old(stack, previous, "-m", "app.ops.cli", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert all(p.alive() for p in (web, beat, *workers.values()))
