"""The event types of evsched's log: past-tense facts, one frozen dataclass per kind.

Times are integers in epoch milliseconds (UTC) everywhere; durations carry their unit in the name.
These are the *current* shapes; older writer schemas are upcast by the Avro adapter before the core
ever sees them. Each kind declares, once, its family (the fold that judges it) and its timeline
(the entity whose timeline keeps it): every router reads those, see core.routing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Literal, TypeAlias, assert_never, get_args


class EventFamily(Enum):
    """The fold that judges an event; a family's kinds are the members of its union below."""

    JOB = "job"  # JobEvent: the job fold (core.fold)
    SCHEDULE = "schedule"  # ScheduleEvent: the schedule fold (core.schedule.fold)
    CONTROL = "control"  # ControlEvent: pauses and resumes (core.controls)
    LIMIT = "limit"  # LimitEvent: a limit's settings and permit steps at its home (core.permits)
    PERMIT = "permit"  # PermitEvent: a job's permit asked for and granted (core.permits)


class EventTimeline(Enum):
    """Whose timeline keeps an event: the kind of entity ``entity_id`` names (the index keys each
    under a family byte of its own, adapters.index.keys)."""

    JOB = "job"
    SCHEDULE = "schedule"
    QUEUE = "queue"  # a queue's (or a concurrency key's) pauses and limit settings
    # A limit's permit steps: apart from its settings, which time travel and ``--wait`` read whole.
    PERMIT = "permit"


