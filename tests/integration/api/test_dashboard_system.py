"""The dashboard's reads (app.storage.overview), its system page, and its objective pages.

Overview queries run on SQLite and PostgreSQL; the broker probe runs against a real Redis.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from api.ui import objectives as ui_objectives
from api.ui.objective_views import FINDER_EXTENSION
from api.ui.system import BrokerReport, QueueOverview, QueueStat, queue_roles
from api.ui.system_views import PROBE_EXTENSION
from app.config import Settings
from app.jobs.routing import worker_group_for
from app.jobs.vocab import WORKER_GROUPS
from app.storage import delivery, loop_claims, overview
from app.storage.db import db_now, transaction
from delivery.client import consumers_by_queue
from tests.integration.api.test_dashboard import sign_in, text
from tests.support.api import ORG_A, ORG_B, WORKER, Api, build_api, key, make_settings, payload
from tests.support.queue_ops import lease
from tests.unit.test_ui_graph import DIAMOND

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

AGENTS = ("codex", "factory-control", "factory", "someone-else")
KINDS = ("factory.integration.publish", "factory.run", "factory.objective.control", "factory.task.run")


def test_the_worker_group_filter_is_exactly_the_routing_rule(api: Api) -> None:
    expected: dict[str, set[str]] = {g: set() for g in WORKER_GROUPS}
    for agent in AGENTS:
        for kind in KINDS:
            # A system token: codex task runs need the `commands` scope.
            job = api.job("system", agent=agent, payload=payload(kind))
            expected[worker_group_for(agent, kind)].add(key(job))
    scope = overview.Scope(ORG_A)
    with api.engine.connect() as conn:
        for group in WORKER_GROUPS:
            page = overview.list_jobs(conn, scope, overview.JobFilter(worker_group=group), limit=100)
            assert {j.id for j in page.jobs} == expected[group], group
    assert sum(len(v) for v in expected.values()) == len(AGENTS) * len(KINDS)


def test_status_counts_are_scoped(api: Api) -> None:
    api.job("a")
    api.job("a")
    canceled = api.job("b")
    api.queue.cancel(key(canceled))
    with api.engine.connect() as conn:
        mine = overview.status_counts(conn, overview.Scope(ORG_A), overview.JobFilter())
        everyone = overview.status_counts(conn, overview.Scope(None, True), overview.JobFilter())
        only_b = overview.status_counts(
            conn, overview.Scope(None, True), overview.JobFilter(organization_id=ORG_B)
        )
    assert mine["queued"] == 2 and mine["canceled"] == 0
    assert everyone["queued"] == 2 and everyone["canceled"] == 1
    assert only_b == {**dict.fromkeys(mine, 0), "canceled": 1}


def _expire_one(api: Api) -> str:
    job_key = key(api.job())
    assert lease(api.queue, job_key, "w-dead", 1).applied
    deadline = time.monotonic() + 30
    while not api.queue.expire_lease(job_key).applied:
        assert time.monotonic() < deadline, "the 1 ms lease never expired"
        time.sleep(0.01)
    return job_key


def test_recent_events_count_expiries_and_redrives_in_the_window(api: Api) -> None:
    _expire_one(api)
    job_key = key(api.job())
    with transaction(api.engine) as conn:
        now = db_now(conn)
        delivery.begin(conn, job_key, delivery.redrive_key(job_key, 1, "queued"), now, 120_000)
        delivery.begin(conn, job_key, job_key, now, 120_000)  # an ordinary start: not a redrive
    with api.engine.connect() as conn:
        recent = overview.recent_events(conn, window=timedelta(hours=1))
        empty = overview.recent_events(conn, window=timedelta(microseconds=1))
    assert recent.counts["job.lease_expired"] == 1
    assert recent.counts["redrive"] == 1
    assert recent.counts["job.enqueued"] == 2
    assert recent.counts["job.released"] == 0
    assert recent.complete
    assert empty.counts["job.lease_expired"] == 0 and empty.counts["redrive"] == 0


def test_recent_events_say_when_the_scan_limit_cut_the_window(sqlite_api: Api) -> None:
    for _ in range(3):
        sqlite_api.job()
    with sqlite_api.engine.connect() as conn:
        cut = overview.recent_events(conn, window=timedelta(hours=1), scan_limit=2)
        whole = overview.recent_events(conn, window=timedelta(hours=1), scan_limit=1000)
    assert not cut.complete and cut.counts["job.enqueued"] == 2
    assert whole.complete and whole.counts["job.enqueued"] == 3


def test_loop_runs_report_last_start_and_duration(api: Api) -> None:
    assert loop_claims.claim(api.engine, "lease-expiry", "host:1", min_interval_ms=0, ttl_ms=60_000)
    loop_claims.release(api.engine, "lease-expiry", "host:1")
    assert loop_claims.claim(api.engine, "queued-redrive", "host:2", min_interval_ms=0, ttl_ms=60_000)
    with api.engine.connect() as conn:
        runs = {r.name: r for r in overview.loop_runs_all(conn)}
    assert not runs["lease-expiry"].running and runs["lease-expiry"].duration_ms is not None
    assert runs["lease-expiry"].duration_ms >= 0
    assert runs["queued-redrive"].running and runs["queued-redrive"].duration_ms is None
    assert runs["queued-redrive"].owner == "host:2"


# -- the system page ----------------------------------------------------------------------------


class FakeProbe:
    def __init__(self, report: BrokerReport) -> None:
        self._report = report

    def report(self) -> BrokerReport:
        return self._report


def test_system_page_shows_queues_loops_and_the_last_hour(sqlite_api: Api) -> None:
    _expire_one(sqlite_api)
    assert loop_claims.claim(sqlite_api.engine, "lease-expiry", "host:1", min_interval_ms=0, ttl_ms=60_000)
    loop_claims.release(sqlite_api.engine, "lease-expiry", "host:1")
    queues = [
        QueueStat("receipt-chat", "worker group chat", 7, ("celery@a", "celery@b")),
        QueueStat("receipt-codex", "worker group codex", None, None, "ChannelError"),
        QueueStat("receipt-control", "worker group control", 0, ()),
    ]
    sqlite_api.app.extensions[PROBE_EXTENSION] = FakeProbe(BrokerReport("redis", queues, None, 2, []))
    sign_in(sqlite_api, "system")
    page = text(sqlite_api.client.get("/ui/system"))
    assert "celery@a, celery@b" in page and "<td data-depth>7</td>" in page
    assert "unknown (ChannelError)" in page  # a depth it could not read is not shown as 0
    assert '<td data-consumers><span class="warn">none</span></td>' in page
    assert 'data-loop="lease-expiry"' in page and "host:1" in page
    # Loops that never ran are named, not silently missing.
    assert 'data-loop="queued-redrive"' in page and "has never run" in page
    assert '<tr data-recent="job.lease_expired"><th>Lease expiries</th><td>1</td>' in page


# In every secret below, and in nothing the page makes itself: a short hex marker turned up by chance
# in the page's random CSRF token (64 hex digits).
SECRET_MARK = "zq-secret-marker-xk"


def test_system_page_shows_the_configuration_with_every_secret_hidden(
    sqlite_engine: Engine, tmp_path: Any
) -> None:
    settings = make_settings(
        tmp_path,
        event_callback_url=f"https://u:pw-{SECRET_MARK}@hooks.example/events",
        callback_url=f"https://hooks.example/cb?token=q-{SECRET_MARK}",
        callback_secret=f"whsec_s-{SECRET_MARK}",
        metrics_token=f"m-{SECRET_MARK}",
        integration_publish_secret=f"p-{SECRET_MARK}",
    )
    api = build_api(sqlite_engine, settings)
    api.app.extensions[PROBE_EXTENSION] = FakeProbe(BrokerReport("redis", [], None, 0, []))
    sign_in(api, "system")
    page = text(api.client.get("/ui/system"))
    assert SECRET_MARK not in page
    assert 'data-setting="RECEIPT_METRICS_TOKEN"' in page and "RECEIPT_CALLBACK_SECRET" in page
    assert "https://u:***@hooks.example/events" in page and "https://hooks.example/cb?***" in page
    assert page.count('<td class="mono">***</td>') == 3
    assert 'RECEIPT_CALLBACK_TOKEN</td><td class="mono"><span class="muted">(unset)</span>' in page


def test_the_broker_probe_reads_redis_depth_and_says_when_no_worker_answers(
    tmp_path: Any, redis_url: str
) -> None:
    settings: Settings = make_settings(tmp_path, redis_url=redis_url)
    probe = QueueOverview(settings)
    for i in range(3):
        probe.client().send("receipt.dispatch", [[f"job-{i}"]], queue="receipt-codex")
    report = probe.report()
    depth = {s.queue: s.depth for s in report.queues}
    assert depth["receipt-codex"] == 3
    assert depth["receipt-chat"] == 0
    assert set(depth) == set(queue_roles())
    assert report.consumers_error is None and report.workers_answered == 0
    assert all(s.consumers == () for s in report.queues)
    assert any("No worker answered" in n for n in report.notes)


def test_the_broker_probe_counts_files_on_the_embedded_broker(tmp_path: Any) -> None:
    probe = QueueOverview(make_settings(tmp_path))
    for i in range(2):
        probe.client().send("receipt.dispatch", [[f"job-{i}"]], queue="receipt-chat")
    report = probe.report()
    assert report.transport == "embedded folder broker"
    assert {s.queue: s.depth for s in report.queues}["receipt-chat"] == 2
    assert any("Embedded folder broker" in n for n in report.notes)


def test_the_broker_probe_says_when_redis_is_unreachable_at_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, redis_url="redis://127.0.0.1:1/0")
    overview = QueueOverview(settings)
    # A refused connection is known from one PING: the page never reaches the Celery client, whose
    # connect and broadcast would each retry for seconds while the page waits.
    monkeypatch.setattr(overview, "client", lambda: pytest.fail("the Celery client was asked"))
    report = overview.report()
    assert all(s.depth is None and s.consumers is None for s in report.queues)
    refused = "no Redis answers at 127.0.0.1:1 (connection refused)"
    assert {s.depth_error for s in report.queues} == {f"broker unreachable ({refused})"}
    assert report.consumers_error == "the workers could not be asked (the broker is unreachable)"
    assert report.notes == [
        f"REDIS_URL=redis://127.0.0.1:1/0: {refused}; start redis-server there, or set REDIS_URL to a "
        "server that runs"
    ]


def test_consumers_by_queue_inverts_active_queues() -> None:
    active = {"w1": [{"name": "receipt-chat"}, {"name": "receipt-driver"}], "w2": [{"name": "receipt-chat"}]}
    assert consumers_by_queue(active) == {"receipt-chat": ["w1", "w2"], "receipt-driver": ["w1"]}
    assert consumers_by_queue(None) == {}


# -- objectives through a reader ----------------------------------------------------------------


class FakeReader:
    """A reader in the issue's JSON shape, scoped by an organisation field of its own."""

    def __init__(self, objectives: list[tuple[str, Mapping[str, Any]]]) -> None:
        self.objectives = objectives

    def _visible(self, scope: overview.Scope) -> list[Mapping[str, Any]]:
        return [o for org, o in self.objectives if scope.all_organizations or org == scope.organization_id]

    def list(
        self, scope: overview.Scope, *, status: str | None, limit: int, cursor: str | None
    ) -> ui_objectives.ObjectivePage:
        found = [o for o in self._visible(scope) if status is None or o["status"] == status]
        return ui_objectives.ObjectivePage(found[:limit], None)

    def get(self, scope: overview.Scope, objective_id: str) -> Mapping[str, Any] | None:
        return next((o for o in self._visible(scope) if o["id"] == objective_id), None)


