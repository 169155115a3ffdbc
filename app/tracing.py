"""Traces: one OpenTelemetry trace per job, from the enqueue to the terminal receipt (docs/tracing.md).

**Off unless asked.** Tracing is on in a process when ``OTEL_TRACES_EXPORTER`` names an exporter
(anything but ``none``) or, without it, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; ``OTEL_SDK_DISABLED=true`` turns it off whatever
else is set. Off, every call here is one attribute read and the OpenTelemetry API's no-op objects:
no provider, no exporter thread, no span is built.

**On**, the SDK is configured the standard way, from its own ``OTEL_*`` variables: the sampler
(``OTEL_TRACES_SAMPLER``/``_ARG``, default parent-based always-on), the batch processor
(``OTEL_BSP_*``), the resource (``OTEL_RESOURCE_ATTRIBUTES``), and the exporter, which reads its
endpoint, headers, timeout and compression itself (``OTEL_EXPORTER_OTLP_*``). ``otlp`` means
OTLP over HTTP/protobuf, the exporter Receipt depends on; other names are looked up among the
installed exporters' entry points, as the SDK's auto-configuration does. ``service.name`` is
``receipt-<role>`` (``receipt-web``, ``receipt-driver``, ``receipt-worker-codex``...) unless
``OTEL_SERVICE_NAME`` says otherwise.

**Per process, after fork.** The provider (and its exporter thread) is built lazily on first use
in each process id, so a gunicorn worker or any forked child builds its own instead of inheriting
a parent's dead thread.

**A job's trace.** ``job.enqueued`` keeps the enqueue's W3C context (``app.jobs.tracecontext``);
every span about the job is a child of it, in whichever process it runs. A job recorded without
one (an older receipt) still gets one trace: its trace id is derived from its id. Each attempt's
span id is derived from (trace, job, attempt), so attempt *n* links to attempt *n-1*'s span
without any record of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.jobs.tracecontext import TRACEPARENT, trace_context_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator


SCOPE: Final = "receipt"
SERVICE_PREFIX: Final = "receipt-"
# Span attribute names: Receipt's own, under one prefix (no OpenTelemetry convention names a job).
JOB_ID: Final = "receipt.job.id"
ORGANIZATION: Final = "receipt.organization"
AGENT: Final = "receipt.agent"
KIND: Final = "receipt.kind"
ATTEMPT: Final = "receipt.attempt"
WORKER_ID: Final = "receipt.worker.id"
OUTCOME: Final = "receipt.outcome"
LOOP: Final = "receipt.loop"
_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP: Final = trace.NoOpTracer()


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (the module docstring's rule)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def service_name(role: str, env: Mapping[str, str] = os.environ) -> str:
    return env.get("OTEL_SERVICE_NAME") or f"{SERVICE_PREFIX}{role}"


@dataclass
class _State:
    on: bool | None = None  # None: not decided yet in this process
    role: str = "process"
    pid: int = 0
    provider: TracerProvider | None = None
    tracer: Tracer = _NOOP


_STATE = _State()
_LOCK = threading.Lock()
# The span id the next span gets, when the caller derived it (an attempt's): read by _Ids.
_NEXT_SPAN_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "receipt_next_span_id", default=None
)


def set_role(role: str) -> None:
    """Name this process's role (``service.name``); call before the first span."""
    _STATE.role = role


def on() -> bool:
    """Whether this process traces: the cheap check every call site makes first."""
    state = _STATE.on
    if state is None:
        state = _STATE.on = wanted()
    return state


def tracer() -> Tracer:
    """This process's tracer: the no-op one when tracing is off; else built on first use here."""
    if not on():
        return _NOOP
    if _STATE.pid != os.getpid():
        with _LOCK:
            if _STATE.pid != os.getpid():
                _build()
    return _STATE.tracer


def _build() -> None:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service_name(_STATE.role)}), id_generator=ids()
    )
    for exporter in _exporters(os.environ):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _use(provider)


_OTLP_NAMES = ("otlp", "otlp_proto_http")


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    return [n for n in names if n != "none"]


