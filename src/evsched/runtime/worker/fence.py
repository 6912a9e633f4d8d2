"""The worker's fence of one attempt: follows the job from its lease and tells the handler when
the attempt stops being current (cancelled, its lease expired, leased again).

Each running attempt follows its job's events partition from the offset its dispatch carries (the
node's position when it leased), folding only that job's events with the core fold, starting from
the state the dispatch describes. As soon as the fold says the attempt's token no longer holds the
job, ``ended`` is set and ``ctx.is_current()`` turns false. When the job was cancelled, also
``cancelled``: ``ctx.cancelled`` turns true and an async handler is cancelled. An attempt that
lost its lease otherwise (a frozen worker's) is left to finish, as before: its completion is
stale. See docs/design/worker.md ("Following one job") for the cost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import structlog

from evsched.client.results import FollowGap, job_states
from evsched.core.dispatch import Dispatch
from evsched.core.follow import attempt_current, state_before_lease
from evsched.core.state import JobState, Status
from evsched.errors import EvschedError
from evsched.ports import JobFeed

log = structlog.get_logger("evsched.worker")


class AttemptFence:
    """Whether one attempt still holds its job, as its follow last saw; safe to read anywhere."""

    def __init__(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch
        self._ended = threading.Event()
        self.cancelled = False  # ended because the job was cancelled
        self.reason: str | None = None
        self._on_end: list[Callable[[], object]] = []
        self.followed = False  # a follow runs (the dispatch said where to start)
        # The job's state after its last event the follow folded, and that event's offset: the
        # worker waits on them to learn the fold's verdict on its start (runtime.worker.prestart).
        self.state: JobState | None = None
        self.folded_to = -1
        self._stopped = False  # the follow is over (ended, failed, or had nowhere to start)
        self._progress = asyncio.Event()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def on_cancel(self, call: Callable[[], object]) -> None:
        """Call ``call`` (on the worker's loop) once the job is cancelled, at once if it is."""
        if self.cancelled:
            call()
        elif not self.ended:
            self._on_end.append(call)

    def end(self, reason: str, *, cancelled: bool = False) -> None:
        if self.ended:
            return
        self.reason = reason
        self.cancelled = cancelled
        self._ended.set()
        self._progress.set()
        if cancelled:
            for call in self._on_end:
                call()
        self._on_end.clear()

    async def follow(self, feed: JobFeed) -> None:
        """Follow the job until the attempt ends (then ``end``), or until cancelled.

        The runner starts it with the attempt: it confirms the start before the handler runs
        (``runtime.worker.prestart``), then carries a cancel to the handler.
        """
        try:
            await self._follow(feed)
        finally:
            self._stopped = True
            self._progress.set()

    async def reached(self, offset: int) -> None:
        """Until the follow has folded the job's events through ``offset``, or is over."""
        while self.folded_to < offset and not self.ended and not self._stopped:
            self._progress.clear()
            await self._progress.wait()

    async def _follow(self, feed: JobFeed) -> None:
        dispatch = self.dispatch
        if dispatch.events_offset is None:
            return  # a node before events_offset: the fence falls back to the lease watch
        self.followed = True
        logger = log.bind(job_id=dispatch.job_id, token=dispatch.token)
        start = state_before_lease(dispatch)
        try:
            async for state, at in job_states(
                feed, dispatch.job_id, dispatch.partition, dispatch.events_offset, start
            ):
                self.state, self.folded_to = state, at
                self._progress.set()
                if not attempt_current(state, dispatch.token):
                    reason = why_ended(state, dispatch.token)
                    cancelled = state is not None and state.status is Status.CANCELLED
                    logger.info("attempt_ended_by_log", reason=reason, cancelled=cancelled)
                    self.end(reason, cancelled=cancelled)
                    return
        except (FollowGap, EvschedError) as exc:
            # Not knowable from here: the fold still rejects the attempt's late writes.
            logger.warning("attempt_follow_failed", error=str(exc))


def why_ended(state: JobState | None, token: int) -> str:
    """A one-line reason why the attempt of ``token`` is no longer current in ``state``."""
    if state is None:
        return "the job is unknown"
    if state.status is Status.CANCELLED:
        return "the job was cancelled"
    if state.token != token:
        return f"the job was leased again (token {state.token})"
    if state.status is Status.SUCCEEDED:
        return "the job already succeeded"
    return f"the attempt's lease ended (job {state.status})"
