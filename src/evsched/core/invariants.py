"""Replays a recorded history through the fold and checks invariants I1, I6 and I7 on the way.

A history is a sequence of ``(event, position)`` pairs in log order, job and schedule events mixed,
from one or many partitions. ``replay`` folds it per entity (job id or schedule id) into final
states and timelines and lists every ``Violation``. The checker keeps its own account of each
job's ``run_at``, lease token and successes, built only from applied events, instead of trusting
the fold's guards: a fold that wrongly applied an early lease or a reused token is caught. Tests
can pass a deliberately broken fold (``fold_job``) to prove it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from typing import assert_never

from evsched.core import retry
from evsched.core.controls import (
    QUEUE,
    SCHEDULE,
    ControlState,
    fold_control,
    fold_job,
    fold_schedule_guarded,
    target_exists,
    target_of,
)
from evsched.core.events import (
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ControlEvent,
    Event,
    EventFamily,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    LeaseExpired,
    LimitEvent,
    PermitEvent,
    Position,
    RetryPolicy,
    ScheduleEvent,
)
from evsched.core.fold import fold
from evsched.core.permits import (
    LimitState,
    fold_limit,
    fold_permit,
    guard_job,
    limit_name,
    limit_names,
)
from evsched.core.state import JobState, ScheduleState, Status, TimelineEntry, Verdict
from evsched.core.workflow.invariants import RELEASED_ONCE_BY_AN_ACCEPTED_END, Releases

History = Iterable[tuple[Event, Position]]
JobFold = Callable[[JobState | None, JobEvent, Position], tuple[JobState | None, TimelineEntry]]

# I8, every child released at most once per parent and only by an accepted end, is checked by
# core.workflow.invariants at the end of ``feed_all``.
NO_DOUBLE_SUCCESS = "I1"
NO_EARLY_START = "I6"
TOKENS_INCREASE = "I7"


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One breach of an invariant, located by job and log position."""

    invariant: str
    job_id: str
    offset: int
    partition: int
    detail: str


@dataclass(slots=True)
class _Account:
    """What the checker knows about one job from applied events alone."""

    run_at: int | None = None
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    attempt: int = 0
    token: int | None = None
    started: bool = False
    successes: int = 0