def _entry_point(name: str) -> Any:
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="opentelemetry_traces_exporter") if e.name == name]
    if not found:
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: no such span exporter is installed")
    return found[0]


def check(env: Mapping[str, str] = os.environ) -> None:
    """Refuse, at a process's start, an ``OTEL_TRACES_EXPORTER`` naming no installed exporter
    (rather than at its first span, in the middle of a request or a job)."""
    if wanted(env):
        for name in _exporter_names(env):
            if name not in _OTLP_NAMES:
                _entry_point(name)


def _exporters(env: Mapping[str, str]) -> list[Any]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (comma-separated; default ``otlp``)."""
    out: list[Any] = []
    for name in _exporter_names(env):
        if name in _OTLP_NAMES:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append(OTLPSpanExporter())
        else:
            out.append(_entry_point(name).load()())
    return out


def _use(provider: TracerProvider) -> None:
    previous = _STATE.provider
    _STATE.provider = provider
    _STATE.tracer = provider.get_tracer(SCOPE)
    _STATE.pid = os.getpid()
    _STATE.on = True
    if previous is not None and previous is not provider:
        previous.shutdown()


def use_provider(provider: TracerProvider) -> None:
    """Trace through ``provider`` in this process (tests: an in-memory exporter). Give it
    ``id_generator=ids()`` for the derived attempt span ids."""
    with _LOCK:
        _use(provider)


def reset() -> None:
    """Forget this process's decision and provider (tests); the next call decides again."""
    with _LOCK:
        _STATE.on, _STATE.pid, _STATE.provider, _STATE.tracer = None, 0, None, _NOOP


def provider() -> TracerProvider | None:
    """This process's provider when tracing is on and a span was made (the Flask instrumentation)."""
    tracer()
    return _STATE.provider


def ids() -> IdGenerator:
    """The SDK's random ids, except the span id a caller derived for the next span (an attempt's):
    the id generator of Receipt's provider (and of a test's own)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Ids(RandomIdGenerator):
        def generate_span_id(self) -> int:
            derived = _NEXT_SPAN_ID.get()
            return derived if derived is not None else super().generate_span_id()

    return Ids()


def _derive(*parts: str, bits: int = 64) -> int:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[: bits // 8], "big") or 1


# -- contexts ------------------------------------------------------------------------------------------


def carrier() -> dict[str, str] | None:
    """The current context as a stored ``traceContext`` (traceparent, tracestate), or None when
    there is no valid current span (tracing off and no incoming ``traceparent``)."""
    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    _PROPAGATOR.inject(out)
    return trace_context_of(out)


def enqueue_context() -> dict[str, str] | None:
    """The ``traceContext`` a new job records: the current one; with tracing on and none current,
    a new root span's (the job's trace starts at its enqueue)."""
    found = carrier()
    if found is not None or not on():
        return found
    with tracer().start_as_current_span("receipt.enqueue", kind=SpanKind.PRODUCER):
        return carrier()


def extract(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The context an incoming ``traceparent``/``tracestate`` names, or None without a valid one."""
    if not headers.get(TRACEPARENT):
        return None
    ctx = _PROPAGATOR.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def inject(headers: dict[str, str]) -> None:
    """Add the current context's ``traceparent``/``tracestate`` to outgoing headers."""
    _PROPAGATOR.inject(headers)


def job_context(job_id: str, stored: Mapping[str, str] | None) -> otel_context.Context:
    """The parent context of a job's spans: its stored context, else one derived from its id."""
    if stored:
        ctx = _PROPAGATOR.extract(stored)
        if trace.get_current_span(ctx).get_span_context().is_valid:
            return ctx
    root = SpanContext(
        trace_id=_derive("trace", job_id, bits=128),
        span_id=_derive("root", job_id),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(root))


def job_trace_id(job_id: str, stored: Mapping[str, str] | None) -> int:
    return trace.get_current_span(job_context(job_id, stored)).get_span_context().trace_id


