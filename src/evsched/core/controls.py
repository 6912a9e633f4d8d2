"""Pause and resume of queues and schedules: their fold, and their guards on leases and fires.

A control is an entity of its own (a queue, or a schedule's pause switch) with a verdict for every
event, like jobs and schedules. A queue spans every events partition, so its controls are written
to each partition and each partition folds its own copy; a schedule's controls share its key and
so its partition. The guards turn a lease of a paused queue's job, or a fire of a paused
schedule's slot, into ``rejected``, so a zombie node's decision cannot slip through.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from evsched.core import bounds
from evsched.core.entries import judged
from evsched.core.events import (
    ControlEvent,
    EventTimeline,
    JobEvent,
    JobLeased,
    Position,
    QueuePaused,
    ScheduleEvent,
    ScheduleFired,
    SchedulePaused,
)
from evsched.core.fold import RECENT_EVENT_IDS, fold
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import JobState, ScheduleState, TimelineEntry, Verdict

QUEUE, SCHEDULE = "queue", "schedule"
Target = str  # QUEUE or SCHEDULE


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlState:
    """Whether a queue or a schedule is paused, since when (log time), by whom and why."""

    target: str
    name: str
    paused: bool
    reason: str
    source: str
    changed_at: int
    updated_at: int
    recent_event_ids: tuple[str, ...] = ()


def target_of(event: ControlEvent) -> tuple[Target, str]:
    """What ``event`` controls: ("queue", name) or ("schedule", id)."""
    if event.timeline is EventTimeline.QUEUE:
        return QUEUE, event.queue
    return SCHEDULE, event.schedule_id


def target_exists(target: Target, schedule: ScheduleState | None) -> bool:
    """Whether a control's target exists: any queue does; a schedule if known and not deleted."""
    return target == QUEUE or (schedule is not None and not schedule.deleted)


def fold_control(
    state: ControlState | None, event: ControlEvent, position: Position, *, exists: bool = True
) -> tuple[ControlState | None, TimelineEntry]:
    """Apply a pause or resume; ``exists`` is False for a schedule that is unknown or deleted."""
    verdict, reason = _judge(state, event, exists=exists)
    new = state
    if verdict is Verdict.APPLIED:
        target, name = target_of(event)
        recent = () if state is None else state.recent_event_ids
        new = ControlState(
            target=target,
            name=name,
            paused=isinstance(event, QueuePaused | SchedulePaused),
            reason=event.reason,
            source=event.source,
            changed_at=position.log_at,
            updated_at=position.log_at,
            recent_event_ids=(*recent, event.event_id)[-RECENT_EVENT_IDS:],
        )
    return new, judged(event, position, verdict, reason)


def _judge(state: ControlState | None, event: ControlEvent, *, exists: bool) -> tuple[Verdict, str]:
    refusal = bounds.refusal(event)
    if refusal is not None:
        return Verdict.REJECTED, refusal
    if state is not None and event.event_id in state.recent_event_ids:
        return Verdict.DUPLICATE, f"event {event.event_id} already applied"
    target, name = target_of(event)
    if not exists:
        return Verdict.REJECTED, f"unknown or deleted schedule {name}"
    pause = isinstance(event, QueuePaused | SchedulePaused)
    paused = state is not None and state.paused
    if pause and paused:
        return Verdict.REJECTED, f"{target} {name} is already paused"
    if not pause and not paused:
        return Verdict.REJECTED, f"{target} {name} is not paused"
    by = f" by {event.source}" + (f": {event.reason}" if event.reason else "")
    return Verdict.APPLIED, f"{target} {name} {'paused' if pause else 'resumed'}{by}"


JobFold = Callable[[JobState | None, JobEvent, Position], tuple[JobState | None, TimelineEntry]]


def fold_job(
    state: JobState | None,
    event: JobEvent,
    position: Position,
    paused: Container[str],
    base: JobFold = fold,
) -> tuple[JobState | None, TimelineEntry]:
    """``base`` (the fold), except that a lease of a job on a queue in ``paused`` is rejected."""
    after, entry = base(state, event, position)
    if (
        isinstance(event, JobLeased)
        and entry.verdict is Verdict.APPLIED
        and state is not None
        and state.queue in paused
    ):
        refused = replace(
            entry,
            verdict=Verdict.REJECTED,
            reason=f"cannot lease: queue {state.queue} is paused",
            status_after=state.status,
        )
        return state, refused
    return after, entry


def fold_schedule_guarded(
    state: ScheduleState | None, event: ScheduleEvent, position: Position, *, paused: bool
) -> tuple[ScheduleState | None, TimelineEntry]:
    """``fold_schedule``, except that a fire of a paused schedule is rejected."""
    after, entry = fold_schedule(state, event, position)
    if isinstance(event, ScheduleFired) and paused and entry.verdict is Verdict.APPLIED:
        reason = f"cannot fire slot {event.fire_at}: schedule {event.schedule_id} is paused"
        return state, replace(entry, verdict=Verdict.REJECTED, reason=reason)
    return after, entry
