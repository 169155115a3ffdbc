"""The client and ``receipt jobs`` against the real API over HTTP (PostgreSQL, limits counted in Redis).

A werkzeug server runs ``api.app.create_app`` in this process (no workers: nothing here needs a job to
run). Two things are checked end to end: ``authContext`` filled in from the token (and the server
still refusing another organisation's), and a write limit small enough to be hit in a second,
which the client and the CLI wait out by themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from werkzeug.serving import make_server

from api.app import create_app
from app.config import Settings
from app.jobs.privilege import COMMANDS_SCOPE
from app.ops.cli import main as receipt_main
from app.storage import tokens
from receipt.client import AuthError, Client, RateLimited, RetryNotice
from receipt.retry import RetryPolicy

ORG = "org-http"
Serve = Callable[[str], str]


@pytest.fixture
def serve(pg_engine: Engine, redis_url: str, tmp_path: Path) -> Iterator[Serve]:
    """``serve(rate)``: the API on a free port with that write limit; its URL."""
    servers = []

    def start(rate: str) -> str:
        settings = Settings(home=str(tmp_path / "home"), redis_url=redis_url, rate_limit_writes=rate)
        app = create_app(settings, engine=pg_engine, on_dispatchable=lambda jobs: None)
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server, thread in servers:
        server.shutdown()
        thread.join(10)


@pytest.fixture
def token(pg_engine: Engine) -> tuple[str, str]:
    """A token of ORG that may run commands: (its id, its secret)."""
    info, secret = tokens.create(pg_engine, ORG, scopes=(COMMANDS_SCOPE,))
    return info.id, secret


def cli_env(monkeypatch: pytest.MonkeyPatch, url: str, secret: str) -> None:
    monkeypatch.setenv("RECEIPT_URL", url)
    monkeypatch.setenv("RECEIPT_TOKEN", secret)
    monkeypatch.delenv("RECEIPT_USER", raising=False)


# -- authContext from the token ------------------------------------------------------------------


def test_the_client_fills_auth_context_from_the_token_and_keeps_an_explicit_one(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECEIPT_USER", raising=False)
    token_id, secret = token
    client = Client(serve("disabled"), token=secret)
    assert client.whoami() == {
        "organizationId": ORG,
        "tokenId": token_id,
        "system": False,
        "scopes": ["commands"],
    }
    job = client.enqueue("codex", {"kind": "factory.task.run", "command": ["echo", "hello"]})["job"]
    assert job["payload"]["authContext"] == {"userId": f"token:{token_id}", "organizationId": ORG}
    as_alice = Client(client.url, token=secret, user="alice")
    job = as_alice.enqueue("factory", {"kind": "factory.run"})["job"]
    assert job["payload"]["authContext"] == {"userId": "alice", "organizationId": ORG}
    mine = {"userId": "me", "organizationId": ORG, "source": "script"}
    assert (
        client.enqueue("factory", {"kind": "factory.run", "authContext": mine})["job"]["payload"][
            "authContext"
        ]
        == mine
    )


def test_a_payload_naming_another_organisation_is_still_refused_by_the_server(
    serve: Serve, token: tuple[str, str]
) -> None:
    client = Client(serve("disabled"), token=token[1])
    with pytest.raises(AuthError) as refused:
        client.enqueue(
            "factory", {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "other"}}
        )
    assert refused.value.status == 403 and refused.value.code == "forbidden"
    assert "authContext.organizationId" in refused.value.message


def test_the_banners_command_job_enqueues_as_printed(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token_id, secret = token
    url = serve("disabled")
    cli_env(monkeypatch, url, secret)
    argv = [
        "jobs",
        "enqueue",
        "codex",
        "--kind",
        "factory.task.run",
        "--payload",
        '{"command":["echo","hello"]}',
    ]
    assert receipt_main([*argv, "-q"]) == 0
    job_id = capsys.readouterr().out.strip()
    job = Client(url, token=secret).get(job_id)
    assert job["payload"]["authContext"] == {"userId": f"token:{token_id}", "organizationId": ORG}
    assert receipt_main([*argv, "-q", "--user", "bob"]) == 0
    assert (
        Client(url, token=secret).get(capsys.readouterr().out.strip())["payload"]["authContext"]["userId"]
        == "bob"
    )


# -- limits waited out ---------------------------------------------------------------------------


def test_a_loop_past_a_tiny_write_limit_all_lands_with_retrying_on_by_default(
    serve: Serve, token: tuple[str, str]
) -> None:
    url = serve("4/second")
    notices: list[RetryNotice] = []
    client = Client(url, token=token[1], on_retry=notices.append)
    ids = [client.enqueue("factory", {"kind": "factory.run", "n": n})["job"]["id"] for n in range(12)]
    assert len(set(ids)) == 12
    assert len(client.list(agentId="factory", limit=100)["jobs"]) == 12
    # Twelve writes at four a second cannot all fit one window: the limit was hit and waited out.
    assert len(notices) >= 2
    assert all(n.status == 429 and n.code == "rate_limited" and n.wait >= 1.0 for n in notices)
    # The same loop without retrying is refused.
    bare = Client(url, token=token[1], retry=None)
    with pytest.raises(RateLimited) as refused:
        for n in range(12):
            bare.enqueue("factory", {"kind": "factory.run", "n": n})
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1


def test_the_cli_waits_out_the_limit_saying_so_and_no_retry_fails_at_once(
    serve: Serve,
    token: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = serve("2 per 3 seconds")
    cli_env(monkeypatch, url, token[1])
    bare = Client(url, token=token[1], retry=RetryPolicy(max_tries=1))

    def use_up_the_window() -> None:
        with pytest.raises(RateLimited):
            for _ in range(3):
                bare.enqueue("factory", {"kind": "factory.run"})

    use_up_the_window()
    argv = ["jobs", "enqueue", "factory", "--kind", "factory.run", "-q"]
    assert receipt_main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip() and "rate limited (429 rate_limited): trying again in" in out.err
    use_up_the_window()
    assert receipt_main([*argv, "--no-retry"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "rate_limited" in out.err and "trying again" not in out.err
