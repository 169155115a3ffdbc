"""``/metrics``: who may scrape, and that the counters move with jobs.

In-process (single-process registry); the multiprocess path — gunicorn and the Celery workers
adding up one folder — is scraped end to end in tests/e2e/test_one_command_run.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.storage import loop_claims
from tests.support.api import LEASE_MS, WORKER, Api, build_api, key, make_settings
from tests.support.queue_ops import lease

SCRAPE_SECRET = "scrape-secret-for-tests"


@pytest.fixture
def metrics_api(sqlite_engine, tmp_path: Path):  # type: ignore[no-untyped-def]
    built = build_api(sqlite_engine, make_settings(tmp_path, metrics_token=SCRAPE_SECRET))
    yield built
    assert built.state.internal_errors == 0


def scrape(api: Api, secret: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = api.client.get("/metrics", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "text/plain"
    samples = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_histograms_and_job_gauges_move_after_a_few_jobs(metrics_api: Api) -> None:
    api = metrics_api
    before = scrape(api, SCRAPE_SECRET)
    done = key(api.job(agent="factory"))
    failed = key(api.job(agent="factory", maxAttempts=1))
    queued = key(api.job(agent="codex", lane="chat"))
    attempt = api.lease_and_start(done)
    assert api.queue.settle_attempt(done, WORKER, attempt, result={"ok": True}).applied
    attempt = api.lease_and_start(failed)
    settled = api.queue.settle_attempt(failed, WORKER, attempt, error="boom", retryable=True, status="failed")
    assert settled.applied and settled.job.status == "failed"  # maxAttempts 1: no retry
    after = scrape(api, api.secrets["system"])

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("receipt_jobs_enqueued_total", lane="collect", group="chat") == 2
    assert moved("receipt_jobs_enqueued_total", lane="chat", group="codex") == 1
    assert moved("receipt_jobs_settled_total", status="completed", group="chat") == 1
    assert moved("receipt_jobs_settled_total", status="failed", group="chat") == 1
    assert moved("receipt_attempt_failures_total", outcome="failed", group="chat") == 1
    assert moved("receipt_job_queue_wait_seconds_count", group="chat") == 2
    assert moved("receipt_job_run_seconds_count", group="chat", status="completed") == 1
    assert moved("receipt_job_run_seconds_count", group="chat", status="failed") == 1
    # The state collector reads the projection: this database holds exactly these three jobs.
    jobs = {"lane": "collect", "agent": "factory", "group": "chat"}
    assert value(after, "receipt_jobs", status="completed", **jobs) == 1
    assert value(after, "receipt_jobs", status="failed", **jobs) == 1
    assert value(after, "receipt_jobs", status="queued", lane="chat", agent="codex", group="codex") == 1
    assert queued


def test_lease_expiry_is_counted(metrics_api: Api) -> None:
    api = metrics_api
    job_id = key(api.job(agent="factory"))
    assert lease(api.queue, job_id, WORKER, 1).applied  # a 1 ms lease: expired at once
    before = scrape(api, SCRAPE_SECRET)
    expired = api.queue.expire_leases()
    assert [j.id for j in expired] == [job_id]
    after = scrape(api, SCRAPE_SECRET)
    expiries = ("receipt_lease_expiries_total", (("group", "chat"),))
    assert after.get(expiries, 0) - before.get(expiries, 0) == 1
    assert LEASE_MS  # the ordinary lease of the other tests, for contrast


def test_loop_runs_are_reported_with_last_success_and_duration(metrics_api: Api) -> None:
    api = metrics_api
    assert loop_claims.claim(api.engine, "lease-expiry", "me", min_interval_ms=0, ttl_ms=1000)
    loop_claims.release(api.engine, "lease-expiry", "me")
    samples = scrape(api, SCRAPE_SECRET)
    assert value(samples, "receipt_loop_last_success_timestamp_seconds", loop="lease-expiry") > 1.7e9
    assert value(samples, "receipt_loop_last_duration_seconds", loop="lease-expiry") >= 0
    assert ("receipt_loop_last_started_timestamp_seconds", (("loop", "lease-expiry"),)) in samples


@pytest.mark.parametrize(
    ("who", "status"),
    [("none", 401), ("bogus", 401), ("a", 403), ("system", 200), ("scraper", 200)],
)
def test_who_may_scrape(metrics_api: Api, who: str, status: int) -> None:
    api = metrics_api
    headers = {
        "none": {},
        "bogus": {"Authorization": "Bearer not-a-token"},
        "a": api.headers("a"),
        "system": api.headers("system"),
        "scraper": {"Authorization": f"Bearer {SCRAPE_SECRET}"},
    }[who]
    response = api.client.get("/metrics", headers=headers)
    assert response.status_code == status, response.get_data(as_text=True)
    if status != 200:
        assert response.json is not None and "error" in response.json


def test_the_metrics_token_opens_nothing_but_metrics(metrics_api: Api) -> None:
    response = metrics_api.client.get("/jobs", headers={"Authorization": f"Bearer {SCRAPE_SECRET}"})
    assert response.status_code == 401


def test_retention_gauges_say_what_is_left_and_the_room_for_segments(sqlite_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        tmp_path, metrics_token=SCRAPE_SECRET, retention_days=30, archive_dir=str(tmp_path / "segs")
    )
    api = build_api(sqlite_engine, settings)
    samples = scrape(api, SCRAPE_SECRET)
    assert ("receipt_oldest_terminal_job_age_seconds", ()) not in samples  # nothing has ended
    assert value(samples, "receipt_archive_free_bytes") > 0
    assert ("receipt_archived_streams_total", (("kind", "job"),)) in samples
    done = key(api.job(agent="factory"))
    attempt = api.lease_and_start(done)
    assert api.queue.settle_attempt(done, WORKER, attempt, result={}).applied
    samples = scrape(api, SCRAPE_SECRET)
    assert 0 <= value(samples, "receipt_oldest_terminal_job_age_seconds") < 60
    # Without a retention window there is no archive to measure.
    plain = build_api(sqlite_engine, make_settings(tmp_path, metrics_token=SCRAPE_SECRET))
    assert ("receipt_archive_free_bytes", ()) not in scrape(plain, SCRAPE_SECRET)


def test_each_request_is_counted_by_method_route_and_status(metrics_api: Api) -> None:
    """RECEIPT_ACCESS_LOG is off by default: ``receipt_http_requests_total`` counts each request
    instead, by its URL rule (not its path, so ids never become labels) and status; a path no
    route matches counts as ``unmatched``."""
    api = metrics_api
    before = scrape(api, SCRAPE_SECRET)
    job = api.job(agent="factory")
    headers = api.headers("a")
    assert api.client.get(f"/jobs/{job['id']}", headers=headers).status_code == 200
    assert api.client.get("/jobs/no-such-job", headers=headers).status_code == 404
    assert api.client.get("/no/such/route", headers=headers).status_code == 404
    after = scrape(api, SCRAPE_SECRET)

    def moved(**labels: str) -> float:
        name = "receipt_http_requests_total"
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved(method="POST", route="/agents/<agentId>/jobs", status="202") == 1
    assert moved(method="GET", route="/jobs/<jobId>", status="200") == 1
    assert moved(method="GET", route="/jobs/<jobId>", status="404") == 1
    assert moved(method="GET", route="unmatched", status="404") == 1
    assert moved(method="GET", route="/metrics", status="200") == 1  # the first scrape