def _with_reader(api: Api) -> None:
    mine = {**DIAMOND, "organizationId": ORG_A, "stream": f"objectives/{ORG_A}/obj-1"}
    other = {
        **DIAMOND,
        "id": "obj-b",
        "organizationId": ORG_B,
        "stream": f"objectives/{ORG_B}/obj-b",
        "title": "Theirs",
        "status": "completed",
    }
    reader = FakeReader([(ORG_A, mine), (ORG_B, other)])
    api.app.extensions[FINDER_EXTENSION] = lambda engine: reader


def test_objective_list_and_graph_page(sqlite_api: Api) -> None:
    _with_reader(sqlite_api)
    sign_in(sqlite_api, "a")
    listing = text(sqlite_api.client.get("/ui/objectives"))
    assert "obj-1" in listing and "Ship it" in listing and "obj-b" not in listing
    assert "2/4" in listing
    assert "obj-1" not in text(sqlite_api.client.get("/ui/objectives?status=completed"))
    page = text(sqlite_api.client.get("/ui/objectives/obj-1"))
    assert page.count('class="node task-') == 4
    assert 'data-task-id="B" data-status="running"' in page
    assert 'fill="#fde8e8"' in page  # C failed, drawn in the failed colour
    assert page.count('class="edge') == 4
    assert f'href="/ui/jobs/obj-1:1:A?organizationId={ORG_A}"' in page
    assert "data-events-url" in page  # an active objective follows its stream


