"""Trace context from enqueue to the worker, on the in-memory twins.

A client enqueue carries a W3C ``traceparent``; the fold keeps it in the job's state; the planner
copies it into the JobLeased and the dispatch record; the worker binds it to the attempt's log
context, shows it as ``ctx.trace``, runs the handler in its OpenTelemetry context and writes it on
every event of the attempt.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import structlog
from opentelemetry import trace as otel_trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from structlog.testing import capture_logs

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.client import App, Context, TraceContext
from evsched.core import planner
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    JobEnqueued,
    Position,
)
from evsched.core.fold import fold
from evsched.errors import InvalidEnqueue
from evsched.runtime.worker.worker import Worker, WorkerConfig
from evsched.settings import Settings
from evsched.testing import FrozenClock, MemoryFeed, MemoryLog

NS = "unit"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
TRACESTATE = "vendor=opaque,other=1"


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
def app(log: MemoryLog) -> App:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log, clock=FrozenClock())

    @app.task(name="traced")
    async def traced(x: int) -> int:
        return x

    return app


def enqueued(log: MemoryLog) -> JobEnqueued:
    (event,) = log.events(JobEnqueued)
    assert isinstance(event, JobEnqueued)
    return event


@contextmanager
def active_span(trace_id: int, span_id: int) -> Iterator[None]:
    """An active OpenTelemetry span (the API alone: no SDK needed)."""
    context = SpanContext(
        trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=TraceFlags(1)
    )
    with otel_trace.use_span(NonRecordingSpan(context)):
        yield


# --- the client ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"traceparent": TRACEPARENT, "tracestate": TRACESTATE},
        {"trace": TraceContext(traceparent=TRACEPARENT, tracestate=TRACESTATE)},
    ],
    ids=["traceparent", "trace"],
)
async def test_an_enqueue_carries_the_trace_it_was_given(
    app: App, log: MemoryLog, options: dict[str, Any]
) -> None:
    await app.get_task("traced").options(**options).enqueue(1)
    assert enqueued(log).trace == TraceContext(traceparent=TRACEPARENT, tracestate=TRACESTATE)


async def test_trace_may_be_a_bare_traceparent_and_options_can_set_it_later(
    app: App, log: MemoryLog
) -> None:
    task = app.get_task("traced")
    await task.options(trace=TRACEPARENT).enqueue(1)
    await task.options(priority=2).options(traceparent=TRACEPARENT).enqueue(2)
    assert [e.trace for e in log.events(JobEnqueued)] == [TraceContext(traceparent=TRACEPARENT)] * 2


async def test_without_a_trace_or_a_span_the_job_has_none(app: App, log: MemoryLog) -> None:
    await app.enqueue("traced", 1)
    assert enqueued(log).trace is None


async def test_an_active_opentelemetry_span_is_the_default_trace(app: App, log: MemoryLog) -> None:
    with active_span(int(TRACE_ID, 16), 0x1122334455667788):
        await app.enqueue("traced", 1)
    assert enqueued(log).trace == TraceContext(traceparent=f"00-{TRACE_ID}-1122334455667788-01")


async def test_an_explicit_trace_wins_over_the_active_span(app: App, log: MemoryLog) -> None:
    with active_span(0xABC, 0xDEF):
        await app.get_task("traced").options(traceparent=TRACEPARENT).enqueue(1)
    assert enqueued(log).trace == TraceContext(traceparent=TRACEPARENT)


def test_enqueue_sync_takes_the_calling_threads_span(app: App, log: MemoryLog) -> None:
    with app, active_span(int(TRACE_ID, 16), 0x1122334455667788):
        app.enqueue_sync("traced", 1)
    assert enqueued(log).trace == TraceContext(traceparent=f"00-{TRACE_ID}-1122334455667788-01")


@pytest.mark.parametrize(
    "options",
    [
        {"traceparent": "not-a-traceparent"},
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": f"00-{'0' * 32}-b7ad6b7169203331-01"},
        {"traceparent": f"00-{TRACE_ID}-{'0' * 16}-01"},
        {"traceparent": f"ff-{TRACE_ID}-b7ad6b7169203331-01"},
        {"traceparent": TRACEPARENT + "-extra"},
        {"tracestate": TRACESTATE},
        {"traceparent": TRACEPARENT, "tracestate": "x" * 513},
        {"trace": TraceContext(traceparent=TRACEPARENT), "traceparent": TRACEPARENT},
        {"trace": TraceContext(traceparent="00-short")},
    ],
)
async def test_a_malformed_trace_is_refused_naming_the_field(
    app: App, log: MemoryLog, options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidEnqueue) as raised:
        await app.get_task("traced").options(**options).enqueue(1)
    assert raised.value.field == "trace"
    assert log.records == []


async def test_a_later_traceparent_version_may_carry_more_fields(app: App, log: MemoryLog) -> None:
    later = f"01-{TRACE_ID}-b7ad6b7169203331-01-what-comes-next"
    await app.get_task("traced").options(traceparent=later).enqueue(1)
    assert enqueued(log).trace == TraceContext(traceparent=later)


# --- enqueue -> fold -> planner -> worker -------------------------------------------------------


def lease_of(event: JobEnqueued) -> planner.Lease:
    """What a node does with the enqueue: fold it, then lease the due job (now: the worker
    starts no dispatch past its start deadline)."""
    now = SYSTEM_CLOCK.now_ms()
    state, entry = fold(None, event, Position(partition=0, offset=0, log_at=now))
    assert state is not None and entry.verdict.value == "applied"
    (lease,) = planner.plan_leases(
        [state], {}, now=now, budgets=planner.PlannerBudgets(), source="node-1"
    )
    return lease


@asynccontextmanager
async def running(app: App, log: MemoryLog, feed: MemoryFeed) -> AsyncIterator[Worker]:
    config = WorkerConfig(queues=("default",), worker_id="w1", poll_s=0.05, lease_ms=300)
    worker = Worker(app, config, feed=feed, events=log)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        worker.stop()
        await asyncio.wait_for(task, 5)


async def run_job(app: App, log: MemoryLog, job_id: str) -> Dispatch:
    """Lease the job's enqueue as a node would and let a worker run the dispatch to its outcome."""
    (event,) = [e for e in log.events(JobEnqueued) if e.job_id == job_id]
    assert isinstance(event, JobEnqueued)
    lease = lease_of(event)
    assert lease.event.trace == lease.dispatch.trace == event.trace
    feed = MemoryFeed(f"{NS}.dispatch.default")
    feed.put_dispatch(lease.dispatch)
    async with running(app, log, feed):
        await log.wait_for(
            lambda _: any(e.job_id == job_id for e in log.events(AttemptSucceeded, AttemptFailed)),
            what=f"an outcome of {job_id}",
        )
    return lease.dispatch


