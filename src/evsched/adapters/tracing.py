"""W3C trace context from enqueue to the worker, with OpenTelemetry when it is installed.

Without OpenTelemetry a job carries the ``traceparent`` its producer gave and the worker binds it
to the attempt's log context; that is all. With it, an enqueue made inside an active span carries
that span's context when none was given, and a worker runs the handler inside the job's remote
context, so the handler's spans continue the producer's trace.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import structlog

from evsched.core.events import TraceContext

# version-traceid-parentid-flags in lowercase hex (W3C Trace Context): version ff and all-zero ids
# are invalid; a version above 00 may append fields after a dash.
_TRACEPARENT = re.compile(
    r"(?!ff)(?P<version>[0-9a-f]{2})-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
    r"(?P<more>-.*)?"
)
MAX_TRACESTATE_CHARS = 512


class InvalidTrace(ValueError):
    """A trace context that is not W3C Trace Context."""


def check_trace(trace: TraceContext) -> TraceContext:
    """``trace`` if its traceparent (and tracestate) are well formed; InvalidTrace otherwise."""
    if not isinstance(trace, TraceContext):
        raise InvalidTrace(f"must be an evsched TraceContext, not {type(trace).__name__}")
    parent = trace.traceparent
    shape = _TRACEPARENT.fullmatch(parent) if isinstance(parent, str) else None
    if shape is None or (shape["version"] == "00" and shape["more"] is not None):
        raise InvalidTrace(f"traceparent {parent!r} is not 00-<32 hex>-<16 hex>-<2 hex>")
    state = trace.tracestate
    if state is not None and (not isinstance(state, str) or len(state) > MAX_TRACESTATE_CHARS):
        raise InvalidTrace(f"tracestate must be a string of at most {MAX_TRACESTATE_CHARS} chars")
    return trace


def make_trace(
    trace: TraceContext | str | None, traceparent: str | None, tracestate: str | None
) -> TraceContext | None:
    """The client's ``trace=`` (a TraceContext or a traceparent) or ``traceparent=`` and
    ``tracestate=`` options as one TraceContext."""
    if trace is not None and (traceparent is not None or tracestate is not None):
        raise InvalidTrace("give either trace or traceparent/tracestate, not both")
    if isinstance(trace, str):
        return TraceContext(traceparent=trace)
    if traceparent is None:
        if tracestate is not None:
            raise InvalidTrace("tracestate needs a traceparent")
        return trace
    return TraceContext(traceparent=traceparent, tracestate=tracestate)


@functools.cache
def _opentelemetry() -> tuple[ModuleType, ModuleType, ModuleType] | None:
    """``(opentelemetry.propagate, opentelemetry.context, opentelemetry.trace)``, or None when not
    installed."""
    try:
        return (
            importlib.import_module("opentelemetry.propagate"),
            importlib.import_module("opentelemetry.context"),
            importlib.import_module("opentelemetry.trace"),
        )
    except ImportError:
        return None


def current_trace() -> TraceContext | None:
    """The active OpenTelemetry span's W3C context; None without one (or without OpenTelemetry)."""
    otel = _opentelemetry()
    if otel is None:
        return None
    if not otel[2].get_current_span().get_span_context().is_valid:
        return None  # no span to inject (most enqueues): the propagators' round is skipped
    carrier: dict[str, str] = {}
    otel[0].inject(carrier)
    parent = carrier.get("traceparent")
    if not parent:
        return None
    return TraceContext(traceparent=parent, tracestate=carrier.get("tracestate") or None)


def remote_context(trace: TraceContext) -> Any:
    """``trace`` as an OpenTelemetry context with it as the remote parent (needs OpenTelemetry)."""
    otel = _opentelemetry()
    assert otel is not None
    carrier = {"traceparent": trace.traceparent}
    if trace.tracestate:
        carrier["tracestate"] = trace.tracestate
    return otel[0].extract(carrier)


@contextmanager
def attempt_trace(trace: TraceContext | None) -> Iterator[None]:
    """Within it, logs carry ``traceparent`` and OpenTelemetry's current context is the job's."""
    if trace is None:
        yield
        return
    otel = _opentelemetry()
    attached = None
    if otel is not None:
        context = otel[1]
        attached = (context, context.attach(remote_context(trace)))
    try:
        with structlog.contextvars.bound_contextvars(traceparent=trace.traceparent):
            yield
    finally:
        if attached is not None:
            context, token = attached
            context.detach(token)
