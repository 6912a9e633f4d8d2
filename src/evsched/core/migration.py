"""Moving a namespace's live jobs and schedules into another namespace: which are carried, and the
pair of events that carries each (one enqueued in the new namespace, one ending it in the old).

Only ``scheduled`` jobs are carried (due, delayed or waiting for a retry's backoff), and only
from partitions where their queue is paused: a node may lease a job of a running queue between
the reading and the writing, and its attempt could then succeed in the old namespace while the
job is enqueued in the new one. A leased or running job is left to finish where it runs:
carrying it while a worker may still complete it in the old namespace could run it twice, with
effects in both. Workflows stay too: a job waiting on parents (their results are folded in the
old namespace), and a parent with children (its cancel there would resolve them there).
``evsched namespace migrate`` is repeatable: what finished since is not live, and what went
back to ``scheduled`` (a failed attempt's retry) is carried by the next run.

Every event id is derived from the job (or schedule) and its run, so a repeated or resumed
migration writes the same events again, and the fold calls them duplicates.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from evsched.core.events import (
    JobCancelled,
    JobEnqueued,
    ScheduleDeleted,
    ScheduleUpserted,
)
from evsched.core.ids import moved_event_id
from evsched.core.state import JobState, ScheduleState, Status

SOURCE = "migrate"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMove:
    """A job carried over: enqueued in the new namespace, cancelled in the old one."""

    enqueued: JobEnqueued
    cancelled: JobCancelled


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleMove:
    """A schedule carried over: upserted in the new namespace, deleted in the old one."""

    upserted: ScheduleUpserted
    deleted: ScheduleDeleted


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one migration run writes, and the live jobs it leaves (to carry on a later run)."""

    jobs: tuple[JobMove, ...]
    schedules: tuple[ScheduleMove, ...]
    left: tuple[JobState, ...]


def moved_reason(to_namespace: str) -> str:
    """The reason of the old namespace's JobCancelled: where the job went (``evsched audit``)."""
    return f"moved to namespace {to_namespace}"


def job_move(state: JobState, *, to_namespace: str, now_ms: int) -> JobMove:
    """The pair of events that moves ``state`` (a scheduled job) into ``to_namespace``.

    The job keeps its id, so its idempotency key or uniqueness still dedupes in the new
    namespace, and attempts already used are taken off its maximum (at least one is left: a
    scheduled job has one to run). A checkpoint is not carried: its next attempt starts afresh.
    """
    run = (state.job_id, state.generation)
    enqueued = JobEnqueued(
        event_id=moved_event_id("enqueued", *run),
        job_id=state.job_id,
        emitted_at=now_ms,
        source=SOURCE,
        task=state.task,
        queue=state.queue,
        args=state.args,
        run_at=state.run_at,
        priority=state.priority,
        max_attempts=max(1, state.max_attempts - state.attempt),
        retry=state.retry,
        timeout_ms=state.timeout_ms,
        idempotency_key=state.idempotency_key,
        labels=dict(state.labels),
        schedule_id=state.schedule_id,
        fire_at=state.fire_at,
        trace=state.trace,
        retention_ms=state.retention_ms,
        key_window_ms=state.key_window_ms,
        unique=state.unique,
        unique_period_ms=state.unique_period_ms,
    )
    cancelled = JobCancelled(
        event_id=moved_event_id("cancelled", *run),
        job_id=state.job_id,
        emitted_at=now_ms,
        source=SOURCE,
        reason=moved_reason(to_namespace),
        trace=state.trace,
    )
    return JobMove(enqueued=enqueued, cancelled=cancelled)


def schedule_move(state: ScheduleState, *, now_ms: int) -> ScheduleMove:
    """The pair of events that moves a live schedule: same id, cron, template and policies."""
    run = (state.schedule_id, state.created_at)
    upserted = ScheduleUpserted(
        event_id=moved_event_id("upserted", *run),
        schedule_id=state.schedule_id,
        emitted_at=now_ms,
        source=SOURCE,
        cron=state.cron,
        timezone=state.timezone,
        template=state.template,
        catchup_window_ms=state.catchup_window_ms,
        max_jitter_ms=state.max_jitter_ms,
        overlap=state.overlap,
    )
    deleted = ScheduleDeleted(
        event_id=moved_event_id("deleted", *run),
        schedule_id=state.schedule_id,
        emitted_at=now_ms,
        source=SOURCE,
    )
    return ScheduleMove(upserted=upserted, deleted=deleted)


LIVE_STATUSES = frozenset({Status.SCHEDULED, Status.LEASED, Status.RUNNING, Status.WAITING})


def plan(
    jobs: Iterable[JobState],
    schedules: Iterable[ScheduleState],
    *,
    paused: Collection[tuple[int, str]],
    to_namespace: str,
    now_ms: int,
) -> Plan:
    """The moves of every scheduled job whose (partition, queue) is ``paused``, and of every live
    schedule; the other live jobs are ``left``."""
    moves: list[JobMove] = []
    left: list[JobState] = []
    for state in jobs:
        movable = state.status is Status.SCHEDULED and not state.children
        if movable and (state.partition, state.queue) in paused:
            moves.append(job_move(state, to_namespace=to_namespace, now_ms=now_ms))
        elif state.status in LIVE_STATUSES:
            left.append(state)
    live = [s for s in schedules if not s.deleted]
    return Plan(
        jobs=tuple(moves),
        schedules=tuple(schedule_move(s, now_ms=now_ms) for s in live),
        left=tuple(left),
    )
