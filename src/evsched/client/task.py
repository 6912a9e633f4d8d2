"""A defined task: its handler and defaults, and how calls to it become enqueues."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from evsched.adapters import spans
from evsched.adapters.ids import new_id
from evsched.adapters.tracing import InvalidTrace, current_trace, make_trace
from evsched.client.limits import with_concurrency_key
from evsched.client.results import JobHandle
from evsched.client.snooze import DEFAULT_MAX_SNOOZES, checked_max_snoozes
from evsched.client.workflows import registrations, write_atomically
from evsched.commands import (
    Delay,
    EnqueueOptions,
    TaskSpec,
    Unique,
    args_bytes,
    build_enqueue,
    job_template,
)
from evsched.core.events import JobEnqueued, JobTemplate, TraceContext
from evsched.core.failures import category_refusal
from evsched.errors import InvalidEnqueue, InvalidTask

if TYPE_CHECKING:
    from evsched.client.app import App

Handler = Callable[..., Any]
CONTEXT_PARAMETER = "ctx"
# Argument shapes a task remembers as accepted by its handler (a handful in practice).
ACCEPTED_SHAPES = 64
# Exception classes to the failure category their failures are counted under.
Categories = Mapping[type[BaseException], str]


def checked_categories(categories: Categories | None, field: str = "categories") -> Categories:
    """``categories`` as a dict, InvalidTask when a key is no exception class or a name is bad."""
    checked: dict[type[BaseException], str] = {}
    for kind, name in (categories or {}).items():
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise InvalidTask(field, f"{kind!r} is not an exception class")
        reason = category_refusal(name)
        if reason is not None:
            raise InvalidTask(field, reason)
        checked[kind] = name
    return checked


def takes_context(handler: Handler) -> bool:
    """The rule: a handler gets the attempt's Context iff its first parameter is named ``ctx``."""
    parameters = list(inspect.signature(handler).parameters.values())
    return bool(parameters) and parameters[0].name == CONTEXT_PARAMETER


def qualified_name(kind: type[BaseException]) -> str:
    """``module.QualName`` of an exception class; builtins by their bare name (``TimeoutError``)."""
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


