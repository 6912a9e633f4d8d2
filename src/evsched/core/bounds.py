"""The documented bounds of ids, names and numbers: what the fold refuses so a node can always act.

The fold applies an event only when a node could carry out every consequence of it: key the job in
the index, create its dispatch topic, grant the next lease, add a lease or a backoff to a log time.
Each check returns None, or a one-line reason naming the field and the bound it breaks. The table
of bounds is in docs/wire-format.md ("Bounds"); a test keeps the two in step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import assert_never

from evsched.core import unique
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    ControlEvent,
    Event,
    EventFamily,
    EventTimeline,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobPurged,
    JobRequeued,
    JobTemplate,
    KeyLimitSet,
    LeaseExpired,
    LeaseRenewed,
    ParentResolved,
    PermitGranted,
    PermitRequested,
    QueueLimitSet,
    QueuePermit,
    RetryPolicy,
    ScheduleDeleted,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.failures import MAX_TRACEBACK_CHARS, category_refusal

# job_id, schedule_id, event_id: UTF-8 bytes. The index keys an id with a 2-byte length.
MAX_ID_BYTES = 1024
MAX_IDEMPOTENCY_KEY_BYTES = 2048
MAX_TASK_BYTES = 2048
# A queue is the last part of the topic `<ns>.dispatch.<queue>`; Kafka allows 249 characters in
# [A-Za-z0-9._-], so a namespace may have at most 249 - len(".dispatch.") - 200 = 39 characters.
MAX_QUEUE_CHARS = 200
MAX_TOPIC_CHARS = 249
MAX_NAMESPACE_CHARS = MAX_TOPIC_CHARS - len(".dispatch.") - MAX_QUEUE_CHARS
QUEUE_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
MAX_LABELS = 64
MAX_LABEL_KEY_BYTES = 256
MAX_LABEL_VALUE_BYTES = 2048
MAX_CRON_BYTES = 256
MAX_TIMEZONE_BYTES = 64

# Instants (run_at, fire_at) in epoch ms: 1970-01-01 to 9999-12-31T23:59:59.999Z, which every
# datetime library can represent.
MAX_TIME_MS = 253_402_300_799_999
# Durations (lease_ms, timeout_ms, backoffs): at most 3,653 days, so an instant plus a duration
# stays far inside a signed 64-bit long (and the index's unsigned 8-byte time keys).
MAX_DURATION_MS = 3653 * 86_400_000
# A ScheduleFired's decisions besides an ordinary fire (core.schedule.policy).
FIRE_DECISIONS = ("caught_up", "missed", "backfilled")
# A schedule's overlap policies (core.schedule.policy); None is "allow".
OVERLAPS = ("allow", "skip", "buffer")
# Tokens: the next lease's `token + 1` must still be exact in a signed 64-bit long and in a
# double (JSON readers in any language); attempts match the API's bound.
MAX_TOKEN = 2**53 - 1
MAX_ATTEMPTS = 2**31 - 1
MAX_PRIORITY = 2**63 - 1
MAX_MULTIPLIER = 1000.0
# How far ahead of a job's run_at a node may lease it (a pre-lease): a worker holds the dispatch
# that long, so the bound keeps a zombie or a foreign producer from parking jobs for hours.
MAX_PRELEASE_MS = 60_000
# A snooze (core.snooze): how far ahead a handler may put its job off, how many snoozes of one
# job a task may allow, and the length of its reason (a timeline line).
MAX_SNOOZE_MS = 30 * 86_400_000
MAX_SNOOZES = 10_000
MAX_SNOOZE_REASON_BYTES = 1024

# Workflows (core.workflow.waits): parents a job may wait on, children a job may have waiting on it
# (both lists live in the job's state), the rules, result placements and parent outcomes.
MAX_PARENTS = 1_000
MAX_CHILDREN = 1_000
# The parents' results a waiting job keeps, in bytes all together (fold version 5). They live in
# its state twice once released (resolutions and args), which must fit one changelog record
# (4 MB) with the job's own args; any one result of a 1 MB event fits. Past it a resolution is
# kept without its result, and a job that was to get the results is cancelled.
MAX_RESULTS_BYTES = 1 << 20
AFTER_RULES = ("all_succeeded", "all_finished", "any_succeeded")
RESULT_PLACEMENTS = ("none", "append", "list")
PARENT_OUTCOMES = ("succeeded", "dead", "cancelled", "unknown", "refused")
# A queue's max_running (QueueLimitSet) and the permit actions on its home (QueuePermit).
MAX_RUNNING = 2**31 - 1
MAX_CONCURRENCY_KEY_BYTES = 200
PERMIT_ACTIONS = ("request", "grant", "release")

# Cron fields that croniter fills at random (R) or from a hash of an id it is not given (H): every
# replica would compute different slots.
_RANDOM_CRON_FIELD = re.compile(r"[HhRr](\(\d+-\d+\))?(/\d+)?")


def refusal(event: Event) -> str | None:
    """Why the fold must refuse ``event`` (a field breaks its documented bound), or None."""
    # ``or`` picks the first reason, as ``_first`` does (a reason is never empty), and checks
    # no further once one is found: this runs once per folded event.
    match event.family:
        case EventFamily.JOB:
            return (
                id_refusal("event_id", event.event_id)
                or id_refusal("job_id", event.job_id)
                or _job_refusal(event)
            )
        case EventFamily.SCHEDULE:
            return _first(id_refusal("event_id", event.event_id), _schedule_refusal(event))
        case EventFamily.CONTROL:
            return _first(id_refusal("event_id", event.event_id), _control_refusal(event))
        case EventFamily.LIMIT | EventFamily.PERMIT:
            return _first(id_refusal("event_id", event.event_id), _permit_refusal(event))
        case _:
            assert_never(event.family)


def _control_refusal(event: ControlEvent) -> str | None:
    if event.timeline is EventTimeline.QUEUE:
        return queue_refusal(event.queue)
    return id_refusal("schedule_id", event.schedule_id)


def _permit_refusal(
    event: QueueLimitSet | KeyLimitSet | QueuePermit | PermitRequested | PermitGranted,
) -> str | None:
    """The bounds of a queue's or a key's limits and of their permits' steps."""
    if isinstance(event, QueueLimitSet | KeyLimitSet):
        name = (
            queue_refusal(event.queue)
            if isinstance(event, QueueLimitSet)
            else _key_refusal(event.key)
        )
        return _first(name, _limit_refusal(event))
    action = None
    if isinstance(event, QueuePermit) and event.action not in PERMIT_ACTIONS:
        action = f"action {_show(event.action)} is not one of {', '.join(PERMIT_ACTIONS)}"
    priority = getattr(event, "priority", 0)
    return _first(
        queue_refusal(event.queue),
        None if event.key is None else _key_refusal(event.key),
        id_refusal("job_id", event.job_id),
        action,
        _bounded("priority", priority, -MAX_PRIORITY, MAX_PRIORITY),
    )


