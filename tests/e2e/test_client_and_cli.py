"""The Python client and the ``receipt jobs`` CLI against a live stack.

Real gunicorn, workers and beat on PostgreSQL and Redis (``module_stack``). The CLI runs
in-process through the same ``receipt`` entry point a shell uses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.ops.cli import main as receipt_main
from devharness import handlers
from receipt.client import Client, InvalidRequest, NotFound, WaitTimeout
from tests.support.services import TcpProxy
from tests.support.stack import ORG, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

AUTH = {"userId": "e2e-user", "organizationId": ORG}


def payload(**fields: Any) -> dict[str, Any]:
    return {"kind": "factory.run", "authContext": AUTH, **fields}


@pytest.fixture
def client(module_stack: Stack) -> Client:
    return Client(module_stack.url(""), token=module_stack.token, timeout=15)


# -- the client ------------------------------------------------------------------------------------


def test_client_enqueue_get_list_and_typed_errors(client: Client) -> None:
    created = client.enqueue(handlers.ECHO, payload(message="hi"), jobId="client-typed-1")
    job_id = created["job"]["id"]
    assert job_id == "client-typed-1" and created["async"]["jobId"] == job_id
    assert client.get(job_id)["agentId"] == handlers.ECHO
    assert job_id in [j["id"] for j in client.list(agentId=handlers.ECHO, limit=100)["jobs"]]
    with pytest.raises(NotFound) as missing:
        client.get("no-such-job-anywhere")
    assert missing.value.status == 404 and missing.value.code == "not_found"
    with pytest.raises(InvalidRequest) as bad:
        client.enqueue(handlers.ECHO, {"kind": "not.a.kind", "authContext": AUTH})
    assert bad.value.code == "invalid_field" and bad.value.details["field"] == "payload.kind"


def test_follow_yields_every_state_in_order_until_terminal_and_wait_returns_it(client: Client) -> None:
    job_id = client.enqueue(handlers.SLEEP, payload(seconds=0.5, progress=True))["job"]["id"]
    events = list(client.follow(job_id, timeout=60))
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # every receipt, once, in order
    statuses = [e.status for e in events]
    assert statuses[0] == "queued" and statuses[-1] == "completed"
    assert "running" in statuses
    assert any((e.job["progress"] or {}).get("started") is True for e in events)
    assert client.wait(job_id, timeout=10)["status"] == "completed"  # already terminal: at once


def test_wait_times_out_on_a_job_that_does_not_finish(client: Client, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job_id = client.enqueue(handlers.GATE, payload(gate=str(gate)))["job"]["id"]
    with pytest.raises(WaitTimeout):
        client.wait(job_id, timeout=2)
    gate.touch()
    assert client.wait(job_id, timeout=60)["status"] == "completed"


def test_follow_resumes_with_last_event_id_after_the_connection_drops(
    module_stack: Stack, tmp_path: Path
) -> None:
    proxy = TcpProxy("127.0.0.1", module_stack.web_port)
    try:
        client = Client(f"http://127.0.0.1:{proxy.port}", token=module_stack.token, timeout=15)
        gate = tmp_path / "gate"
        job_id = client.enqueue(handlers.GATE, payload(gate=str(gate)))["job"]["id"]
        follower = client.follow(job_id, reconnect_delay=0.2, timeout=90)
        seen = []
        for event in follower:
            seen.append(event)
            if event.status == "running":
                break
        connections_before = proxy.accepted
        proxy.cut()  # the open event stream dies mid-flight
        gate.touch()
        module_stack.wait_terminal(job_id, timeout=60)  # everything after this happened while cut
        proxy.restore()
        seen.extend(follower)
        seqs = [e.seq for e in seen]
        assert seqs == list(range(1, len(module_stack.receipts(job_id)) + 1)), seqs  # no gap, no repeat
        assert seen[-1].status == "completed"
        assert proxy.accepted > connections_before  # it did reconnect (with Last-Event-ID)
    finally:
        proxy.close()


# -- the CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def cli(module_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    monkeypatch.setenv("RECEIPT_URL", module_stack.url(""))
    monkeypatch.setenv("RECEIPT_TOKEN", module_stack.token)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = receipt_main(["jobs", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_tail_exits_0_when_the_job_completes(cli: Any, client: Client) -> None:
    job_id = client.enqueue(handlers.SLEEP, payload(seconds=0.3, progress=True))["job"]["id"]
    code, out, _ = cli("tail", job_id)
    assert code == 0, out
    assert "completed" in out and "progress" in out and '"slept": 0.3' in out


def test_tail_exits_1_when_the_job_fails(cli: Any, client: Client) -> None:
    job_id = client.enqueue(handlers.FAIL, payload(retryable=False))["job"]["id"]
    code, out, _ = cli("tail", job_id)
    assert code == 1, out
    assert "failed" in out and "e2e failure on attempt 1" in out


def test_tail_exits_2_when_the_job_is_canceled(cli: Any, client: Client, module_stack: Stack) -> None:
    job_id = client.enqueue(handlers.WAIT_CANCEL, payload(seconds=60))["job"]["id"]
    module_stack.wait_running(job_id)
    code, out, _ = cli("cancel", job_id, "--reason", "from the cli")
    assert code == 0 and json.loads(out)["abortRequested"] is True
    code, out, _ = cli("tail", job_id)
    assert code == 2, out
    assert "canceled" in out


def test_tail_exits_3_for_a_job_it_cannot_see(cli: Any) -> None:
    code, _, err = cli("tail", "no-such-job-anywhere")
    assert code == 3 and "not_found" in err


def test_enqueue_with_follow_list_and_show(cli: Any, tmp_path: Path) -> None:
    body = tmp_path / "payload.json"
    body.write_text(json.dumps({"message": "from a file", "authContext": AUTH}))
    code, out, _ = cli(
        "enqueue",
        handlers.ECHO,
        "--kind",
        "factory.run",
        "--payload",
        f"@{body}",
        "--job-id",
        "cli-1",
        "--follow",
    )
    assert code == 0, out
    assert "completed" in out and "from a file" in out
    code, out, _ = cli("show", "cli-1")
    assert code == 0 and json.loads(out)["result"]["echo"] == "from a file"
    code, out, _ = cli("list", "--agent", handlers.ECHO, "--status", "completed", "--limit", "100")
    assert code == 0 and "cli-1" in out
    code, out, _ = cli("enqueue", handlers.ECHO, "--kind", "factory.run", "--payload", "[1]")
    assert code == 2 and "must be a JSON object" not in out  # usage errors go to stderr


def test_enqueue_refused_names_the_field(cli: Any) -> None:
    code, _, err = cli(
        "enqueue", handlers.ECHO, "--kind", "nope", "--payload", json.dumps({"authContext": AUTH})
    )
    assert code == 1 and "invalid_field" in err
