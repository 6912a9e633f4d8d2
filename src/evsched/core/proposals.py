"""A dry run of a node's planned decision: would the fold apply it to the state it came from?

A node plans leases, expiries, purges and cron fires from the states it folded, and the fold
judges each like any other event. Folding a decision against the state it was planned from, at
the position it would get as closely as the node can know it (its partition, the next offset, its
clock for the log time), finds one the fold would refuse before it is sent: a planner that
disagrees with the fold then costs a log line, not a rejected record in the log on every step.
"""

from __future__ import annotations

from evsched.core.events import JobEvent, Position, ScheduleFired
from evsched.core.fold import fold
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import JobState, ScheduleState, TimelineEntry, Verdict


def job_refusal(state: JobState, event: JobEvent, position: Position) -> str | None:
    """Why the fold would not apply ``event`` to ``state`` at ``position``, or None if it would."""
    _, entry = fold(state, event, position)
    return _refusal(entry)


def fire_refusal(state: ScheduleState, event: ScheduleFired, position: Position) -> str | None:
    """Why the schedule fold would not apply the fire ``event`` to ``state``, or None."""
    _, entry = fold_schedule(state, event, position)
    return _refusal(entry)


def _refusal(entry: TimelineEntry) -> str | None:
    if entry.verdict is Verdict.APPLIED:
        return None
    return f"{entry.verdict.value}: {entry.reason}"
