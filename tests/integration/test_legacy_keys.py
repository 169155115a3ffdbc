"""A database written before keys carried the organisation still migrates, verifies, rebuilds, and
keeps every id its organisation's.

The fixture (``tests/fixtures/pre_tenancy``) was written by the release before, through its own
queue, Factory and worker path (``generate.py`` says how): jobs and objectives with bare keys
(``jobs/legacy-done``), a watchdog tick without an organisation, tokens and ledger rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.factory import service
from app.ops import cli
from app.storage import store, tokens
from app.storage.db import jobs, make_engine, objectives
from app.storage.migrate import current, upgrade
from tests.factory_support import drain
from tests.support.api import Api, as_posted, build_api, json_of, make_settings
from tests.support.databases import assert_projection_equals_fold, new_database
from tests.support.queue_ops import close_queues

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pre_tenancy"
LEGACY_JOBS = (
    "legacy-queued",
    "legacy-done",
    "legacy-failed",
    "legacy-running",
    "legacy-canceled",
    "legacy-session",
    "legacy-b",
)


def _load_postgres(url: str) -> None:
    engine = make_engine(url)
    try:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute((FIXTURES / "pre_tenancy.pg.sql").read_text())
            raw.commit()
        finally:
            raw.close()
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def legacy_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database restored from the pre-tenancy fixture (still at its old revision)."""
    if request.param == "sqlite":
        path = tmp_path / "legacy.db"
        conn = sqlite3.connect(path)
        conn.executescript((FIXTURES / "pre_tenancy.sqlite.sql").read_text())
        conn.close()
        yield f"sqlite:///{path}"
        return
    admin: Engine = request.getfixturevalue("pg_admin")
    with new_database(admin, "receipt_legacy") as url:
        _load_postgres(url)
        yield url


@pytest.fixture
def legacy(legacy_url: str) -> Iterator[Engine]:
    engine = make_engine(legacy_url)
    assert current(engine) == "0007"  # the fixture is what the release before left
    upgrade(engine)
    yield engine
    close_queues(engine)
    engine.dispose()


def _rows(engine: Engine) -> tuple[dict[str, Any], dict[str, Any]]:
    with engine.connect() as conn:
        job_rows = {r.id: r.state for r in conn.execute(select(jobs.c.id, jobs.c.state))}
        objective_rows = {r.id: r.state for r in conn.execute(select(objectives.c.id, objectives.c.state))}
    return job_rows, objective_rows