class Role(Enum):
    """Who states facts on the log (core.roles says which kinds each may state)."""

    PRODUCER = "producer"  # services, the API, the command line: they ask for work
    NODE = "node"  # evsched nodes: they decide (leases, expiries, fires, purges, permits)
    WORKER = "worker"  # evsched workers: they report the attempts they were leased
    OPERATOR = "operator"  # the command line's administration (pauses, limits, backfills)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceContext:
    """W3C trace context carried from enqueue to the worker."""

    traceparent: str
    tracestate: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff: ``initial_backoff_ms * multiplier**(attempt-1)``, capped, with jitter.

    ``jitter`` is the fraction (0..1) of the delay that is randomised, deterministically from
    (job id, attempt).
    """

    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 300_000
    multiplier: float = 2.0
    jitter: float = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """A side effect recorded by a handler; published only with an accepted success."""

    kind: str
    payload: bytes
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Position:
    """Where an event sits in the log; ``log_at`` is the broker's LogAppendTime in epoch ms.

    ``proven`` is the role the record's proof proves (None: no proof, or one that does not
    verify), and ``proofs_required`` whether its partition requires proofs of node and worker
    facts at that offset (core.roles): both read by the process that folds from the record's
    headers and its partition's history, like ``log_at`` from the broker.
    """

    partition: int
    offset: int
    log_at: int
    proven: Role | None = None
    proofs_required: bool = False


# --- job events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEnqueued:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    task: str
    queue: str
    args: bytes
    run_at: int | None = None
    priority: int = 0
    max_attempts: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_ms: int = 300_000
    idempotency_key: str | None = None
    body_digest: bytes | None = None
    labels: dict[str, str] = field(default_factory=dict)
    schedule_id: str | None = None
    fire_at: int | None = None
    trace: TraceContext | None = None
    # None: the fold's defaults (core.retention); see docs/job-lifecycle.md, "Retention".
    retention_ms: int | None = None
    key_window_ms: int | None = None
    # Fold version 4: a uniqueness scope ("queued", "active" or "period", see core.unique).
    unique: str | None = None
    unique_period_ms: int | None = None
    # Added in fold version 4 (core.workflow.waits): the parents this job waits on, the rule that
    # releases it, and where their results go in its args ("none", "append" or "list").
    after: tuple[str, ...] = ()
    after_rule: str = "all_succeeded"
    results_to_args: str = "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCancelled:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLeased:
    """A node grants ``token`` for ``attempt``; the worker must start within ``lease_ms``.

    A pre-lease (``not_before`` set to the job's ``run_at``) is granted a short horizon ahead of
    it: the worker holds the dispatch and starts at ``run_at``, and ``lease_ms`` counts from then.
    """

    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    attempt: int
    lease_ms: int
    trace: TraceContext | None = None
    not_before: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStarted:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    worker_id: str
    lease_ms: int
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRenewed:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    lease_ms: int
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptCheckpointed:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    checkpoint: bytes
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSucceeded:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    result: bytes
    effects: tuple[Effect, ...] = ()
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailed:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    error_type: str
    message: str
    retryable: bool = True
    trace: TraceContext | None = None
    # Added in fold version 3: the failure's category and its (bounded) traceback.
    category: str | None = None
    traceback: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSnoozed:
    """The handler asked to run again in ``delay_ms`` (fold version 10): the job goes back to
    scheduled at log time + ``delay_ms`` without spending its attempt, unless the job has been
    snoozed ``max_snoozes`` times already (the task's cap), when it counts as a failure."""

    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    delay_ms: int
    max_snoozes: int
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseExpired:
    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    token: int
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequeued:
    """A dead or cancelled job goes back to scheduled with a fresh attempt budget.

    With ``rerun`` (fold version 3) a succeeded job may go back too, to run again; with
    ``rewait`` (fold version 5) a workflow's child goes back to waiting on its parents.
    """

    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    reason: str = ""
    run_at: int | None = None
    trace: TraceContext | None = None
    rerun: bool = False
    # Fold version 5 (core.workflow.ops): a workflow's dead or cancelled child waits again on
    # the parents whose resolution was a failure, instead of being scheduled.
    rewait: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPurged:
    """A node removes run ``generation`` of a terminal job whose retention ran out in log time."""

    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    generation: int
    trace: TraceContext | None = None


# --- workflow events (core.workflow.waits) -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRegistered:
    """Job ``child_id`` waits on this job (``job_id``, the key): written with the child's enqueue.

    The parent's node answers with a ParentResolved once the parent ends (at once if it has).
    """

    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    child_id: str
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ParentResolved:
    """Parent ``parent_id`` of job ``job_id`` (the key) ended with ``outcome``.

    Written by the parent's node in the transaction of its fold of the parent's accepted end;
    ``parent_partition``/``parent_offset`` is the record whose fold released it.
    """

    family: ClassVar[Literal[EventFamily.JOB]] = EventFamily.JOB
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    parent_id: str
    outcome: str
    parent_partition: int
    parent_offset: int
    result: bytes | None = None
    trace: TraceContext | None = None


# --- schedule events (key = schedule id) ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTemplate:
    """What a cron schedule enqueues at each fire."""

    task: str
    queue: str
    args: bytes
    priority: int = 0
    max_attempts: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_ms: int = 300_000
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleUpserted:
    family: ClassVar[Literal[EventFamily.SCHEDULE]] = EventFamily.SCHEDULE
    timeline: ClassVar[Literal[EventTimeline.SCHEDULE]] = EventTimeline.SCHEDULE

    event_id: str
    schedule_id: str
    emitted_at: int
    source: str
    cron: str
    timezone: str
    template: JobTemplate
    trace: TraceContext | None = None
    # Fold version 4 (core.schedule.policy): None keeps the original rules.
    catchup_window_ms: int | None = None
    max_jitter_ms: int | None = None
    overlap: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleDeleted:
    family: ClassVar[Literal[EventFamily.SCHEDULE]] = EventFamily.SCHEDULE
    timeline: ClassVar[Literal[EventTimeline.SCHEDULE]] = EventTimeline.SCHEDULE

    event_id: str
    schedule_id: str
    emitted_at: int
    source: str
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleFired:
    """A node fired the slot ``fire_at``; written in one transaction with the job's JobEnqueued."""

    family: ClassVar[Literal[EventFamily.SCHEDULE]] = EventFamily.SCHEDULE
    timeline: ClassVar[Literal[EventTimeline.SCHEDULE]] = EventTimeline.SCHEDULE

    event_id: str
    schedule_id: str
    emitted_at: int
    source: str
    fire_at: int
    job_id: str
    trace: TraceContext | None = None
    # Fold version 4 (core.schedule.policy): None for an ordinary fire, else caught_up, missed (no
    # job) or backfilled; and the job's jittered run_at (None: the slot).
    decision: str | None = None
    run_at: int | None = None


# --- controls: pause and resume (key = queue name, or schedule id) ----------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePaused:
    """No new leases on ``queue``; written to every events partition, each owner keeps it."""

    family: ClassVar[Literal[EventFamily.CONTROL]] = EventFamily.CONTROL
    timeline: ClassVar[Literal[EventTimeline.QUEUE]] = EventTimeline.QUEUE

    event_id: str
    queue: str
    emitted_at: int
    source: str
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueResumed:
    family: ClassVar[Literal[EventFamily.CONTROL]] = EventFamily.CONTROL
    timeline: ClassVar[Literal[EventTimeline.QUEUE]] = EventTimeline.QUEUE

    event_id: str
    queue: str
    emitted_at: int
    source: str
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulePaused:
    """No slot of the schedule fires while it is paused."""

    family: ClassVar[Literal[EventFamily.CONTROL]] = EventFamily.CONTROL
    timeline: ClassVar[Literal[EventTimeline.SCHEDULE]] = EventTimeline.SCHEDULE

    event_id: str
    schedule_id: str
    emitted_at: int
    source: str
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleResumed:
    """Slots fire again. Of those missed while paused, the newest fires; with a catch-up window,
    each one within the window fires, oldest first, and older ones are skipped."""

    family: ClassVar[Literal[EventFamily.CONTROL]] = EventFamily.CONTROL
    timeline: ClassVar[Literal[EventTimeline.SCHEDULE]] = EventTimeline.SCHEDULE

    event_id: str
    schedule_id: str
    emitted_at: int
    source: str
    reason: str = ""
    trace: TraceContext | None = None


# --- limits: concurrency and rate permits (key = the limit's name, see core.permits) ----------


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLimitSet:
    """The queue's global limits (None: none); written to every events partition, home first.

    ``max_running``: at most this many of the queue's jobs hold a lease at once, over all
    partitions. ``rate_starts`` per ``rate_per_ms``: at most that many permits granted in any
    such window (of log time). The partition of the queue's name is its home: it grants permits.
    """

    family: ClassVar[Literal[EventFamily.LIMIT]] = EventFamily.LIMIT
    timeline: ClassVar[Literal[EventTimeline.QUEUE]] = EventTimeline.QUEUE

    event_id: str
    queue: str
    emitted_at: int
    source: str
    max_running: int | None = None
    rate_starts: int | None = None
    rate_per_ms: int | None = None
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyLimitSet:
    """A concurrency key's global limits, as ``QueueLimitSet`` for a queue: they hold for every
    job whose ``concurrency_key`` is ``key``, whatever its queue; home: the key's partition."""

    family: ClassVar[Literal[EventFamily.LIMIT]] = EventFamily.LIMIT
    timeline: ClassVar[Literal[EventTimeline.QUEUE]] = EventTimeline.QUEUE

    event_id: str
    key: str
    emitted_at: int
    source: str
    max_running: int | None = None
    rate_starts: int | None = None
    rate_per_ms: int | None = None
    reason: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PermitRequested:
    """A node proposes that a due job asks a limit's home for a permit: the limit of its queue,
    or of its concurrency key when ``key`` is set."""

    family: ClassVar[Literal[EventFamily.PERMIT]] = EventFamily.PERMIT
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    queue: str
    key: str | None = None
    priority: int = 0
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PermitGranted:
    """A limit's home granted the job a permit: once it holds all it needs, it may be leased."""

    family: ClassVar[Literal[EventFamily.PERMIT]] = EventFamily.PERMIT
    timeline: ClassVar[Literal[EventTimeline.JOB]] = EventTimeline.JOB

    event_id: str
    job_id: str
    emitted_at: int
    source: str
    queue: str
    key: str | None = None
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePermit:
    """A permit's step on a limit's home partition: ``action`` request, grant or release; the
    limit is the queue's, or the concurrency key's when ``key`` is set."""

    family: ClassVar[Literal[EventFamily.LIMIT]] = EventFamily.LIMIT
    timeline: ClassVar[Literal[EventTimeline.PERMIT]] = EventTimeline.PERMIT

    event_id: str
    queue: str
    job_id: str
    action: str
    emitted_at: int
    source: str
    key: str | None = None
    priority: int = 0
    trace: TraceContext | None = None


JobEvent: TypeAlias = (
    JobEnqueued
    | JobCancelled
    | JobLeased
    | AttemptStarted
    | LeaseRenewed
    | AttemptCheckpointed
    | AttemptSucceeded
    | AttemptFailed
    | AttemptSnoozed
    | LeaseExpired
    | JobRequeued
    | JobPurged
    | ChildRegistered
    | ParentResolved
)
ScheduleEvent: TypeAlias = ScheduleUpserted | ScheduleDeleted | ScheduleFired
ControlEvent: TypeAlias = QueuePaused | QueueResumed | SchedulePaused | ScheduleResumed
LimitEvent: TypeAlias = QueueLimitSet | KeyLimitSet | QueuePermit
PermitEvent: TypeAlias = PermitRequested | PermitGranted
Event: TypeAlias = JobEvent | ScheduleEvent | ControlEvent | LimitEvent | PermitEvent

# Drawn from the unions, in their order: a kind added to its family's union is in every table.
JOB_EVENT_TYPES: tuple[type[JobEvent], ...] = get_args(JobEvent)
SCHEDULE_EVENT_TYPES: tuple[type[ScheduleEvent], ...] = get_args(ScheduleEvent)
CONTROL_EVENT_TYPES: tuple[type[ControlEvent], ...] = get_args(ControlEvent)
LIMIT_EVENT_TYPES: tuple[type[LimitEvent], ...] = get_args(LimitEvent)
PERMIT_EVENT_TYPES: tuple[type[PermitEvent], ...] = get_args(PermitEvent)
EVENT_TYPES: tuple[type[Event], ...] = get_args(Event)


# A concurrency key's limit is named (and its events keyed) ``key:<key>``; no queue has a colon.
KEY_PREFIX = "key:"


def entity_id(event: Event) -> str:
    """The key an event is partitioned and indexed by: the job id, schedule id or queue name."""
    match event.timeline:
        case EventTimeline.JOB:
            return event.job_id
        case EventTimeline.SCHEDULE:
            return event.schedule_id
        case EventTimeline.QUEUE | EventTimeline.PERMIT:
            return _limit_id(event)
        case _:
            assert_never(event.timeline)


def _limit_id(event: QueuePaused | QueueResumed | LimitEvent) -> str:
    """A queue's name, or ``key:<key>`` for a concurrency key's limit and its permit steps."""
    if isinstance(event, KeyLimitSet):
        return KEY_PREFIX + event.key
    if isinstance(event, QueuePermit) and event.key is not None:
        return KEY_PREFIX + event.key
    return event.queue
