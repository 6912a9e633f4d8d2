"""One-line human readings of timeline entries, composed from the entry, its event and the states.

The fold's own reason is terse and has raw epoch milliseconds; an audit refolds the job, so it
knows the state before and after each event and can say who did what, to which token, and why
it was refused ("completion from worker-3 rejected: token 4 is stale, current is 5"). When a case
is not recognised here, the fold's reason is shown as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from evsched.core import retention
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    ControlEvent,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobPurged,
    JobRequeued,
    LeaseExpired,
    LeaseRenewed,
    ParentResolved,
    QueuePaused,
    QueueResumed,
    ScheduleDeleted,
    ScheduleEvent,
    ScheduleFired,
    SchedulePaused,
    ScheduleResumed,
    ScheduleUpserted,
)
from evsched.core.state import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    JobState,
    ScheduleState,
    Status,
    TimelineEntry,
    Verdict,
)

MAX_MESSAGE = 120
NOUNS = {
    "JobEnqueued": "enqueue",
    "JobCancelled": "cancel",
    "JobRequeued": "requeue",
    "JobLeased": "lease",
    "AttemptStarted": "start",
    "LeaseRenewed": "heartbeat",
    "AttemptCheckpointed": "checkpoint",
    "AttemptSucceeded": "completion",
    "AttemptFailed": "failure report",
    "AttemptSnoozed": "snooze",
    "LeaseExpired": "lease expiry",
    "JobPurged": "purge",
    "ChildRegistered": "child registration",
    "ParentResolved": "parent resolution",
    "ScheduleUpserted": "schedule update",
    "ScheduleDeleted": "schedule deletion",
    "ScheduleFired": "fire",
    "QueuePaused": "queue pause",
    "QueueResumed": "queue resume",
    "SchedulePaused": "schedule pause",
    "ScheduleResumed": "schedule resume",
    "QueueLimitSet": "queue limit",
    "KeyLimitSet": "key limit",
    "QueuePermit": "permit step",
    "PermitRequested": "permit request",
    "PermitGranted": "permit grant",
}


def iso(at_ms: int | None) -> str:
    """``2026-11-29T10:43:12.345Z`` (UTC, milliseconds); an empty string for None."""
    if at_ms is None:
        return ""
    moment = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def span(ms: int) -> str:
    """A duration for people: ``600 ms``, ``2.5 s``, ``4 min``, ``3 h``, ``2 d``."""
    if abs(ms) < 1_000:
        return f"{ms} ms"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if abs(ms) >= 2 * size:
            return f"{ms / size:.3g} {unit}"
    return f"{ms / 1000:.3g} s"


def _who(entry: TimelineEntry) -> str:
    return f"{NOUNS.get(entry.kind, entry.kind)} from {entry.source}"


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


# --- jobs -------------------------------------------------------------------------------------


def job_reading(
    entry: TimelineEntry, event: JobEvent, before: JobState | None, after: JobState | None
) -> str:
    """What ``event`` did to the job (``before`` → ``after``), as the audit shows it."""
    if entry.verdict is Verdict.APPLIED and isinstance(event, JobPurged):
        return purged_line(entry)
    if entry.verdict is Verdict.APPLIED and after is not None:
        return _APPLIED[type(event)](event, before, after)
    if entry.verdict is Verdict.DUPLICATE:
        return _duplicate(entry, event)
    if entry.verdict is Verdict.CONFLICT and isinstance(event, JobEnqueued):
        return _conflict(event)
    return _refused(entry, event, before)


def purged_line(entry: TimelineEntry) -> str:
    """When, where and by whom a job was purged, and where its history can still be read."""
    return (
        f"purged at {iso(entry.log_at)} at p{entry.partition}@{entry.offset} by "
        f"{entry.source}: {entry.reason}"
    )


# Where a rejected event of an unknown job (fold version 6) or schedule (7, no purge mark) is
# read once its entry expired.
_DAYS = (
    f"{retention.ORPHAN_KEPT_MS // retention.DAY_MS} days of log time; the events log and its "
    "archives keep it for good"
)
_KEPT = f"; the index keeps this entry until the job's purge mark expires, else for {_DAYS}"
_SCHEDULE_KEPT = f"; the index keeps this entry for {_DAYS}"


def _refused(entry: TimelineEntry, event: JobEvent, before: JobState | None) -> str:
    """A stale or rejected event: who sent it and why the state it met refused it."""
    if before is None:
        return f"{_who(entry)} rejected: no such job (never enqueued here, or purged){_KEPT}"
    if entry.verdict is Verdict.STALE:
        return _stale(entry, before)
    if entry.verdict is Verdict.REJECTED:
        return f"{_who(entry)} rejected: {_refusal(entry, event, before)}"
    return entry.reason


def _enqueued(event: JobEnqueued, _: JobState | None, after: JobState) -> str:
    text = f"enqueued {event.task} on queue {event.queue} by {event.source}"
    if event.schedule_id is not None:
        text += f" for schedule {event.schedule_id}'s slot {iso(event.fire_at)}"
    if after.run_at > after.enqueued_at:
        text += f", due in {span(after.run_at - after.enqueued_at)}"
    if event.idempotency_key is not None:
        text += f" (idempotency key {event.idempotency_key!r})"
    return text


def _cancelled(event: JobCancelled, before: JobState | None, _: JobState) -> str:
    text = f"cancelled by {event.source}"
    if before is not None and before.status in ACTIVE_STATUSES:
        text += f" while token {before.token} was {before.status}"
    elif before is not None:
        text += f" while {before.status}"
    return text + (f": {_short(event.reason)}" if event.reason else "")


def _requeued(event: JobRequeued, before: JobState | None, after: JobState) -> str:
    was = f" from {before.status}" if before is not None else ""
    if event.rewait:
        left = len(after.after) - len(after.resolutions)
        text = f"requeued{was} by {event.source} to wait again on {left} of its parents"
        return text + (f": {_short(event.reason)}" if event.reason else "")
    again = " to run again (rerun)" if event.rerun and was == " from succeeded" else ""
    text = f"requeued{was} by {event.source}{again} with a fresh attempt budget"
    if after.run_at > after.updated_at:
        text += f", due in {span(after.run_at - after.updated_at)}"
    return text + (f": {_short(event.reason)}" if event.reason else "")


def _leased(event: JobLeased, _: JobState | None, __: JobState) -> str:
    return (
        f"{event.source} leased attempt {event.attempt} as token {event.token}; "
        f"a worker must start within {span(event.lease_ms)}"
    )


def _started(event: AttemptStarted, _: JobState | None, after: JobState) -> str:
    return (
        f"attempt {after.attempt} started on {event.source} (token {event.token}), "
        f"run lease {span(event.lease_ms)}"
    )


def _renewed(event: LeaseRenewed, _: JobState | None, __: JobState) -> str:
    extended = span(event.lease_ms)
    return f"heartbeat from {event.source}: token {event.token}'s lease extended by {extended}"


def _checkpointed(event: AttemptCheckpointed, _: JobState | None, __: JobState) -> str:
    size = len(event.checkpoint)
    return f"{event.source} saved a checkpoint under token {event.token} ({size} bytes)"


def _succeeded(event: AttemptSucceeded, _: JobState | None, after: JobState) -> str:
    text = f"attempt {after.attempt} succeeded on {event.source} (token {event.token})"
    count = len(event.effects)
    if count:
        text += f"; {count} effect{'s' if count > 1 else ''} committed"
    return text


def _failed(event: AttemptFailed, _: JobState | None, after: JobState) -> str:
    attempt = after.attempt
    error = _short(f"{event.error_type}: {event.message}")
    kind = "" if event.retryable else "permanent "
    category = f" [{event.category}]" if event.category is not None else ""
    traced = "; traceback kept" if event.traceback else ""
    return (
        f"attempt {attempt} failed on {event.source} with {kind}{error}{category}{traced}; "
        f"{_next(after)}"
    )


def _snoozed(event: AttemptSnoozed, before: JobState | None, after: JobState) -> str:
    why = f" ({_short(event.reason)})" if event.reason else ""
    if after.snoozed_until is None:
        used = before.snoozes if before is not None else after.snoozes
        return (
            f"{event.source} snoozed again{why}, past the task's cap of {event.max_snoozes} "
            f"(snoozed {used} times): counted as a failed attempt; {_next(after)}"
        )
    return (
        f"{event.source} snoozed the job for {span(event.delay_ms)}{why}: due again, "
        f"attempt {after.attempt + 1} not spent (snooze {after.snoozes} of {event.max_snoozes})"
    )


def _expired(event: LeaseExpired, before: JobState | None, after: JobState) -> str:
    if before is not None and before.status is Status.LEASED:
        why = "no worker started it"
    else:
        worker = before.worker_id if before is not None else None
        why = f"no heartbeat from {worker}" if worker else "the worker went silent"
    return f"token {event.token}'s lease expired ({why}), noted by {event.source}; {_next(after)}"


def _registered(event: ChildRegistered, before: JobState | None, _: JobState) -> str:
    text = f"job {event.child_id} now waits on this job (registered by {event.source})"
    if before is not None and before.status in TERMINAL_STATUSES:
        return f"{text}; already {before.status}: answered at once"
    return text


def _resolved(event: ParentResolved, before: JobState | None, after: JobState) -> str:
    """Which parent's end, logged where, moved the child: the audit of a release."""
    at = f"p{event.parent_partition}@{event.parent_offset}"
    text = f"parent {event.parent_id} {event.outcome} (its record at {at}, sent by {event.source})"
    waited = before is not None and before.status is Status.WAITING
    match after.status:
        case Status.SCHEDULED if waited:
            return f"{text}: released by it, rule {after.after_rule} met"
        case Status.WAITING:
            return f"{text}: waiting on {len(after.after) - len(after.resolutions)} more"
        case Status.CANCELLED if waited:
            return f"{text}: cancelled, rule {after.after_rule} can no longer be met"
        case _:
            return f"{text}: recorded"


