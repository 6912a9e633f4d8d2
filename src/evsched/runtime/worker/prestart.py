"""What a worker checks between its AttemptStarted and the handler: the fold accepted the start
(the job was not cancelled, expired or leased again before it), and the run lease still holds by
the worker's clock.

When the dispatch may have been held across a stall of the worker (``StallWatch``), or was
pre-leased, the attempt's follow of its job (``runtime.worker.fence``) starts with the attempt:
from the lease, through the start's own offset, it folds the job's events as a node does, so the
worker learns the fold's verdict on its start before the handler runs, however long the worker
was frozen or held the dispatch. Otherwise the handler runs at once and the follow begins
``FOLLOW_AFTER_S`` in. The same follow carries a later cancel to the handler. See
docs/design/worker.md ("Before the handler starts").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from evsched.adapters.clock import monotonic_s
from evsched.core.dispatch import START_MARGIN_MS, Dispatch, start_window_opens
from evsched.core.follow import attempt_current
from evsched.core.state import JobState, Status
from evsched.ports import Appended, JobFeed
from evsched.runtime.worker.fence import AttemptFence, why_ended
from evsched.runtime.worker.later import LaterTask

# The longest a confirmation may take: a third of the run lease (when the first heartbeat is due),
# at most this. A start not confirmed in time is not run: its lease expires.
CONFIRM_MAX_S = 5.0
# An attempt that starts at once is followed from this far in: most end sooner and never read.
FOLLOW_AFTER_S = 0.25
# The stall watch ticks this often; a tick this much later than due means the worker's loop stood
# still (SIGSTOP, a long pause of the collector, a starved VM).
TICK_S = 0.1
STALL_S = 0.5


class StallWatch:
    """When the worker's event loop last stood still, by a timer that ticks every ``TICK_S``.

    A start waits for the fold's verdict (``needs_confirmation``) only when its dispatch may have
    been held across such a stall: a cancel, an expiry or a new lease may then have come meanwhile
    (the finding of issue 32: a frozen worker woke and ran a cancelled job). Without a stall a
    start runs at once, and a cancel logged just before it races it as on any scheduler: the
    follow, begun ``FOLLOW_AFTER_S`` in, carries it to the handler.
    """

    def __init__(self, clock: Callable[[], float] = monotonic_s) -> None:
        self._clock = clock
        self._last: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.stalled_at: float | None = None  # when the newest stall was seen to end

    def start(self) -> None:
        if self._handle is None:
            self._last = self._clock()
            self._handle = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now = self._clock()
        if self._stalled(now):
            self.stalled_at = now
        self._last = now
        self._handle = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _stalled(self, now: float) -> bool:
        return self._last is not None and now - self._last > TICK_S + STALL_S

    def stalled_within(self, seconds: float) -> bool:
        """Whether the loop stood still in the last ``seconds``, or stands still now (a stall the
        next tick has not seen yet: the decision may run before it after a SIGCONT)."""
        now = self._clock()
        if self._stalled(now):
            return True
        return self.stalled_at is not None and now - self.stalled_at < seconds


def needs_confirmation(dispatch: Dispatch, appended: Appended, stalls: StallWatch) -> bool:
    """Whether the start at ``appended`` waits for the fold's verdict before the handler runs:
    one whose dispatch may have been held across a stall of the worker (its start deadline,
    ``lease_ms`` after its window opened, leaves no older stall that could matter), or one whose
    log time is unknown.

    A pre-lease held until run_at without a stall does not wait: its follow would read the
    partition from the lease, seconds back, for every such job (a fifth of the bench's jobs
    doubled the worker's CPU). A cancel during the hold reaches the handler through the follow.
    """
    if appended.log_at is None:
        return True
    window_s = (start_window_opens(dispatch) - dispatch.leased_at + dispatch.lease_ms) / 1000
    return stalls.stalled_within(window_s)


def lease_passed(*, held_ms: float, lease_ms: int) -> bool:
    """Whether a run lease of ``lease_ms``, counted from when the start was sent ``held_ms`` ago
    (the worker's monotonic clock), is over or within its margin of the end.

    The lease runs from the start's log time, which is after its send: counting from the send errs
    on the side of not running. The margin is the start deadline's (``core.dispatch``).
    """
    margin = min(START_MARGIN_MS, lease_ms // 4)
    return held_ms > lease_ms - margin


def confirm_timeout_s(lease_ms: int) -> float:
    return min(CONFIRM_MAX_S, lease_ms / 3000)


def start_refused(state: JobState | None, token: int, worker_id: str) -> str | None:
    """Why the job's state, folded through the start of ``token`` by ``worker_id``, shows that
    start not accepted; None when the attempt runs under it."""
    if state is not None and state.status is Status.RUNNING and state.token == token:
        if state.worker_id == worker_id:
            return None
        return f"token {token} runs on {state.worker_id}"
    if not attempt_current(state, token):
        return why_ended(state, token)
    return "the fold refused the start"


def follow_job(feed: JobFeed | None, fence: AttemptFence, *, after_s: float) -> LaterTask | None:
    """The follow of the attempt's job, ``after_s`` from now (0: from the next turn of the loop);
    None when there is no feed or the dispatch does not say where to start (a node before
    ``events_offset``)."""
    dispatch = fence.dispatch
    if feed is None or dispatch.events_offset is None:
        return None
    name = f"follow job {dispatch.job_id} token {dispatch.token}"
    return LaterTask(after_s, lambda: fence.follow(feed), name)


async def confirm_start(
    fence: AttemptFence, *, offset: int, worker_id: str, timeout_s: float
) -> str | None:
    """Wait until the fence's follow folded the start at ``offset`` (or ended); why the handler
    must not run, or None when the fold accepted the start."""
    try:
        async with asyncio.timeout(timeout_s):
            await fence.reached(offset)
    except TimeoutError:
        return f"the start was not confirmed within {timeout_s} s"
    if fence.ended:
        return fence.reason or "the attempt ended"
    if fence.folded_to < offset:
        return "the follow of the job failed"
    return start_refused(fence.state, fence.dispatch.token, worker_id)


async def why_not_run(
    fence: AttemptFence,
    appended: Appended,
    *,
    worker_id: str,
    lease_ms: int,
    held_ms: Callable[[], float],
    confirm: bool,
) -> str | None:
    """Why the handler of the attempt started at ``appended`` must not run, or None.

    With ``confirm`` (the attempt is followed), first the fold's verdict on the start; then, just
    before the handler (the worker may have been held since the start), its run lease by
    ``held_ms``: how long ago, by the worker's monotonic clock, the start was sent.
    """
    if confirm:
        timeout_s = confirm_timeout_s(lease_ms)
        why = await confirm_start(
            fence, offset=appended.offset, worker_id=worker_id, timeout_s=timeout_s
        )
        if why is not None:
            return why
    held = held_ms()
    if lease_passed(held_ms=held, lease_ms=lease_ms):
        return f"the run lease passed: the start was sent {held:.0f} ms ago"
    return None
