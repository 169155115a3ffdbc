"""Secrets are declared, not listed: no secret setting ever shows, in any output of a running stack.

Every setting marked secret, and the password and query string of every URL setting, is set to a
text holding one marker; the marker is fresh for each run. ``receipt up`` then runs the whole
stack (web, driver, the three worker groups, beat) on PostgreSQL and on a Redis that requires
its password. The test exercises it:

- the CLI: config (JSON and the README table), migrate, verify, token create/list, callbacks
  and logs;
- the JSON API: an enqueue, reads, and error answers (404, 400, 401);
- the dashboard's HTML pages, the system page signed in with a system token;
- ``/metrics``, scraped with a system token and with the metrics token itself;
- callbacks: one target answers and checks the bearer token and the signature (so the secrets
  were really in use); the other is down, so the sender records and logs the HTTP client's error
  naming the URL;
- handlers that log, and fail quoting, every secret they hold, once as a HandlerError and once
  as a crash with a traceback.

Every output and every log file the processes wrote is then searched for the marker: no hit.
"""

from __future__ import annotations

import json
import queue as queue_module
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select
from sqlalchemy.engine import make_url
from standardwebhooks.webhooks import Webhook

from app.config import SETTINGS
from app.ops.supervisor import STOP_GRACE_S
from app.storage.db import callback_outbox, make_engine
from devharness import handlers
from tests.support.processes import REPO_ROOT, Harness, base_env, descendants_of, pid_alive
from tests.support.services import RedisServer
from tests.support.waiting import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

TOKEN_LINE = re.compile(r"Dev token \(organization 'dev'\): (\S+)")
SUPERVISED = 6
RECEIPT = REPO_ROOT / ".venv" / "bin" / "receipt"


@dataclass(frozen=True)
class Call:
    """One request the sink received."""

    path: str
    headers: dict[str, str]
    body: bytes