def test_another_organisations_objective_is_not_found(sqlite_api: Api) -> None:
    _with_reader(sqlite_api)
    sign_in(sqlite_api, "a")
    for path in ("/ui/objectives/obj-b", "/ui/objectives/obj-b/fragment", "/ui/objectives/obj-b/events"):
        response = sqlite_api.client.get(path)
        assert response.status_code == 404, path
    assert "Theirs" not in text(sqlite_api.client.get("/ui/objectives/obj-b"))
    # A system token acts in its own organisation unless the page names another.
    sign_in(sqlite_api, "system")
    assert sqlite_api.client.get("/ui/objectives/obj-b").status_code == 404
    named = sqlite_api.client.get(f"/ui/objectives/obj-b?organizationId={ORG_B}")
    assert named.status_code == 200 and "Theirs" in text(named)
    assert f'href="/ui/objectives/obj-b?organizationId={ORG_B}"' in text(
        sqlite_api.client.get("/ui/objectives")
    )


def test_a_bad_objective_status_filter_is_a_400(sqlite_api: Api) -> None:
    _with_reader(sqlite_api)
    sign_in(sqlite_api)
    response = sqlite_api.client.get("/ui/objectives?status=done")
    assert response.status_code == 400
    assert "active, completed, failed, canceled" in text(response)


