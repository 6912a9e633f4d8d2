"""Caller input to checked events: task definitions and enqueue or schedule calls, from any edge.

The client, the HTTP API and the operator CLI all turn what a caller asked for into events here, so
one set of checks (ids, times, labels, limits, size on the wire) holds whoever writes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from evsched.adapters.avro import encode_event
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.payload import NotJson, encode_args
from evsched.adapters.tracing import InvalidTrace, check_trace
from evsched.core import bounds, ids, unique
from evsched.core.events import (
    ControlEvent,
    Event,
    JobEnqueued,
    JobTemplate,
    KeyLimitSet,
    QueueLimitSet,
    QueuePaused,
    QueueResumed,
    RetryPolicy,
    ScheduleUpserted,
    TraceContext,
)
from evsched.core.schedule import cron
from evsched.errors import EncodeError, InvalidEnqueue, InvalidTask
from evsched.settings import Settings

# Kafka's default max.message.bytes is 1 MB; leave room for the record's own overhead.
MAX_EVENT_BYTES = 900 * 1024
MAX_AHEAD = timedelta(days=3653)
MAX_BEHIND = timedelta(days=366)
MAX_KEY_CHARS = 512
MAX_REASON_CHARS = 1_000
SOURCE = "client"

Delay = timedelta | float | int
# A uniqueness scope: "queued", "active", or a period (timedelta or seconds) for "period".
Unique = str | Delay
EventT = TypeVar("EventT", JobEnqueued, ScheduleUpserted)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """A task's name and defaults, checked once when the task is defined."""

    name: str
    queue: str = "default"
    max_attempts: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_ms: int = 300_000
    priority: int = 0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    permanent_on: tuple[type[BaseException], ...] = ()
    # The uniqueness scope of its jobs (core.unique) and the period of "period".
    unique: str | None = None
    unique_period_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOptions:
    """Per-call options; None keeps the task's default."""

    delay: Delay | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    priority: int | None = None
    labels: Mapping[str, str] | None = None
    trace: TraceContext | None = None
    # How long the job stays in the index once finished, and its idempotency key's window
    # (timedelta or seconds); None: the namespace's settings, else the defaults (7 days, 24 h).
    retention: Delay | None = None
    key_window: Delay | None = None
    # "queued", "active", or a period (timedelta or seconds); None: the task's.
    unique: Unique | None = None
    # Job ids this job waits on, and the rule that releases it (core.workflow.waits); the client
    # writes a ChildRegistered per parent in the enqueue's transaction (client.workflows).
    after: Sequence[str] | None = None
    after_rule: str | None = None


def task_spec(
    name: str,
    *,
    queue: str,
    max_attempts: int,
    retry: RetryPolicy,
    timeout_s: float,
    priority: int,
    retry_on: Sequence[type[BaseException]],
    permanent_on: Sequence[type[BaseException]],
    unique: Unique | None = None,
) -> TaskSpec:
    """A TaskSpec, or InvalidTask naming the first bad option."""
    if not isinstance(name, str) or not name:
        raise InvalidTask("name", "must be a non-empty string")
    try:
        Topics("ns").dispatch(queue)
    except (ValueError, TypeError) as exc:
        raise InvalidTask("queue", str(exc)) from exc
    if bounds.queue_refusal(queue) is not None:
        raise InvalidTask("queue", str(bounds.queue_refusal(queue)))
    if not _is_int(max_attempts) or not 1 <= max_attempts <= bounds.MAX_ATTEMPTS:
        raise InvalidTask(
            "max_attempts",
            f"must be an integer in [1, {bounds.MAX_ATTEMPTS}], not {max_attempts!r}",
        )
    if not _is_number(timeout_s) or not 0 < timeout_s <= bounds.MAX_DURATION_MS / 1000:
        raise InvalidTask(
            "timeout_s",
            f"must be a positive number of seconds, at most 10 years, not {timeout_s!r}",
        )
    if not _is_int(priority):
        raise InvalidTask("priority", f"must be an integer, not {priority!r}")
    _check_retry(retry)
    for option, classes in (("retry_on", retry_on), ("permanent_on", permanent_on)):
        if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise InvalidTask(option, "must be a sequence of exception classes")
    return TaskSpec(
        name=name,
        queue=queue,
        max_attempts=max_attempts,
        retry=retry,
        timeout_ms=max(1, round(timeout_s * 1000)),
        priority=priority,
        retry_on=tuple(retry_on),
        permanent_on=tuple(permanent_on),
        **_unique_fields(unique, InvalidTask),
    )


