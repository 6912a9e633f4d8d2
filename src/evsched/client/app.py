"""The client library: an App holds task definitions and writes enqueues and commands to the log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, overload

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.ids import new_id
from evsched.adapters.kafka.event_log_choice import event_log_factory
from evsched.adapters.kafka.job_feed import KafkaJobFeed
from evsched.adapters.kafka.queues import KafkaQueues, QueueCatalog, QueueLookupError, undeclared
from evsched.adapters.kafka.topics import Topics
from evsched.client.batch import MAX_BATCH, BatchResult, write_batch
from evsched.client.controls import control_event, publish_everywhere
from evsched.client.limits import limit_event, publish_limit
from evsched.client.per_loop import PerLoop
from evsched.client.results import JobHandle, terminal_state
from evsched.client.snooze import DEFAULT_MAX_SNOOZES
from evsched.client.sync import LoopThread
from evsched.client.task import Categories, EnqueueCall, Handler, Task, checked_categories
from evsched.client.workflows import Chain, Group, WorkflowHandle, enqueue_workflow
from evsched.commands import (
    SOURCE,
    Delay,
    Unique,
    build_schedule,
    check_id,
    encode_checked,
    resolve_run_at,
    task_spec,
)
from evsched.core.events import (
    ControlEvent,
    Event,
    JobCancelled,
    JobEnqueued,
    JobRequeued,
    QueuePaused,
    QueueResumed,
    RetryPolicy,
    ScheduleDeleted,
    SchedulePaused,
    ScheduleResumed,
    ScheduleUpserted,
    entity_id,
)
from evsched.core.state import JobState
from evsched.errors import (
    EvschedError,
    InvalidEnqueue,
    NoJobReader,
    PublishError,
    UnknownQueue,
    UnknownTask,
)
from evsched.ports import Appended, Clock, EventLog, JobFeed, JobReader
from evsched.settings import Settings


@dataclass(slots=True)
class _Producer:
    """A loop's EventLog, with the declared queues as that loop sees them (a KafkaQueues holds
    an asyncio lock)."""

    log: EventLog
    queues: QueueCatalog | None

    async def start(self) -> None:
        await self.log.start()

    async def close(self) -> None:
        await self.log.close()


class App:
    """Task definitions plus a producer: ``@app.task`` to define, ``await task.enqueue()`` to run.

    Writes return only after the broker acknowledged them (idempotent producer, acks=all).
    ``log_factory`` replaces Kafka (tests pass ``testing.MemoryLog``); ``feed_factory`` makes
    the follower results are read with (``testing.MemoryJobFeed``); ``reader`` serves
    :meth:`get_job`. Use ``async with app:`` (or ``with app:`` in sync code) to close it.
    Enqueues and schedules on a queue that is not declared raise UnknownQueue; ``queues`` says
    which are (default: the cluster's dispatch topics, or every queue with a ``log_factory``).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        name: str = "evsched",
        log_factory: Callable[[], EventLog] | None = None,
        reader: JobReader | None = None,
        clock: Clock = SYSTEM_CLOCK,
        queues: QueueCatalog | None = None,
        feed_factory: Callable[[], JobFeed] | None = None,
        failure_categories: Categories | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        # Exception classes to failure categories, for every task (a task's own map wins).
        self.failure_categories = checked_categories(failure_categories, "failure_categories")
        self.name = name
        self.topics = Topics(self.settings.namespace)
        self.reader = reader
        self.clock = clock
        # EVSCHED_KAFKA_CLIENT picks the Kafka client (aiokafka unless set to confluent).
        factory = log_factory or event_log_factory(
            self.settings, client_id=f"evsched-client-{name}"
        )
        self._tasks: dict[str, Task] = {}
        catalog = self._catalog_factory(queues, checked=log_factory is None)
        self._async_log = PerLoop(lambda: _Producer(factory(), catalog()))
        self._sync_log = PerLoop(lambda: _Producer(factory(), catalog()))
        if feed_factory is None and log_factory is None:
            feed_factory = lambda: KafkaJobFeed(  # noqa: E731
                self.settings, self.topics.events, client_id=f"evsched-follow-{name}"
            )
        self._feed_factory = feed_factory
        self._async_feed = PerLoop(self._make_feed)
        self._sync_feed = PerLoop(self._make_feed)
        self._sync = LoopThread(f"evsched-client-{name}", cleanup=self._close_sync_loop)

    # --- definitions ----------------------------------------------------------------------------

    @overload
    def task(self, fn: Handler, /) -> Task: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        retry: RetryPolicy | None = None,
        timeout_s: float = 300,
        priority: int = 0,
        retry_on: Sequence[type[BaseException]] = (Exception,),
        permanent_on: Sequence[type[BaseException]] = (),
        categories: Categories | None = None,
        unique: Unique | None = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
    ) -> Callable[[Handler], Task]: ...

    def task(
        self,
        fn: Handler | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        retry: RetryPolicy | None = None,
        timeout_s: float = 300,
        priority: int = 0,
        retry_on: Sequence[type[BaseException]] = (Exception,),
        permanent_on: Sequence[type[BaseException]] = (),
        categories: Categories | None = None,
        unique: Unique | None = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
    ) -> Task | Callable[[Handler], Task]:
        """Define a task; its name defaults to ``module.function_name``.

        An exception in ``permanent_on`` kills the job at once; one in ``retry_on`` (and not in
        ``permanent_on``) is retried while attempts are left; any other is permanent.
        ``categories`` maps exception classes to the failure category (snake_case) their
        failures are reported under, before the app's ``failure_categories``; unmapped ones are
        ``transient`` or ``permanent``. ``unique`` makes an enqueue of the same task and args
        (or idempotency key) a duplicate that gets the existing job: ``"queued"`` while it has
        not started, ``"active"`` while queued or running, or a timedelta (or seconds) from its
        enqueue. ``max_snoozes`` caps how often a handler may snooze one job (``Snooze``, see
        docs/job-lifecycle.md "Snooze"); a snooze past it counts as a failed attempt.
        """

        def define(handler: Handler) -> Task:
            spec = task_spec(
                name if name is not None else f"{handler.__module__}.{handler.__name__}",
                queue=queue,
                max_attempts=max_attempts,
                retry=retry if retry is not None else RetryPolicy(),
                timeout_s=timeout_s,
                priority=priority,
                retry_on=retry_on,
                permanent_on=permanent_on,
                unique=unique,
            )
            if spec.name in self._tasks:
                raise EvschedError(f"task {spec.name!r} is defined twice")
            defined = Task(self, spec, handler, categories, max_snoozes=max_snoozes)
            self._tasks[spec.name] = defined
            return defined

        return define if fn is None else define(fn)

    @property
    def tasks(self) -> Mapping[str, Task]:
        return dict(self._tasks)

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues the app's tasks run on, in definition order."""
        return tuple(dict.fromkeys(t.spec.queue for t in self._tasks.values()))

    def get_task(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(name) from None

    # --- writes ---------------------------------------------------------------------------------

    async def enqueue(self, task: str, /, *args: Any, **kwargs: Any) -> JobHandle:
        """Enqueue the task named ``task`` with default options; returns the job's handle."""
        return await self.get_task(task).enqueue(*args, **kwargs)

    def enqueue_sync(self, task: str, /, *args: Any, **kwargs: Any) -> JobHandle:
        return self.get_task(task).enqueue_sync(*args, **kwargs)

    async def cancel(self, job_id: str, *, reason: str = "") -> None:
        """Ask for the job to stop; a running attempt's later completion is rejected."""
        check_id("job_id", job_id)
        await self.publish(
            JobCancelled(
                event_id=new_id(),
                job_id=job_id,
                emitted_at=self.clock.now_ms(),
                source=SOURCE,
                reason=reason,
            )
        )

    async def requeue(
        self,
        job_id: str,
        *,
        reason: str = "",
        delay: Delay | None = None,
        run_at: datetime | None = None,
        rerun: bool = False,
    ) -> JobHandle:
        """Send a dead or cancelled job back to scheduled, with a fresh attempt budget; with
        ``rerun``, a succeeded job too, to run it again (audited as a rerun). Returns a handle
        whose ``result()`` is the outcome after this requeue."""
        check_id("job_id", job_id)
        now = self.clock.now_ms()
        appended = await self.publish(
            JobRequeued(
                event_id=new_id(),
                job_id=job_id,
                emitted_at=now,
                source=SOURCE,
                reason=reason,
                run_at=resolve_run_at(now, delay, run_at),
                rerun=rerun,
            )
        )
        return JobHandle(job_id, self, partition=appended.partition, after=appended.offset)

    async def upsert_schedule(
        self,
        schedule_id: str,
        cron: str,
        timezone: str,
        task: str | Task,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
        catchup_window: Delay | None = None,
        max_jitter: Delay | None = None,
        overlap: str | None = None,
    ) -> None:
        """Create or replace a cron schedule that enqueues ``task`` at each slot.

        ``catchup_window`` (timedelta or seconds): slots missed while no node ran (or while
        paused) fire one by one if within it, older ones are skipped; by default missed slots
        collapse into one fire. ``max_jitter``: each job runs up to this long after its slot, by
        an offset derived from (schedule, slot). ``overlap``: ``"skip"`` fires nothing while
        the previous fire's job is queued or running, ``"buffer"`` runs one fire after it
        ends, ``"allow"`` (the default) runs them all.
        """
        defined = task if isinstance(task, Task) else self.get_task(task)
        template = defined.template(args, kwargs or {}, priority=priority, labels=labels)
        event = build_schedule(
            schedule_id,
            cron,
            timezone,
            template,
            now_ms=self.clock.now_ms(),
            event_id=new_id(),
            catchup_window=catchup_window,
            max_jitter=max_jitter,
            overlap=overlap,
        )
        await self.publish(event)

    async def delete_schedule(self, schedule_id: str) -> None:
        check_id("schedule_id", schedule_id)
        await self.publish(
            ScheduleDeleted(
                event_id=new_id(),
                schedule_id=schedule_id,
                emitted_at=self.clock.now_ms(),
                source=SOURCE,
            )
        )

    async def enqueue_many(
        self, calls: Iterable[EnqueueCall], *, atomic: bool = False
    ) -> list[BatchResult]:
        """Enqueue ``task.call(...)``s in one round trip, with a verdict per call (in order).

        ``atomic=True`` writes all of them in one Kafka transaction, or none.
        """
        listed = list(calls)
        if len(listed) > MAX_BATCH:
            raise InvalidEnqueue("calls", f"{len(listed)} calls, above the limit of {MAX_BATCH}")
        producer = await self._producer()
        now = self.clock.now_ms()
        items = [await _checked_call(call, now, producer.queues) for call in listed]
        return await write_batch(producer.log, self.topics.events, items, atomic=atomic)

    async def pause_queue(self, queue: str, *, reason: str = "") -> list[Appended]:
        """No new leases on ``queue``; running jobs finish. One event per events partition."""
        return await self._everywhere(QueuePaused, queue, reason)

    async def resume_queue(self, queue: str, *, reason: str = "") -> list[Appended]:
        return await self._everywhere(QueueResumed, queue, reason)

    async def limit_queue(
        self,
        queue: str,
        *,
        max_running: int | None = None,
        rate: tuple[int, int] | None = None,
        reason: str = "",
    ) -> list[Appended]:
        """At most ``max_running`` of the queue's jobs leased or running at once, and at most
        ``rate`` = (starts, per_ms) permits granted per window, over every node and partition
        (None removes each). One event per events partition, the queue's home first."""
        event = limit_event(
            queue, max_running=max_running, rate=rate, reason=reason, now_ms=self.clock.now_ms()
        )
        return await publish_limit(await self.event_log(), self.topics.events, event)

    async def limit_key(
        self,
        key: str,
        *,
        max_running: int | None = None,
        rate: tuple[int, int] | None = None,
        reason: str = "",
    ) -> list[Appended]:
        """``limit_queue`` for the jobs of a concurrency key (``task.options(concurrency_key=)``),
        whatever their queue."""
        event = limit_event(
            key,
            key=True,
            max_running=max_running,
            rate=rate,
            reason=reason,
            now_ms=self.clock.now_ms(),
        )
        return await publish_limit(await self.event_log(), self.topics.events, event)

    async def pause_schedule(self, schedule_id: str, *, reason: str = "") -> Appended:
        """No slot of the schedule fires until it is resumed."""
        now = self.clock.now_ms()
        return await self.publish(
            control_event(SchedulePaused, schedule_id, reason=reason, now_ms=now)
        )

    async def resume_schedule(self, schedule_id: str, *, reason: str = "") -> Appended:
        """Slots fire again. Of the slots missed while paused, the newest fires; with a catch-up
        window, each one within the window fires, oldest first, and older ones are skipped."""
        now = self.clock.now_ms()
        return await self.publish(
            control_event(ScheduleResumed, schedule_id, reason=reason, now_ms=now)
        )

    async def _everywhere(
        self, kind: type[ControlEvent], queue: str, reason: str
    ) -> list[Appended]:
        event = control_event(kind, queue, reason=reason, now_ms=self.clock.now_ms())
        return await self.publish_control_everywhere(event)

    async def publish_control_everywhere(self, event: ControlEvent) -> list[Appended]:
        """``event`` to every events partition, with explicit partitions (a queue's control)."""
        return await publish_everywhere(await self.event_log(), self.topics.events, event)

    async def enqueue_workflow(
        self, workflow: EnqueueCall | Chain | Group, *, key: str | None = None
    ) -> WorkflowHandle:
        """Enqueue ``chain(...)``/``group(...)`` (or one call) atomically: all its jobs or none.

        With ``key`` the job ids derive from it, so enqueueing the same workflow again under the
        same key makes no new jobs. ``await handle.last.result()`` is the workflow's outcome.
        """
        return await enqueue_workflow(self, workflow, key=key)

    async def require_queue(self, queue: str) -> None:
        """UnknownQueue when the namespace declares queues and not this one."""
        producer = await self._producer()
        if producer.queues is not None:
            await _require_declared(producer.queues, queue)

    async def event_log(self) -> EventLog:
        """The calling loop's EventLog (started on first use)."""
        return (await self._producer()).log

    async def publish(self, event: Event) -> Appended:
        """Write one event to ``<ns>.events`` keyed by its job or schedule id, after checks.

        An enqueue or a schedule on an undeclared queue raises UnknownQueue, as the API refuses
        it: only an operator makes a queue (``evsched kafka topics --queue NAME``).
        """
        data = encode_checked(event)
        producer = await self._producer()
        queue = _queue_of(event)
        if queue is not None and producer.queues is not None:
            await _require_declared(producer.queues, queue)
        return await producer.log.append(self.topics.events, entity_id(event), data)

    def _catalog_factory(
        self, queues: QueueCatalog | None, *, checked: bool
    ) -> Callable[[], QueueCatalog | None]:
        if queues is not None:
            return lambda: queues
        if not checked:
            return lambda: None  # an in-memory log has no topics: every queue goes
        # One per event loop; a queue found declared stays so, an unknown one is looked up
        # again at most every 2 s.
        return lambda: KafkaQueues(self.settings, timeout_s=10.0)

    # --- sync forms -----------------------------------------------------------------------------

    def run_sync(self, make: Callable[[], Any]) -> Any:
        """Run ``make()`` (a coroutine of this app) from sync code, on the app's private loop."""
        return self._sync.run(make)

    def cancel_sync(self, job_id: str, *, reason: str = "") -> None:
        self._sync.run(lambda: self.cancel(job_id, reason=reason))

    def requeue_sync(self, job_id: str, **options: Any) -> JobHandle:
        handle: JobHandle = self._sync.run(lambda: self.requeue(job_id, **options))
        return handle

    def upsert_schedule_sync(
        self, schedule_id: str, cron: str, timezone: str, task: str | Task, **options: Any
    ) -> None:
        self._sync.run(lambda: self.upsert_schedule(schedule_id, cron, timezone, task, **options))

    def delete_schedule_sync(self, schedule_id: str) -> None:
        self._sync.run(lambda: self.delete_schedule(schedule_id))

    def enqueue_many_sync(
        self, calls: Iterable[EnqueueCall], *, atomic: bool = False
    ) -> list[BatchResult]:
        listed = list(calls)
        found: list[BatchResult] = self._sync.run(lambda: self.enqueue_many(listed, atomic=atomic))
        return found

    def pause_queue_sync(self, queue: str, *, reason: str = "") -> None:
        self._sync.run(lambda: self.pause_queue(queue, reason=reason))

    def limit_queue_sync(
        self,
        queue: str,
        *,
        max_running: int | None = None,
        rate: tuple[int, int] | None = None,
        reason: str = "",
    ) -> None:
        self._sync.run(
            lambda: self.limit_queue(queue, max_running=max_running, rate=rate, reason=reason)
        )

    def resume_queue_sync(self, queue: str, *, reason: str = "") -> None:
        self._sync.run(lambda: self.resume_queue(queue, reason=reason))

    def pause_schedule_sync(self, schedule_id: str, *, reason: str = "") -> None:
        self._sync.run(lambda: self.pause_schedule(schedule_id, reason=reason))

    def resume_schedule_sync(self, schedule_id: str, *, reason: str = "") -> None:
        self._sync.run(lambda: self.resume_schedule(schedule_id, reason=reason))

    # --- reads ----------------------------------------------------------------------------------

    def job(self, job_id: str) -> JobHandle:
        """A handle on a job known by its id only: its result is followed from the partition's
        start (a handle from ``enqueue`` knows where to start)."""
        check_id("job_id", job_id)
        return JobHandle(job_id, self)

    async def follow_to_end(
        self,
        job_id: str,
        partition: int | None = None,
        offset: int | None = None,
        *,
        after: int | None = None,
    ) -> JobState:
        """Follow the job on its partition from ``offset`` until it is finished (past ``after``
        when given); its state then."""
        feed = await (self._sync_feed if self._on_sync_loop() else self._async_feed).get()
        return await terminal_state(feed, job_id, partition, offset, after=after)

    def _make_feed(self) -> JobFeed:
        if self._feed_factory is None:
            raise NoJobReader("this App was created without a feed: pass App(feed_factory=...)")
        return self._feed_factory()

    async def _close_sync_loop(self) -> None:
        try:
            await self._sync_feed.close()
        finally:
            await self._sync_log.close()

    async def get_job(self, job_id: str) -> JobState | None:
        """The job's state from the app's JobReader (None if unknown there)."""
        if self.reader is None:
            raise NoJobReader("this App was created without a reader: pass App(reader=...)")
        return await self.reader.job(job_id)

    # --- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the producer of the calling loop and the private loop of the sync forms."""
        try:
            await self._async_feed.close()
        finally:
            await self._async_log.close()
        await asyncio.to_thread(self._sync.close)

    def close_sync(self) -> None:
        self._sync.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __enter__(self) -> App:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close_sync()

    def _on_sync_loop(self) -> bool:
        """Whether the running loop is the sync forms' private one (each loop has its clients)."""
        return asyncio.get_running_loop() is self._sync.loop

    async def _producer(self) -> _Producer:
        """The running loop's EventLog and queue catalog (started on first use)."""
        return await (self._sync_log if self._on_sync_loop() else self._async_log).get()


def _queue_of(event: Event) -> str | None:
    if isinstance(event, JobEnqueued):
        return event.queue
    if isinstance(event, ScheduleUpserted):
        return event.template.queue
    return None


async def _checked_call(
    call: EnqueueCall, now_ms: int, queues: QueueCatalog | None
) -> JobEnqueued | InvalidEnqueue:
    """One call of a batch as its JobEnqueued, or why it is refused (the batch goes on)."""
    try:
        event = call.options.build(call.args, call.kwargs, now_ms)
        if queues is not None:
            await _require_declared(queues, event.queue)
    except InvalidEnqueue as exc:
        return exc
    return event


async def _require_declared(queues: QueueCatalog, queue: str) -> None:
    try:
        declared = await queues.declared(queue)
    except QueueLookupError as exc:
        raise PublishError(str(exc)) from exc
    if not declared:
        raise UnknownQueue(queue, undeclared(queue))