def test_recent_events_count_hand_backs(api: Api) -> None:
    job_key = key(api.job())
    attempt = api.lease_and_start(job_key)
    assert api.queue.release(job_key, WORKER, attempt, "shutdown").applied
    with api.engine.connect() as conn:
        recent = overview.recent_events(conn, window=timedelta(hours=1))
    assert recent.counts["job.released"] == 1


def test_system_page_shows_what_retention_moved_and_what_is_left(
    sqlite_engine: Engine, tmp_path: Any
) -> None:
    from app.retention import archive
    from app.retention.policy import Policy
    from app.retention.sink import DirectorySink
    from tests.support.queue_ops import complete

    settings = make_settings(
        tmp_path,
        retention_days=30,
        retention_days_by_organization=(("audited", 0),),
        archive_dir=str(tmp_path / "segments"),
    )
    api = build_api(sqlite_engine, settings)
    api.app.extensions[PROBE_EXTENSION] = FakeProbe(BrokerReport("redis", [], None, 0, []))
    sign_in(api, "system")
    page = text(api.client.get("/ui/system"))
    assert '30 days; <span class="mono">audited</span>: kept' in page
    assert "No pass has archived anything yet." in page
    assert (
        '<tr data-retention="oldest"><th>Oldest ended job still here</th><td><span class="muted">none' in page
    )
    for i in range(3):
        job = api.job("a", jobId=f"j{i}")
        lease(api.queue, key(job), "w1", 60_000)
        complete(api.queue, key(job), "w1", 1, {})
    page = text(api.client.get("/ui/system"))
    assert "0.0 days ago" in page
    totals = archive.run_pass(
        api.engine,
        DirectorySink(settings.archive_path),
        Policy.from_settings(settings),
        page_size=2,
        clock=lambda conn: db_now(conn) + timedelta(days=31),
    )
    page = text(api.client.get("/ui/system"))
    assert f'<tr data-pass="{totals.pass_id}">' in page
    assert "<td data-streams>3</td>" in page and f"<td data-bytes>{totals.bytes}</td>" in page
    assert str(tmp_path / "segments") in page and "GB free" in page
