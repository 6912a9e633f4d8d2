"""The dry run of a planned decision (``core.proposals``): the fold's verdict on it, without
keeping the state, and the reason when the fold would refuse it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from evsched.core import planner, proposals
from evsched.core.bounds import MAX_TOKEN
from evsched.core.events import JobEnqueued, Position
from evsched.core.fold import fold
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import JobState, ScheduleState
from tests.unit.core.schedule.test_schedules import MINUTE, T0, fire, upsert

BUDGETS = planner.PlannerBudgets(prelease_ms=0)


def at(log_at: int) -> Position:
    return Position(partition=0, offset=9, log_at=log_at)


def scheduled(**changes: Any) -> JobState:
    enqueued = JobEnqueued(
        event_id="e1", job_id="j", emitted_at=0, source="client", task="t", queue="q", args=b"[]"
    )
    state, _ = fold(None, enqueued, at(T0))
    assert state is not None
    return replace(state, **changes)


def lease_of(state: JobState) -> planner.Lease:
    [lease] = planner.plan_leases([state], {}, now=T0, budgets=BUDGETS, source="node-n1")
    return lease


def test_a_planned_lease_the_fold_applies_has_no_refusal_and_leaves_the_state_alone() -> None:
    state = scheduled()
    lease = lease_of(state)
    assert lease.state is state  # the state it was planned from
    assert proposals.job_refusal(state, lease.event, at(T0)) is None
    assert state.token == 0  # a dry run


def test_a_lease_past_the_last_token_is_refused_with_the_bound_it_breaks() -> None:
    state = scheduled(token=MAX_TOKEN)
    lease = lease_of(state)  # the planner proposes the next token regardless
    assert lease.event.token == MAX_TOKEN + 1
    assert proposals.job_refusal(state, lease.event, at(T0)) == (
        f"rejected: token {MAX_TOKEN + 1} is outside [1, {MAX_TOKEN}]"
    )


def test_a_lease_proposed_before_the_log_reaches_run_at_is_refused() -> None:
    state = scheduled(run_at=T0 + 1)
    lease = lease_of(replace(state, run_at=T0))  # planned from an older view of the job
    assert proposals.job_refusal(state, lease.event, at(T0)) == (
        "rejected: lease granted before the job's run_at"
    )


def schedule_at(slot: int) -> ScheduleState:
    state, _ = fold_schedule(None, upsert(), at(slot - 1))
    assert state is not None
    return state


def test_a_fire_is_applied_when_due_and_refused_before() -> None:
    state = schedule_at(T0)
    assert proposals.fire_refusal(state, fire(T0), at(T0)) is None
    later = T0 + 5 * MINUTE
    assert proposals.fire_refusal(state, fire(later), at(later - 1)) == (
        f"rejected: slot {later} fired before it was due"
    )
