"""Waiting for a job's outcome by following its partition from its enqueue offset, with the fold.

No replica: the client reads only the job's own partition, from where its enqueue landed (the
produce acknowledgement says where), and folds only that job's events. A job enqueued with an
idempotency key (whose first enqueue may be older than ours), or known only by its id, is
followed from the partition's start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from evsched.adapters.avro import decode_event
from evsched.adapters.payload import decode_json
from evsched.core.events import JOB_EVENT_TYPES, Position
from evsched.core.fold import fold
from evsched.core.follow import missed_history
from evsched.core.state import TERMINAL_STATUSES, JobState, Status
from evsched.errors import DecodeError, EvschedError, JobFailed
from evsched.ports import JobFeed


class Follower(Protocol):
    """What a handle needs of its App (``client.app.App``)."""

    async def follow_to_end(
        self,
        job_id: str,
        partition: int | None = None,
        offset: int | None = None,
        *,
        after: int | None = None,
    ) -> JobState: ...

    def run_sync(self, make: Callable[[], Any]) -> Any: ...


class FollowGap(EvschedError):
    """The follow began after the job's history did (see ``core.follow.missed_history``)."""


async def job_states(
    feed: JobFeed, job_id: str, partition: int, offset: int, state: JobState | None = None
) -> AsyncIterator[tuple[JobState | None, int]]:
    """The job's state after each of its events from ``offset`` on, with the event's offset;
    FollowGap when the follow began late.

    Undecodable records and events of other kinds or ids under the job's key are skipped.
    """
    async with contextlib.aclosing(feed.follow(job_id, partition, offset)) as records:
        async for record in records:
            try:
                event = decode_event(record.value or b"")
            except DecodeError:
                continue
            if not isinstance(event, JOB_EVENT_TYPES) or event.job_id != job_id:
                continue
            at = Position(partition=record.partition, offset=record.offset, log_at=record.log_at)
            new, entry = fold(state, event, at)
            if missed_history(state, entry):
                raise FollowGap(f"job {job_id}: {entry.kind} at p{partition}@{record.offset}")
            state = new
            yield state, record.offset


async def terminal_state(
    feed: JobFeed,
    job_id: str,
    partition: int | None,
    offset: int | None,
    *,
    after: int | None = None,
) -> JobState:
    """The job's state once it succeeded, died or was cancelled (no time limit: the caller's).

    Without a known ``offset`` (or after a gap) it follows from the partition's start. With
    ``after``, only an outcome folded past that offset counts (a requeue's: its rerun's outcome).
    """
    if partition is None:
        partition = await feed.partition_of(job_id)
    starts = [0] if offset is None or offset <= 0 else [offset, 0]
    for index, start in enumerate(starts):
        try:
            async for state, at in job_states(feed, job_id, partition, start):
                if state is None or state.status not in TERMINAL_STATUSES:
                    continue
                if after is None or at > after:
                    return state
        except FollowGap:
            if index == len(starts) - 1:
                raise
    raise AssertionError("unreachable: a follow only ends by returning or raising")


def outcome(state: JobState) -> Any:
    """A terminal job's result (decoded JSON), or JobFailed carrying its last error."""
    if state.status is Status.SUCCEEDED:
        return decode_json(state.result)
    error = state.last_error
    if error is None:
        raise JobFailed(state.job_id, state.status)
    raise JobFailed(
        state.job_id,
        state.status,
        error_type=error.error_type,
        message=error.message,
        category=error.category,
        traceback=error.traceback,
    )


class JobHandle(str):
    """What ``enqueue`` returns: the job id (a ``str``, as before), plus a way to its result.

    ``enqueue_partition`` and ``enqueue_offset`` say where its enqueue landed (None: unknown).
    ``await handle.result(timeout=…)`` (or ``result_sync``) returns its result or raises
    JobFailed (dead or cancelled), and TimeoutError when it is not finished in time.
    """

    app: Follower
    enqueue_partition: int | None
    enqueue_offset: int | None
    after: int | None

    def __new__(
        cls,
        job_id: str,
        app: Follower,
        *,
        partition: int | None = None,
        offset: int | None = None,
        after: int | None = None,
    ) -> JobHandle:
        handle = super().__new__(cls, job_id)
        handle.app, handle.enqueue_partition, handle.enqueue_offset = app, partition, offset
        handle.after = after  # only an outcome past this offset (a requeue's) counts
        return handle

    @property
    def job_id(self) -> str:
        return str(self)

    async def result(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the API asked for
        """The job's result once it succeeded; JobFailed if it died or was cancelled."""
        async with asyncio.timeout(timeout):
            state = await self.app.follow_to_end(
                self.job_id, self.enqueue_partition, self.enqueue_offset, after=self.after
            )
        return outcome(state)

    def result_sync(self, timeout: float | None = None) -> Any:
        """``result`` for sync code (any thread), on the app's private event loop."""
        return self.app.run_sync(lambda: self.result(timeout))
