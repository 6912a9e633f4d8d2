"""Runs one dispatched attempt: start, the handler under a timeout with heartbeats, outcome."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from evsched.adapters.avro import encode_event
from evsched.adapters.ids import new_id
from evsched.adapters.payload import NotJson, canonical_json, decode_args
from evsched.adapters.proofs import PROOF_HEADER, worker_proof
from evsched.adapters.spans import AttemptSpans, NoSpans, attempt_spans
from evsched.adapters.tracing import attempt_trace
from evsched.client.context import AttemptIo, Context, LeaseWatch
from evsched.client.snooze import Snooze
from evsched.client.task import Task, qualified_name
from evsched.commands import MAX_EVENT_BYTES
from evsched.core import failures
from evsched.core.dispatch import Dispatch, start_deadline_by_log
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    JobEvent,
    LeaseRenewed,
)
from evsched.errors import EncodeError, InvalidEnqueue
from evsched.ports import Appended, Clock, EventLog, JobFeed, JobReader
from evsched.runtime.worker.attempt_log import AttemptLog
from evsched.runtime.worker.fence import AttemptFence
from evsched.runtime.worker.handler_loop import HandlerEscaped, HandlerLoop, ThreadCount
from evsched.runtime.worker.later import LaterTask
from evsched.runtime.worker.log_clock import LogClock
from evsched.runtime.worker.prestart import (
    FOLLOW_AFTER_S,
    StallWatch,
    follow_job,
    needs_confirmation,
    why_not_run,
)

MAX_MESSAGE_CHARS = 4_000
# How long a timed-out async handler keeps its slot while it winds down after its cancellation.
OVERRUN_BOUND_S = 5.0
# A start logged before run_at is sent again after the difference; more than a few rounds means
# the log's clock is not where the samples put it, and the lease's expiry takes over.
EARLY_START_RETRIES = 3


@dataclass(frozen=True, slots=True)
class Succeeded:
    result: bytes


@dataclass(frozen=True, slots=True)
class Failed:
    error_type: str
    message: str
    retryable: bool
    exc: BaseException | None = field(default=None, compare=False)
    category: str | None = None
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Snoozed:
    """The handler returned or raised a Snooze; ``max_snoozes`` is its task's cap."""

    delay_ms: int
    reason: str
    max_snoozes: int


