"""The client and ``receipt jobs`` against the real API over HTTP (PostgreSQL, limits counted in Redis).

A werkzeug server runs ``api.app.create_app`` in this process (no workers: nothing here needs a job to
run). Two things are checked end to end: ``authContext`` filled in from the token (and the server
still refusing another organisation's), and a write limit small enough to be hit in a second,
which the client and the CLI wait out by themselves.
"""

from __future__ import annotations

import json
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
        settings = Settings(
            home=str(tmp_path / "home"), redis_url=redis_url, rate_limit_writes=rate, codex_commands=True
        )
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


def test_enqueue_without_kind_posts_the_kind_a_deployments_own_handlers_take(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README, "Using it": a handler registered by RECEIPT_HANDLER_MODULES takes factory.run."""
    _token_id, secret = token
    url = serve("disabled")
    cli_env(monkeypatch, url, secret)
    assert receipt_main(["jobs", "enqueue", "my-agent", "--payload", '{"message": "hi"}', "-q"]) == 0
    job = Client(url, token=secret).get(capsys.readouterr().out.strip())
    assert (job["agentId"], job["payload"]["kind"], job["payload"]["message"]) == (
        "my-agent",
        "factory.run",
        "hi",
    )


def test_enqueue_sends_the_flow_options_and_the_server_names_a_bad_one(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _token_id, secret = token
    url = serve("disabled")
    cli_env(monkeypatch, url, secret)
    base = ["jobs", "enqueue", "my-agent", "--no-retry"]
    flow = ["--priority", "-4", "--concurrency-key", "crm", "--concurrency-limit", "2"]
    assert receipt_main([*base, *flow, "--debounce-key", "sync", "--debounce-ms", "1500"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert (job["priority"], job["concurrencyKey"], job["concurrencyLimit"]) == (-4, "crm", 2)
    assert job["debounce"] == {"key": "sync", "windowMs": 1500} and job["availableAt"] is not None
    # The server names what it refuses; the two debounce options go together.
    assert receipt_main([*base, "--priority", "11"]) != 0
    assert "priority" in capsys.readouterr().err
    assert receipt_main([*base, "--debounce-key", "sync", "--debounce-ms", "0"]) != 0
    assert "debounce.windowMs" in capsys.readouterr().err
    assert receipt_main([*base, "--debounce-key", "sync"]) == 2
    assert "--debounce-ms" in capsys.readouterr().err


def test_jobs_list_at_80_columns_shows_every_id_whole(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Columns are dropped from the right before an id is cut short."""
    _token_id, secret = token
    url = serve("disabled")
    cli_env(monkeypatch, url, secret)
    client = Client(url, token=secret)
    ids = [client.enqueue("a-rather-long-agent-name", {"kind": "factory.run"})["job"]["id"] for _ in range(2)]
    monkeypatch.setenv("COLUMNS", "80")
    assert receipt_main(["jobs", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert all(any(job_id in line for line in lines) for job_id in ids), lines
    assert "…" not in "".join(lines)
    assert "agent" in lines[1] and "not before" not in lines[1]  # the header: right-hand columns left out
    monkeypatch.setenv("COLUMNS", "250")
    assert receipt_main(["jobs", "list"]) == 0
    assert "not before" in capsys.readouterr().out  # every column when there is room


def test_jobs_waiting_lists_queued_jobs_with_why_each_waits(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No worker offers a slot here: each queued job waits for its organisation's turn (``share``);
    a delayed one waits for its time; ``--json`` is the page itself."""
    _token_id, secret = token
    url = serve("disabled")
    cli_env(monkeypatch, url, secret)
    client = Client(url, token=secret)
    now = client.enqueue("factory", {"kind": "factory.run"})["job"]["id"]
    later = client.enqueue("factory", {"kind": "factory.run"}, delayMs=3_600_000)["job"]["id"]
    monkeypatch.setenv("COLUMNS", "200")
    assert receipt_main(["jobs", "waiting"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [mine] = [line for line in lines if now in line]
    [delayed] = [line for line in lines if later in line]
    assert " share " in f" {mine} " and "not before" in delayed
    assert receipt_main(["jobs", "waiting", "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert {j["id"]: j.get("waiting") for j in page["jobs"]} == {
        now: {"reason": "share", "key": None},
        later: None,
    }


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


# -- bulk enqueue --------------------------------------------------------------------------------


def test_enqueue_many_sends_batches_fills_auth_context_and_numbers_every_item(
    serve: Serve, token: tuple[str, str]
) -> None:
    client = Client(serve("disabled"), token=token[1])
    items = [
        {"agentId": "factory", "jobId": f"bulk-{n}", "payload": {"kind": "factory.run"}} for n in range(5)
    ]
    answered = client.enqueue_many(items, batch_size=2)  # three requests: 2 + 2 + 1
    assert [e["index"] for e in answered] == [0, 1, 2, 3, 4]
    assert [e["job"]["id"] for e in answered] == [f"bulk-{n}" for n in range(5)]
    assert all(e["created"] and e["job"]["payload"]["authContext"]["organizationId"] == ORG for e in answered)
    again = client.enqueue_many(items, batch_size=5)  # idempotent by jobId
    assert [e["created"] for e in again] == [False] * 5


def test_the_cli_enqueues_a_json_lines_file(
    serve: Serve,
    token: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    cli_env(monkeypatch, serve("disabled"), token[1])
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        '{"agentId": "factory", "jobId": "file-1", "payload": {"kind": "factory.run"}}\n'
        "\n"
        '{"agentId": "factory", "payload": {"kind": "factory.run"}, "lane": "chat"}\n'
    )
    assert receipt_main(["jobs", "enqueue", "--from", str(lines)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["index"], p["created"], p["status"]) for p in printed] == [
        (0, True, "queued"),
        (1, True, "queued"),
    ]
    assert printed[0]["id"] == "file-1"
    assert receipt_main(["jobs", "enqueue", "--from", str(lines), "-q"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "file-1"  # re-posted: the same job
    lines.write_text('{"agentId": "factory", "payload": {"kind": "factory.run"}}\nnot json\n')
    assert receipt_main(["jobs", "enqueue", "--from", str(lines)]) == 2
    assert "line 2 is not valid JSON" in capsys.readouterr().err


# -- delayed jobs --------------------------------------------------------------------------------


def test_delayed_jobs_from_the_client_and_the_cli(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime, timedelta

    from app.storage.db import parse_iso

    url = serve("disabled")
    client = Client(url, token=token[1])
    at = datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert client.enqueue("factory", {"kind": "factory.run"}, run_at=at)["job"]["availableAt"] == (
        "2099-01-02T03:04:05.000000Z"
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        client.enqueue("factory", {"kind": "factory.run"}, run_at=datetime(2099, 1, 2))
    cli_env(monkeypatch, url, token[1])
    base = ["jobs", "enqueue", "factory", "--kind", "factory.run", "-q"]
    assert receipt_main([*base, "--in", "1h30m"]) == 0
    job = client.get(capsys.readouterr().out.strip())
    waited = parse_iso(job["availableAt"]) - parse_iso(job["createdAt"])  # type: ignore[operator]
    assert waited == timedelta(hours=1, minutes=30)
    assert receipt_main([*base, "--at", "2099-06-01T12:00:00+02:00"]) == 0
    assert client.get(capsys.readouterr().out.strip())["availableAt"] == "2099-06-01T10:00:00.000000Z"
    # Bad values are refused before anything is sent, naming the option.
    assert receipt_main([*base, "--in", "soon"]) == 2
    assert "--in" in capsys.readouterr().err
    assert receipt_main([*base, "--in", "5m", "--at", "2099-06-01T12:00:00Z"]) == 2


# -- schedules -----------------------------------------------------------------------------------


def test_schedules_from_the_client_and_the_cli(
    serve: Serve, token: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    url = serve("disabled")
    client = Client(url, token=token[1])
    made = client.create_schedule(
        {
            "scheduleId": "hourly",
            "cron": "0 * * * *",
            "job": {"agentId": "factory", "payload": {"kind": "factory.run"}},
        }
    )
    assert made["job"]["payload"]["authContext"] == {"userId": f"token:{token[0]}", "organizationId": ORG}
    assert client.schedule("hourly")["cron"] == "0 * * * *"
    assert client.update_schedule("hourly", overlap="allow")["overlap"] == "allow"
    cli_env(monkeypatch, url, token[1])
    monkeypatch.setenv("COLUMNS", "250")  # rich draws its tables to this width
    assert (
        receipt_main(
            [
                "schedules",
                "create",
                "weekday-report",
                "--cron",
                "0 9 * * 1-5",
                "--tz",
                "Europe/Paris",
                "--agent",
                "factory",
                "--kind",
                "factory.run",
                "--payload",
                '{"goal": "report"}',
                "--catchup",
                "10m",
            ]
        )
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    assert (created["id"], created["timeZone"], created["catchupWindowMs"]) == (
        "weekday-report",
        "Europe/Paris",
        600_000,
    )
    assert receipt_main(["schedules", "list"]) == 0
    listing = capsys.readouterr().out
    assert "weekday-report" in listing and "hourly" in listing and "Europe/Paris" in listing
    assert receipt_main(["schedules", "trigger", "weekday-report", "-q"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert job_id.startswith("weekday-report:") and client.get(job_id)["payload"]["goal"] == "report"
    # Its job is still queued (no worker here): under skip, a second trigger is skipped, exit 1.
    assert receipt_main(["schedules", "trigger", "weekday-report", "-q"]) == 1
    assert capsys.readouterr().out == ""
    span = ["--from", "2026-01-05T00:00:00Z", "--to", "2026-01-07T23:00:00Z"]
    assert receipt_main(["schedules", "backfill", "weekday-report", *span]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(first["created"]) == 3 and first["existing"] == []
    assert receipt_main(["schedules", "backfill", "weekday-report", *span]) == 0
    assert json.loads(capsys.readouterr().out) == {"created": [], "existing": first["created"]}
    assert receipt_main(["schedules", "fires", "weekday-report"]) == 0
    fires = capsys.readouterr().out
    assert "fired" in fires and "skipped" in fires and "queued" in fires
    assert receipt_main(["schedules", "pause", "weekday-report", "--reason", "holiday"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "paused"
    assert receipt_main(["schedules", "resume", "weekday-report"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "active"
    assert receipt_main(["schedules", "delete", "weekday-report"]) == 0
    capsys.readouterr()
    assert receipt_main(["schedules", "show", "weekday-report"]) == 1
    assert "not_found" in capsys.readouterr().err
    # Bad input is named before anything is sent.
    assert receipt_main(["schedules", "create", "x", "--agent", "factory", "--kind", "factory.run"]) == 2
    assert "--cron or --every" in capsys.readouterr().err


# -- tags, search and replay ---------------------------------------------------------------------


def test_the_cli_tags_lists_by_filter_and_replays(
    serve: Serve,
    token: tuple[str, str],
    pg_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = serve("disabled")
    cli_env(monkeypatch, url, token[1])
    base = ["jobs", "enqueue", "factory", "--kind", "factory.run", "-q"]
    assert receipt_main([*base, "--tag", "customer:acme", "--tag", "run:7"]) == 0
    tagged = capsys.readouterr().out.strip()
    assert receipt_main(base) == 0
    capsys.readouterr()
    assert receipt_main(["jobs", "list", "--tag", "customer:acme", "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [j["id"] for j in page["jobs"]] == [tagged]
    assert page["jobs"][0]["tags"] == {"customer": "acme", "run": "7"}
    # A bad filter: the server's 400 naming it, exit 1.
    assert receipt_main(["jobs", "list", "--kind", "nope"]) == 1
    assert "kind" in capsys.readouterr().err
    from app.composition import queue_for

    queue = queue_for(pg_engine)
    try:
        queue.fail(f"{ORG}/{tagged}", None, None, "command exited with 1", retryable=False)
    finally:
        queue.close()
    assert (
        receipt_main(["jobs", "list", "--error-prefix", "command exited", "--status", "failed", "--json"])
        == 0
    )
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == [tagged]
    assert receipt_main(["jobs", "replay", tagged, "--replay-key", "again"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["created"] is True and first["replayOf"] == tagged
    assert first["job"]["tags"] == {"customer": "acme", "run": "7"}
    assert receipt_main(["jobs", "replay", tagged, "--replay-key", "again"]) == 0
    retried = json.loads(capsys.readouterr().out)
    assert retried["created"] is False and retried["job"]["id"] == first["job"]["id"]


def test_the_cli_shows_dead_letters_and_replays_them(
    serve: Serve,
    token: tuple[str, str],
    pg_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = serve("disabled")
    cli_env(monkeypatch, url, token[1])
    from app.composition import queue_for

    ids = []
    for _ in range(2):
        assert (
            receipt_main(["jobs", "enqueue", "factory", "--kind", "factory.run", "--tag", "dl:cli", "-q"])
            == 0
        )
        ids.append(capsys.readouterr().out.strip())
    queue = queue_for(pg_engine)
    try:
        for job_id in ids:
            queue.fail(f"{ORG}/{job_id}", None, None, "command exited with 3", retryable=False)
    finally:
        queue.close()
    assert receipt_main(["jobs", "dead-letters", "--error-prefix", "command exited with 3", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["total"] == 2 and view["groups"][0]["errors"] == [
        {"error": "command exited with 3", "count": 2}
    ]
    assert receipt_main(["jobs", "dead-letters", "--error-prefix", "command exited with 3"]) == 0
    assert "command exited with 3" in capsys.readouterr().out
    argv = ["jobs", "dead-letters", "--error-prefix", "command exited with 3", "--replay", "cli-dl"]
    assert receipt_main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["affected"] == 2
    assert receipt_main(argv) == 0  # again: the same pages, nothing replayed twice
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["affected"] == 2
    operation = Client().operation("cli-dl")["operation"]  # the progress, from its audit stream
    assert (operation["action"], operation["affected"], operation["done"]) == ("replay", 2, True)
    assert receipt_main(["jobs", "list", "--tag", "dl:cli", "--status", "queued", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["jobs"]) == 2