def _key_refusal(key: str) -> str | None:
    if not key:
        return "key must not be empty"
    return _text("key", key, MAX_CONCURRENCY_KEY_BYTES)


def _limit_refusal(event: QueueLimitSet | KeyLimitSet) -> str | None:
    running, starts, per = event.max_running, event.rate_starts, event.rate_per_ms
    if (starts is None) != (per is None):
        return "rate_starts and rate_per_ms go together: give both or neither"
    return _first(
        None if running is None else _bounded("max_running", running, 1, MAX_RUNNING),
        None if starts is None else _bounded("rate_starts", starts, 1, MAX_RUNNING),
        None if per is None else _bounded("rate_per_ms", per, 1, MAX_DURATION_MS),
    )


def _first(*reasons: str | None) -> str | None:
    for reason in reasons:
        if reason is not None:
            return reason
    return None


def _job_refusal(event: JobEvent) -> str | None:
    match event:
        case JobEnqueued():
            return _enqueued_refusal(event)
        case JobLeased():
            return (
                _bounded("token", event.token, 1, MAX_TOKEN)
                or _bounded("attempt", event.attempt, 1, MAX_ATTEMPTS)
                or _bounded("lease_ms", event.lease_ms, 0, MAX_DURATION_MS)
                or _optional_time("not_before", event.not_before)
            )
        case AttemptStarted() | LeaseRenewed():
            return _bounded("token", event.token, 0, MAX_TOKEN) or _bounded(
                "lease_ms", event.lease_ms, 0, MAX_DURATION_MS
            )
        case (
            AttemptCheckpointed()
            | AttemptSucceeded()
            | AttemptFailed()
            | AttemptSnoozed()
            | LeaseExpired()
        ):
            return _bounded("token", event.token, 0, MAX_TOKEN) or _failure_refusal(event)
        case JobRequeued() | JobPurged():
            return _after_end_refusal(event)
        case _:
            return _workflow_event_refusal(event)  # a cancel carries nothing to bound


def _failure_refusal(
    event: AttemptCheckpointed | AttemptSucceeded | AttemptFailed | AttemptSnoozed | LeaseExpired,
) -> str | None:
    if isinstance(event, AttemptSnoozed):
        return _first(
            _bounded("delay_ms", event.delay_ms, 0, MAX_SNOOZE_MS),
            _bounded("max_snoozes", event.max_snoozes, 0, MAX_SNOOZES),
            _text("reason", event.reason, MAX_SNOOZE_REASON_BYTES, empty=True),
        )
    if not isinstance(event, AttemptFailed):
        return None
    traceback = event.traceback
    if traceback is not None and len(traceback) > MAX_TRACEBACK_CHARS:
        return (
            f"traceback has {len(traceback)} characters, above the limit of {MAX_TRACEBACK_CHARS}"
        )
    return None if event.category is None else category_refusal(event.category)