Outcome = Succeeded | Failed | Snoozed


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRunner:
    """What every attempt of one worker shares: identity, the event log, clock, thread pool."""

    worker_id: str
    lease_ms: int
    events_topic: str
    log: EventLog
    clock: Clock
    executor: Executor
    handlers: HandlerLoop
    reader: JobReader | None = None
    # Follows each attempt's job from its lease, so a cancel reaches the handler
    # (runtime.worker.fence).
    feed: JobFeed | None = None
    threads: ThreadCount = field(default_factory=ThreadCount)
    log_clock: LogClock = field(default_factory=LogClock)
    # Told (task, outcome, seconds) once an attempt's completion is sent; outcome is
    # "reported" (a success sent: only the fold knows whether it was accepted or stale),
    # "failed" (retryable), "failed_permanent" or "snoozed" (runtime.worker.attempt.Snoozed).
    on_finished: Callable[[str, str, float], None] | None = None
    # When the worker's loop last stood still: a start held across a stall waits for the fold's
    # verdict (runtime.worker.prestart).
    stalls: StallWatch = field(default_factory=StallWatch)

    @property
    def source(self) -> str:
        return f"worker-{self.worker_id}"

    async def run(self, dispatch: Dispatch, task: Task | None) -> None:
        """Start, run and complete the attempt; PublishError if even AttemptStarted fails.

        The job's trace context is the attempt's: logs carry its ``traceparent``, and with
        OpenTelemetry the handler runs in its remote span context.
        """
        with attempt_trace(dispatch.trace), attempt_spans(dispatch, self.clock.now_ms) as spans:
            await self._run(dispatch, task, spans)

    async def _run(
        self, dispatch: Dispatch, task: Task | None, spans: AttemptSpans | NoSpans
    ) -> None:
        logger = AttemptLog(dispatch, with_task=True)
        sent_at = self.clock.monotonic_s()
        appended = await self._start(dispatch, logger)
        if appended.log_at is not None and appended.log_at >= start_deadline_by_log(dispatch):
            # The worker was held (frozen, starved) between its last check and the start's
            # append: the lease is gone by the log's clock, and the fold refuses the start.
            logger.warning(
                "start_after_deadline",
                log_at=appended.log_at,
                deadline=start_deadline_by_log(dispatch),
            )
            return
        fence = AttemptFence(dispatch)
        self.stalls.start()  # on the worker's loop, from its first attempt on
        confirm = needs_confirmation(dispatch, appended, self.stalls)
        following = follow_job(self.feed, fence, after_s=0.0 if confirm else FOLLOW_AFTER_S)
        if await self._cleared(fence, appended, following, sent_at, logger, confirm=confirm):
            spans.started()
            await self._attempt(
                dispatch,
                task,
                fence,
                following=following,
                sent_at=sent_at,
                logger=logger,
                spans=spans,
            )

    async def _cleared(
        self,
        fence: AttemptFence,
        appended: Appended,
        following: LaterTask | None,
        sent_at: float,
        logger: AttemptLog,
        *,
        confirm: bool,
    ) -> bool:
        """Whether the handler may start (``runtime.worker.prestart``); if not, the follow is
        stopped and nothing is sent: the fold refused the start, or the lease is over, and the
        node's expiry or the cancel has the last word."""
        try:
            why = await why_not_run(
                fence,
                appended,
                worker_id=self.worker_id,
                lease_ms=self.lease_ms,
                held_ms=lambda: (self.clock.monotonic_s() - sent_at) * 1000,
                confirm=confirm and following is not None,
            )
        except BaseException:
            await _stop(following)
            raise
        if why is None:
            return True
        await _stop(following)
        logger.warning("handler_not_started", reason=why)
        return False

    async def _attempt(
        self,
        dispatch: Dispatch,
        task: Task | None,
        fence: AttemptFence,
        *,
        following: LaterTask | None,
        sent_at: float,
        logger: AttemptLog,
        spans: AttemptSpans | NoSpans,
    ) -> None:
        """Run the handler of a started attempt and send its outcome."""
        lease = LeaseWatch(self.lease_ms, self.clock, renewed_at=sent_at)
        # Debug, like job_succeeded: a line per job costs a worker more than the job's own work.
        logger.debug("job_started", attempt=dispatch.attempt, worker_id=self.worker_id)
        ctx = Context(
            dispatch,
            worker_id=self.worker_id,
            io=AttemptIo(
                save_checkpoint=functools.partial(self._checkpoint, dispatch),
                lease=lease,
                reader=self.reader,
                loop=asyncio.get_running_loop(),
                fence=fence,
            ),
        )
        try:
            outcome, overrun = await self._supervised(dispatch, task, ctx, fence, lease)
        finally:
            await _stop(following)  # the attempt's outcome is known: nothing more to hear
        if fence.cancelled:
            # Whatever the handler did after: its attempt is over (the fold rejects it anyway).
            message = f"attempt cancelled: {fence.reason}"
            outcome = Failed("evsched.Cancelled", message, True, category=failures.CANCELLED)
        try:
            outcome = await self._complete(dispatch, outcome, ctx.finish(), logger)
            error = outcome.error_type if isinstance(outcome, Failed) else None
            spans.finished(_outcome_label(outcome), error)
            if self.on_finished is not None:
                elapsed = self.clock.monotonic_s() - sent_at
                self.on_finished(dispatch.task, _outcome_label(outcome), elapsed)
        finally:
            if overrun is not None:
                # A thread holds its slot until it returns (the pool has one thread per slot);
                # an async handler gets a bounded time to honour its cancellation.
                bound = OVERRUN_BOUND_S if task is not None and task.is_async else None
                await _outlive(overrun, logger, bound)

    async def _supervised(
        self,
        dispatch: Dispatch,
        task: Task | None,
        ctx: Context,
        fence: AttemptFence,
        lease: LeaseWatch,
    ) -> tuple[Outcome, asyncio.Future[Any] | None]:
        """The handler's outcome, with heartbeats while it runs.

        Heartbeats start only when they have something to do (a third of the lease): until then
        they are a timer, and most attempts end before it fires.
        """
        name = f"job {dispatch.job_id} token {dispatch.token}"
        heartbeat = LaterTask(
            self.lease_ms / 3000, lambda: self._heartbeat(dispatch, lease), f"heartbeat {name}"
        )
        try:
            return await self._execute(dispatch, task, ctx, fence)
        finally:
            await heartbeat.stop()

    async def emit(self, event: JobEvent, lease_key: bytes | None) -> Appended:
        """Write one event keyed by its job id, proven with its lease's key when the dispatch
        carried one (adapters.proofs); EncodeError when it cannot be written."""
        data = encode_event(event)
        if len(data) > MAX_EVENT_BYTES:
            raise EncodeError(f"{type(event).__name__} is {len(data)} bytes, above the limit")
        headers = () if lease_key is None else ((PROOF_HEADER, worker_proof(lease_key, data)),)
        sent_at = self.clock.now_ms()
        appended = await self.log.append(self.events_topic, event.job_id, data, headers)
        if appended.log_at is not None:
            self.log_clock.observe(sent_at=sent_at, log_at=appended.log_at)
        return appended

    async def _start(self, dispatch: Dispatch, logger: AttemptLog) -> Appended:
        """AttemptStarted, sent again when the log's clock had not reached run_at yet.

        The fold refuses a start logged before the job's run_at (only a pre-lease can be that
        early, when this worker's clock runs ahead of the broker's): wait out the difference
        and start again, under the same token, before the handler runs.
        """
        appended = await self.emit(self._started(dispatch), dispatch.lease_key)
        for _ in range(EARLY_START_RETRIES):
            if appended.log_at is None or appended.log_at >= dispatch.run_at:
                break
            early = dispatch.run_at - appended.log_at
            logger.info("start_before_run_at", early_ms=early, offset_ms=self.log_clock.offset_ms)
            await asyncio.sleep(early / 1000)
            appended = await self.emit(self._started(dispatch), dispatch.lease_key)
        return appended

    def _started(self, dispatch: Dispatch) -> AttemptStarted:
        return AttemptStarted(
            event_id=new_id(),
            job_id=dispatch.job_id,
            emitted_at=self.clock.now_ms(),
            source=self.source,
            token=dispatch.token,
            worker_id=self.worker_id,
            lease_ms=self.lease_ms,
            trace=dispatch.trace,
        )

    async def _checkpoint(self, dispatch: Dispatch, value: bytes) -> None:
        await self.emit(
            AttemptCheckpointed(
                event_id=new_id(),
                job_id=dispatch.job_id,
                emitted_at=self.clock.now_ms(),
                source=self.source,
                token=dispatch.token,
                checkpoint=value,
                trace=dispatch.trace,
            ),
            dispatch.lease_key,
        )

    async def _heartbeat(self, dispatch: Dispatch, lease: LeaseWatch) -> None:
        """Renew the lease now and every third of it (started a third of it after the start)."""
        logger = AttemptLog(dispatch)
        reported_lost = False
        while True:
            sent_at = self.clock.monotonic_s()
            if lease.lost and not reported_lost:
                reported_lost = True
                logger.warning("lease_lost", lease_ms=self.lease_ms)
            renewal = LeaseRenewed(
                event_id=new_id(),
                job_id=dispatch.job_id,
                emitted_at=self.clock.now_ms(),
                source=self.source,
                token=dispatch.token,
                lease_ms=self.lease_ms,
                trace=dispatch.trace,
            )
            try:
                await self.emit(renewal, dispatch.lease_key)
            except Exception as exc:  # keep beating: the next renewal may get through
                logger.warning("lease_renew_failed", error=repr(exc))
            else:
                lease.renewed(sent_at)
            await asyncio.sleep(self.lease_ms / 3000)

    async def _execute(
        self, dispatch: Dispatch, task: Task | None, ctx: Context, fence: AttemptFence
    ) -> tuple[Outcome, asyncio.Future[Any] | None]:
        if task is None:
            # Likely a rolling deploy: a worker that knows the task may get the retry.
            reason = f"this worker has no task {dispatch.task!r}"
            return Failed("evsched.UnknownTask", reason, retryable=True), None
        try:
            arguments = decode_args(dispatch.args)
            task.check_call(arguments.args, arguments.kwargs)
        except (NotJson, InvalidEnqueue) as exc:
            return Failed("evsched.InvalidArguments", str(exc), retryable=False), None
        leading = (ctx,) if task.takes_context else ()
        call = functools.partial(task.handler, *leading, *arguments.args, **arguments.kwargs)
        return await self._call(task, call, dispatch, fence)

    async def _call(
        self, task: Task, call: Callable[[], Any], dispatch: Dispatch, fence: AttemptFence
    ) -> tuple[Outcome, asyncio.Future[Any] | None]:
        """Run the handler: async ones on the handler loop, sync ones in the thread pool."""
        timeout_ms = dispatch.timeout_ms
        running: asyncio.Future[Any]
        stop: Callable[[], object]
        if task.is_async:
            name = f"evsched handler {task.name} job {dispatch.job_id} token {dispatch.token}"
            run = self.handlers.submit(call, name=name)
            running, stop = run.done, run.cancel
            fence.on_cancel(run.cancel)  # a cancel seen in the log reaches the handler
        else:
            context = contextvars.copy_context()
            running = asyncio.wrap_future(self.executor.submit(self.threads.run, context, call))
            stop = running.cancel  # a thread cannot be stopped: it runs on, holding its slot
        try:
            async with asyncio.timeout(timeout_ms / 1000) as scope:
                value = await asyncio.shield(running)
        except asyncio.CancelledError:
            stop()
            running.add_done_callback(_retrieve)  # its end is of no interest any more
            raise
        except TimeoutError as exc:
            if not scope.expired():
                return _failure(task, exc), None
            if task.is_async:
                stop()  # a handler that ignores it keeps its slot until it really ends
            message = f"attempt exceeded its timeout of {timeout_ms} ms"
            return Failed("TimeoutError", message, True, category=failures.TIMEOUT), running
        except Exception as exc:
            raised = exc.original if isinstance(exc, HandlerEscaped) else exc
            if isinstance(raised, Snooze):
                return _snoozed(task, raised), None
            return _failure(task, raised), None
        return _returned(task, value), None

    async def _complete(
        self, dispatch: Dispatch, outcome: Outcome, effects: tuple[Any, ...], logger: AttemptLog
    ) -> Outcome:
        """Send the completion; returns the outcome sent (a result too large becomes a failure)."""
        completion = self._completion(dispatch, outcome, effects)
        try:
            await self.emit(completion, dispatch.lease_key)
        except EncodeError as exc:
            # Oversized or unwritable result/effects: retrying would fail the same way.
            outcome = Failed("evsched.ResultTooLarge", exc.reason, retryable=False)
            await self.emit(self._completion(dispatch, outcome, ()), dispatch.lease_key)
        if isinstance(outcome, Succeeded):
            logger.debug("job_succeeded", effects=len(effects))
        elif isinstance(outcome, Snoozed):
            logger.info("job_snoozed", delay_ms=outcome.delay_ms, reason=outcome.reason)
        else:
            logger.info(
                "job_failed",
                error_type=outcome.error_type,
                error=outcome.message,
                retryable=outcome.retryable,
                exc_info=outcome.exc,
            )
        return outcome

    def _completion(
        self, dispatch: Dispatch, outcome: Outcome, effects: tuple[Any, ...]
    ) -> JobEvent:
        common: dict[str, Any] = {
            "event_id": new_id(),
            "job_id": dispatch.job_id,
            "emitted_at": self.clock.now_ms(),
            "source": self.source,
            "token": dispatch.token,
            "trace": dispatch.trace,
        }
        if isinstance(outcome, Succeeded):
            return AttemptSucceeded(**common, result=outcome.result, effects=effects)
        if isinstance(outcome, Snoozed):
            return AttemptSnoozed(
                **common,
                delay_ms=outcome.delay_ms,
                max_snoozes=outcome.max_snoozes,
                reason=outcome.reason,
            )
        return AttemptFailed(
            **common,
            error_type=outcome.error_type,
            message=outcome.message,
            retryable=outcome.retryable,
            category=outcome.category or _default_category(outcome.retryable),
            traceback=outcome.traceback,
        )