@dataclass(slots=True)
class Replay:
    """Final states, timelines and violations of a history fed to it in log order."""

    fold_job: JobFold = fold
    jobs: dict[str, JobState] = field(default_factory=dict)
    schedules: dict[str, ScheduleState] = field(default_factory=dict)
    job_timelines: dict[str, list[TimelineEntry]] = field(default_factory=dict)
    schedule_timelines: dict[str, list[TimelineEntry]] = field(default_factory=dict)
    # Pause switches by (partition, target, name): a queue's are folded on every partition.
    controls: dict[tuple[int, str, str], ControlState] = field(default_factory=dict)
    # Queue limits by (partition, queue): every partition folds its own (core.permits).
    limits: dict[tuple[int, str], LimitState] = field(default_factory=dict)
    # The verdicts of limit events (sets and permit steps at the homes), by (partition, offset).
    limit_verdicts: dict[tuple[int, int], Verdict] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    _accounts: dict[str, _Account] = field(default_factory=dict)
    # The names paused by (partition, target), kept with ``controls`` (every event reads them).
    _paused: dict[tuple[int, str], set[str]] = field(default_factory=dict)
    # I8 (core.workflow.invariants): checked once the whole history is in.
    releases: Releases = field(default_factory=Releases)

    def feed_all(self, history: History) -> Replay:
        for event, position in history:
            self.feed(event, position)
        return self.finish()

    def finish(self) -> Replay:
        """Add the breaches of I8, which need the whole history (call once, after feeding)."""
        self.violations += [
            Violation(
                invariant=RELEASED_ONCE_BY_AN_ACCEPTED_END,
                job_id=b.job_id,
                offset=b.offset,
                partition=b.partition,
                detail=f"ParentResolved: {b.detail}",
            )
            for b in self.releases.breaches()
        ]
        return self

    def feed(self, event: Event, position: Position) -> TimelineEntry:
        """Fold one event into its entity's state, record its timeline entry, check it."""
        match event.family:
            case EventFamily.JOB:
                return self._feed_job(event, position)
            case EventFamily.SCHEDULE:
                return self._feed_schedule(event, position)
            case EventFamily.CONTROL:
                return self._feed_control(event, position)
            case EventFamily.LIMIT:
                return self._feed_limit(event, position)
            case EventFamily.PERMIT:
                return self._feed_permit(event, position)
            case _:
                assert_never(event.family)

    def _feed_job(self, event: JobEvent, position: Position) -> TimelineEntry:
        key = event.job_id
        before = self.jobs.get(key)
        after, entry = fold_job(
            before, event, position, self.paused(position.partition, QUEUE), self.fold_job
        )
        for name in () if before is None else limit_names(before):
            if (limit := self.limits.get((position.partition, name))) is not None:
                after, entry, guarded, _ = guard_job(limit, before, after, event, entry)
                self.limits[position.partition, name] = guarded
        if after is not None:
            self.jobs[key] = after
        self.job_timelines.setdefault(key, []).append(entry)
        self.releases.note(event, position, entry)
        if entry.verdict is Verdict.APPLIED and after is None:
            # A purge: the id is forgotten, so a later enqueue of it is a new job.
            self.jobs.pop(key, None)
            self._accounts.pop(key, None)
        elif entry.verdict is Verdict.APPLIED:
            account = self._accounts.setdefault(key, _Account())
            self.violations.extend(_audit(account, before, event, position, after))
        return entry

    def _feed_schedule(self, event: ScheduleEvent, position: Position) -> TimelineEntry:
        key = event.schedule_id
        paused = key in self.paused(position.partition, SCHEDULE)
        after, entry = fold_schedule_guarded(
            self.schedules.get(key), event, position, paused=paused
        )
        if after is not None:
            self.schedules[key] = after
        self.schedule_timelines.setdefault(key, []).append(entry)
        return entry

    def paused(self, partition: int, target: str) -> Set[str]:
        """The queues (or schedules) paused on ``partition`` as the history stands."""
        return self._paused.get((partition, target), set())

    def _feed_control(self, event: ControlEvent, position: Position) -> TimelineEntry:
        target, name = target_of(event)
        key = (position.partition, target, name)
        exists = target_exists(target, self.schedules.get(name))
        after, entry = fold_control(self.controls.get(key), event, position, exists=exists)
        if after is not None:
            self.controls[key] = after
            paused = self._paused.setdefault((position.partition, target), set())
            (paused.add if after.paused else paused.discard)(name)
        return entry

    def _feed_limit(self, event: LimitEvent, position: Position) -> TimelineEntry:
        key = (position.partition, limit_name(event))
        after, entry, _ = fold_limit(self.limits.get(key), event, position)
        if after is not None:
            self.limits[key] = after
        self.limit_verdicts[position.partition, position.offset] = entry.verdict
        return entry

    def _feed_permit(self, event: PermitEvent, position: Position) -> TimelineEntry:
        key = event.job_id
        job = self.jobs.get(key)
        limit_key = (position.partition, limit_name(event))
        after, entry, _ = fold_permit(self.limits.get(limit_key), job, event, position)
        if after is not None:
            self.limits[limit_key] = after
        self.job_timelines.setdefault(key, []).append(entry)
        return entry


def replay(history: History, *, fold_job: JobFold = fold) -> Replay:
    """Fold a whole history; the result holds final states, timelines and violations."""
    return Replay(fold_job=fold_job).feed_all(history)


def check_history(history: History, *, fold_job: JobFold = fold) -> list[Violation]:
    """Every violation of I1, I6 and I7 in ``history``, in log order."""
    return replay(history, fold_job=fold_job).violations


