"""Projected job and schedule state, the fold's verdicts, and timeline entries for observers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from evsched.core.events import JobTemplate, RetryPolicy, TraceContext


class Status(enum.StrEnum):
    SCHEDULED = "scheduled"
    LEASED = "leased"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    WAITING = "waiting"  # on its parents (core.workflow.waits); last, as in the Avro enum


TERMINAL_STATUSES = frozenset({Status.SUCCEEDED, Status.DEAD, Status.CANCELLED})
ACTIVE_STATUSES = frozenset({Status.LEASED, Status.RUNNING})


class Verdict(enum.StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    STALE = "stale"
    REJECTED = "rejected"
    UNDECODABLE = "undecodable"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobError:
    """A failed attempt's error; ``category`` and ``traceback`` are None when not reported
    (see ``core.failures.category_of`` for the category such a failure counts under)."""

    error_type: str
    message: str
    retryable: bool
    category: str | None = None
    traceback: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    """How one parent of a waiting job ended, and the record whose fold said so."""

    parent_id: str
    outcome: str
    partition: int
    offset: int
    result: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    """Everything the scheduler, workers and readers need to know about one job.

    ``attempt`` counts attempts since the job was (re)queued; ``token`` only ever grows.
    ``lease_until`` is set while leased or running; ``run_at`` is when a scheduled job is due.
    """

    job_id: str
    status: Status
    task: str
    queue: str
    args: bytes
    priority: int
    run_at: int
    max_attempts: int
    retry: RetryPolicy
    timeout_ms: int
    enqueued_at: int
    updated_at: int
    partition: int
    attempt: int = 0
    token: int = 0
    lease_until: int | None = None
    worker_id: str | None = None
    idempotency_key: str | None = None
    body_digest: bytes = b""
    labels: dict[str, str] = field(default_factory=dict)
    schedule_id: str | None = None
    fire_at: int | None = None
    checkpoint: bytes | None = None
    result: bytes | None = None
    last_error: JobError | None = None
    trace: TraceContext | None = None
    recent_event_ids: tuple[str, ...] = ()
    # Retention (core.retention): the run of this id, where its history starts on the log, and
    # the windows its enqueue asked for (None: the defaults).
    generation: int = 0
    first_offset: int = 0
    retention_ms: int | None = None
    key_window_ms: int | None = None
    # Uniqueness (core.unique): the scope, its period, and the run_at of an enqueue held until
    # this run ends.
    unique: str | None = None
    unique_period_ms: int | None = None
    unique_held_at: int | None = None
    # Workflows (core.workflow.waits): the parents this job waits on, its rule, where their results
    # go, how each resolved so far; and the children waiting on this job.
    after: tuple[str, ...] = ()
    after_rule: str = "all_succeeded"
    results_to_args: str = "none"
    resolutions: tuple[Resolution, ...] = ()
    children: tuple[str, ...] = ()
    # Snoozes (fold version 10): how often the handler snoozed this run since its (re)queue, and
    # when a snoozed job is due again (None once it is leased or moved otherwise).
    snoozes: int = 0
    snoozed_until: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleState:
    """A cron schedule; ``next_fire_at`` is None once deleted or when no slot is left."""

    schedule_id: str
    cron: str
    timezone: str
    template: JobTemplate
    created_at: int
    updated_at: int
    next_fire_at: int | None
    last_fire_at: int | None = None
    last_job_id: str | None = None
    deleted: bool = False
    recent_event_ids: tuple[str, ...] = ()
    # Cron policies (core.schedule.policy), from the upsert.
    catchup_window_ms: int | None = None
    max_jitter_ms: int | None = None
    overlap: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineEntry:
    """One event of an entity's history as the fold judged it.

    ``reason`` is a one-line human reading of the verdict, for audits.
    """

    partition: int
    offset: int
    log_at: int
    kind: str
    event_id: str
    source: str
    verdict: Verdict
    reason: str
    token: int | None = None
    status_after: Status | None = None


@dataclass(frozen=True, slots=True)
class FoldedEvent:
    """One record as the fold judged it, for observers such as metrics.

    ``before``/``after`` are the job's states around the event (equal unless it applied); both are
    None for schedule events and undecodable bytes.
    """

    entry: TimelineEntry
    before: JobState | None = None
    after: JobState | None = None

    @property
    def purged(self) -> JobState | None:
        """The job's last state when this event purged it from the index, else None."""
        if self.entry.verdict is Verdict.APPLIED and self.after is None:
            return self.before
        return None