def _next(after: JobState) -> str:
    """What became of the job after a failed or expired attempt."""
    if after.status is Status.SCHEDULED:
        return (
            f"retry in {span(after.run_at - after.updated_at)} "
            f"(attempt {after.attempt + 1} of {after.max_attempts})"
        )
    if after.last_error is not None and not after.last_error.retryable:
        return "dead: the error is permanent"
    return f"dead: all {after.max_attempts} attempts used"


_APPLIED: dict[type[Any], Callable[[Any, JobState | None, JobState], str]] = {
    JobEnqueued: _enqueued,
    JobCancelled: _cancelled,
    JobRequeued: _requeued,
    JobLeased: _leased,
    AttemptStarted: _started,
    LeaseRenewed: _renewed,
    AttemptCheckpointed: _checkpointed,
    AttemptSucceeded: _succeeded,
    AttemptFailed: _failed,
    AttemptSnoozed: _snoozed,
    LeaseExpired: _expired,
    ChildRegistered: _registered,
    ParentResolved: _resolved,
}


def _duplicate(entry: TimelineEntry, event: JobEvent) -> str:
    if isinstance(event, JobEnqueued):
        key = f" (idempotency key {event.idempotency_key!r})" if event.idempotency_key else ""
        return f"enqueue from {event.source} repeated with the same body{key}: ignored"
    return f"{_who(entry)} repeats an event already applied (a producer retry): ignored"


