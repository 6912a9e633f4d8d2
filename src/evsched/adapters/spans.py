"""evsched's own OpenTelemetry spans of a job: enqueue, lease, dispatch and run.

Only when an OpenTelemetry SDK's tracer provider is set (``trace.set_tracer_provider``): with the
API alone (it comes with FastAPI) or none, every function here returns at once and a job costs
nothing more. The spans of a job all belong to the trace its ``traceparent`` names:

- ``evsched.enqueue`` (producer), made by the client around the append until the broker's
  acknowledgement. A job given no trace, and enqueued with no active span, carries this span's
  context, so its later spans are its children; a job given a trace carries that one, and the
  enqueue span is a child of it.
- ``evsched.lease`` (from the job's due time to the node's lease) and ``evsched.dispatch`` (from
  the lease to the attempt's start) describe the node's part. The node itself makes no spans: its
  step is the hot path of every job, and its decision times travel in the dispatch record, so the
  worker that receives it reports both, with the node's timestamps (clocks of two machines: a skew
  shows as a short or empty span, never a negative one).
- ``evsched.run`` (consumer), from the attempt's start to its outcome, made by the worker; the
  handler runs inside it, so the handler's own spans are its children. A failed attempt's span has
  status ERROR with the error type; a success is "reported" (whether the fold accepts it, or finds
  it stale, is known only to the log).

Attributes: ``evsched.job_id``, ``evsched.task``, ``evsched.queue`` and, from the lease on,
``evsched.attempt``, ``evsched.token`` and ``evsched.partition``; ``messaging.system`` is
``kafka``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from evsched import __version__
from evsched.adapters.tracing import remote_context
from evsched.core.dispatch import Dispatch
from evsched.core.events import TraceContext

_NS_PER_MS = 1_000_000


def _trace_api() -> ModuleType | None:
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:  # pragma: no cover - the API comes with FastAPI
        return None


_TRACE = _trace_api()
# (provider, its tracer): a provider set later (or replaced, as tests do) gets its own tracer.
_cached: tuple[object, Any] | None = None
# A provider named by the environment is made on the first ``get_tracer_provider()``; without one,
# "none set yet" can be told from the API's global alone, not by looking at os.environ per enqueue.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def tracer() -> Any | None:
    """evsched's tracer from the provider set now; None without an SDK's provider."""
    global _cached  # noqa: PLW0603 - one cache of (provider, tracer), replaced with the provider
    if _TRACE is None:  # pragma: no cover - the API comes with FastAPI
        return None
    if not _PROVIDER_FROM_ENV and getattr(_TRACE, "_TRACER_PROVIDER", _TRACE) is None:
        return None  # no provider set (the attribute gone in another version: the long way)
    provider = _TRACE.get_tracer_provider()
    if isinstance(provider, _TRACE.ProxyTracerProvider | _TRACE.NoOpTracerProvider):
        return None
    if _cached is None or _cached[0] is not provider:
        _cached = (provider, provider.get_tracer("evsched", __version__))
    return _cached[1]


def _job_attributes(job_id: str, task: str, queue: str) -> dict[str, Any]:
    return {
        "messaging.system": "kafka",
        "evsched.job_id": job_id,
        "evsched.task": task,
        "evsched.queue": queue,
    }


class EnqueueSpan:
    """The client's span of one enqueue; ``job(job_id)`` names the job once it is built."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def job(self, job_id: str, task: str, queue: str) -> None:
        self._span.set_attributes(_job_attributes(job_id, task, queue))

    def failed(self, exc: BaseException) -> None:
        assert _TRACE is not None
        self._span.record_exception(exc)
        self._span.set_status(_TRACE.Status(_TRACE.StatusCode.ERROR, type(exc).__name__))


@contextmanager
def enqueue_span(traced: Any, trace: TraceContext | None) -> Iterator[EnqueueSpan]:
    """The current span while the enqueue runs, so a job without a trace of its own takes it;
    with one (given, or taken from the caller's thread by ``enqueue_sync``), its child."""
    assert _TRACE is not None
    with traced.start_as_current_span(
        "evsched.enqueue",
        context=None if trace is None else remote_context(trace),
        kind=_TRACE.SpanKind.PRODUCER,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield EnqueueSpan(span)


class AttemptSpans:
    """One attempt's spans, made by its worker: lease and dispatch once it started, then run."""

    def __init__(self, traced: Any, dispatch: Dispatch, now_ms: Callable[[], int]) -> None:
        self._tracer = traced
        self._dispatch = dispatch
        self._now_ms = now_ms
        self._attributes = _job_attributes(dispatch.job_id, dispatch.task, dispatch.queue) | {
            "evsched.attempt": dispatch.attempt,
            "evsched.token": dispatch.token,
            "evsched.partition": dispatch.partition,
        }
        self._run: Any = None
        self._current: Any = None

    def started(self) -> None:
        """The attempt's start is in the log: the node's part ends here and the run begins."""
        assert _TRACE is not None
        dispatch = self._dispatch
        now = self._now_ms()
        leased_at = min(dispatch.leased_at, now)
        due_at = min(dispatch.run_at, leased_at)
        for name, start, end in (
            ("evsched.lease", due_at, leased_at),
            ("evsched.dispatch", leased_at, now),
        ):
            span = self._tracer.start_span(
                name, start_time=start * _NS_PER_MS, attributes=self._attributes
            )
            span.end(end_time=end * _NS_PER_MS)
        self._run = self._tracer.start_span(
            "evsched.run",
            kind=_TRACE.SpanKind.CONSUMER,
            start_time=now * _NS_PER_MS,
            attributes=self._attributes,
        )
        self._current = _TRACE.use_span(self._run, end_on_exit=False)
        self._current.__enter__()

    def finished(self, outcome: str, error_type: str | None) -> None:
        """The attempt's outcome was sent: ``reported``, ``failed``, ``failed_permanent`` or
        ``snoozed``."""
        assert _TRACE is not None
        if self._run is None:
            return
        self._run.set_attribute("evsched.outcome", outcome)
        if error_type is not None:
            self._run.set_status(_TRACE.Status(_TRACE.StatusCode.ERROR, error_type))

    def close(self) -> None:
        if self._current is not None:
            self._current.__exit__(None, None, None)
            self._current = None
        if self._run is not None:
            self._run.end(end_time=self._now_ms() * _NS_PER_MS)
            self._run = None


class NoSpans:
    """An attempt's spans without an SDK: nothing."""

    def started(self) -> None:
        pass

    def finished(self, outcome: str, error_type: str | None) -> None:
        pass

    def close(self) -> None:
        pass


NO_SPANS = NoSpans()


@contextmanager
def attempt_spans(
    dispatch: Dispatch, now_ms: Callable[[], int]
) -> Iterator[AttemptSpans | NoSpans]:
    """The attempt's spans, closed on exit; ``NO_SPANS`` without an SDK."""
    traced = tracer()
    if traced is None:
        yield NO_SPANS
        return
    spans = AttemptSpans(traced, dispatch, now_ms)
    try:
        yield spans
    finally:
        spans.close()
