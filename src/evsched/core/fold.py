"""The fold: the only place where job state changes, judging every event with a verdict.

``fold(state, event, position) -> (state, timeline entry)`` is pure and total: it reads time only
from the position (the broker's log append time) and never raises on any event, so every replica
and every replay reaches the same states and verdicts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, assert_never

from evsched.core import bounds, ids, retention, retry, roles, snooze, unique
from evsched.core.entries import judged
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobPurged,
    JobRequeued,
    LeaseExpired,
    LeaseRenewed,
    ParentResolved,
    Position,
)
from evsched.core.slots import new_state, state_replacer
from evsched.core.state import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    JobError,
    JobState,
    Status,
    TimelineEntry,
    Verdict,
)
from evsched.core.workflow import ops as workflow_ops
from evsched.core.workflow import waits as workflows

# Bump when a change to the fold could change any state or verdict, or the index holds something
# an older one lacks (5: workflow rewaits; the partition's tallies, core.tallies; 6: rejected
# events of jobs the index does not hold expire, core.retention.orphan_until; 7: the index keeps
# only the newest undecodable and refused records of each partition, adapters.index.poison,
# where an index of version 6 keeps them all, and a limit's permit steps and rejected events of
# schedules it does not hold expire like those of unknown jobs, where version 6 keeps them and
# marks an unknown job's by its id alone; the permit steps are keyed under a timeline family
# of their own, where version 6 keys them with the queue's pauses and limit settings, which
# time travel reads whole; 8: a lease is applied only at the job's token + 1, where version 7
# took any higher token, so one forged lease near bounds.MAX_TOKEN left the job unleasable and
# its node proposing an impossible lease for ever; 9: from a partition's first record that
# carries a valid proof on, a node's or a worker's fact without its role's proof is rejected,
# core.roles, where version 8 took them from anyone who could write the log; a ChildRegistered
# of a job its parent itself waits on is rejected as a cycle, core.workflow.waits, where version
# 8 applied it; and the index keeps a reused id's earlier runs only for their retention, in the
# families runs and run_marks that an index of version 8 lacks; 10: a handler's AttemptSnoozed
# puts its job back without spending the attempt, core.snooze, where version 9 kept the unknown
# kind's record as undecodable, and JobState counts snoozes): indexes then rebuild.
FOLD_VERSION = 10

# Producer retries repeat an event id within moments; older repeats are still caught by the
# transition rules (they are rejected or stale), so a short window keeps state small.
RECENT_EVENT_IDS = 16

TokenEvent = (
    AttemptStarted
    | LeaseRenewed
    | AttemptCheckpointed
    | AttemptSucceeded
    | AttemptFailed
    | AttemptSnoozed
    | LeaseExpired
)
# A step's result: the new state, the verdict and a one-line human reading of it.
Step = tuple[JobState | None, Verdict, str]

# A replacer per set of changed fields (a handful: one per kind of transition).
_REPLACERS: dict[tuple[str, ...], Callable[..., JobState]] = {}


def fold(
    state: JobState | None, event: JobEvent, position: Position
) -> tuple[JobState | None, TimelineEntry]:
    """Apply ``event`` at ``position``; the state changes only when the verdict is applied."""
    new: JobState | None
    refusal = bounds.refusal(event) or roles.refusal(event, position)
    if refusal is not None:
        new, verdict, reason = state, Verdict.REJECTED, refusal
    elif state is not None and event.event_id in state.recent_event_ids:
        new, verdict, reason = state, Verdict.DUPLICATE, f"event {event.event_id} already applied"
    else:
        new, verdict, reason = _step(state, event, position)
    if verdict is not Verdict.APPLIED:
        new = state
    elif new is not None and new.unique_held_at is not None and new.status in TERMINAL_STATUSES:
        new, started = unique.next_run(new, position)
        reason += started
    return new, _entry(event, position, verdict, reason, new)


def _applied(state: JobState, event: JobEvent, position: Position, **changes: Any) -> JobState:
    """``state`` after ``event``: ``changes`` plus what every applied event records, in one copy.

    This is ``dataclasses.replace`` at a fraction of its cost (see ``core.slots``), and a
    misspelt field name still raises.
    """
    names = tuple(changes)
    replace = _REPLACERS.get(names) or _REPLACERS.setdefault(names, state_replacer(names))
    recent = (*state.recent_event_ids, event.event_id)[-RECENT_EVENT_IDS:]
    return replace(state, *changes.values(), recent, position.log_at)


def _entry(
    event: JobEvent, position: Position, verdict: Verdict, reason: str, state: JobState | None
) -> TimelineEntry:
    token = getattr(event, "token", None)
    status = None if state is None else state.status
    return judged(event, position, verdict, reason, token=token, status_after=status)


def _step(state: JobState | None, event: JobEvent, position: Position) -> Step:
    # The kinds are disjoint, so the order of the cases is free: the most frequent first.
    match event:
        case (
            AttemptStarted()
            | AttemptSucceeded()
            | LeaseRenewed()
            | AttemptFailed()
            | AttemptCheckpointed()
            | AttemptSnoozed()
            | LeaseExpired()
        ):
            return _token_event(state, event, position)
        case JobLeased():
            return _leased(state, event, position)
        case JobEnqueued():
            return _enqueued(state, event, position)
        case JobCancelled():
            return _cancelled(state, event, position)
        case JobRequeued():
            return _requeued(state, event, position)
        case JobPurged() | ChildRegistered() | ParentResolved():
            return _purged_or_workflow(state, event, position)
        case _:
            assert_never(event)


def _enqueued(state: JobState | None, event: JobEnqueued, position: Position) -> Step:
    # Recomputed, never the producer's: a forged digest must not pass for another body.
    digest = ids.body_digest(event.task, event.queue, event.args)
    if state is not None and state.unique is not None:
        return _unique_enqueued(state, event, position, digest)
    if state is not None and not retention.key_window_passed(state, position.log_at):
        if digest == state.body_digest:
            return state, Verdict.DUPLICATE, "same job already enqueued with the same body"
        return state, Verdict.CONFLICT, "job id already used by an enqueue with a different body"
    # Past the key window a finished keyed job's id starts a new run: its token goes on growing,
    # so a worker of an earlier run is still fenced off.
    generation = 0 if state is None else state.generation + 1
    created = new_state(
        job_id=event.job_id,
        status=Status.WAITING if event.after else Status.SCHEDULED,
        task=event.task,
        queue=event.queue,
        args=event.args,
        priority=event.priority,
        run_at=position.log_at if event.run_at is None else event.run_at,
        max_attempts=event.max_attempts,
        retry=event.retry,
        timeout_ms=event.timeout_ms,
        enqueued_at=position.log_at,
        updated_at=position.log_at,
        partition=position.partition,
        idempotency_key=event.idempotency_key,
        body_digest=digest,
        labels=dict(sorted(event.labels.items())),
        schedule_id=event.schedule_id,
        fire_at=event.fire_at,
        trace=event.trace,
        recent_event_ids=(event.event_id,),
        token=0 if state is None else state.token,
        generation=generation,
        first_offset=position.offset if state is None else state.first_offset,
        retention_ms=event.retention_ms,
        key_window_ms=event.key_window_ms,
        unique=event.unique,
        unique_period_ms=event.unique_period_ms,
        after=event.after,
        after_rule=event.after_rule,
        results_to_args=event.results_to_args,
    )
    run = f" (run {generation}: the key window of run {generation - 1} ended)" if state else ""
    waits = f", waiting on {len(event.after)} parents ({event.after_rule})" if event.after else ""
    return created, Verdict.APPLIED, f"enqueued {event.task} on {event.queue}{run}{waits}"


def _purged_or_workflow(
    state: JobState | None, event: JobPurged | ChildRegistered | ParentResolved, position: Position
) -> Step:
    """Events outside a job's attempts: a purge, or a workflow's registration or resolution."""
    if isinstance(event, JobPurged):
        return _purged(state, event, position)
    if isinstance(event, ChildRegistered):
        return workflows.registered(state, event, position, _applied)
    return workflows.resolved(state, event, position, _applied)


def _unique_enqueued(
    state: JobState, event: JobEnqueued, position: Position, digest: bytes
) -> Step:
    """An enqueue of a unique job's id: judged by the existing run's scope (``core.unique``).

    Another body may start a new run once the run ended (a schedule's template changed).
    """
    outcome, why = unique.judge(state, position.log_at)
    if digest != state.body_digest and outcome != unique.NEW_RUN:
        return state, Verdict.CONFLICT, "job id already used by an enqueue with a different body"
    if outcome == unique.DUPLICATE:
        return state, Verdict.DUPLICATE, why
    if outcome == unique.HOLD:
        run_at = position.log_at if event.run_at is None else event.run_at
        return _applied(state, event, position, unique_held_at=run_at), Verdict.APPLIED, why
    created, _, enqueued = _enqueued(None, event, position)
    assert created is not None  # a first enqueue of a checked event always applies
    created = replace(
        created,
        token=state.token,
        generation=state.generation + 1,
        first_offset=state.first_offset,
    )
    return created, Verdict.APPLIED, f"{enqueued} (run {created.generation}: {why})"


def _purged(state: JobState | None, event: JobPurged, position: Position) -> Step:
    if state is None:
        return None, Verdict.REJECTED, "unknown job"
    refusal = retention.purge_refusal(state, event.generation, position.log_at)
    if refusal is not None:
        return state, Verdict.REJECTED, refusal
    return None, Verdict.APPLIED, retention.purge_reason(state, position.partition)


def _cancelled(state: JobState | None, event: JobCancelled, position: Position) -> Step:
    if state is None:
        return None, Verdict.REJECTED, "unknown job"
    if state.status in TERMINAL_STATUSES:
        return state, Verdict.REJECTED, f"cannot cancel: job is already {state.status}"
    cancelled = _applied(
        state, event, position, status=Status.CANCELLED, lease_until=None, snoozed_until=None
    )
    reason = f"cancelled by {event.source}" + (f": {event.reason}" if event.reason else "")
    return cancelled, Verdict.APPLIED, reason


def _requeued(state: JobState | None, event: JobRequeued, position: Position) -> Step:
    if state is None:
        return None, Verdict.REJECTED, "unknown job"
    if event.rewait:  # fold version 5: a workflow's child waits again on its parents
        return workflow_ops.rewaited(state, event, position, _applied)
    rerun = event.rerun and state.status is Status.SUCCEEDED
    if state.status not in (Status.DEAD, Status.CANCELLED) and not rerun:
        why = " (a succeeded job needs rerun)" if state.status is Status.SUCCEEDED else ""
        return state, Verdict.REJECTED, f"cannot requeue: job is {state.status}{why}"
    run_at = position.log_at if event.run_at is None else event.run_at
    # A rerun's earlier result and progress leave the state (the log keeps them): a reader waiting
    # for the rerun's result must not take the old one, nor the run resume from its checkpoint.
    cleared = (
        {"result": None, "checkpoint": None} if rerun else {"lease_until": None, "worker_id": None}
    )
    requeued = _applied(
        state,
        event,
        position,
        status=Status.SCHEDULED,
        attempt=0,
        run_at=run_at,
        snoozes=0,
        **cleared,
    )
    why = "to run again (rerun)" if rerun else "with a fresh attempt budget"
    return requeued, Verdict.APPLIED, f"requeued by {event.source} {why}"


def _leased(state: JobState | None, event: JobLeased, position: Position) -> Step:
    if state is None:
        return None, Verdict.REJECTED, "unknown job"
    if state.status is not Status.SCHEDULED:
        return state, Verdict.REJECTED, f"cannot lease: job is {state.status}"
    token, attempt = event.token, event.attempt
    if token != state.token + 1:
        # A node only ever proposes the next token: one that jumps ahead is forged, and would
        # leave the job at a token whose next lease breaks bounds.MAX_TOKEN (fold version 8).
        why = f"lease token {token}, expected token {state.token + 1}"
        return state, Verdict.REJECTED, why
    if (too_early := _lease_too_early(state, event, position)) is not None:
        return state, Verdict.REJECTED, too_early
    if attempt != state.attempt + 1:
        why = f"lease for attempt {attempt}, expected attempt {state.attempt + 1}"
        return state, Verdict.REJECTED, why
    # A pre-lease's start window opens at run_at, so its length does not shrink with the horizon.
    opens = position.log_at if event.not_before is None else max(position.log_at, state.run_at)
    leased = _applied(
        state,
        event,
        position,
        status=Status.LEASED,
        token=event.token,
        attempt=event.attempt,
        lease_until=opens + event.lease_ms,
        worker_id=None,
        snoozed_until=None,
    )
    ahead = "" if opens == position.log_at else f", pre-leased {opens - position.log_at} ms ahead"
    why = f"leased to token {event.token} for attempt {event.attempt}{ahead}"
    return leased, Verdict.APPLIED, why


def _lease_too_early(state: JobState, event: JobLeased, position: Position) -> str | None:
    """Why a lease comes too early for the job's run_at, or None.

    An ordinary lease needs the job to be due by log time; a pre-lease names the run_at it was
    granted for (a requeue or retry since then moves it) and comes at most MAX_PRELEASE_MS ahead.
    """
    if event.not_before is None:
        if position.log_at < state.run_at:
            return "lease granted before the job's run_at"
        return None
    if event.not_before != state.run_at:
        return f"pre-lease for run_at {event.not_before}, but the job's run_at is {state.run_at}"
    if state.run_at - position.log_at > bounds.MAX_PRELEASE_MS:
        return f"pre-lease more than {bounds.MAX_PRELEASE_MS} ms ahead of the job's run_at"
    return None


def _fence(state: JobState | None, event: TokenEvent) -> Step | None:
    """The verdict for an event whose token is not the live one, or None when it is live.

    An older token is stale whatever became of the job, so an audit names the zombie as such;
    the current token of a finished job is rejected (the transition is not allowed).
    """
    if state is None:
        return None, Verdict.REJECTED, "unknown job"
    actor, token = _actor(event), event.token
    if token != state.token:
        why = f"{actor} rejected: token {token} is stale, current is {state.token}"
        return state, Verdict.STALE, why
    if state.status in TERMINAL_STATUSES:
        return state, Verdict.REJECTED, f"{actor} rejected: job is already {state.status}"
    if state.status not in ACTIVE_STATUSES:
        why = f"{actor} rejected: token {token} is stale, its attempt has ended"
        return state, Verdict.STALE, why
    return None


def _actor(event: TokenEvent) -> str:
    return f"{type(event).__name__} from {event.source}"


def _token_event(state: JobState | None, event: TokenEvent, position: Position) -> Step:
    fenced = _fence(state, event)
    if fenced is not None:
        return fenced
    assert state is not None  # _fence returned None, so the job exists and holds a live lease
    if isinstance(event, LeaseExpired):
        return _expired(state, event, position)
    if isinstance(event, AttemptStarted):
        return _started(state, event, position)
    if state.status is not Status.RUNNING:
        return state, Verdict.REJECTED, f"{_actor(event)} rejected: attempt not started"
    return _running_event(state, event, position)


def _started(state: JobState, event: AttemptStarted, position: Position) -> Step:
    if state.status is not Status.LEASED:
        return state, Verdict.REJECTED, f"token {event.token} already started"
    if position.log_at < state.run_at:
        # Only a pre-lease gets here: its worker's clock ran ahead of the log's.
        return state, Verdict.REJECTED, f"token {event.token} started before the job's run_at"
    if state.lease_until is not None and position.log_at >= state.lease_until:
        # Its start deadline passed: the lease is as good as expired, so no handler may count
        # as having started under it (the node's expiry follows, spending no attempt).
        return (
            state,
            Verdict.REJECTED,
            f"token {event.token} started after its start deadline {state.lease_until}",
        )
    started = _applied(
        state,
        event,
        position,
        status=Status.RUNNING,
        worker_id=event.worker_id,
        lease_until=position.log_at + event.lease_ms,
    )
    return started, Verdict.APPLIED, f"attempt {state.attempt} started on {event.worker_id}"


def _running_event(
    state: JobState,
    event: LeaseRenewed | AttemptCheckpointed | AttemptSucceeded | AttemptFailed | AttemptSnoozed,
    position: Position,
) -> Step:
    match event:
        case LeaseRenewed():
            renewed = _applied(state, event, position, lease_until=position.log_at + event.lease_ms)
            return renewed, Verdict.APPLIED, f"lease of token {event.token} renewed"
        case AttemptCheckpointed():
            saved = _applied(state, event, position, checkpoint=event.checkpoint)
            return saved, Verdict.APPLIED, f"checkpoint saved under token {event.token}"
        case AttemptSucceeded():
            done = _applied(
                state,
                event,
                position,
                status=Status.SUCCEEDED,
                result=event.result,
                lease_until=None,
            )
            return done, Verdict.APPLIED, f"succeeded with token {event.token}"
        case AttemptFailed():
            error = JobError(
                error_type=event.error_type,
                message=event.message,
                retryable=event.retryable,
                category=event.category,
                traceback=event.traceback,
            )
            return _retry_or_die(state, event, error, position)
        case AttemptSnoozed():
            return snooze.snoozed(state, event, position, _applied, _retry_or_die)
        case _:
            assert_never(event)


def _expired(state: JobState, event: LeaseExpired, position: Position) -> Step:
    if state.lease_until is not None and position.log_at < state.lease_until:
        why = f"lease of token {event.token} runs until {state.lease_until}, not expired"
        return state, Verdict.REJECTED, why
    if state.status is Status.LEASED:
        # No worker started it (the dispatch was lost or waited too long): no attempt was spent.
        back = _applied(
            state,
            event,
            position,
            status=Status.SCHEDULED,
            attempt=state.attempt - 1,
            run_at=position.log_at,
            lease_until=None,
            worker_id=None,
        )
        reason = f"lease of token {event.token} expired before any start: attempt not counted"
        return back, Verdict.APPLIED, reason
    error = JobError(
        error_type="LeaseExpired",
        message=f"lease of token {event.token} expired (worker died or froze)",
        retryable=True,
    )
    return _retry_or_die(state, event, error, position)


def _retry_or_die(
    state: JobState,
    event: AttemptFailed | AttemptSnoozed | LeaseExpired,
    error: JobError,
    position: Position,
) -> Step:
    ended = {"last_error": error, "lease_until": None, "worker_id": None}
    if retry.may_retry(
        attempt=state.attempt, max_attempts=state.max_attempts, retryable=error.retryable
    ):
        delay = retry.backoff_ms(state.retry, state.job_id, state.attempt)
        run_at = position.log_at + delay
        rescheduled = _applied(
            state, event, position, **ended, status=Status.SCHEDULED, run_at=run_at
        )
        why = f"attempt {state.attempt} failed ({error.error_type}), retry in {delay} ms"
        return rescheduled, Verdict.APPLIED, why
    why = "permanent error" if not error.retryable else f"{state.attempt} attempts used"
    return (
        _applied(state, event, position, **ended, status=Status.DEAD),
        Verdict.APPLIED,
        (f"attempt {state.attempt} failed ({error.error_type}), dead: {why}"),
    )