def _conflict(event: JobEnqueued) -> str:
    if event.idempotency_key is not None:
        taken = f"idempotency key {event.idempotency_key!r} on queue {event.queue}"
    else:
        taken = f"job id {event.job_id}"
    return (
        f"enqueue from {event.source} refused: {taken} was first used with a different body; "
        "the first enqueue stands"
    )


def _stale(entry: TimelineEntry, before: JobState) -> str:
    token = entry.token
    if token is not None and token != before.token:
        return f"{_who(entry)} rejected: token {token} is stale, current is {before.token}"
    return f"{_who(entry)} rejected: token {token}'s attempt has already ended"


def _refusal(entry: TimelineEntry, event: JobEvent, before: JobState) -> str:
    """Why a transition was refused, from the state it met; the fold's reason as a fallback."""
    match event:
        case JobPurged() | ChildRegistered() | ParentResolved() | JobRequeued(rewait=True):
            # The fold names the run, the status, the limit, the parent or the rule.
            return entry.reason
        case JobCancelled() | JobRequeued() if before.status in TERMINAL_STATUSES:
            return f"job is already {before.status}"
        case JobRequeued():
            return f"job is {before.status}; only dead or cancelled jobs can be requeued"
        case JobLeased():
            return _lease_refusal(entry, event, before)
        case LeaseExpired() if before.lease_until is not None:
            left = span(before.lease_until - entry.log_at)
            return f"token {event.token}'s lease runs {left} longer"
        case _:
            return _attempt_refusal(entry, event, before)


