"""An OpenTelemetry SDK tracer provider with an in-memory exporter, for one test at a time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider set for this test only (the API lets a process set one once: the
    fixture resets that guard and monkeypatch restores the API's proxy afterwards)."""
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", None)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    otel_trace.set_tracer_provider(provider)
    yield memory
    provider.shutdown()


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    """(trace id, span id) in the W3C lowercase hex."""
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")