def _unique_fields(value: Unique | None, error: type[InvalidTask | InvalidEnqueue]) -> Any:
    """The JobEnqueued fields of a uniqueness option, or ``error`` naming what is wrong."""
    if value is None:
        return {"unique": None, "unique_period_ms": None}
    if isinstance(value, str):
        if value not in (unique.QUEUED, unique.ACTIVE):
            raise error("unique", f"must be 'queued', 'active' or a period, not {value!r}")
        return {"unique": value, "unique_period_ms": None}
    try:
        period_ms = _delay_ms(value, "unique")
    except InvalidEnqueue as exc:
        raise error("unique", f"a period {exc.reason}") from exc
    if period_ms <= 0:
        raise error("unique", "a period must be longer than 0 s")
    return {"unique": unique.PERIOD, "unique_period_ms": period_ms}


def _check_retry(retry: RetryPolicy) -> None:
    if not isinstance(retry, RetryPolicy):
        raise InvalidTask("retry", "must be an evsched RetryPolicy")
    if retry.initial_backoff_ms < 0 or retry.max_backoff_ms < retry.initial_backoff_ms:
        raise InvalidTask("retry", "needs 0 <= initial_backoff_ms <= max_backoff_ms")
    if retry.multiplier < 1 or not 0 <= retry.jitter <= 1:
        raise InvalidTask("retry", "needs multiplier >= 1 and 0 <= jitter <= 1")
    refusal = bounds.retry_refusal(retry)
    if refusal is not None:
        raise InvalidTask("retry", refusal)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def args_bytes(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    try:
        return encode_args(args, kwargs)
    except NotJson as exc:
        raise InvalidEnqueue("args", f"not JSON-serialisable: {exc}") from exc


def resolve_run_at(now_ms: int, delay: Delay | None, run_at: datetime | None) -> int | None:
    """The epoch-ms start asked for (None: as soon as possible); InvalidEnqueue if absurd."""
    if delay is not None and run_at is not None:
        raise InvalidEnqueue("run_at", "give either delay or run_at, not both")
    if delay is not None:
        return now_ms + _delay_ms(delay)
    if run_at is None:
        return None
    if not isinstance(run_at, datetime) or run_at.utcoffset() is None:
        raise InvalidEnqueue("run_at", "must be a timezone-aware datetime (e.g. tzinfo=UTC)")
    at_ms = math.floor(run_at.timestamp() * 1000)
    if at_ms > now_ms + _ms(MAX_AHEAD):
        raise InvalidEnqueue("run_at", f"{run_at.isoformat()} is more than 10 years ahead")
    if at_ms < now_ms - _ms(MAX_BEHIND):
        raise InvalidEnqueue("run_at", f"{run_at.isoformat()} is more than a year in the past")
    return at_ms


def _delay_ms(delay: Delay, what: str = "delay") -> int:
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif _is_number(delay) and math.isfinite(delay):
        seconds = float(delay)
    else:
        raise InvalidEnqueue(what, f"must be a timedelta or seconds, not {delay!r}")
    if seconds < 0:
        raise InvalidEnqueue(what, f"must not be negative, not {seconds} s")
    if seconds > MAX_AHEAD.total_seconds():
        raise InvalidEnqueue(what, "must be at most 10 years")
    return math.ceil(seconds * 1000)


def _window_ms(what: str, value: Delay | None, default: int | None) -> int | None:
    return default if value is None else _delay_ms(value, what)


def _ms(span: timedelta) -> int:
    return int(span.total_seconds() * 1000)


def job_template(
    spec: TaskSpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    priority: int | None = None,
    labels: Mapping[str, str] | None = None,
) -> JobTemplate:
    """What a cron schedule of the task ``spec`` enqueues at each slot; InvalidEnqueue if bad."""
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise InvalidEnqueue("priority", f"must be an integer, not {priority!r}")
    return JobTemplate(
        task=spec.name,
        queue=spec.queue,
        args=args_bytes(args, kwargs),
        priority=spec.priority if priority is None else priority,
        max_attempts=spec.max_attempts,
        retry=spec.retry,
        timeout_ms=spec.timeout_ms,
        labels=check_labels(labels),
    )


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise InvalidEnqueue("labels", "must map strings to strings")
    refusal = bounds.labels_refusal(labels)
    if refusal is not None:
        raise InvalidEnqueue("labels", refusal)
    return dict(labels)


def checked_trace(trace: TraceContext | None) -> TraceContext | None:
    if trace is None:
        return None
    try:
        return check_trace(trace)
    except InvalidTrace as exc:
        raise InvalidEnqueue("trace", str(exc)) from exc


def check_id(what: str, value: object) -> str:
    """A job or schedule id: every one the fold takes (bounds.MAX_ID_BYTES UTF-8 bytes)."""
    if not isinstance(value, str) or not value:
        raise InvalidEnqueue(what, "must be a non-empty string")
    refusal = bounds.id_refusal(what, value)
    if refusal is not None:
        raise InvalidEnqueue(what, refusal)
    return value


def check_key(value: object) -> str:
    """An idempotency key: an id's bounds, and the Idempotency-Key header's characters."""
    if isinstance(value, str) and len(value) > MAX_KEY_CHARS:
        raise InvalidEnqueue("idempotency_key", f"must have at most {MAX_KEY_CHARS} characters")
    return check_id("idempotency_key", value)


def check_limits(event: EventT) -> EventT:
    """``event``, or InvalidEnqueue naming the field when the fold would refuse it (its limits)."""
    refusal = bounds.refusal(event)
    if refusal is not None:
        field = re.match(r"[A-Za-z_.]*", refusal)
        raise InvalidEnqueue(field.group() if field else "event", refusal)
    return event


def build_enqueue(
    spec: TaskSpec,
    args: bytes,
    options: EnqueueOptions,
    *,
    now_ms: int,
    new_id: Callable[[], str],
    defaults: Settings | None = None,
) -> JobEnqueued:
    """The JobEnqueued of one call; its job id derives from the idempotency key when given.

    ``defaults`` holds the namespace's retention and key window, for calls that give none.
    """
    run_at = resolve_run_at(now_ms, options.delay, options.run_at)
    priority = spec.priority if options.priority is None else options.priority
    if not _is_int(priority):
        raise InvalidEnqueue("priority", f"must be an integer, not {priority!r}")
    key = options.idempotency_key
    if key is not None:
        check_key(key)
    scoped = (
        _unique_fields(options.unique, InvalidEnqueue)
        if options.unique is not None
        else {"unique": spec.unique, "unique_period_ms": spec.unique_period_ms}
    )
    job_id = _job_id(spec, args, key, scoped["unique"] is not None, new_id)
    retention_ms = None if defaults is None else defaults.retention_ms
    key_window_ms = None if defaults is None else defaults.key_window_ms
    return check_limits(
        JobEnqueued(
            event_id=new_id(),
            job_id=job_id,
            emitted_at=now_ms,
            source=SOURCE,
            task=spec.name,
            queue=spec.queue,
            args=args,
            run_at=run_at,
            priority=priority,
            max_attempts=spec.max_attempts,
            retry=spec.retry,
            timeout_ms=spec.timeout_ms,
            idempotency_key=key,
            body_digest=ids.body_digest(spec.name, spec.queue, args),
            labels=check_labels(options.labels),
            trace=checked_trace(options.trace),
            retention_ms=_window_ms("retention", options.retention, retention_ms),
            key_window_ms=_window_ms("key_window", options.key_window, key_window_ms),
            **scoped,
            after=_after(options.after),
            after_rule=options.after_rule or "all_succeeded",
        )
    )


def _job_id(
    spec: TaskSpec, args: bytes, key: str | None, unique: bool, new_id: Callable[[], str]
) -> str:
    """A keyed job's id derives from its key, a unique one's from its body: repeats meet."""
    if key is not None:
        return ids.job_id_for_key(spec.queue, key)
    return ids.job_id_for_unique(spec.queue, spec.name, args) if unique else new_id()


def _after(after: Sequence[str] | None) -> tuple[str, ...]:
    if after is None:
        return ()
    if isinstance(after, str) or not all(isinstance(p, str) for p in after):
        raise InvalidEnqueue("after", "must be a list of job ids")
    return tuple(after)


def build_schedule(
    schedule_id: str,
    cron_expression: str,
    timezone: str,
    template: JobTemplate,
    *,
    now_ms: int,
    event_id: str,
    catchup_window: Delay | None = None,
    max_jitter: Delay | None = None,
    overlap: str | None = None,
) -> ScheduleUpserted:
    """A ScheduleUpserted, after checking the cron expression and the time zone on their own.

    ``catchup_window`` and ``max_jitter`` (timedelta or seconds) and ``overlap`` (allow, skip or
    buffer) are its cron policies (``core.schedule.policy``); None keeps the original rules.
    """
    if overlap is not None and overlap not in bounds.OVERLAPS:
        raise InvalidEnqueue("overlap", f"must be one of {', '.join(bounds.OVERLAPS)}")
    check_id("schedule_id", schedule_id)
    # Checked one at a time, so the error names the field that is wrong.
    for what, expression, zone in (
        ("timezone", "* * * * *", timezone),
        ("cron", cron_expression, "UTC"),
    ):
        try:
            cron.validate(expression, zone)
        except (cron.InvalidSchedule, TypeError) as exc:
            raise InvalidEnqueue(what, str(exc)) from exc
    return check_limits(
        ScheduleUpserted(
            event_id=event_id,
            schedule_id=schedule_id,
            emitted_at=now_ms,
            source=SOURCE,
            cron=cron_expression,
            timezone=timezone,
            template=template,
            catchup_window_ms=_window_ms("catchup_window", catchup_window, None),
            max_jitter_ms=_window_ms("max_jitter", max_jitter, None),
            overlap=overlap,
        )
    )


def build_control(
    kind: type[ControlEvent], name: str, *, reason: str, now_ms: int, event_id: str
) -> ControlEvent:
    """A pause or resume of a queue (``Queue*`` kinds) or a schedule, checked."""
    is_queue = kind in (QueuePaused, QueueResumed)
    if is_queue:
        refusal = bounds.queue_refusal(name)
        if refusal is not None:
            raise InvalidEnqueue("queue", refusal)
    else:
        check_id("schedule_id", name)
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise InvalidEnqueue("reason", f"must be a string of at most {MAX_REASON_CHARS} chars")
    fields: dict[str, Any] = {"queue" if is_queue else "schedule_id": name}
    return kind(event_id=event_id, emitted_at=now_ms, source=SOURCE, reason=reason, **fields)


def build_limit(
    name: str,
    *,
    key: bool = False,
    max_running: int | None = None,
    rate: tuple[int, int] | None = None,
    reason: str = "",
    now_ms: int,
    event_id: str,
) -> QueueLimitSet | KeyLimitSet:
    """A queue's (or with ``key``, a concurrency key's) global limits, checked: at most
    ``max_running`` at once, at most ``rate`` = (starts, per_ms) permits per window; None each
    removes that limit."""
    starts, per = rate if rate is not None else (None, None)
    numbers = {"max_running": max_running, "rate_starts": starts, "rate_per_ms": per}
    for name_of, value in numbers.items():
        if value is not None and not _is_int(value):
            raise InvalidEnqueue(name_of, f"must be an integer, not {value!r}")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise InvalidEnqueue("reason", f"must be a string of at most {MAX_REASON_CHARS} chars")
    common: dict[str, Any] = {
        "event_id": event_id, "emitted_at": now_ms, "source": SOURCE, "max_running": max_running,
        "rate_starts": starts, "rate_per_ms": per, "reason": reason,
    }  # fmt: skip
    if not isinstance(name, str):
        raise InvalidEnqueue("key" if key else "queue", "must be a string")
    event = KeyLimitSet(key=name, **common) if key else QueueLimitSet(queue=name, **common)
    refusal = bounds.refusal(event)
    if refusal is not None:
        raise InvalidEnqueue(refusal.split(" ", 1)[0], refusal)
    return event


def encode_checked(event: Event) -> bytes:
    """The event's bytes, or InvalidEnqueue when they cannot be written or would be too big."""
    try:
        data = encode_event(event)
    except EncodeError as exc:
        raise InvalidEnqueue("event", exc.reason) from exc
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEnqueue(
            "args", f"the event is {len(data)} bytes, above the {MAX_EVENT_BYTES}-byte limit"
        )
    return data