def _attempt_refusal(entry: TimelineEntry, event: JobEvent, before: JobState) -> str:
    """Why a worker's event with the current token was refused."""
    if isinstance(event, AttemptStarted) and before.status is Status.RUNNING:
        return f"token {event.token} already started on {before.worker_id}"
    if before.status in TERMINAL_STATUSES:
        return f"job is already {before.status}"
    if before.status is Status.LEASED:
        return f"token {before.token} has not started yet"
    return entry.reason


def _lease_refusal(entry: TimelineEntry, event: JobLeased, before: JobState) -> str:
    if before.status is not Status.SCHEDULED:
        return f"job is {before.status} (a late or duplicate proposal)"
    if event.token != before.token + 1:
        return f"it proposes token {event.token}, the next is {before.token + 1}"
    if entry.log_at < before.run_at:
        return f"the job is not due for another {span(before.run_at - entry.log_at)}"
    if event.attempt != before.attempt + 1:
        return f"it proposes attempt {event.attempt}, the next is {before.attempt + 1}"
    return entry.reason


# --- schedules --------------------------------------------------------------------------------


def schedule_reading(
    entry: TimelineEntry,
    event: ScheduleEvent,
    before: ScheduleState | None,
    after: ScheduleState | None,
) -> str:
    """What a schedule event did, as the audit of a schedule id shows it."""
    applied = entry.verdict is Verdict.APPLIED and after is not None
    match event:
        case ScheduleUpserted() if applied and after is not None:
            verb = "created" if before is None or before.deleted else "replaced"
            return (
                f"schedule {verb} by {event.source}: {event.cron!r} ({event.timezone}) enqueues "
                f"{event.template.task} on {event.template.queue}; next slot "
                f"{iso(after.next_fire_at)}"
            )
        case ScheduleDeleted() if applied:
            return f"schedule deleted by {event.source}"
        case ScheduleFired() if applied and (event.decision or event.run_at or _overlaps(after)):
            # A cron policy's decision (core.schedule.policy): the fold's own reading names it.
            return f"{event.source} at slot {iso(event.fire_at)}: {entry.reason}"
        case ScheduleFired() if applied:
            return f"{event.source} fired slot {iso(event.fire_at)} as job {event.job_id}"
        case ScheduleFired() if entry.verdict is Verdict.DUPLICATE:
            return f"{event.source} fired slot {iso(event.fire_at)} again: already fired, ignored"
        case _:
            kept = _SCHEDULE_KEPT if before is None else ""
            return f"{_who(entry)} {entry.verdict}: {entry.reason}{kept}"


def _overlaps(state: ScheduleState | None) -> bool:
    return state is not None and state.overlap is not None


# --- controls ---------------------------------------------------------------------------------


def permit_reading(entry: TimelineEntry) -> str:
    """What a queue limit or a permit step did (its verdict's reason says it all)."""
    if entry.verdict is Verdict.APPLIED:
        return entry.reason
    return f"{_who(entry)} {entry.verdict}: {entry.reason}"


def control_reading(entry: TimelineEntry, event: ControlEvent, *, held: bool = True) -> str:
    """What a pause or resume did, as the audit of a queue or schedule shows it; ``held`` is
    False for a schedule the index did not hold (its rejected entry expires)."""
    if entry.verdict is not Verdict.APPLIED:
        kept = "" if held or isinstance(event, QueuePaused | QueueResumed) else _SCHEDULE_KEPT
        return f"{_who(entry)} {entry.verdict}: {entry.reason}{kept}"
    why = f": {_short(event.reason)}" if event.reason else ""
    if isinstance(event, QueuePaused):
        return f"queue paused by {event.source}: no new leases, running jobs finish{why}"
    if isinstance(event, SchedulePaused):
        return f"schedule paused by {event.source}: no slot fires until it is resumed{why}"
    if isinstance(event, ScheduleResumed):
        return (
            f"schedule resumed by {event.source}: of the slots missed while paused, the newest "
            f"fires, or each one within its catch-up window{why}"
        )
    return f"queue resumed by {event.source}: its due jobs are leased again{why}"