async def _stop(following: LaterTask | None) -> None:
    if following is not None:
        await following.stop()


def _retrieve(running: asyncio.Future[Any]) -> None:
    if not running.cancelled():
        running.exception()


def _outcome_label(outcome: Outcome) -> str:
    if isinstance(outcome, Succeeded):
        return "reported"  # not "succeeded": the worker cannot tell an accepted success
    if isinstance(outcome, Snoozed):
        return "snoozed"
    return "failed" if outcome.retryable else "failed_permanent"


def _returned(task: Task, value: Any) -> Outcome:
    """The outcome of a handler that returned ``value``: a result, or a returned Snooze."""
    if isinstance(value, Snooze):
        return _snoozed(task, value)
    try:
        return Succeeded(canonical_json(value))
    except NotJson as exc:
        reason = f"the handler returned a value that is not JSON: {exc}"
        return Failed("evsched.ResultNotJson", reason, retryable=False)


def _snoozed(task: Task, snooze: Snooze) -> Snoozed:
    return Snoozed(snooze.delay_ms, snooze.reason, task.max_snoozes)


def _failure(task: Task, exc: BaseException) -> Failed:
    message = (str(exc) or repr(exc))[:MAX_MESSAGE_CHARS]
    retryable = task.is_retryable(exc)
    return Failed(
        qualified_name(type(exc)),
        message,
        retryable,
        exc,
        category=task.category_for(exc),
        traceback=failures.truncate_middle("".join(traceback.format_exception(exc))),
    )


def _default_category(retryable: bool) -> str:
    return failures.TRANSIENT if retryable else failures.PERMANENT


async def _outlive(running: asyncio.Future[Any], logger: AttemptLog, bound_s: float | None) -> None:
    """Hold the attempt's slot until a timed-out handler stops, or at most ``bound_s``."""
    if not running.done():
        logger.warning("handler_overran")
    await asyncio.wait({running}, timeout=bound_s)
    running.add_done_callback(_retrieve)  # already reported as a timeout
    if not running.done():
        # It ignores its cancellation: it runs on, on the handler loop, without its slot.
        logger.warning("handler_ignored_cancellation", waited_s=bound_s)