def _audit(
    account: _Account,
    before: JobState | None,
    event: JobEvent,
    position: Position,
    after: JobState | None,
) -> list[Violation]:
    """Check one applied event against the account, then update the account with it."""
    found = _audit_event(account, event, position, after)
    if before is not None and after is not None and after.generation > before.generation:
        # A new run of the id (a unique job's held enqueue starts when its run ends): it may
        # run and succeed once more; its token goes on growing.
        account.run_at, account.policy, account.successes = after.run_at, after.retry, 0
        account.started = False
    return found


def _audit_event(
    account: _Account, event: JobEvent, position: Position, after: JobState | None
) -> list[Violation]:
    found: list[Violation] = []
    match event:
        case JobEnqueued() if after is not None and after.unique_held_at is not None:
            pass  # held for the next run: the running one is still this account's
        case JobEnqueued() | JobRequeued():
            _queued(account, event, position)
        case JobLeased():
            found += _leased(account, event, position)
        case AttemptStarted():
            found += _early(account, event, position)
            account.started = True
        case LeaseExpired() if not account.started:
            # A lease nobody started costs no attempt and no backoff: due again at once.
            account.run_at = position.log_at
            account.attempt -= 1
        case AttemptSucceeded():
            account.successes += 1
            if account.successes > 1:
                found.append(_violation(NO_DOUBLE_SUCCESS, event, position, _twice(account)))
        case AttemptFailed() | AttemptSnoozed() | LeaseExpired():
            _ended(account, event, position, after)
        case _:
            pass
    return found


def _ended(
    account: _Account,
    event: AttemptFailed | AttemptSnoozed | LeaseExpired,
    position: Position,
    after: JobState | None,
) -> None:
    """The account after an attempt's end: due after its backoff, or its snooze's delay."""
    if after is None or after.status is not Status.SCHEDULED:
        return
    if isinstance(event, AttemptSnoozed) and after.snoozed_until is not None:
        # A snooze within the task's cap gives the attempt back: due at its delay, no backoff.
        account.run_at = position.log_at + event.delay_ms
        account.attempt -= 1
        return
    delay = retry.backoff_ms(account.policy, event.job_id, account.attempt)
    account.run_at = position.log_at + delay


def _leased(account: _Account, event: JobLeased, position: Position) -> list[Violation]:
    # A pre-lease may come before run_at by design; its start may not (AttemptStarted's check).
    found = [] if event.not_before is not None else _early(account, event, position)
    found += _token_reused(account, event, position)
    account.token = event.token
    account.attempt = event.attempt
    account.started = False
    return found


def _queued(account: _Account, event: JobEnqueued | JobRequeued, position: Position) -> None:
    account.run_at = position.log_at if event.run_at is None else event.run_at
    if isinstance(event, JobEnqueued):
        # A new run of a keyed id (after its key window) may succeed once more.
        account.policy, account.successes = event.retry, 0
    elif event.rerun:
        account.successes = 0  # an explicit rerun is a new run: it may succeed again


def _twice(account: _Account) -> str:
    return f"applied success number {account.successes} of the job"


def _early(
    account: _Account, event: JobLeased | AttemptStarted, position: Position
) -> list[Violation]:
    if account.run_at is None:
        why = "no enqueue of the job was applied before it"
        return [_violation(NO_EARLY_START, event, position, why)]
    if position.log_at < account.run_at:
        why = f"log time {position.log_at} is before run_at {account.run_at}"
        return [_violation(NO_EARLY_START, event, position, why)]
    return []


def _token_reused(account: _Account, event: JobLeased, position: Position) -> list[Violation]:
    if account.token is not None and event.token <= account.token:
        why = f"lease token {event.token} does not exceed previous token {account.token}"
        return [_violation(TOKENS_INCREASE, event, position, why)]
    return []


def _violation(invariant: str, event: JobEvent, position: Position, detail: str) -> Violation:
    kind = type(event).__name__
    return Violation(
        invariant=invariant,
        job_id=event.job_id,
        offset=position.offset,
        partition=position.partition,
        detail=f"{kind} {event.event_id}: {detail}",
    )