def _after_end_refusal(event: JobRequeued | JobPurged) -> str | None:
    """The bounds of what may happen to a finished job: a requeue or a purge."""
    if isinstance(event, JobPurged):
        return _bounded("generation", event.generation, 0, MAX_TOKEN)
    return _optional_time("run_at", event.run_at)


def _enqueued_refusal(event: JobEnqueued) -> str | None:
    key = event.idempotency_key
    return _first(
        _job_shape_refusal(event),
        _optional_time("run_at", event.run_at),
        None if key is None else _text("idempotency_key", key, MAX_IDEMPOTENCY_KEY_BYTES),
        None if event.schedule_id is None else id_refusal("schedule_id", event.schedule_id),
        _optional_time("fire_at", event.fire_at),
        _optional_duration("retention_ms", event.retention_ms),
        _optional_duration("key_window_ms", event.key_window_ms),
        unique.refusal(event.unique, event.unique_period_ms, MAX_DURATION_MS),
        _after_refusal(event),
    )


def _after_refusal(event: JobEnqueued) -> str | None:
    """The bounds of an enqueue's workflow fields: its parents, rule and result placement."""
    after = event.after
    if len(after) > MAX_PARENTS:
        return f"after has {len(after)} parents, above the limit of {MAX_PARENTS}"
    if event.job_id in after:
        return "after names the job itself"
    if len(set(after)) != len(after):
        return "after names a parent twice"
    return _first(
        _one_of("after_rule", event.after_rule, AFTER_RULES),
        _one_of("results_to_args", event.results_to_args, RESULT_PLACEMENTS),
        *(id_refusal("after[]", parent) for parent in after),
    )


def _workflow_event_refusal(event: Event) -> str | None:
    if isinstance(event, ChildRegistered):
        if event.child_id == event.job_id:
            return "child_id is the job itself"
        return id_refusal("child_id", event.child_id)
    if not isinstance(event, ParentResolved):
        return None
    return _first(
        id_refusal("parent_id", event.parent_id),
        _one_of("outcome", event.outcome, PARENT_OUTCOMES),
        _bounded("parent_partition", event.parent_partition, 0, MAX_ATTEMPTS),
        _bounded("parent_offset", event.parent_offset, 0, MAX_PRIORITY),
    )


def _one_of(field: str, value: str, allowed: tuple[str, ...]) -> str | None:
    if value not in allowed:
        return f"{field} {_show(value)} is not one of {', '.join(allowed)}"
    return None


def _schedule_refusal(event: ScheduleUpserted | ScheduleDeleted | ScheduleFired) -> str | None:
    match event:
        case ScheduleUpserted():
            return _first(
                id_refusal("schedule_id", event.schedule_id),
                _text("cron", event.cron, MAX_CRON_BYTES),
                _text("timezone", event.timezone, MAX_TIMEZONE_BYTES),
                random_cron_refusal(event.cron),
                _job_shape_refusal(event.template, "template."),
                _optional_duration("catchup_window_ms", event.catchup_window_ms),
                _optional_duration("max_jitter_ms", event.max_jitter_ms),
                _overlap_refusal(event.overlap),
            )
        case ScheduleFired():
            return _first(
                id_refusal("schedule_id", event.schedule_id),
                _bounded("fire_at", event.fire_at, 0, MAX_TIME_MS),
                id_refusal("job_id", event.job_id),
                _optional_time("run_at", event.run_at),
                _decision_refusal(event.decision),
            )
        case _:
            return id_refusal("schedule_id", event.schedule_id)


def _job_shape_refusal(job: JobEnqueued | JobTemplate, prefix: str = "") -> str | None:
    """The bounds an enqueue and a schedule's template share (``prefix`` names the template)."""
    return _first(
        _text(f"{prefix}task", job.task, MAX_TASK_BYTES),
        queue_refusal(job.queue, f"{prefix}queue"),
        _bounded(f"{prefix}priority", job.priority, -MAX_PRIORITY, MAX_PRIORITY),
        _bounded(f"{prefix}max_attempts", job.max_attempts, 1, MAX_ATTEMPTS),
        _bounded(f"{prefix}timeout_ms", job.timeout_ms, 1, MAX_DURATION_MS),
        retry_refusal(job.retry, f"{prefix}retry."),
        labels_refusal(job.labels, f"{prefix}labels"),
    )


