"""Tracing under test: the SDK's in-memory exporter as this process's provider (``app.tracing``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app import tracing


class Spans:
    """What the in-memory exporter holds, by name."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def all(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [s.name for s in self.all()]
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    """Tracing on in this process, every span kept in memory (exported as it ends)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=tracing.ids())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield Spans(exporter)
    tracing.reset()
    provider.shutdown()


@pytest.fixture
def tracing_off() -> Iterator[None]:
    """Tracing decided off in this process (no OTEL_* variable: the conftest clears them)."""
    tracing.reset()
    assert not tracing.on()
    yield
    tracing.reset()
