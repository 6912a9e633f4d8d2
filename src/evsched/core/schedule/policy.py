"""Cron policies: catch-up of missed slots within a window, deterministic jitter, and backfills.

A schedule's ``catchup_window_ms`` says what becomes of slots missed while no node fired them
(nodes down, or the schedule paused). None keeps the original rule: missed slots collapse into
one fire of the newest. With a window, every missed slot within it of the node's clock fires, in
order ("caught up"), and the slots before the window are skipped by one ``missed`` fire that makes
no job. ``max_jitter_ms`` delays each fired job by an offset derived from (schedule id, slot), so
every replica and replay derives the same one. A backfill fires past slots on request, without
moving the schedule. Each is a ``ScheduleFired`` with its ``decision``, judged by the fold.
"""

from __future__ import annotations

import hashlib

from evsched.core import bounds, ids
from evsched.core.events import ScheduleFired
from evsched.core.schedule import cron
from evsched.core.state import ScheduleState

DECISIONS = bounds.FIRE_DECISIONS
CAUGHT_UP, MISSED, BACKFILLED = DECISIONS
ALLOW, SKIP, BUFFER = bounds.OVERLAPS
# An overlap policy is a uniqueness scope of the one job id all fires share (core.unique).
_SCOPES = {SKIP: "active", BUFFER: "queued"}
MAX_BACKFILL_SLOTS = 1_000


def fired_job(schedule_id: str, slot: int, overlap: str | None) -> tuple[str, str | None]:
    """The job id a fire of ``slot`` enqueues and its uniqueness scope.

    Allowing overlaps (the default), each slot has its own job. With ``skip`` or ``buffer``
    every fire enqueues the schedule's one job id, unique while queued or running (``skip``: a
    fire while the previous run is active is a duplicate) or while queued (``buffer``: a fire
    while it runs is held and runs next, a further one is a duplicate): the job's own fold
    decides, on its partition, with no message between partitions.
    """
    scope = _SCOPES.get(overlap or ALLOW)
    if scope is None:
        return ids.job_id_for_fire(schedule_id, slot), None
    return ids.job_id_for_runs(schedule_id), scope


def jitter_ms(schedule_id: str, slot: int, max_jitter_ms: int | None) -> int:
    """The delay of slot ``slot``'s job: in ``[0, max_jitter_ms]``, the same on every replica."""
    if not max_jitter_ms:
        return 0
    digest = hashlib.sha256(f"jitter\x00{schedule_id}\x00{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (max_jitter_ms + 1)


def due(schedule: ScheduleState, now: int) -> tuple[int, str | None] | None:
    """The slot a node should fire at ``now`` and its decision, or None when none is due."""
    next_fire = schedule.next_fire_at
    if schedule.deleted or next_fire is None or now < next_fire:
        return None
    window = schedule.catchup_window_ms
    newest = cron.latest_due_slot(schedule.cron, schedule.timezone, next_fire, now)
    if window is None or newest is None:
        return None if newest is None else (newest, None)
    if next_fire < now - window:
        # Everything before the window goes in one fire: the newest slot before it.
        last_missed = cron.latest_due_slot(
            schedule.cron, schedule.timezone, next_fire, now - window - 1
        )
        return None if last_missed is None else (last_missed, MISSED)
    return next_fire, (CAUGHT_UP if next_fire < newest else None)


def backfill_slots(schedule: ScheduleState, start: int, end: int) -> list[int]:
    """The slots in ``[start, end]`` (at most MAX_BACKFILL_SLOTS + 1, so a caller can refuse)."""
    slots: list[int] = []
    at = cron.next_fire_at(schedule.cron, schedule.timezone, start - 1)
    while at is not None and at <= end and len(slots) <= MAX_BACKFILL_SLOTS:
        slots.append(at)
        at = cron.next_fire_at(schedule.cron, schedule.timezone, at)
    return slots


def refusal(state: ScheduleState, event: ScheduleFired, log_at: int) -> str | None:
    """Why a fire's decision or jitter does not hold for ``state``, or None."""
    expected = event.fire_at + jitter_ms(state.schedule_id, event.fire_at, state.max_jitter_ms)
    if (event.run_at if event.run_at is not None else event.fire_at) != expected:
        return f"run_at {event.run_at} is not slot {event.fire_at}'s jittered time {expected}"
    window = state.catchup_window_ms
    if event.decision == MISSED:
        if window is None:
            return "no catch-up window: a missed slot is fired, not skipped"
        if event.fire_at >= log_at - window:
            return f"slot {event.fire_at} is within the {window} ms catch-up window"
    return None


def reading(state: ScheduleState, event: ScheduleFired, log_at: int) -> str:
    """The timeline's reading of an applied fire, naming its decision and jitter."""
    if event.decision == MISSED:
        return (
            f"skipped slots from {state.next_fire_at} to {event.fire_at}: outside the "
            f"{state.catchup_window_ms} ms catch-up window"
        )
    verb = {CAUGHT_UP: "caught up", BACKFILLED: "backfilled"}.get(event.decision or "", "fired")
    text = f"{verb} slot {event.fire_at} as job {event.job_id}"
    if event.decision == CAUGHT_UP:
        text += f" ({log_at - event.fire_at} ms late)"
    if event.run_at is not None and event.run_at != event.fire_at:
        text += f", jittered to {event.run_at} (+{event.run_at - event.fire_at} ms)"
    if state.overlap in _SCOPES:
        text += (
            f" (overlap {state.overlap}: the job's timeline says if it ran, waits or was skipped)"
        )
    return text