def queue_refusal(queue: str, field: str = "queue") -> str | None:
    """Why ``queue`` cannot be the last part of a dispatch topic name, or None."""
    if not isinstance(queue, str) or not QUEUE_PATTERN.fullmatch(queue):
        return f"{field} {_show(queue)} must be non-empty and only [A-Za-z0-9._-]"
    if len(queue) > MAX_QUEUE_CHARS:
        return f"{field} has {len(queue)} characters, above the limit of {MAX_QUEUE_CHARS}"
    return None


def namespace_refusal(namespace: str) -> str | None:
    """Why ``namespace`` cannot be the first part of every topic name, queues included, or None."""
    if not isinstance(namespace, str) or not QUEUE_PATTERN.fullmatch(namespace):
        return f"namespace {_show(namespace)} must be non-empty and only [A-Za-z0-9._-]"
    if len(namespace) > MAX_NAMESPACE_CHARS:
        return (
            f"namespace has {len(namespace)} characters, above the limit of "
            f"{MAX_NAMESPACE_CHARS} (a topic name holds {MAX_TOPIC_CHARS})"
        )
    return None


def retry_refusal(policy: RetryPolicy, prefix: str = "retry.") -> str | None:
    return _first(
        _bounded(f"{prefix}initial_backoff_ms", policy.initial_backoff_ms, 0, MAX_DURATION_MS),
        _bounded(f"{prefix}max_backoff_ms", policy.max_backoff_ms, 0, MAX_DURATION_MS),
        _fraction(f"{prefix}multiplier", policy.multiplier, 1.0, MAX_MULTIPLIER),
        _fraction(f"{prefix}jitter", policy.jitter, 0.0, 1.0),
    )


def labels_refusal(labels: Mapping[str, str], field: str = "labels") -> str | None:
    if len(labels) > MAX_LABELS:
        return f"{field} has {len(labels)} entries, above the limit of {MAX_LABELS}"
    for key, value in labels.items():
        reason = _first(
            _text(f"{field} key", key, MAX_LABEL_KEY_BYTES),
            _text(f"{field}[{_show(key)}]", value, MAX_LABEL_VALUE_BYTES, empty=True),
        )
        if reason is not None:
            return reason
    return None


def random_cron_refusal(cron: str) -> str | None:
    """Refuse R (random) and H (hashed) fields: replicas must all compute the same slots."""
    for field in cron.split():
        if _RANDOM_CRON_FIELD.fullmatch(field):
            return f"cron field {field!r} is random or hashed; give the values explicitly"
    return None


def id_refusal(field: str, value: str) -> str | None:
    """Why ``value`` cannot be an id (job, schedule or event id), or None."""
    return _text(field, value, MAX_ID_BYTES)


def _text(field: str, value: str, limit: int, *, empty: bool = False) -> str | None:
    if value.__class__ is str and value.isascii() and (0 if empty else 1) <= len(value) <= limit:
        return None  # the common case, without encoding: ASCII has a byte per character
    if not isinstance(value, str):
        return f"{field} must be a string"
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return f"{field} is not valid UTF-8"
    if size > limit:
        return f"{field} has {size} UTF-8 bytes, above the limit of {limit}"
    if not size and not empty:
        return f"{field} must not be empty"
    return None


def _overlap_refusal(overlap: str | None) -> str | None:
    if overlap is None or overlap in OVERLAPS:
        return None
    return f"overlap {_show(overlap)} is not one of {', '.join(OVERLAPS)}"


def _decision_refusal(decision: str | None) -> str | None:
    if decision is None or decision in FIRE_DECISIONS:
        return None
    return f"decision {_show(decision)} is not one of {', '.join(FIRE_DECISIONS)}"


def _bounded(field: str, value: int, low: int, high: int) -> str | None:
    # An exact int needs no isinstance checks (a bool is an int, and out of bounds here).
    exact = value.__class__ is int
    if (exact or (isinstance(value, int) and not isinstance(value, bool))) and low <= value <= high:
        return None
    return f"{field} {_show(value)} is outside [{low}, {high}]"


def _optional_time(field: str, value: int | None) -> str | None:
    return None if value is None else _bounded(field, value, 0, MAX_TIME_MS)


def _optional_duration(field: str, value: int | None) -> str | None:
    return None if value is None else _bounded(field, value, 0, MAX_DURATION_MS)


def _fraction(field: str, value: float, low: float, high: float) -> str | None:
    if not isinstance(value, int | float) or not (math.isfinite(value) and low <= value <= high):
        return f"{field} {_show(value)} is outside [{low:g}, {high:g}]"
    return None


def _show(value: object) -> str:
    """``value`` for a reason: short, whatever its size, so a reason stays one line."""
    shown = repr(value)
    return shown if len(shown) <= 40 else f"{shown[:37]}..."
