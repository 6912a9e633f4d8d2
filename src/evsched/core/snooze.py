"""Snoozes: a handler's "run me again in N ms", which spends no attempt up to the task's cap.

A snooze of a running attempt (its token current, judged like any completion by the fold's
fence) puts the job back to scheduled at log time + ``delay_ms`` and gives the attempt back, as a
lease that expired before its start does. The job counts its snoozes; once it has been snoozed
``max_snoozes`` times (the task's cap, carried by the event), a further snooze is a failed
attempt of category ``snooze_limit``, retried or dead by the job's retry policy.
"""

from __future__ import annotations

from collections.abc import Callable

from evsched.core import failures
from evsched.core.events import AttemptSnoozed, Position
from evsched.core.state import JobError, JobState, Status, Verdict

Step = tuple[JobState | None, Verdict, str]
Applier = Callable[..., JobState]
# The fold's ``_retry_or_die``: a failed attempt, retried after its backoff or dead.
Failer = Callable[[JobState, AttemptSnoozed, JobError, Position], Step]

SNOOZE_LIMIT_ERROR = "evsched.SnoozeLimit"


def snoozed(
    state: JobState, event: AttemptSnoozed, position: Position, apply: Applier, fail: Failer
) -> Step:
    """The step of an applied snooze of the running attempt ``state`` holds."""
    if state.snoozes >= event.max_snoozes:
        error = JobError(
            error_type=SNOOZE_LIMIT_ERROR,
            message=(
                f"snoozed {state.snoozes} times already, the task allows {event.max_snoozes}"
                + _because(event)
            ),
            retryable=True,
            category=failures.SNOOZE_LIMIT,
        )
        return fail(state, event, error, position)
    run_at = position.log_at + event.delay_ms
    back = apply(
        state,
        event,
        position,
        status=Status.SCHEDULED,
        attempt=state.attempt - 1,
        run_at=run_at,
        lease_until=None,
        worker_id=None,
        snoozes=state.snoozes + 1,
        snoozed_until=run_at,
    )
    why = (
        f"snoozed by {event.source} for {event.delay_ms} ms (snooze {state.snoozes + 1} of at"
        f" most {event.max_snoozes}), attempt {state.attempt} not counted{_because(event)}"
    )
    return back, Verdict.APPLIED, why


def _because(event: AttemptSnoozed) -> str:
    return f": {event.reason}" if event.reason else ""
