"""``receipt objective …`` against a real HTTP server, and the operator verbs over objective streams."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from werkzeug.serving import make_server

from api.app import create_app
from app.composition import queue_for
from app.config import Settings
from app.factory import service
from app.ops.cli import main as receipt_main
from app.storage import store, tokens
from app.storage.db import objective_tasks, objectives
from tests.factory_support import DIAMOND, drain, plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    app = create_app(
        Settings(home=str(tmp_path / "home")), engine=sqlite_engine, on_dispatchable=lambda jobs: None
    )
    srv = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.server_port}"
    monkeypatch.setenv("RECEIPT_URL", url)
    monkeypatch.setenv("RECEIPT_TOKEN", tokens.create(sqlite_engine, "org-cli")[1])
    yield url
    srv.shutdown()
    thread.join(5)


def plan_file(tmp_path: Path, **extra: Any) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"title": "cli", "goal": "g", "plan": plan(DIAMOND), **extra}))
    return path


def test_launch_follow_show_list_cancel(
    server: str,
    sqlite_engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = queue_for(sqlite_engine)
    stop = threading.Event()

    def worker() -> None:  # the deployment's workers, in-process
        while not stop.is_set():
            drain(queue)
            stop.wait(0.05)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    monkeypatch.setenv("COLUMNS", "80")
    try:
        code = receipt_main(
            [
                "objective",
                "launch",
                str(plan_file(tmp_path, objectiveId="cli-1")),
                "--follow",
            ]
        )
    finally:
        stop.set()
        t.join(10)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out.strip().splitlines()[-1]) == {"objectiveId": "cli-1", "status": "completed"}
    assert "cli-1" in out.err and "completed" in out.err  # the live progress view
    # The view ends its line, so the result line starts its own when both go to one file (2>&1).
    assert out.err.endswith("\n")
    frames = out.err

    assert receipt_main(["objective", "show", "cli-1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "completed" and len(shown["tasks"]) == 4
    # At 80 columns every task's job id was shown whole, on lines no wider.
    assert all(task["jobId"] in frames for task in shown["tasks"]), frames
    assert max(len(line) for line in frames.splitlines()) <= 80

    assert receipt_main(["objective", "launch", str(plan_file(tmp_path, objectiveId="cli-2"))]) == 0
    launched = json.loads(capsys.readouterr().out)
    assert launched["async"]["objectiveId"] == "cli-2"
    assert receipt_main(["objective", "list", "--limit", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[:3] for line in lines] == [
        ["cli-2", "active", "0/4"],
        ["cli-1", "completed", "4/4"],
    ]
    assert receipt_main(["objective", "cancel", "cli-2", "--reason", "enough"]) == 0
    assert "cli-2\tactive (cancel requested)" in capsys.readouterr().out
    assert receipt_main(["objective", "cancel", "cli-1"]) == 1
    assert "conflict" in capsys.readouterr().err


def test_launch_refused_names_the_problem(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps({"title": "t", "goal": "g", "plan": {"tasks": [{"id": "a", "dependsOn": ["a"]}]}})
    )
    assert receipt_main(["objective", "launch", str(path)]) == 1
    assert "invalid_field" in capsys.readouterr().err


def test_example_plan_is_a_valid_launch(sqlite_engine: Engine) -> None:
    from app.factory.plan import validate_objective

    body = json.loads((REPO / "examples" / "diamond-objective.json").read_text())
    spec = validate_objective(body, auth_context={"userId": "u", "organizationId": "o"})
    assert [t.id for t in spec.tasks] == ["fetch", "lint", "test", "report"]


def test_operator_verbs_rebuild_replay_and_verify_objective_streams(
    sqlite_engine: Engine,
    sqlite_database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from app.factory.plan import validate_objective

    monkeypatch.setenv("DATABASE_URL", sqlite_database_url)
    queue = queue_for(sqlite_engine)
    body = {
        "title": "t",
        "goal": "g",
        "authContext": {"userId": "u", "organizationId": "o"},
        "plan": plan(DIAMOND),
    }
    oid = service.launch(queue, validate_objective(body), launched_by=service.system_launcher()).objective.id
    drain(queue)

    def rows() -> Any:
        with sqlite_engine.connect() as conn:
            return [tuple(r) for r in conn.execute(select(objectives))], sorted(
                tuple(r) for r in conn.execute(select(objective_tasks))
            )

    before = rows()
    with sqlite_engine.begin() as conn:
        conn.execute(update(objectives).values(status="failed"))
        conn.execute(update(objective_tasks).values(status="pending"))
    assert rows() != before
    assert receipt_main(["rebuild-projections"]) == 0
    assert "1 objectives" in capsys.readouterr().out
    assert rows() == before

    with sqlite_engine.connect() as conn:
        stream = store.read_stream(conn, f"objectives/{oid}")
    path = tmp_path / "objective.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"stream": r.stream, "seq": r.seq, "type": r.type, "body": r.body, "at": r.at})
            for r in stream
        )
    )
    assert receipt_main(["replay", str(path)]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["status"] == "completed" and [t["status"] for t in replayed["tasks"]] == ["completed"] * 4
    # An event for an objective that does not exist: the reducer's invariant, exit 1.
    path.write_text(
        json.dumps({"stream": "objectives/ghost", "seq": 1, "type": "objective.completed", "body": {}})
    )
    assert receipt_main(["replay", str(path)]) == 1
    assert capsys.readouterr().err.strip() == "Invariant: no objective for ghost"
    assert receipt_main(["verify", "--stream", f"objectives/{oid}"]) == 0
    assert f"ok: {len(stream)} receipts verified" in capsys.readouterr().out
