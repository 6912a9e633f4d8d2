"""The write path: events built with the client library's own checks, produced with acks=all, then
judged by this API's replica, so a response tells what the fold made of the write.

Tasks are named, not imported: the API process runs no user code. A task the optional ``--app``
defines lends its defaults (queue, attempts, retry, timeout, priority) and its signature check;
any other name is enqueued as given, on the body's queue (default ``default``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

import structlog

from evsched.adapters.clock import monotonic_s
from evsched.adapters.ids import new_id
from evsched.api.errors import ApiError
from evsched.api.models import EnqueueRequest, RequeueRequest, ScheduleRequest
from evsched.api.reader import ReplicaView, timeline
from evsched.client.app import App
from evsched.client.workflows import registrations, write_atomically
from evsched.commands import (
    EnqueueOptions,
    TaskSpec,
    Unique,
    args_bytes,
    build_enqueue,
    build_schedule,
    check_id,
    check_limits,
    job_template,
    resolve_run_at,
    task_spec,
)
from evsched.core.events import (
    Event,
    EventTimeline,
    JobCancelled,
    JobEnqueued,
    JobRequeued,
    RetryPolicy,
    ScheduleDeleted,
    ScheduleUpserted,
    entity_id,
)
from evsched.core.state import TimelineEntry
from evsched.errors import InvalidEnqueue, NotEnoughReplicas, PublishError
from evsched.metrics import Metrics
from evsched.ports import Appended

SOURCE = "api"
log = structlog.get_logger("evsched.api")
T = TypeVar("T")


class NotYetApplied(Exception):
    """The write's outcome is not known within the timeout.

    ``appended`` is where the broker put it when it acknowledged it (the replica has not applied
    it yet); None when the broker has not acknowledged it yet (it may still be written).
    """

    def __init__(self, entity: str, appended: Appended | None, location: str) -> None:
        where = "unconfirmed" if appended is None else f"p{appended.partition}@{appended.offset}"
        super().__init__(f"{entity} written: {where}")
        self.entity = entity
        self.appended = appended
        self.location = location


@dataclass(slots=True)
class Writer:
    """Publishes events and returns the verdict the replica gave them (read-your-writes).

    One timeout bounds a whole write, the send and the read-back of every record it wrote.
    """

    client: App
    replica: ReplicaView
    metrics: Metrics
    wait_timeout_s: float
    # Sends that outlived their request: kept referenced until they end (and are logged).
    _pending: set[asyncio.Future[Any]] = field(default_factory=set)

    async def write(self, event: Event, location: str) -> TimelineEntry:
        """The event's timeline entry once applied here; NotYetApplied past the timeout.

        The timeout bounds the whole write: a frozen broker gets a NotYetApplied without a
        position, and the send goes on in the background (the producer retries it).
        """
        started = monotonic_s()
        entity = entity_id(event)
        appended = await self.send(self._publish(event), entity, location)
        if isinstance(event, JobEnqueued):
            self.metrics.enqueue_latency.observe(monotonic_s() - started)
        schedule = event.timeline is EventTimeline.SCHEDULE
        deadline = started + self.wait_timeout_s
        entry = await self.entry_at(entity, appended, deadline, schedule=schedule)
        if entry is None:
            raise NotYetApplied(entity, appended, location)
        return entry

    async def _publish(self, event: Event) -> Appended:
        if isinstance(event, JobEnqueued) and event.after:
            # A waiting job's registrations with its parents go in its enqueue's transaction.
            written: list[Event] = [event, *registrations(event, event.emitted_at)]
            return (await write_atomically(self.client, written))[0]
        return await self.client.publish(event)

    def deadline(self) -> float:
        """When a write starting now is out of time, on the monotonic clock."""
        return monotonic_s() + self.wait_timeout_s

    async def send(self, sending: Awaitable[T], entity: str, location: str) -> T:
        """What ``sending`` (a produce) returns once the broker acknowledged it.

        ApiError 503 when the broker refused it; past the timeout NotYetApplied without a
        position, while the send goes on in the background (the producer retries it).
        """
        send = asyncio.ensure_future(sending)
        try:
            return await asyncio.wait_for(asyncio.shield(send), self.wait_timeout_s)
        except NotEnoughReplicas as exc:  # retriable: the brokers are down, not this request
            raise ApiError(
                503, "not_enough_replicas", str(exc), headers={"Retry-After": "5"}
            ) from exc
        except PublishError as exc:
            raise ApiError(503, "broker_unavailable", str(exc)) from exc
        except TimeoutError:
            self.metrics.writes_unconfirmed.inc()
            self._pending.add(send)
            send.add_done_callback(partial(_settled, self._pending, entity))
            raise NotYetApplied(entity, None, location) from None

    async def applied(self, appended: Appended, deadline: float) -> bool:
        """Whether this replica folded ``appended`` by ``deadline`` (see :meth:`deadline`)."""
        left = max(deadline - monotonic_s(), 0.001)
        try:
            await self.replica.wait_for(appended.partition, appended.offset, left)
        except TimeoutError:
            return False
        return True

    async def entry_at(
        self, entity: str, appended: Appended, deadline: float, *, schedule: bool = False
    ) -> TimelineEntry | None:
        """The timeline entry ``entity`` got for the record at ``appended``, once this replica
        folded it; None when it has not by ``deadline``."""
        if not await self.applied(appended, deadline):
            return None
        for entry in reversed(timeline(self.replica, entity, schedule=schedule)):
            if entry.offset == appended.offset and entry.partition == appended.partition:
                return entry
        raise RuntimeError(f"p{appended.partition}@{appended.offset} folded without an entry")

    def now_ms(self) -> int:
        return self.client.clock.now_ms()


def _settled(pending: set[asyncio.Future[Any]], entity: str, send: asyncio.Future[Any]) -> None:
    """Log how a send that outlived its request ended (the client was told "unconfirmed")."""
    pending.discard(send)
    if send.cancelled():
        log.warning("unconfirmed_write_cancelled", entity=entity)
    elif (error := send.exception()) is not None:
        log.warning("unconfirmed_write_failed", entity=entity, error=repr(error))
    else:
        done = send.result()
        # One record's position; a write of many (a batch, a queue's control) logs its entity.
        where = (
            {"partition": done.partition, "offset": done.offset}
            if isinstance(done, Appended)
            else {}
        )
        log.info("unconfirmed_write_acknowledged", entity=entity, **where)


# --- events from requests ----------------------------------------------------------------------


def _spec(
    client: App,
    task: str,
    *,
    queue: str | None,
    max_attempts: int | None,
    timeout_s: float | None,
    retry: RetryPolicy | None = None,
) -> TaskSpec:
    """The task's options: the app's definition if any, the body's overrides, checked."""
    defined = client.tasks.get(task)
    base = defined.spec if defined is not None else TaskSpec(name=task)
    if defined is not None and queue is not None and queue != base.queue:
        raise InvalidEnqueue("queue", f"task {task!r} runs on queue {base.queue!r}")
    spec = task_spec(
        task,
        queue=base.queue if queue is None else queue,
        max_attempts=base.max_attempts if max_attempts is None else max_attempts,
        retry=base.retry if retry is None else retry,
        timeout_s=base.timeout_ms / 1000 if timeout_s is None else timeout_s,
        priority=base.priority,
        retry_on=base.retry_on,
        permanent_on=base.permanent_on,
    )
    return replace(spec, unique=base.unique, unique_period_ms=base.unique_period_ms)