def attempt_events(log: MemoryLog, job_id: str) -> list[Any]:
    return [e for e in log.events() if e.job_id == job_id and not isinstance(e, JobEnqueued)]


@pytest.mark.parametrize("sync", [False, True], ids=["async-handler", "sync-handler"])
async def test_the_trace_reaches_the_handler_its_logs_and_every_attempt_event(
    log: MemoryLog, sync: bool
) -> None:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)
    seen: dict[str, Any] = {}

    def look(ctx: Context) -> None:
        span = otel_trace.get_current_span().get_span_context()
        seen.update(
            trace=ctx.trace,
            bound=structlog.contextvars.get_contextvars().get("traceparent"),
            otel=(format(span.trace_id, "032x"), format(span.span_id, "016x"), span.is_remote),
            tracestate=span.trace_state.to_header(),
            thread=threading.current_thread().name,
        )
        ctx.log.info("handler_says_hello")

    if sync:

        @app.task(name="look")
        def sync_look(ctx: Context) -> None:
            look(ctx)
    else:

        @app.task(name="look")
        async def async_look(ctx: Context) -> None:
            look(ctx)
            await ctx.checkpoint({"step": 1})

    trace = TraceContext(traceparent=TRACEPARENT, tracestate=TRACESTATE)
    job_id = await app.get_task("look").options(trace=trace).enqueue()
    with capture_logs() as logs:
        await run_job(app, log, job_id)

    assert seen["trace"] == trace
    assert seen["bound"] == TRACEPARENT
    assert seen["otel"] == (TRACE_ID, "b7ad6b7169203331", True)
    assert seen["tracestate"] == TRACESTATE
    assert seen["thread"].startswith("evsched-handler") is sync
    events = attempt_events(log, job_id)
    kinds = {type(e) for e in events}
    assert {AttemptStarted, AttemptSucceeded} <= kinds
    assert (AttemptCheckpointed in kinds) is not sync
    assert all(e.trace == trace for e in events)
    by_name = {entry["event"]: entry for entry in logs if entry.get("job_id") == job_id}
    for name in ("job_started", "handler_says_hello", "job_succeeded"):
        assert by_name[name]["traceparent"] == TRACEPARENT, name
    # Outside the attempt nothing stays bound.
    assert "traceparent" not in structlog.contextvars.get_contextvars()
    assert not otel_trace.get_current_span().get_span_context().is_valid


async def test_a_failed_attempt_carries_the_trace_too(log: MemoryLog) -> None:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)

    @app.task(name="fails", max_attempts=1)
    async def fails() -> None:
        raise ConnectionError("down")

    job_id = await app.get_task("fails").options(traceparent=TRACEPARENT).enqueue()
    await run_job(app, log, job_id)
    (failed,) = [e for e in attempt_events(log, job_id) if isinstance(e, AttemptFailed)]
    assert failed.trace == TraceContext(traceparent=TRACEPARENT)


async def test_an_untraced_job_binds_nothing(log: MemoryLog) -> None:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)
    seen: dict[str, Any] = {}

    @app.task(name="plain")
    async def plain(ctx: Context) -> None:
        seen.update(trace=ctx.trace, bound=dict(structlog.contextvars.get_contextvars()))

    job_id = await app.enqueue("plain")
    with capture_logs() as logs:
        await run_job(app, log, job_id)
    assert seen == {"trace": None, "bound": {}}
    assert all(e.trace is None for e in attempt_events(log, job_id))
    assert not any("traceparent" in entry for entry in logs)


async def test_the_workers_own_logs_of_an_abandoned_attempt_name_the_trace(
    app: App, log: MemoryLog
) -> None:
    job_id = await app.get_task("traced").options(traceparent=TRACEPARENT).enqueue(1)
    (event,) = log.events(JobEnqueued)
    assert isinstance(event, JobEnqueued)
    feed = MemoryFeed(f"{NS}.dispatch.default")
    feed.put_dispatch(lease_of(event).dispatch)
    log.fail_next()  # AttemptStarted cannot be written: the attempt is abandoned
    with capture_logs() as logs:
        async with running(app, log, feed):
            # Checked at each of the worker's polls.
            await feed.wait_for(lambda _: any(e["event"] == "attempt_abandoned" for e in logs))
    (abandoned,) = [e for e in logs if e["event"] == "attempt_abandoned"]
    assert (abandoned["job_id"], abandoned["traceparent"]) == (job_id, TRACEPARENT)
