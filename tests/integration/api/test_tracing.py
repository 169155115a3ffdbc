"""One trace per job, in process: the enqueue's context kept in ``job.enqueued``, the request's span,
each attempt's span (linked to the one before), the handler's, the callbacks' and the dispatch's;
log lines naming the span; the dashboard's trace link. The SDK's in-memory exporter collects them.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

from opentelemetry.trace import SpanKind

from app import tracing
from app.config import Settings
from app.jobs.vocab import job_stream
from app.ops import logs
from app.storage import store
from tests.integration.runtime_support import registry_of
from tests.support.api import Api, build_api, json_of, key, make_settings, payload
from tests.support.tracing import Spans
from workers.handler import HandlerError, JobContext
from workers.runner import run_attempt

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def enqueued_body(api: Api, job_key: str) -> dict[str, Any]:
    with api.engine.connect() as conn:
        first = store.read_stream(conn, job_stream(job_key))[0]
    assert first.type == "job.enqueued"
    return dict(first.body)


def post(api: Api, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    body.setdefault("payload", payload())
    response = api.client.post("/agents/factory/jobs", json=body, headers=api.headers(**(headers or {})))
    assert response.status_code == 202, response.json
    job: dict[str, Any] = json_of(response)["job"]
    return job


def test_with_tracing_on_the_job_records_the_request_span_a_child_of_the_callers_traceparent(
    spans: Spans, sqlite_api: Api
) -> None:
    job = post(sqlite_api, {"traceparent": PARENT, "tracestate": "vendor=1"})
    stored = enqueued_body(sqlite_api, key(job))["traceContext"]
    request = [s for s in spans.all() if s.kind == SpanKind.SERVER]
    assert len(request) == 1
    server = request[0]
    assert server.context.trace_id == int(TRACE, 16)
    assert server.parent is not None and server.parent.span_id == int("00f067aa0ba902b7", 16)
    # The job's context is the request span's: same trace, the server span as parent.
    assert stored["traceparent"] == f"00-{TRACE}-{server.context.span_id:016x}-01"
    assert stored["tracestate"] == "vendor=1"
    assert job["traceContext"] == stored


def test_with_tracing_on_and_no_caller_context_the_job_starts_a_trace_of_its_own(
    spans: Spans, sqlite_api: Api
) -> None:
    first, second = post(sqlite_api), post(sqlite_api)
    ids = {enqueued_body(sqlite_api, key(j))["traceContext"]["traceparent"][3:35] for j in (first, second)}
    assert len(ids) == 2  # one trace per job, not one for every job


def test_with_tracing_off_the_callers_traceparent_is_still_recorded_and_nothing_else(
    tracing_off: None, sqlite_api: Api
) -> None:
    job = post(sqlite_api, {"traceparent": PARENT})
    assert enqueued_body(sqlite_api, key(job))["traceContext"] == {"traceparent": PARENT}
    plain = post(sqlite_api)
    assert "traceContext" not in enqueued_body(sqlite_api, key(plain))
    bad = post(sqlite_api, {"traceparent": "00-nothex-01"})
    assert "traceContext" not in enqueued_body(sqlite_api, key(bad))


def test_every_item_of_a_bulk_enqueue_keeps_the_requests_context(tracing_off: None, sqlite_api: Api) -> None:
    items = [{"agentId": "factory", "payload": payload()} for _ in range(3)]
    response = sqlite_api.client.post(
        "/jobs:batch", json={"items": items}, headers=sqlite_api.headers(traceparent=PARENT)
    )
    assert response.status_code == 202, response.json
    answered = json_of(response)["jobs"]
    assert len(answered) == 3
    for item in answered:
        assert enqueued_body(sqlite_api, key(item["job"]))["traceContext"] == {"traceparent": PARENT}


class FailsOnce:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ctx: JobContext) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise HandlerError("first attempt fails", retryable=True, status="failed")
        return {"ok": True}


def test_each_attempt_is_a_span_in_the_jobs_trace_and_a_retry_links_to_the_attempt_before(
    spans: Spans, sqlite_api: Api
) -> None:
    job = post(sqlite_api, {"traceparent": PARENT}, maxAttempts=2)
    settings = sqlite_api.state.settings
    registry = registry_of({"factory": FailsOnce()})
    first = run_attempt(sqlite_api.queue, settings, registry, key(job), 1, worker_id="w:1")
    assert first.status == "failed"
    # The retry's backoff is the database's business; the attempt is run as its delivery would.
    second = run_attempt(sqlite_api.queue, settings, registry, key(job), 2, worker_id="w:2")
    assert second.status == "completed", second
    attempts = sorted(
        spans.named("receipt.attempt"), key=lambda s: str(dict(s.attributes or {})[tracing.ATTEMPT])
    )
    assert [dict(s.attributes or {})[tracing.ATTEMPT] for s in attempts] == [1, 2]
    assert {s.context.trace_id for s in attempts} == {int(TRACE, 16)}
    one, two = attempts
    assert dict(one.attributes or {})[tracing.OUTCOME] == "failed"
    assert dict(two.attributes or {}) == {
        tracing.JOB_ID: key(job),
        tracing.ORGANIZATION: job["organizationId"],
        tracing.AGENT: "factory",
        tracing.KIND: "factory.run",
        tracing.ATTEMPT: 2,
        tracing.WORKER_ID: "w:2",
        tracing.OUTCOME: "completed",
    }
    assert not one.links
    assert [link.context.span_id for link in two.links] == [one.context.span_id]
    handlers = spans.named("receipt.handler")
    assert len(handlers) == 2
    assert {h.parent.span_id for h in handlers if h.parent} == {one.context.span_id, two.context.span_id}


def test_json_log_lines_inside_a_span_carry_its_trace_and_span_ids(spans: Spans, tmp_path: Path) -> None:
    settings = Settings.from_env({"RECEIPT_LOG_FORMAT": "json", "RECEIPT_HOME": str(tmp_path)})
    stream = io.StringIO()
    config = logs.dict_config(settings, "worker-chat")
    config["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(config)
    try:
        with tracing.job_span("receipt.test", "org/j1", {"traceparent": PARENT}) as span:
            logging.getLogger("receipt.test").warning("inside")
        logging.getLogger("receipt.test").warning("outside")
    finally:
        logging.config.dictConfig(logs.dict_config(Settings.from_env({}), "test"))
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["trace_id"] == TRACE
    assert inside["span_id"] == f"{span.get_span_context().span_id:016x}"
    assert "trace_id" not in outside


def test_the_dashboard_links_a_job_to_its_trace_when_the_template_is_set(
    tmp_path: Path, sqlite_engine: Any
) -> None:
    template = "http://jaeger.example:16686/trace/{traceId}"
    api = build_api(sqlite_engine, make_settings(tmp_path, trace_url_template=template))
    job = post(api, {"traceparent": PARENT})
    signed = api.client.post("/ui/signin", data={"token": api.secrets["a"]})
    assert signed.status_code == 302
    page = api.client.get(f"/ui/jobs/{job['id']}").get_data(as_text=True)
    assert f'href="http://jaeger.example:16686/trace/{TRACE}"' in page
    bare = build_api(sqlite_engine, make_settings(tmp_path / "bare"))
    bare.client.post("/ui/signin", data={"token": bare.secrets["a"]})
    assert "job-trace" not in bare.client.get(f"/ui/jobs/{job['id']}").get_data(as_text=True)


def test_a_trace_url_template_without_the_placeholder_is_refused() -> None:
    try:
        Settings.from_env({"RECEIPT_TRACE_URL_TEMPLATE": "http://jaeger/trace/"})
    except ValueError as exc:
        assert "{traceId}" in str(exc)
    else:
        raise AssertionError("accepted a template without {traceId}")


def test_a_loop_pass_that_acts_on_no_job_adds_no_span_and_one_that_does_links_each_jobs_trace(
    spans: Spans,
) -> None:
    with tracing.loop_trace("queued-redrive") as idle:
        idle.link([])
    assert spans.named("receipt.loop queued-redrive") == []
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    with tracing.loop_trace("queued-redrive") as busy:
        busy.link([("org/j1", {"traceparent": PARENT})])
        busy.link([("org/j2", {"traceparent": other})])
    span = spans.one("receipt.loop queued-redrive")
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [TRACE, "1" * 32]
    assert span.parent is None and span.context.trace_id not in (int(TRACE, 16), int("1" * 32, 16))