def _unique_option(body: EnqueueRequest) -> Unique | None:
    """The body's uniqueness option as the client takes it, or InvalidEnqueue naming the field."""
    if body.unique == "period":
        if body.unique_period_s is None:
            raise InvalidEnqueue("unique_period_s", "is required with unique 'period'")
        return body.unique_period_s
    if body.unique_period_s is not None:
        raise InvalidEnqueue("unique_period_s", "is only for unique 'period'")
    return body.unique


def _check_call(client: App, body: EnqueueRequest | ScheduleRequest) -> None:
    defined = client.tasks.get(body.task)
    if defined is not None:
        defined.check_call(body.args, body.kwargs)


def enqueue_event(
    client: App, body: EnqueueRequest, idempotency_key: str | None, now_ms: int
) -> JobEnqueued:
    spec = _spec(
        client,
        body.task,
        queue=body.queue,
        max_attempts=body.max_attempts,
        timeout_s=body.timeout_s,
        retry=None if body.retry is None else body.retry.policy(),
    )
    _check_call(client, body)
    options = EnqueueOptions(
        delay=body.delay_s,
        run_at=body.run_at,
        idempotency_key=idempotency_key,
        priority=body.priority,
        labels=body.labels,
        retention=body.retention_s,
        key_window=body.key_window_s,
        unique=_unique_option(body),
    )
    event = build_enqueue(
        spec,
        args_bytes(body.args, body.kwargs),
        options,
        now_ms=now_ms,
        new_id=new_id,
        defaults=client.settings,
    )
    return replace(_waiting(event, body), source=SOURCE)


def _waiting(event: JobEnqueued, body: EnqueueRequest) -> JobEnqueued:
    """The enqueue with the body's workflow fields, which make sense only with ``after``."""
    if not body.after:
        for name in ("after_rule", "results_to_args"):
            if getattr(body, name) is not None:
                raise InvalidEnqueue(name, "is only for a job with after (its parents)")
        return event
    return check_limits(
        replace(
            event,
            after=tuple(body.after),
            after_rule=body.after_rule or event.after_rule,
            results_to_args=body.results_to_args or event.results_to_args,
        )
    )


def cancel_event(job_id: str, reason: str, now_ms: int) -> JobCancelled:
    return JobCancelled(
        event_id=new_id(),
        job_id=check_id("job_id", job_id),
        emitted_at=now_ms,
        source=SOURCE,
        reason=reason,
    )


def requeue_event(job_id: str, body: RequeueRequest, now_ms: int) -> JobRequeued:
    return JobRequeued(
        event_id=new_id(),
        job_id=check_id("job_id", job_id),
        emitted_at=now_ms,
        source=SOURCE,
        reason=body.reason,
        run_at=resolve_run_at(now_ms, body.delay_s, body.run_at),
        rerun=body.rerun,
    )


def schedule_event(
    client: App, schedule_id: str, body: ScheduleRequest, now_ms: int
) -> ScheduleUpserted:
    spec = _spec(
        client,
        body.task,
        queue=body.queue,
        max_attempts=body.max_attempts,
        timeout_s=body.timeout_s,
    )
    _check_call(client, body)
    template = job_template(
        spec, body.args, body.kwargs, priority=body.priority, labels=body.labels
    )
    event = build_schedule(
        schedule_id,
        body.cron,
        body.timezone,
        template,
        now_ms=now_ms,
        event_id=new_id(),
        catchup_window=body.catchup_window_s,
        max_jitter=body.max_jitter_s,
        overlap=body.overlap,
    )
    return replace(event, source=SOURCE)


def delete_schedule_event(schedule_id: str, now_ms: int) -> ScheduleDeleted:
    return ScheduleDeleted(
        event_id=new_id(),
        schedule_id=check_id("schedule_id", schedule_id),
        emitted_at=now_ms,
        source=SOURCE,
    )
