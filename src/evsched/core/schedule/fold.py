"""The fold of cron schedules: upserts, deletes and fires, each judged with a verdict."""

from __future__ import annotations

from dataclasses import replace
from typing import assert_never

from evsched.core import bounds, roles
from evsched.core.entries import judged
from evsched.core.events import (
    Position,
    ScheduleDeleted,
    ScheduleEvent,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.fold import RECENT_EVENT_IDS
from evsched.core.schedule import cron
from evsched.core.schedule import policy as cron_policy
from evsched.core.state import ScheduleState, Status, TimelineEntry, Verdict

Step = tuple[ScheduleState | None, Verdict, str]


def fold_schedule(
    state: ScheduleState | None, event: ScheduleEvent, position: Position
) -> tuple[ScheduleState | None, TimelineEntry]:
    """Apply a schedule event; like ``fold``, pure and total, state changes only when applied."""
    new: ScheduleState | None
    refusal = bounds.refusal(event) or roles.refusal(event, position)
    if refusal is not None:
        new, verdict, reason = state, Verdict.REJECTED, refusal
    elif state is not None and event.event_id in state.recent_event_ids:
        new, verdict, reason = state, Verdict.DUPLICATE, f"event {event.event_id} already applied"
    else:
        new, verdict, reason = _step(state, event, position)
    if verdict is Verdict.APPLIED and new is not None:
        recent = (*new.recent_event_ids, event.event_id)[-RECENT_EVENT_IDS:]
        new = replace(new, recent_event_ids=recent, updated_at=position.log_at)
    else:
        new = state
    status = Status.SCHEDULED if new is not None and not new.deleted else None
    return new, judged(event, position, verdict, reason, status_after=status)


def _step(state: ScheduleState | None, event: ScheduleEvent, position: Position) -> Step:
    match event:
        case ScheduleUpserted():
            return _upserted(state, event, position)
        case ScheduleDeleted():
            if state is None or state.deleted:
                return state, Verdict.REJECTED, "unknown or already deleted schedule"
            deleted = replace(state, deleted=True, next_fire_at=None)
            return deleted, Verdict.APPLIED, f"deleted by {event.source}"
        case ScheduleFired():
            return _fired(state, event, position)
        case _:
            assert_never(event)


def _upserted(state: ScheduleState | None, event: ScheduleUpserted, position: Position) -> Step:
    try:
        # A slot already fired is never fired again, even when the expression changes.
        after = position.log_at
        if state is not None and state.last_fire_at is not None:
            after = max(after, state.last_fire_at)
        next_fire = cron.next_fire_at(event.cron, event.timezone, after)
    except cron.InvalidSchedule as exc:
        return state, Verdict.REJECTED, str(exc)
    if next_fire is None:
        return state, Verdict.REJECTED, f"cron expression {event.cron!r} never fires again"
    upserted = ScheduleState(
        schedule_id=event.schedule_id,
        cron=event.cron,
        timezone=event.timezone,
        template=event.template,
        created_at=position.log_at if state is None else state.created_at,
        updated_at=position.log_at,
        next_fire_at=next_fire,
        last_fire_at=None if state is None else state.last_fire_at,
        last_job_id=None if state is None else state.last_job_id,
        recent_event_ids=() if state is None else state.recent_event_ids,
        catchup_window_ms=event.catchup_window_ms,
        max_jitter_ms=event.max_jitter_ms,
        overlap=event.overlap,
    )
    verb = "created" if state is None or state.deleted else "replaced"
    return upserted, Verdict.APPLIED, f"schedule {verb}: {event.cron} ({event.timezone})"


def _fired(state: ScheduleState | None, event: ScheduleFired, position: Position) -> Step:
    if state is None or state.deleted:
        return state, Verdict.REJECTED, "unknown or deleted schedule"
    if event.fire_at == state.last_fire_at:
        return state, Verdict.DUPLICATE, f"slot {event.fire_at} already fired"
    if event.decision == cron_policy.BACKFILLED:
        return _backfilled(state, event, position)
    refusal = _fire_refusal(state, event, position) or cron_policy.refusal(
        state, event, position.log_at
    )
    if refusal is not None:
        return state, Verdict.REJECTED, refusal
    reason = cron_policy.reading(state, event, position.log_at)
    # None once the expression has no slot left: the schedule is exhausted and fires no more.
    next_fire = cron.next_fire_at(state.cron, state.timezone, event.fire_at)
    if event.decision == cron_policy.MISSED:
        return replace(state, next_fire_at=next_fire), Verdict.APPLIED, reason
    fired = replace(
        state, last_fire_at=event.fire_at, last_job_id=event.job_id, next_fire_at=next_fire
    )
    return fired, Verdict.APPLIED, reason


def _backfilled(state: ScheduleState, event: ScheduleFired, position: Position) -> Step:
    """A past slot fired on request: the schedule's own slots stay as they are."""
    refusal = cron_policy.refusal(state, event, position.log_at)
    if event.fire_at > position.log_at:
        refusal = f"slot {event.fire_at} is in the future: only past slots are backfilled"
    elif state.next_fire_at is not None and event.fire_at >= state.next_fire_at:
        refusal = f"slot {event.fire_at} is not before the next due slot {state.next_fire_at}"
    elif not cron.is_slot(state.cron, state.timezone, event.fire_at):
        refusal = f"{event.fire_at} is not a slot of {state.cron!r}"
    if refusal is not None:
        return state, Verdict.REJECTED, refusal
    return state, Verdict.APPLIED, cron_policy.reading(state, event, position.log_at)


def _fire_refusal(state: ScheduleState, event: ScheduleFired, position: Position) -> str | None:
    """Why a fire of a live schedule is rejected, or None when it may apply."""
    if state.next_fire_at is None:
        return "schedule exhausted: its expression has no slot left"
    if event.fire_at < state.next_fire_at:
        return f"slot {event.fire_at} is before the next due slot {state.next_fire_at}"
    if event.fire_at > position.log_at:
        return f"slot {event.fire_at} fired before it was due"
    # A zombie node still firing a replaced expression must not shift the schedule off its slots.
    if not cron.is_slot(state.cron, state.timezone, event.fire_at):
        return f"{event.fire_at} is not a slot of {state.cron!r}"
    return None
