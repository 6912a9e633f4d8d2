"""Following one job from a known offset of its partition with the fold, without a replica.

A follower folds only one job's events, from the offset its enqueue landed at (state None), or
from the node's position when it leased the job (the state the dispatch describes). These rules
say what state to start from, when the attempt a worker runs is no longer current, and when a
follow has started too late to see the job's history.
"""

from __future__ import annotations

from evsched.core.dispatch import Dispatch
from evsched.core.events import RetryPolicy
from evsched.core.state import ACTIVE_STATUSES, JobState, Status, TimelineEntry, Verdict


def state_before_lease(dispatch: Dispatch) -> JobState:
    """The job as the node saw it when it leased ``dispatch``: scheduled, one token earlier.

    Only what the fold consults for the lease and later events of its attempt is exact (status,
    token, attempt, run_at, max_attempts); the rest is the dispatch's or a default, so a follow
    from here answers "is this attempt current", not "what is the job's full state".
    """
    return JobState(
        job_id=dispatch.job_id,
        status=Status.SCHEDULED,
        task=dispatch.task,
        queue=dispatch.queue,
        args=dispatch.args,
        priority=0,
        run_at=dispatch.run_at,
        max_attempts=dispatch.max_attempts,
        retry=RetryPolicy(),
        timeout_ms=dispatch.timeout_ms,
        enqueued_at=dispatch.enqueued_at,
        updated_at=dispatch.enqueued_at,
        partition=dispatch.partition,
        attempt=dispatch.attempt - 1,
        token=dispatch.token - 1,
        checkpoint=dispatch.checkpoint,
        idempotency_key=dispatch.idempotency_key,
    )


def attempt_current(state: JobState | None, token: int) -> bool:
    """Whether the attempt holding ``token`` still holds the job's lease in ``state``.

    Before the follow reached the lease (the state still one token earlier and scheduled) the
    attempt counts as current: nothing has ended it yet.
    """
    if state is None:
        return False
    if state.token == token - 1 and state.status is Status.SCHEDULED:
        return True
    return state.token == token and state.status in ACTIVE_STATUSES


def missed_history(state: JobState | None, entry: TimelineEntry) -> bool:
    """Whether ``entry`` shows that the follow began after the job's history did.

    A token the fold never granted (stale, yet newer than the state's), or an event of a job the
    follow never saw enqueued, can only come from before the follow's first offset (or from a
    foreign producer): the caller then follows again from the partition's start.
    """
    if entry.token is None:
        return False
    if state is None:
        return entry.verdict is Verdict.REJECTED
    return entry.verdict is Verdict.STALE and entry.token > state.token
