"""The scheduler's decisions as pure functions: which jobs to lease, which leases expired, which
cron slots to fire, which finished jobs to purge. Every decision is only a proposal: the fold
judges it like any other event."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol, TypeVar

from evsched.core import ids, retention
from evsched.core.dispatch import Dispatch
from evsched.core.events import JobEnqueued, JobLeased, JobPurged, LeaseExpired, ScheduleFired
from evsched.core.schedule import policy as cron_policy
from evsched.core.state import ACTIVE_STATUSES, JobState, ScheduleState, Status


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerBudgets:
    """How far the scheduler may run ahead of the workers, per queue.

    ``dispatch_timeout_ms``: how long a leased job may wait for a worker to start it.
    ``max_in_flight_per_queue``: leased plus running jobs. ``max_unstarted_per_queue``: leased jobs
    no worker has started yet (backpressure: under a backlog jobs stay scheduled instead of
    waiting out their dispatch timeout in a dispatch topic). ``prelease_ms``: how long before its
    run_at a delayed job may be leased, so its worker starts it by a local timer (0: only due
    jobs are leased); at most ``bounds.MAX_PRELEASE_MS``. ``unstarted_horizon_ms``: a node may
    raise a queue's unstarted limit to this long of the queue's recent starts, up to
    ``max_in_flight_per_queue`` (0: the limit stays ``max_unstarted_per_queue``).
    """

    dispatch_timeout_ms: int = 30_000
    max_in_flight_per_queue: int = 1_000
    max_unstarted_per_queue: int = 100
    prelease_ms: int = 1_000
    unstarted_horizon_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A lease to propose, its dispatch record, and the job's state it was planned from (what
    the node's dry run folds it against, ``core.proposals``)."""

    event: JobLeased
    dispatch: Dispatch
    state: JobState