class Task:
    """What ``@app.task`` returns: call it to run the handler here, ``enqueue`` to make a job."""

    def __init__(
        self,
        app: App,
        spec: TaskSpec,
        handler: Handler,
        categories: Categories | None = None,
        *,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
    ) -> None:
        self.app = app
        self.spec = spec
        self.categories = checked_categories(categories)
        self.max_snoozes = checked_max_snoozes(max_snoozes)
        self.name = spec.name
        self.handler = handler
        self.takes_context = takes_context(handler)
        self.is_async = inspect.iscoroutinefunction(handler)
        self._signature = inspect.signature(handler)
        # Argument shapes (how many positional, which keywords) the signature took: binding
        # depends on nothing else, and a worker checks every job's arguments before it runs.
        self._accepted: set[tuple[int, frozenset[str]]] = set()
        self._defaults = TaskOptions(self, EnqueueOptions())  # immutable: one for every call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.handler(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.spec.queue}>"

    def options(
        self,
        *,
        delay: Delay | None = None,
        run_at: datetime | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
        trace: TraceContext | str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
        retention: Delay | None = None,
        key_window: Delay | None = None,
        unique: Unique | None = None,
        after: Sequence[str] | None = None,
        after_rule: str | None = None,
        concurrency_key: str | None = None,
    ) -> TaskOptions:
        """This task with per-call options: ``await task.options(delay=60).enqueue(x)``.

        ``delay`` is a timedelta or seconds from now, ``run_at`` an aware datetime (not both).
        With ``idempotency_key`` the job id derives from (queue, key): repeats make one job.
        ``traceparent`` (and ``tracestate``), or ``trace`` (a TraceContext or a traceparent), is
        the W3C trace context the job carries to its worker; by default the active OpenTelemetry
        span's, when OpenTelemetry is installed and a span is active. ``retention`` (how long the
        finished job stays readable) and ``key_window`` (how long after it ends its key still
        returns it) are timedeltas or seconds; by default the namespace's settings. ``unique``
        overrides the task's uniqueness scope (see ``App.task``). ``after`` lists job ids the
        job waits on, ``after_rule`` (``all_succeeded``, ``all_finished``, ``any_succeeded``)
        when they release it (docs/job-lifecycle.md, "Workflows"). ``concurrency_key`` puts
        the job under the limits set for that key (``App.limit_key``), whatever its queue.
        """
        return TaskOptions(
            self,
            EnqueueOptions(
                delay=delay,
                run_at=run_at,
                idempotency_key=idempotency_key,
                priority=priority,
                labels=with_concurrency_key(labels, concurrency_key),
                trace=_trace_option(trace, traceparent, tracestate),
                retention=retention,
                key_window=key_window,
                unique=unique,
                after=after,
                after_rule=after_rule,
            ),
        )

    async def enqueue(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Enqueue a job with the task's defaults; returns its handle (its id, a ``str``) once the
        broker acknowledged it: ``await handle.result(timeout=…)`` waits for its outcome."""
        return await self._defaults.enqueue(*args, **kwargs)

    def enqueue_sync(self, *args: Any, **kwargs: Any) -> JobHandle:
        """``enqueue`` for sync code (any thread), on the app's private event loop."""
        return self._defaults.enqueue_sync(*args, **kwargs)

    def call(self, *args: Any, **kwargs: Any) -> EnqueueCall:
        """One call for ``app.enqueue_many``, with the task's defaults."""
        return self._defaults.call(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> EnqueueCall:
        """A step of a workflow (``chain``, ``group``): ``call`` under Celery's name."""
        return self.call(*args, **kwargs)

    def is_retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, self.spec.permanent_on):
            return False
        return isinstance(exc, self.spec.retry_on)

    def category_for(self, exc: BaseException) -> str | None:
        """The category ``exc``'s class (or its nearest base) is mapped to, by this task's
        ``categories`` or else the app's ``failure_categories``; None when neither maps it."""
        for kind in type(exc).__mro__:
            for mapping in (self.categories, self.app.failure_categories):
                if kind in mapping:
                    return mapping[kind]
        return None

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """InvalidEnqueue when the handler could not be called with these arguments."""
        shape = (len(args), frozenset(kwargs))
        if shape in self._accepted:
            return
        leading = (None,) if self.takes_context else ()
        try:
            self._signature.bind(*leading, *args, **kwargs)
        except TypeError as exc:
            raise InvalidEnqueue("args", f"{self.name}: {exc}") from exc
        if len(self._accepted) < ACCEPTED_SHAPES:
            self._accepted.add(shape)

    def template(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> JobTemplate:
        """What a cron schedule of this task enqueues at each slot."""
        self.check_call(args, kwargs)
        return job_template(self.spec, args, kwargs, priority=priority, labels=labels)


def _trace_option(
    trace: TraceContext | str | None, traceparent: str | None, tracestate: str | None
) -> TraceContext | None:
    try:
        return make_trace(trace, traceparent, tracestate)
    except InvalidTrace as exc:
        raise InvalidEnqueue("trace", str(exc)) from exc


@dataclass(frozen=True, slots=True)
class EnqueueCall:
    """One call of a task with its options, for ``app.enqueue_many``: ``task.call(...)``."""

    options: TaskOptions
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


class TaskOptions:
    """A task with per-call options set; ``options()`` again to change some of them."""

    def __init__(self, task: Task, options: EnqueueOptions) -> None:
        self.task = task
        self.values = options

    def options(self, **changes: Any) -> TaskOptions:
        traceparent = changes.pop("traceparent", None)
        tracestate = changes.pop("tracestate", None)
        if "trace" in changes or traceparent is not None or tracestate is not None:
            changes["trace"] = _trace_option(changes.get("trace"), traceparent, tracestate)
        return TaskOptions(self.task, replace(self.values, **changes))

    def build(self, args: Sequence[Any], kwargs: Mapping[str, Any], now_ms: int) -> JobEnqueued:
        """The checked JobEnqueued of one call, with the app's namespace defaults (retention, key
        window) for what the options leave out; InvalidEnqueue when the call is refused."""
        self.task.check_call(args, kwargs)
        return build_enqueue(
            self.task.spec,
            args_bytes(args, kwargs),
            self.traced().values,
            now_ms=now_ms,
            new_id=new_id,
            defaults=self.task.app.settings,
        )

    async def enqueue(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Write the JobEnqueued; returns the job's handle once the broker acknowledged it."""
        traced = spans.tracer()
        if traced is None:
            return await self._enqueue(args, kwargs, None)
        with spans.enqueue_span(traced, self.values.trace) as span:
            try:
                return await self._enqueue(args, kwargs, span)
            except Exception as exc:
                span.failed(exc)
                raise

    async def _enqueue(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], span: spans.EnqueueSpan | None
    ) -> JobHandle:
        app = self.task.app
        event = self.build(args, kwargs, app.clock.now_ms())
        if span is not None:
            span.job(event.job_id, event.task, event.queue)
        if event.after:  # its registrations with the parents go in the same transaction
            appended = (
                await write_atomically(app, [event, *registrations(event, event.emitted_at)])
            )[0]
        else:
            appended = await app.publish(event)
        # A keyed job's first enqueue may be older than this one: its result is followed from
        # the partition's start.
        keyed = event.idempotency_key is not None or event.unique is not None
        return JobHandle(
            event.job_id,
            app,
            partition=appended.partition,
            offset=None if keyed else appended.offset,
        )

    def call(self, *args: Any, **kwargs: Any) -> EnqueueCall:
        """One call for ``app.enqueue_many``, with these options."""
        return EnqueueCall(self, args, kwargs)

    def s(self, *args: Any, **kwargs: Any) -> EnqueueCall:
        """A step of a workflow, with these options."""
        return self.call(*args, **kwargs)

    def enqueue_sync(self, *args: Any, **kwargs: Any) -> JobHandle:
        # The app's loop thread does not see this thread's OpenTelemetry context: take it here.
        traced = self.traced()
        result: JobHandle = self.task.app.run_sync(lambda: traced.enqueue(*args, **kwargs))
        return result

    def traced(self) -> TaskOptions:
        """These options, with the active OpenTelemetry span's context when no trace was given."""
        if self.values.trace is not None:
            return self
        current = current_trace()
        if current is None:
            return self
        return TaskOptions(self.task, replace(self.values, trace=current))