@pytest.fixture
def sink() -> Iterator[tuple[str, queue_module.Queue[Call]]]:
    """A callback target that answers 204 and keeps what it received."""
    received: queue_module.Queue[Call] = queue_module.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received.put(Call(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()
    thread.join(5)


def marked_settings(marker: str, database_url: str, redis_url: str, sink: str) -> dict[str, str]:
    """Every secret setting, and the password and query of every URL setting, holding ``marker``.

    Derived from the declarations, so a secret or URL setting added later is covered here too.
    """
    dead = free_port()  # nothing listens: every call to it fails
    env: dict[str, str] = {}
    for s in SETTINGS:
        if s.secret:
            env[s.env] = f"{marker}-{s.attr}"
        elif s.url:
            env[s.env] = f"http://user:{marker}-{s.attr}@127.0.0.1:{dead}/{s.attr}?token={marker}-q-{s.attr}"
    env["DATABASE_URL"] = make_url(database_url).set(password=f"{marker}-db").render_as_string(False)
    env["REDIS_URL"] = redis_url
    # The one target that answers: its query token is secret too, and it checks what it gets.
    env["RECEIPT_EVENT_CALLBACK_URL"] = f"{sink}/events?token={marker}-events"
    return env


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_no_secret_reaches_any_output_or_log_of_a_running_stack(
    harness: Harness,
    pg_database_url: str,
    tmp_path: Path,
    sink: tuple[str, queue_module.Queue[Call]],
    log_format: str,
) -> None:
    assert RECEIPT.exists(), f"{RECEIPT} is not installed"
    marker = f"mk{secrets.token_hex(8)}"
    sink_url, received = sink
    redis = RedisServer(harness, password=f"{marker}-redis")
    redis.start()
    home = tmp_path / "home"
    marked = marked_settings(marker, pg_database_url, redis.url, sink_url)
    env = base_env(RECEIPT_HOME=str(home), RECEIPT_LOG_FORMAT=log_format, **marked)
    outputs: dict[str, str] = {}  # everything the test saw, by where it came from

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(RECEIPT), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        outputs[f"receipt {' '.join(args)}"] = done.stdout + done.stderr
        assert done.returncode == 0, done.stderr
        return done

    # -- the CLI, before and around the stack
    shown = json.loads(cli("config").stdout)
    assert shown["callback_secret"] == "***" and shown["metrics_token"] == "***"
    assert shown["redis_url"].startswith("redis://:***@")
    cli("config", "--markdown")
    assert "database at revision" in cli("migrate").stderr
    system = cli("token", "create", "--org", "ops", "--system").stdout.strip()
    cli("token", "list")

    port = free_port()
    up = harness.start("receipt-up", [str(RECEIPT), "up", "--port", str(port)], env, cwd=tmp_path)
    wait_for(lambda: "Press Ctrl-C" in up.log() or not up.alive(), 120, interval=0.25, what="the banner")
    assert up.alive(), up.tail()
    match = TOKEN_LINE.search(up.log())
    assert match, up.tail()
    dev = match.group(1)
    children = wait_for(
        lambda: found if len(found := descendants_of(up.pid)) >= SUPERVISED else None,
        30,
        what="the supervised processes",
    )
    harness.adopted.extend(children)

    base = f"http://127.0.0.1:{port}"
    http = requests.Session()

    def call(method: str, path: str, token: str | None = dev, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = http.request(method, base + path, headers=headers, timeout=15, **kwargs)
        outputs[f"{method} {path} ({r.status_code})"] = r.text + json.dumps(dict(r.headers))
        return r

    def post_job(agent: str, payload: dict[str, Any]) -> str:
        body = {
            "payload": {
                "kind": "factory.run",
                "authContext": {"userId": "u", "organizationId": "dev"},
                **payload,
            },
            "maxAttempts": 1,
        }
        r = call("POST", f"/agents/{agent}/jobs", json=body)
        assert r.status_code == 202, r.text
        job_id: str = r.json()["job"]["id"]
        return job_id

    def settled(job_id: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job: dict[str, Any] = call("GET", f"/jobs/{job_id}").json()["job"]
            return job if job["status"] in ("completed", "failed", "canceled") else None

        return wait_for(check, 60, interval=0.25, what=f"job {job_id} to settle")

    # -- the JSON API, and handlers that quote every secret they hold
    echo = post_job(handlers.ECHO, {"message": "hello"})
    leaky = post_job(handlers.LEAKY, {"raise": "handler"})
    crash = post_job(handlers.LEAKY, {"raise": "crash"})
    assert settled(echo)["status"] == "completed"
    for job_id in (leaky, crash):
        job = settled(job_id)
        assert job["status"] == "failed", job
        # The failure quoted every secret; what the receipt keeps says where they were.
        assert "leaky: " in job["error"] and "***" in job["error"], job["error"]
    call("GET", "/jobs")
    call("GET", f"/jobs/{leaky}/receipts")
    assert call("GET", "/jobs/no-such-job").status_code == 404
    assert call("POST", f"/agents/{handlers.ECHO}/jobs", json={"payload": "not an object"}).status_code == 400
    assert call("GET", "/jobs", token=f"{marker}-not-a-token").status_code == 401
    call("GET", "/readyz")

    # -- /metrics, with a system token and with the metrics token itself
    assert call("GET", "/metrics", token=system).status_code == 200
    assert call("GET", "/metrics", token=marked["RECEIPT_METRICS_TOKEN"]).status_code == 200

    # -- the dashboard, signed in with the system token
    ui = requests.Session()
    signed = ui.post(f"{base}/ui/signin", data={"token": system}, allow_redirects=False, timeout=15)
    assert signed.status_code == 302, signed.text
    # A system token names the organisation of the jobs it opens (they are the dev token's).
    jobs_of_dev = (f"/ui/jobs/{leaky}?organizationId=dev", f"/ui/jobs/{crash}?organizationId=dev")
    for path in ("/ui/jobs", *jobs_of_dev, "/ui/objectives", "/ui/system"):
        page = ui.get(base + path, timeout=30)
        outputs[f"GET {path} ({page.status_code})"] = page.text
        assert page.status_code == 200, path
    system_page = outputs["GET /ui/system (200)"]
    assert 'data-setting="RECEIPT_METRICS_TOKEN"' in system_page and "***" in system_page

    # -- callbacks: the answering target got signed, authorised calls (the secrets were in use) ...
    call_ = received.get(timeout=60)
    assert call_.headers["authorization"] == f"Bearer {marked['RECEIPT_CALLBACK_TOKEN']}"
    Webhook(marked["RECEIPT_CALLBACK_SECRET"].encode()).verify(call_.body, call_.headers)
    # ... and the sender recorded the down target's failure (the HTTP client's error names the URL).
    engine = make_engine(pg_database_url)
    try:

        def failed_rows() -> list[Any] | None:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(callback_outbox.c.last_error).where(callback_outbox.c.last_error.is_not(None))
                ).all()
            return list(rows) or None

        rows = wait_for(failed_rows, 60, interval=0.25, what="a failed callback attempt")
    finally:
        engine.dispose()
    assert all(marker not in str(r.last_error) for r in rows)
    assert any("/callback_url?***" in str(r.last_error) for r in rows), rows
    cli("callbacks")
    cli("verify")
    cli("logs", "-n", "200")

    # -- stop the stack (its shutdown lines are written too), then search everything
    everyone = sorted(set(children) | set(descendants_of(up.pid)))
    harness.adopted.extend(everyone)
    up.popen.send_signal(signal.SIGINT)
    assert up.popen.wait(timeout=STOP_GRACE_S + 20) == 0, up.tail()
    wait_for(lambda: not any(pid_alive(p) for p in everyone), 10, what="every child to exit")

    log_files = sorted((home / "logs").glob("*.log*"))
    assert {p.stem for p in log_files} >= {"web", "driver", "chat", "codex", "control", "beat"}
    written = {str(p): p.read_text(errors="replace") for p in log_files}
    # The supervisor's own output, and every process this test started but the Redis server
    # (whose command line holds its password: it is the test's service, not Receipt).
    written.update({str(p.log_path): p.log() for p in harness.procs if not p.service})
    leaks = [where for where, text in {**outputs, **written}.items() if marker in text]
    assert leaks == [], f"the marker {marker} appears in: {leaks}"
    # The redaction really ran on the lines that held the secrets.
    chat = written[str(home / "logs" / "chat.log")]
    assert "leaky handler holds" in chat and "RuntimeError: leaky: " in chat, chat[-3000:]
    assert "***" in chat
