"""Tracing's pure parts: when it is on, the stored trace context, and folding receipts without one."""

from __future__ import annotations

import os

import pytest

from app import tracing
from app.jobs.reducer import Job, Receipt, reduce
from app.jobs.tracecontext import trace_context_of, trace_id_of

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
    ],
)
def test_tracing_is_off_unless_an_exporter_or_an_otlp_endpoint_is_set(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_service_name_is_the_role_unless_otel_service_name_says_otherwise() -> None:
    assert tracing.service_name("web", {}) == "receipt-web"
    assert tracing.service_name("worker-codex", {}) == "receipt-worker-codex"
    assert tracing.service_name("driver", {"OTEL_SERVICE_NAME": "mine"}) == "mine"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "x",
        {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"},
        {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": PARENT.upper()},
    ],
)
def test_an_invalid_traceparent_is_dropped_never_an_error(value: object) -> None:
    assert trace_context_of(value) is None


def test_a_valid_context_keeps_its_tracestate_up_to_512_characters() -> None:
    assert trace_context_of({"traceparent": PARENT, "tracestate": "a=1"}) == {
        "traceparent": PARENT,
        "tracestate": "a=1",
    }
    assert trace_context_of({"traceparent": PARENT, "tracestate": "a" * 513}) == {"traceparent": PARENT}
    assert trace_id_of({"traceparent": PARENT}) == "4bf92f3577b34da6a3ce929d0e0e4736"


def _enqueued(body: dict[str, object]) -> Job:
    job = reduce(None, Receipt("jobs/j1", 1, "job.enqueued", {"jobId": "j1", "agentId": "a", **body}))
    assert job is not None
    return job


def test_an_enqueue_without_trace_context_folds_as_before_and_its_json_has_no_field() -> None:
    job = _enqueued({})
    assert job.trace_context is None
    assert "traceContext" not in job.to_json()
    assert Job.from_json(job.to_json()) == job


def test_the_recorded_context_survives_the_projection_round_trip() -> None:
    job = _enqueued({"traceContext": {"traceparent": PARENT}})
    assert job.trace_context == {"traceparent": PARENT}
    assert job.to_json()["traceContext"] == {"traceparent": PARENT}
    assert Job.from_json(job.to_json()) == job


def test_a_job_without_a_context_still_has_one_trace_derived_from_its_id() -> None:
    first = tracing.job_trace_id("org/j1", None)
    assert first == tracing.job_trace_id("org/j1", None)
    assert first != tracing.job_trace_id("org/j2", None)
    assert tracing.job_trace_id("org/j1", {"traceparent": PARENT}) == int(
        "4bf92f3577b34da6a3ce929d0e0e4736", 16
    )


def test_off_the_tracer_is_the_no_op_one_and_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing.reset()
    try:
        assert not tracing.on()
        assert tracing.tracer() is tracing._NOOP
        assert tracing.provider() is None
        assert tracing.carrier() is None
        assert tracing.enqueue_context() is None
    finally:
        tracing.reset()


def test_on_the_provider_is_built_per_process_named_for_the_role_and_rebuilt_after_a_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    tracing.reset()
    tracing.set_role("worker-codex")
    try:
        assert tracing.on()
        first = tracing.provider()
        assert first is not None
        assert first.resource.attributes["service.name"] == "receipt-worker-codex"
        assert tracing.provider() is first  # once per process
        parent = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # as in a forked child
        second = tracing.provider()
        assert second is not None and second is not first
    finally:
        tracing.reset()
        tracing.set_role("process")


def test_an_exporter_name_nothing_installed_provides_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-nowhere")
    with pytest.raises(ValueError, match="no such span exporter is installed"):
        tracing.check()
    tracing.check({"OTEL_TRACES_EXPORTER": "otlp,console"})
    tracing.check({"OTEL_TRACES_EXPORTER": "zipkin-nowhere", "OTEL_SDK_DISABLED": "true"})  # off
    tracing.reset()
    try:
        with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin-nowhere'"):
            tracing.tracer()
    finally:
        tracing.reset()