class Plannable(Protocol):
    """What choosing leases reads of a due job: a ``JobState``, or a stand-in for one that was
    not decoded (its index entry), so jobs that will not be leased are never decoded."""

    @property
    def job_id(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def run_at(self) -> int: ...

    @property
    def status(self) -> Status: ...


P = TypeVar("P", bound=Plannable)


def due_order(state: Plannable) -> tuple[int, int, str]:
    """Higher priority first, then earlier run_at, then job id for a total, stable order."""
    return (-state.priority, state.run_at, state.job_id)


def plan_leases(
    candidates: Iterable[JobState],
    in_flight: Mapping[str, int],
    *,
    unstarted: Mapping[str, int] | None = None,
    unstarted_limits: Mapping[str, int] | None = None,
    staffed: Set[str] | None = None,
    now: int,
    budgets: PlannerBudgets,
    source: str,
    events_offset: int | None = None,
) -> list[Lease]:
    """Lease due scheduled jobs in priority order while their queue has room.

    ``events_offset`` is the partition's position the candidates' states were folded up to; each
    dispatch carries it, so its worker can follow the job from there.

    A queue has room while both its leased-or-running jobs (``in_flight``) and its leased jobs
    no worker started yet (``unstarted``) are within their budgets; each lease granted here counts
    against both. ``unstarted_limits`` may raise a queue's unstarted limit above
    ``budgets.max_unstarted_per_queue`` (a node's budget does, for queues whose workers start jobs
    quickly). Jobs due within ``budgets.prelease_ms`` are pre-leased.

    ``staffed`` names the queues some worker serves now; a job of any other queue is not leased
    (it stays scheduled and costs nothing while it waits: a lease nobody takes would only expire
    and be granted again every dispatch timeout). None: not known, every queue may be leased.
    """
    chosen = pick_leases(
        candidates,
        in_flight,
        unstarted=unstarted,
        unstarted_limits=unstarted_limits,
        staffed=staffed,
        now=now,
        budgets=budgets,
    )
    return [_lease(s, now=now, budgets=budgets, source=source, at=events_offset) for s in chosen]


def pick_leases(
    candidates: Iterable[P],
    in_flight: Mapping[str, int],
    *,
    unstarted: Mapping[str, int] | None = None,
    unstarted_limits: Mapping[str, int] | None = None,
    staffed: Set[str] | None = None,
    now: int,
    budgets: PlannerBudgets,
) -> list[P]:
    """The candidates ``plan_leases`` leases, in its order, read only through ``Plannable``.

    Per queue these are the first ones in ``due_order``, as many as it has room for: so
    ``plan_leases`` over the chosen ones alone leases exactly them again.
    """
    used = dict(in_flight)
    waiting = dict(unstarted or {})
    raised = unstarted_limits or {}
    chosen: list[P] = []
    for state in sorted(candidates, key=due_order):
        if state.status is not Status.SCHEDULED or state.run_at > now + budgets.prelease_ms:
            continue
        queue = state.queue
        if staffed is not None and queue not in staffed:
            continue
        if used.get(queue, 0) >= budgets.max_in_flight_per_queue:
            continue
        if waiting.get(queue, 0) >= raised.get(queue, budgets.max_unstarted_per_queue):
            continue
        used[queue] = used.get(queue, 0) + 1
        waiting[queue] = waiting.get(queue, 0) + 1
        chosen.append(state)
    return chosen


def _lease(
    state: JobState, *, now: int, budgets: PlannerBudgets, source: str, at: int | None
) -> Lease:
    token = state.token + 1
    event = JobLeased(
        event_id=ids.decision_event_id(state.job_id, "lease", token),
        job_id=state.job_id,
        emitted_at=now,
        source=source,
        token=token,
        attempt=state.attempt + 1,
        lease_ms=budgets.dispatch_timeout_ms,
        trace=state.trace,
        # Also on a job that just came due: a node clock ahead of the log's then costs nothing.
        not_before=state.run_at if state.run_at > now - budgets.prelease_ms else None,
    )
    dispatch = Dispatch(
        job_id=state.job_id,
        token=token,
        attempt=state.attempt + 1,
        max_attempts=state.max_attempts,
        task=state.task,
        queue=state.queue,
        args=state.args,
        timeout_ms=state.timeout_ms,
        lease_ms=budgets.dispatch_timeout_ms,
        run_at=state.run_at,
        enqueued_at=state.enqueued_at,
        leased_at=now,
        partition=state.partition,
        checkpoint=state.checkpoint,
        idempotency_key=state.idempotency_key,
        trace=state.trace,
        events_offset=at,
    )
    return Lease(event=event, dispatch=dispatch, state=state)


def plan_expiries(candidates: Iterable[JobState], *, now: int, source: str) -> list[LeaseExpired]:
    """Propose expiry for every live lease whose time ran out by ``now``."""
    return [
        LeaseExpired(
            event_id=ids.decision_event_id(state.job_id, "expire", state.token),
            job_id=state.job_id,
            emitted_at=now,
            source=source,
            token=state.token,
        )
        for state in candidates
        if state.status in ACTIVE_STATUSES
        and state.lease_until is not None
        and state.lease_until <= now
    ]


def plan_purges(candidates: Iterable[JobState], *, now: int, source: str) -> list[JobPurged]:
    """Propose a purge of every finished job whose retention ran out by ``now``."""
    return [
        JobPurged(
            event_id=ids.decision_event_id(state.job_id, "purge", state.generation),
            job_id=state.job_id,
            emitted_at=now,
            source=source,
            generation=state.generation,
        )
        for state in candidates
        if (at := retention.purge_at(state)) is not None and at <= now
    ]


def plan_fires(
    schedules: Sequence[ScheduleState], *, now: int, source: str
) -> list[tuple[ScheduleFired, JobEnqueued | None]]:
    """Fire each schedule's due slot (``cron_policy.due``): a ScheduleFired and the job it
    enqueues, which is None for slots skipped as missed."""
    fires: list[tuple[ScheduleFired, JobEnqueued | None]] = []
    for schedule in schedules:
        due = cron_policy.due(schedule, now)
        if due is not None:
            fires.append(fire(schedule, due[0], now=now, source=source, decision=due[1]))
    return fires


def fire(
    schedule: ScheduleState, slot: int, *, now: int, source: str, decision: str | None = None
) -> tuple[ScheduleFired, JobEnqueued | None]:
    """The ScheduleFired of ``slot`` and its job's JobEnqueued (None when ``decision`` is missed).

    Ids derive from (schedule, slot): a backfill of a slot that fired makes the same job.
    """
    job_id, scope = cron_policy.fired_job(schedule.schedule_id, slot, schedule.overlap)
    template = schedule.template
    run_at = slot + cron_policy.jitter_ms(schedule.schedule_id, slot, schedule.max_jitter_ms)
    kind = "backfill" if decision == cron_policy.BACKFILLED else "fire"
    fired = ScheduleFired(
        event_id=ids.decision_event_id(schedule.schedule_id, kind, slot),
        schedule_id=schedule.schedule_id,
        emitted_at=now,
        source=source,
        fire_at=slot,
        job_id=job_id,
        decision=decision,
        run_at=None if run_at == slot else run_at,
    )
    if decision == cron_policy.MISSED:
        return fired, None
    enqueued = JobEnqueued(
        event_id=ids.decision_event_id(job_id, "enqueue", slot),
        job_id=job_id,
        emitted_at=now,
        source=source,
        task=template.task,
        queue=template.queue,
        args=template.args,
        run_at=run_at,
        priority=template.priority,
        max_attempts=template.max_attempts,
        retry=template.retry,
        timeout_ms=template.timeout_ms,
        idempotency_key=None if scope else ids.fire_idempotency_key(schedule.schedule_id, slot),
        labels=template.labels,
        schedule_id=schedule.schedule_id,
        fire_at=slot,
        unique=scope,
    )
    return fired, enqueued
