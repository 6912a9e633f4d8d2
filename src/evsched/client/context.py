"""What a running handler sees of its attempt: ids, effects, checkpoints and a fence check."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from evsched.adapters.payload import canonical_json, decode_json
from evsched.core.dispatch import Dispatch, external_idempotency_key
from evsched.core.events import Effect, TraceContext
from evsched.core.state import ACTIVE_STATUSES
from evsched.ports import Clock, JobReader


class AttemptFinished(RuntimeError):
    """The handler used its context after the attempt ended (a sync handler past its timeout)."""


@dataclass(slots=True)
class LeaseWatch:
    """When this worker last renewed its run lease, by its own monotonic clock.

    A gap longer than the lease (the process was frozen, or the broker unreachable) means the node
    has probably expired the lease; the watch then stays ``lost`` for the rest of the attempt.
    """

    lease_ms: int
    clock: Clock
    renewed_at: float
    _lost: bool = False

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` (monotonic) was acknowledged."""
        if self._gap_exceeded(sent_at):
            self._lost = True
        self.renewed_at = max(self.renewed_at, sent_at)

    @property
    def lost(self) -> bool:
        if not self._lost and self._gap_exceeded(self.clock.monotonic_s()):
            self._lost = True
        return self._lost

    def _gap_exceeded(self, at: float) -> bool:
        return (at - self.renewed_at) * 1000 > self.lease_ms


class Fence(Protocol):
    """What the worker's follow of the job (``runtime.worker.fence.AttemptFence``) tells a
    context."""

    @property
    def ended(self) -> bool:
        """The log showed the attempt is over: cancelled, expired or leased again."""
        ...

    @property
    def cancelled(self) -> bool:
        """The log showed the job cancelled while this attempt ran."""
        ...

    @property
    def followed(self) -> bool:
        """A follow of the job runs, so ``ended`` is as fresh as the log."""
        ...


@dataclass(slots=True, kw_only=True)
class AttemptIo:
    """The worker's side of a context: how checkpoints are written and who can check the fence."""

    save_checkpoint: Callable[[bytes], Awaitable[None]]
    lease: LeaseWatch
    reader: JobReader | None
    loop: asyncio.AbstractEventLoop
    fence: Fence | None = None


@dataclass(slots=True)
class _Collected:
    effects: list[Effect] = field(default_factory=list)
    finished: bool = False


class Context:
    """Passed to a handler whose first parameter is named ``ctx``.

    ``idempotency_key`` is the same for every attempt of a job: hand it to external systems.
    ``last_checkpoint`` is the decoded value of the newest accepted (or own) checkpoint, or None.
    ``trace`` is the W3C trace context the job was enqueued with (None when not traced); ``log``
    carries its ``traceparent``.
    """

    def __init__(self, dispatch: Dispatch, *, worker_id: str, io: AttemptIo) -> None:
        self.job_id = dispatch.job_id
        self.token = dispatch.token
        self.attempt = dispatch.attempt
        self.max_attempts = dispatch.max_attempts
        self.task = dispatch.task
        self.queue = dispatch.queue
        self.worker_id = worker_id
        self.idempotency_key = external_idempotency_key(dispatch.job_id)
        self.last_checkpoint: Any = decode_json(dispatch.checkpoint)
        self.trace: TraceContext | None = dispatch.trace
        self._log: Any = None
        self._io = io
        self._collected = _Collected()

    @property
    def log(self) -> Any:
        """A logger bound to the attempt (made on first use: most handlers never log)."""
        if self._log is None:
            self._log = structlog.get_logger("evsched.handler").bind(
                job_id=self.job_id, token=self.token, attempt=self.attempt
            )
            if self.trace is not None:
                self._log = self._log.bind(traceparent=self.trace.traceparent)
        return self._log

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def cancelled(self) -> bool:
        """True once the worker saw in the log that the job was cancelled while this attempt
        ran (within about a second). Sync handlers poll it; an async handler is also cancelled
        (``asyncio.CancelledError``) at that moment. Whatever it writes later (checkpoints, its
        completion) is rejected by the fold."""
        fence = self._io.fence
        return fence is not None and fence.cancelled

    def effect(self, kind: str, payload: bytes | Any, key: str | None = None) -> None:
        """Record a side effect; it is published only if this attempt's success is accepted.

        ``payload`` is kept as is when it is bytes, otherwise stored as canonical JSON.
        """
        self._check_open()
        body = payload if isinstance(payload, bytes) else canonical_json(payload)
        self._collected.effects.append(Effect(kind=kind, payload=body, key=key))

    async def checkpoint(self, value: Any) -> None:
        """Save progress (any JSON value); returns once the broker acknowledged it.

        A later attempt of the job starts with it as ``last_checkpoint``.
        """
        self._check_open()
        body = canonical_json(value)
        await self._on_worker_loop(lambda: self._io.save_checkpoint(body))
        self.last_checkpoint = value

    async def is_current(self) -> bool:
        """Whether this attempt still holds the job's lease, as far as the worker can tell.

        False once the attempt ended, or the worker went longer than the lease without renewing
        it (by its own monotonic clock: e.g. it was frozen), or its follow of the job saw it
        cancelled, expired or leased again. A worker that follows the job
        answers from that follow; otherwise, with a JobReader, from whether the projection still
        shows this token live (as fresh as that projection); without either, True.
        The fold has the last word: a completion with a stale token is rejected either way.
        """
        fence = self._io.fence
        if self._collected.finished or self._io.lease.lost or (fence is not None and fence.ended):
            return False
        if fence is not None and fence.followed:
            return True
        reader = self._io.reader
        if reader is None:
            return True
        state = await self._on_worker_loop(lambda: reader.job(self.job_id))
        return state is not None and state.token == self.token and state.status in ACTIVE_STATUSES

    async def _on_worker_loop(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Await ``call()`` on the worker's loop, where its Kafka clients live: async handlers
        run on a loop of their own (see runtime/worker/handler_loop.py)."""
        if asyncio.get_running_loop() is self._io.loop:
            return await call()

        async def run() -> Any:
            return await call()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self._io.loop))

    def checkpoint_sync(self, value: Any) -> None:
        """``checkpoint`` for a sync handler running in the worker's thread pool."""
        self._from_thread(lambda: self.checkpoint(value))

    def is_current_sync(self) -> bool:
        """``is_current`` for a sync handler running in the worker's thread pool."""
        return bool(self._from_thread(self.is_current))

    def _from_thread(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async def run() -> Any:
            return await call()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._io.loop:
            raise RuntimeError("called on the worker's event loop: await the async form instead")
        return asyncio.run_coroutine_threadsafe(run(), self._io.loop).result()

    def _check_open(self) -> None:
        if self._collected.finished:
            raise AttemptFinished(f"attempt {self.attempt} of job {self.job_id} has ended")

    def finish(self) -> tuple[Effect, ...]:
        """Close the context (later calls raise AttemptFinished) and return its effects."""
        self._collected.finished = True
        return tuple(self._collected.effects)
