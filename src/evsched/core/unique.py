"""Uniqueness scopes: when a second enqueue of a unique job's id is a duplicate or a new run.

A unique job's id derives from its body (or its idempotency key), so every enqueue of it lands on
one partition and this fold decides from the existing run's state and log time alone:

- ``queued``: a duplicate while the run has not started (scheduled or leased);
- ``active``: a duplicate while it is queued or running;
- ``period``: a duplicate for ``unique_period_ms`` of log time from the run's enqueue.

Out of scope, a finished run makes way for a new run of the id (its generation grows, its token
goes on growing, as past a key window). A run that is still leased or running cannot be replaced
(one id holds one run at a time): the enqueue is held on the state and the next run starts as soon
as this one ends; a second enqueue meanwhile is a duplicate of the held one. An out-of-scope
enqueue of a run that has not started yet (``period`` only) is a duplicate too: that run is still
to come.
"""

from __future__ import annotations

from dataclasses import replace

from evsched.core.events import Position
from evsched.core.state import ACTIVE_STATUSES, TERMINAL_STATUSES, JobState, Status

QUEUED, ACTIVE, PERIOD = "queued", "active", "period"
SCOPES = (QUEUED, ACTIVE, PERIOD)
_QUEUED_STATUSES = frozenset({Status.SCHEDULED, Status.LEASED})
_SCOPE_STATUSES = {QUEUED: _QUEUED_STATUSES, ACTIVE: _QUEUED_STATUSES | ACTIVE_STATUSES}

# What an enqueue of an existing unique run comes to.
DUPLICATE, NEW_RUN, HOLD = "duplicate", "new run", "hold"


def refusal(scope: str | None, period_ms: int | None, max_ms: int) -> str | None:
    """Why a unique scope and period cannot be carried out, or None."""
    if scope is None:
        return None if period_ms is None else "unique_period_ms is set without unique 'period'"
    if scope not in SCOPES:
        return f"unique {scope[:40]!r} is not one of {', '.join(SCOPES)}"
    if scope != PERIOD:
        return None if period_ms is None else f"unique_period_ms is set with unique {scope!r}"
    if isinstance(period_ms, bool) or not isinstance(period_ms, int):
        return "unique 'period' needs unique_period_ms"
    if not 0 < period_ms <= max_ms:
        return f"unique_period_ms {period_ms} is outside [1, {max_ms}]"
    return None


def in_scope(state: JobState, log_at: int) -> bool:
    """Whether an enqueue at ``log_at`` is a duplicate of ``state``'s run by its scope."""
    if state.unique == PERIOD:
        return log_at < state.enqueued_at + (state.unique_period_ms or 0)
    return state.status in _SCOPE_STATUSES.get(state.unique or "", frozenset())


def judge(state: JobState, log_at: int) -> tuple[str, str]:
    """What an enqueue at ``log_at`` of ``state``'s (unique) id comes to, and why."""
    scope = describe(state)
    if in_scope(state, log_at):
        return DUPLICATE, f"unique {scope}: run {state.generation} is {state.status}"
    if state.status in TERMINAL_STATUSES:
        return NEW_RUN, f"unique {scope}: run {state.generation} ended ({state.status})"
    if state.status not in ACTIVE_STATUSES:
        why = f"unique {scope} passed, but run {state.generation} has not started yet"
        return DUPLICATE, why
    if state.unique_held_at is not None:
        why = f"unique {scope}: run {state.generation + 1} is already held"
        return DUPLICATE, why
    why = f"unique {scope}: held until run {state.generation} ({state.status}) ends"
    return HOLD, why


def describe(state: JobState) -> str:
    if state.unique == PERIOD:
        return f"for {state.unique_period_ms} ms"
    return "while queued" if state.unique == QUEUED else "while queued or running"


def next_run(state: JobState, position: Position) -> tuple[JobState, str]:
    """The held run started at ``position``, now that ``state``'s run ended, and its reading."""
    assert state.unique_held_at is not None
    started = replace(
        state,
        status=Status.SCHEDULED,
        generation=state.generation + 1,
        attempt=0,
        run_at=max(position.log_at, state.unique_held_at),
        enqueued_at=position.log_at,
        lease_until=None,
        worker_id=None,
        checkpoint=None,
        result=None,
        last_error=None,
        unique_held_at=None,
    )
    return started, f"; the held enqueue starts run {started.generation}"