def test_it_migrates_verifies_and_rebuilds_to_the_same_rows(
    legacy: Engine, legacy_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _rows(legacy)
    assert set(LEGACY_JOBS) <= set(before[0])  # bare keys, as the release before wrote them
    monkeypatch.setenv("DATABASE_URL", legacy_url)
    assert cli.main(["verify"]) == 0
    assert cli.main(["rebuild-projections"]) == 0
    assert cli.main(["rebuild-ledger"]) == 0
    assert cli.main(["verify"]) == 0
    assert _rows(legacy) == before  # the same rows, folded by this release's reducers
    for job_id in before[0]:
        assert_projection_equals_fold(legacy, job_id)
    capsys.readouterr()


def test_replay_folds_a_legacy_stream(
    legacy: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with legacy.connect() as conn:
        stream = store.read_stream(conn, "jobs/legacy-done")
    path = tmp_path / "legacy-done.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in stream))
    capsys.readouterr()
    assert cli.main(["replay", str(path)]) == 0
    folded = json.loads(capsys.readouterr().out)
    assert folded["id"] == "legacy-done" and folded["status"] == "completed"
    assert folded["result"] == {"answer": 42}


@pytest.fixture
def api(legacy: Engine, tmp_path: Path) -> Api:
    return build_api(legacy, make_settings(tmp_path))


def test_a_legacy_job_is_still_its_organisations_under_its_id(api: Api) -> None:
    mine = api.client.get("/jobs/legacy-done", headers=api.headers("a"))
    assert mine.status_code == 200
    job = json_of(mine)["job"]
    assert (job["id"], job["organizationId"], job["status"]) == ("legacy-done", "org-a", "completed")
    assert job["stream"] == "jobs/legacy-done"
    receipts = api.client.get(f"/streams/{job['stream']}/receipts", headers=api.headers("a"))
    assert [r["type"] for r in json_of(receipts)["receipts"]][-1] == "job.completed"
    # Organisation B: exactly what an id nobody holds answers.
    foreign = api.client.get("/jobs/legacy-done", headers=api.headers("b"))
    unknown = api.client.get("/jobs/never-used", headers=api.headers("b"))
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.get_data() == unknown.get_data()
    assert api.client.get(f"/streams/{job['stream']}/receipts", headers=api.headers("b")).status_code == 404


def test_reposting_a_legacy_id_returns_it_and_another_organisation_gets_its_own(api: Api) -> None:
    before = api.receipt_count()
    first = as_posted(json_of(api.client.get("/jobs/legacy-queued", headers=api.headers("a")))["job"])
    again = api.job("a", jobId="legacy-queued")
    assert again == first and again["stream"] == "jobs/legacy-queued"
    assert api.receipt_count() == before  # idempotent: nothing written
    theirs = api.job("b", jobId="legacy-queued")
    assert theirs["organizationId"] == "org-b" and theirs["stream"] == "jobs/org-b/legacy-queued"
    assert api.receipt_count() == before + 1
    assert as_posted(json_of(api.client.get("/jobs/legacy-queued", headers=api.headers("a")))["job"]) == first


def test_a_steer_reaches_the_legacy_session_job(api: Api) -> None:
    steered = api.job("a", jobId="steer-after", sessionKey="s1", singletonMode="steer")
    assert steered["id"] == "legacy-session"
    assert [c["type"] for c in steered["commands"]] == ["steer", "steer"]


def test_a_system_token_reads_the_legacy_watchdog_tick_in_the_system_organisation(api: Api) -> None:
    path = "/jobs/watchdog:20261130T120000Z"
    assert api.client.get(path, headers=api.headers("system")).status_code == 404  # not its own org
    found = api.client.get(path + "?organizationId=_system", headers=api.headers("system"))
    assert found.status_code == 200
    assert json_of(found)["job"]["stream"] == "jobs/watchdog:20261130T120000Z"
    assert api.client.get(path + "?organizationId=_system", headers=api.headers("a")).status_code == 403


def test_legacy_objectives_read_and_the_live_one_runs_to_completion(legacy: Engine, api: Api) -> None:
    done = json_of(api.client.get("/objectives/legacy-obj-done", headers=api.headers("a")))["objective"]
    assert done["status"] == "completed" and done["stream"] == "objectives/legacy-obj-done"
    assert {t["jobId"] for t in done["tasks"]} == {f"legacy-obj-done:p1:{t}" for t in "ABCD"}
    assert api.client.get("/objectives/legacy-obj-done", headers=api.headers("b")).status_code == 404
    # The live objective was left with task A queued: this release's worker path finishes it, and
    # the jobs it derives keep the objective's bare key (so its recorded task job ids match).
    queue = queue_for(legacy)
    drain(queue)
    live = service.get(legacy, "legacy-obj-live")
    assert live is not None and live.status == "completed" and live.audit is not None
    assert {t.job_id for t in live.tasks.values()} == {f"legacy-obj-live:p1:{t}" for t in "ABCD"}
    assert {queue.get(f"legacy-obj-live:p1:{t}").status for t in "ABCD"} == {"completed"}  # type: ignore[union-attr]


def test_fixture_tokens_keep_working(legacy: Engine) -> None:
    with legacy.connect() as conn:
        listed = tokens.list_all(conn)
    assert {t.organization_id for t in listed} == {"org-a", "org-b", "ops"}