def attempt_span_id(trace_id: int, job_id: str, attempt: int) -> int:
    """Attempt ``attempt``'s span id: derived, so the next attempt can link to it unrecorded."""
    return _derive(f"{trace_id:032x}", job_id, str(attempt))


def attempt_link(job_id: str, stored: Mapping[str, str] | None, attempt: int) -> Link | None:
    """A link to attempt ``attempt``'s span (None before the first)."""
    if attempt < 1:
        return None
    parent = trace.get_current_span(job_context(job_id, stored)).get_span_context()
    linked = SpanContext(
        trace_id=parent.trace_id,
        span_id=attempt_span_id(parent.trace_id, job_id, attempt),
        is_remote=True,
        trace_flags=parent.trace_flags,
    )
    return Link(linked, {ATTEMPT: attempt})


def job_link(job_id: str, stored: Mapping[str, str] | None) -> Link:
    """A link to a job's trace (a loop's span acting on the job)."""
    ctx = trace.get_current_span(job_context(job_id, stored)).get_span_context()
    return Link(ctx, {JOB_ID: job_id})


def start_attempt_span(
    job_id: str, stored: Mapping[str, str] | None, attempt: int, attributes: Mapping[str, Any], start_ns: int
) -> Span:
    """Attempt ``attempt``'s span (its derived id), linked to the attempt before it; not current."""
    parent = job_context(job_id, stored)
    trace_id = trace.get_current_span(parent).get_span_context().trace_id
    link = attempt_link(job_id, stored, attempt - 1)
    token = _NEXT_SPAN_ID.set(attempt_span_id(trace_id, job_id, attempt))
    try:
        return tracer().start_span(
            "receipt.attempt",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=dict(attributes),
            links=[link] if link else (),
            start_time=start_ns,
        )
    finally:
        _NEXT_SPAN_ID.reset(token)


@contextlib.contextmanager
def job_span(
    name: str,
    job_id: str,
    stored: Mapping[str, str] | None,
    attributes: Mapping[str, Any] | None = None,
    *,
    start_ns: int | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A span in the job's trace, current inside the block."""
    with tracer().start_as_current_span(
        name,
        context=job_context(job_id, stored),
        kind=kind,
        attributes=dict(attributes or {}),
        start_time=start_ns,
    ) as span:
        yield span


class LoopTrace:
    """A recovery loop's pass in traces: a root span of its own, begun with the pass but made only
    once the pass acts on a job (a pass that finds nothing adds no span), and linked to each job's
    trace. Never current: a job the pass enqueues (a schedule's) starts a trace of its own."""

    def __init__(self, loop: str) -> None:
        self.loop = loop
        self.began_ns = time.time_ns()
        self.span: Span | None = None

    def link(self, jobs: Sequence[tuple[str, Mapping[str, str] | None]]) -> None:
        if not jobs:
            return
        if self.span is None:
            self.span = tracer().start_span(
                f"receipt.loop {self.loop}",
                context=otel_context.Context(),
                attributes={LOOP: self.loop},
                start_time=self.began_ns,
            )
        for job_id, stored in jobs:
            link = job_link(job_id, stored)
            self.span.add_link(link.context, link.attributes)

    def end(self) -> None:
        if self.span is not None:
            self.span.end()


@contextlib.contextmanager
def loop_trace(loop: str) -> Iterator[LoopTrace]:
    trace_ = LoopTrace(loop)
    try:
        yield trace_
    finally:
        trace_.end()


# The command a handler ran: OpenTelemetry's process conventions name its exit code.
EXIT_CODE: Final = "process.exit.code"
OUTPUT_BYTES: Final = "receipt.command.output_bytes"


def note_command(exit_code: int | None, output_bytes: int) -> None:
    """Record a command's exit code and output size on the current span (the handler's run)."""
    span = trace.get_current_span()
    if span.is_recording():
        if exit_code is not None:
            span.set_attribute(EXIT_CODE, exit_code)
        span.set_attribute(OUTPUT_BYTES, output_bytes)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span in hex, for log lines; None without one."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
