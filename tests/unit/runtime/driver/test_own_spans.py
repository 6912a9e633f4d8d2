"""evsched's own OpenTelemetry spans (enqueue, lease, dispatch, run), on the in-memory twins,
recorded by the SDK's in-memory exporter.

Without an SDK's tracer provider no span is made and nothing about a job changes (the trace tests
beside this file run that way).
"""

from __future__ import annotations

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from evsched.adapters import spans
from evsched.client import App, Context
from evsched.core.events import JobEnqueued, TraceContext
from evsched.errors import InvalidEnqueue
from evsched.settings import Settings
from evsched.testing import MemoryLog
from tests.otel_sdk import exporter, hex_ids, parent_id
from tests.unit.runtime.driver.test_trace_propagation import (
    NS,
    TRACE_ID,
    TRACEPARENT,
    active_span,
    app,
    log,
    run_job,
)

__all__ = ["app", "exporter", "log"]  # the fixtures


def named(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    found: dict[str, ReadableSpan] = {}
    for span in exporter.get_finished_spans():
        assert span.name not in found, f"two spans named {span.name}"
        found[span.name] = span
    return found


def test_without_an_sdk_there_is_no_tracer() -> None:
    assert spans.tracer() is None


async def test_an_untraced_enqueue_makes_a_producer_span_that_the_job_carries(
    exporter: InMemorySpanExporter, app: App, log: MemoryLog
) -> None:
    job_id = await app.enqueue("traced", 1)
    (span,) = exporter.get_finished_spans()
    (event,) = log.events(JobEnqueued)
    assert isinstance(event, JobEnqueued)
    assert span.name == "evsched.enqueue"
    assert span.kind is SpanKind.PRODUCER
    assert span.parent is None
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "evsched.job_id": str(job_id),
        "evsched.task": "traced",
        "evsched.queue": "default",
    }
    trace_id, span_id = hex_ids(span)
    context = span.get_span_context()
    assert context is not None
    flags = format(context.trace_flags, "02x")
    assert event.trace == TraceContext(traceparent=f"00-{trace_id}-{span_id}-{flags}")


async def test_a_given_trace_stays_the_jobs_and_parents_the_enqueue_span(
    exporter: InMemorySpanExporter, app: App, log: MemoryLog
) -> None:
    await app.get_task("traced").options(traceparent=TRACEPARENT).enqueue(1)
    (span,) = exporter.get_finished_spans()
    (event,) = log.events(JobEnqueued)
    assert isinstance(event, JobEnqueued)
    assert event.trace == TraceContext(traceparent=TRACEPARENT)
    assert hex_ids(span)[0] == TRACE_ID
    assert parent_id(span) == "b7ad6b7169203331"


async def test_an_enqueue_inside_a_span_is_its_child(
    exporter: InMemorySpanExporter, app: App
) -> None:
    with active_span(int(TRACE_ID, 16), 0x1122334455667788):
        await app.enqueue("traced", 1)
    (span,) = exporter.get_finished_spans()
    assert (hex_ids(span)[0], parent_id(span)) == (TRACE_ID, "1122334455667788")


def test_enqueue_sync_parents_the_span_with_the_calling_threads_span(
    exporter: InMemorySpanExporter, app: App
) -> None:
    with app, active_span(int(TRACE_ID, 16), 0x1122334455667788):
        app.enqueue_sync("traced", 1)
    (span,) = exporter.get_finished_spans()
    assert (hex_ids(span)[0], parent_id(span)) == (TRACE_ID, "1122334455667788")


async def test_a_refused_enqueue_ends_its_span_as_an_error(
    exporter: InMemorySpanExporter, app: App, log: MemoryLog
) -> None:
    with pytest.raises(InvalidEnqueue):
        await app.enqueue("traced", 1, 2)  # one argument too many
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "InvalidEnqueue"
    assert log.records == []


@pytest.mark.parametrize("sync", [False, True], ids=["async-handler", "sync-handler"])
async def test_an_attempt_has_lease_dispatch_and_run_spans_and_the_handlers_spans_nest(
    exporter: InMemorySpanExporter, log: MemoryLog, sync: bool
) -> None:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)
    handler_tracer = otel_trace.get_tracer("the-handler")

    if sync:

        @app.task(name="work")
        def sync_work(ctx: Context) -> None:
            with handler_tracer.start_as_current_span("charge"):
                pass
    else:

        @app.task(name="work")
        async def async_work(ctx: Context) -> None:
            with handler_tracer.start_as_current_span("charge"):
                pass

    job_id = await app.enqueue("work")
    dispatch = await run_job(app, log, job_id)
    found = named(exporter)
    assert set(found) == {
        "evsched.enqueue",
        "evsched.lease",
        "evsched.dispatch",
        "evsched.run",
        "charge",
    }
    enqueue_trace, enqueue_span = hex_ids(found["evsched.enqueue"])
    for name in ("evsched.lease", "evsched.dispatch", "evsched.run"):
        span = found[name]
        assert hex_ids(span)[0] == enqueue_trace, name
        assert parent_id(span) == enqueue_span, name
        assert (span.attributes or {})["evsched.token"] == dispatch.token, name
        assert (span.attributes or {})["evsched.attempt"] == 1, name
    assert parent_id(found["charge"]) == hex_ids(found["evsched.run"])[1]
    run = found["evsched.run"]
    assert run.kind is SpanKind.CONSUMER
    assert (run.attributes or {})["evsched.outcome"] == "reported"
    assert run.status.status_code is StatusCode.UNSET
    # The node's part ends where the run begins; no span ends before it starts.
    assert found["evsched.lease"].end_time == found["evsched.dispatch"].start_time
    assert found["evsched.dispatch"].end_time == run.start_time
    for span in found.values():
        assert span.start_time is not None and span.end_time is not None
        assert span.end_time >= span.start_time, span.name
    assert found["evsched.lease"].start_time == dispatch.run_at * 1_000_000
    assert found["evsched.dispatch"].start_time == dispatch.leased_at * 1_000_000


async def test_a_failed_attempts_run_span_is_an_error_naming_its_type(
    exporter: InMemorySpanExporter, log: MemoryLog
) -> None:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)

    @app.task(name="fails", max_attempts=1)
    async def fails() -> None:
        raise ConnectionError("down")

    job_id = await app.enqueue("fails")
    await run_job(app, log, job_id)
    run = named(exporter)["evsched.run"]
    assert (run.attributes or {})["evsched.outcome"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "ConnectionError"
