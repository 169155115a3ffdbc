"""A PostgreSQL restart under the API: every storage outage answers 503 ``unavailable``
with Retry-After, never a 500, and writes nothing partial.

Real PostgreSQL: the API's backends are killed with ``pg_terminate_backend`` while requests run
(what a restart does to a pooled connection: AdminShutdown 57P01, "server closed the connection
unexpectedly", "connection already closed"), with and without ``pool_pre_ping``; and an app is
pointed at a closed port.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.jobs.ids import qualify
from app.jobs.vocab import job_stream
from app.storage import store
from app.storage.db import make_engine
from tests.support.api import ORG_A, Api, build_api, make_settings, payload
from tests.support.stack import terminate_backends
from tests.support.waiting import free_port


def _check_unavailable(response: Any) -> None:
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.get_json()["error"]["code"] == "unavailable"
    assert int(response.headers["Retry-After"]) >= 1


def _whole_or_absent(api: Api, job_id: str) -> bool:
    """True when org A's job ``job_id`` exists, with its projection and exactly its one enqueued
    receipt; False when neither exists. Anything in between is a partial write and fails the test."""
    job_key = qualify(ORG_A, job_id)
    job = api.queue.get(job_key)
    with api.engine.connect() as conn:
        stream = store.read_stream(conn, job_stream(job_key))
    assert (job is None) == (stream == []), (job_id, job, [r.type for r in stream])
    if job is None:
        return False
    assert [r.type for r in stream] == ["job.enqueued"] and job.status == "queued"
    return True


@pytest.mark.parametrize("pre_ping", [True, False], ids=["pre_ping", "no_pre_ping"])
def test_enqueues_while_the_apis_backends_are_terminated_answer_202_or_503(
    pg_admin: Engine, pg_database_url: str, tmp_path: Path, pre_ping: bool
) -> None:
    engine = make_engine(pg_database_url, pool_pre_ping=pre_ping, pool_size=4, max_overflow=0)
    # The organisation's write limit is not under test here (it answers 429 at this rate).
    api = build_api(engine, make_settings(tmp_path, rate_limit_writes="disabled"))
    outcomes: dict[str, int] = {}
    bad: list[tuple[int, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        http = api.app.test_client()
        i = 0
        while not stop.is_set():
            job_id = f"outage-{n}-{i}"
            i += 1
            r = http.post(
                "/agents/factory/jobs",
                json={"jobId": job_id, "payload": payload()},
                headers=api.headers(),
            )
            with lock:
                outcomes[job_id] = r.status_code
                if r.status_code == 503:
                    try:
                        _check_unavailable(r)
                    except AssertionError as exc:
                        bad.append((r.status_code, str(exc)))
                elif r.status_code != 202:
                    bad.append((r.status_code, r.get_data(as_text=True)))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    killed = 0
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:  # the fault: a restart's worth of dead connections
            killed += terminate_backends(pg_admin, pg_database_url)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    try:
        counts = Counter(outcomes.values())
        print(f"\n[pre_ping={pre_ping}] {dict(counts)}, {killed} backends terminated")
        assert bad == [], bad[:5]
        assert api.state.internal_errors == 0
        assert killed > 0 and counts[503] > 0 and counts[202] > 0, counts
        for job_id, status in outcomes.items():
            exists = _whole_or_absent(api, job_id)
            if status == 202:
                assert exists, f"{job_id} answered 202 but does not exist"
    finally:
        engine.dispose()


def test_a_dead_pooled_connection_without_pre_ping_is_503_not_500(
    pg_admin: Engine, pg_database_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_database_url, pool_pre_ping=False, pool_size=2, max_overflow=0)
    api = build_api(engine, make_settings(tmp_path))
    try:
        assert api.enqueue(jobId="warm").status_code == 202  # the pool now holds a connection
        assert terminate_backends(pg_admin, pg_database_url) >= 1
        first = api.enqueue(jobId="after-kill")
        assert first.status_code in (202, 503), first.get_data(as_text=True)
        if first.status_code == 503:
            _check_unavailable(first)
        assert _whole_or_absent(api, "after-kill") == (first.status_code == 202)
        again = api.enqueue(jobId="after-kill")  # the client's retry, same jobId: now it succeeds
        assert again.status_code in (200, 202), again.get_data(as_text=True)
        assert _whole_or_absent(api, "after-kill")
        assert api.state.internal_errors == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("path", ["/agents/factory/jobs", "/jobs/some-job"])
def test_an_app_pointed_at_a_closed_port_answers_503(pg_engine: Engine, tmp_path: Path, path: str) -> None:
    api = build_api(pg_engine, make_settings(tmp_path))  # tokens are created on the real database
    dead = make_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/receipt")
    try:
        from api.app import create_app

        app = create_app(make_settings(tmp_path), engine=dead, on_dispatchable=lambda jobs: None)
        http = app.test_client()
        if path.startswith("/agents"):
            r = http.post(path, json={"payload": payload()}, headers=api.headers())
        else:
            r = http.get(path, headers=api.headers())
        _check_unavailable(r)
    finally:
        dead.dispose()
