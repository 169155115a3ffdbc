"""``receipt objective replan`` against a real HTTP server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.ops.cli import main as receipt_main
from tests.factory_support import drain, plan
from tests.integration.test_objective_cli import plan_file, server  # noqa: F401  (the fixture)


def test_replan_starts_the_next_phase_and_refuses_once_ended(
    server: str,  # noqa: F811
    sqlite_engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = queue_for(sqlite_engine)
    assert receipt_main(["objective", "launch", str(plan_file(tmp_path, objectiveId="cli-rp"))]) == 0
    capsys.readouterr()
    drain(queue, skip_agents=("test-echo",))
    new = tmp_path / "phase2.json"
    new.write_text(json.dumps(plan({"E": []})))
    assert receipt_main(["objective", "replan", "cli-rp", str(new), "--reason", "rethink"]) == 0
    assert capsys.readouterr().out.strip() == "cli-rp\tactive\tphase 2"
    drain(queue, skip_agents=("test-echo",))
    drain(queue)
    assert receipt_main(["objective", "show", "cli-rp"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "completed" and shown["phase"] == 2
    assert [(t["id"], t["phase"]) for t in shown["tasks"]][-1] == ("E", 2)
    assert receipt_main(["objective", "replan", "cli-rp", str(new)]) == 1
    assert "conflict" in capsys.readouterr().err
