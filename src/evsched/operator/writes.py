"""Operator writes: events built from command-line arguments, published, then judged by the fold.

A write returns once the broker acknowledged it; unless told not to wait, the command then folds
the local replica past the written offset and reports the verdict the fold gave it, so an
operator learns at once that a cancel came too late or an enqueue hit another body's key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import typer

from evsched.adapters.avro import decode_event
from evsched.adapters.clock import now_ms
from evsched.adapters.ids import new_id
from evsched.adapters.payload import MAX_JSON_DEPTH, deeper_than
from evsched.client import App
from evsched.client.controls import control_event
from evsched.commands import (
    SOURCE,
    EnqueueOptions,
    TaskSpec,
    Unique,
    args_bytes,
    build_enqueue,
    build_schedule,
    check_id,
    job_template,
    resolve_run_at,
    task_spec,
)
from evsched.core.events import (
    ControlEvent,
    Event,
    JobEnqueued,
    JobRequeued,
    JobTemplate,
    KeyLimitSet,
    QueueLimitSet,
    QueuePaused,
    QueueResumed,
    RetryPolicy,
    ScheduleUpserted,
)
from evsched.core.state import Verdict
from evsched.errors import InvalidEnqueue, InvalidTask
from evsched.operator.audit import audit
from evsched.operator.readings import control_reading, permit_reading
from evsched.operator.replica_dir import LocalIndex
from evsched.ports import Appended
from evsched.settings import Settings

# Where each field of a refused call came from on the command line.
PARAMETERS = {
    "args": "ARGS_JSON",
    "kwargs": "--kwargs",
    "task": "TASK",
    "queue": "--queue",
    "max_attempts": "--max-attempts",
    "timeout_s": "--job-timeout-s",
    "priority": "--priority",
    "run_at": "--run-at",
    "delay": "--delay-s",
    "idempotency_key": "--idempotency-key",
    "catchup_window": "--catchup-window-s",
    "max_jitter": "--max-jitter-s",
    "overlap": "--overlap",
    "unique": "--unique",
    "labels": "--label",
    "job_id": "JOB",
    "schedule_id": "SCHEDULE_ID",
    "cron": "CRON",
    "timezone": "--timezone",
}
ACCEPTED = frozenset({Verdict.APPLIED, Verdict.DUPLICATE})
# Written to every partition and judged on the queue's (or concurrency key's) timeline there.
_QUEUE_WIDE = frozenset(
    {QueuePaused.__name__, QueueResumed.__name__, QueueLimitSet.__name__, KeyLimitSet.__name__}
)


def bad(field: str, reason: str) -> typer.BadParameter:
    """A usage error naming the command-line parameter behind ``field``."""
    return typer.BadParameter(reason, param_hint=PARAMETERS.get(field, field))


def parse_args(args_json: str | None, kwargs_json: str | None) -> tuple[list[Any], dict[str, Any]]:
    """ARGS_JSON (a JSON array) and --kwargs (a JSON object)."""
    args = _json(args_json, "args", list, "a JSON array, e.g. '[1, \"a\"]'")
    kwargs = _json(kwargs_json, "kwargs", dict, 'a JSON object, e.g. \'{"to": "a@b.c"}\'')
    return list(args or []), dict(kwargs or {})


def _json(text: str | None, field: str, kind: type[Any], shape: str) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad(field, f"not JSON ({exc}); expected {shape}") from None
    if not isinstance(value, kind):
        raise bad(field, f"expected {shape}, got {type(value).__name__}")
    if deeper_than(value, MAX_JSON_DEPTH):
        raise bad(field, f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def parse_run_at(text: str | None) -> datetime | None:
    """An ISO 8601 time with a zone (``2026-12-01T08:00:00Z``, ``...+01:00``)."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise bad("run_at", f"{text!r} is not an ISO 8601 time") from None
    if moment.utcoffset() is None:
        raise bad("run_at", f"{text!r} has no time zone; add Z or +HH:MM")
    return moment


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskChoice:
    """Which task to enqueue and with what defaults: the app's definition, or plain defaults."""

    name: str
    queue: str | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None


def unique_option(value: str | None) -> Unique | None:
    """``--unique``: a scope's name, or else a period in seconds."""
    if value is None or value in ("queued", "active"):
        return value
    try:
        return float(value)
    except ValueError:
        raise bad("unique", f"must be queued, active or seconds, not {value!r}") from None


def resolve_spec(choice: TaskChoice, app: App | None, args: Sequence[Any], kwargs: Any) -> TaskSpec:
    """The task's spec: from ``app`` when given (arguments checked against the handler)."""
    try:
        if app is not None:
            task = app.get_task(choice.name)
            task.check_call(args, kwargs)
            spec = task.spec
        else:
            spec = task_spec(
                choice.name,
                queue="default",
                max_attempts=3,
                retry=RetryPolicy(),
                timeout_s=300,
                priority=0,
                retry_on=(Exception,),
                permanent_on=(),
            )
        return _override(spec, choice)
    except (InvalidEnqueue, InvalidTask) as exc:
        raise bad(exc.field, exc.reason) from None


def _override(spec: TaskSpec, choice: TaskChoice) -> TaskSpec:
    checked = task_spec(
        spec.name,
        queue=choice.queue or spec.queue,
        max_attempts=choice.max_attempts or spec.max_attempts,
        retry=spec.retry,
        timeout_s=choice.timeout_s or spec.timeout_ms / 1000,
        priority=spec.priority,
        retry_on=spec.retry_on,
        permanent_on=spec.permanent_on,
    )
    return replace(
        spec, queue=checked.queue, max_attempts=checked.max_attempts, timeout_ms=checked.timeout_ms
    )


def enqueue_event(
    spec: TaskSpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: EnqueueOptions,
    now_ms: int,
    *,
    defaults: Settings | None = None,
) -> JobEnqueued:
    try:
        return build_enqueue(
            spec, args_bytes(args, kwargs), options, now_ms=now_ms, new_id=new_id, defaults=defaults
        )
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


def schedule_event(
    schedule_id: str,
    cron: str,
    timezone: str,
    template: JobTemplate,
    now_ms: int,
    *,
    policies: Mapping[str, Any] | None = None,
) -> ScheduleUpserted:
    """``policies``: ``catchup_window`` and ``max_jitter`` in seconds, ``overlap`` (None: not
    set)."""
    try:
        return build_schedule(
            schedule_id,
            cron,
            timezone,
            template,
            now_ms=now_ms,
            event_id=new_id(),
            **(policies or {}),
        )
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


def template_for(
    spec: TaskSpec, args: Sequence[Any], kwargs: Mapping[str, Any], priority: int | None
) -> JobTemplate:
    try:
        return job_template(spec, args, kwargs, priority=priority)
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


def checked_id(job_id: str) -> str:
    try:
        return check_id("job_id", job_id)
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


def requeue_event(
    job_id: str, reason: str, delay_s: float | None, run_at: str | None, *, rerun: bool = False
) -> Event:
    now = now_ms()
    try:
        at = resolve_run_at(now, delay_s, parse_run_at(run_at))
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None
    return JobRequeued(
        event_id=new_id(),
        job_id=checked_id(job_id),
        emitted_at=now,
        source=SOURCE,
        reason=reason,
        run_at=at,
        rerun=rerun,
    )


def checked_control(kind: type[ControlEvent], name: str, reason: str) -> ControlEvent:
    try:
        return control_event(kind, name, reason=reason, now_ms=now_ms())
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """A write and, once the replica folded it, the verdict it got and the reading of it."""

    entity_id: str
    kind: str
    appended: Appended
    verdict: Verdict | None = None
    reading: str = ""

    @property
    def accepted(self) -> bool:
        return self.verdict is None or self.verdict in ACCEPTED

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.entity_id,
            "kind": self.kind,
            "partition": self.appended.partition,
            "offset": self.appended.offset,
            "verdict": None if self.verdict is None else self.verdict.value,
            "reading": self.reading or None,
        }


async def publish(app: App, events: Sequence[tuple[str, Event]]) -> list[Judged]:
    """Write each (id, event) in turn; each returns after the broker acknowledged it."""
    return [
        Judged(entity_id=entity, kind=type(event).__name__, appended=await app.publish(event))
        for entity, event in events
    ]


def highest_offsets(written: Sequence[Judged]) -> dict[int, int]:
    """Per partition, the highest offset written: what the replica must fold past."""
    offsets: dict[int, int] = {}
    for item in written:
        partition = item.appended.partition
        offsets[partition] = max(offsets.get(partition, -1), item.appended.offset)
    return offsets


def judge(local: LocalIndex, written: Sequence[Judged]) -> list[Judged]:
    """Each write with the verdict the (caught-up) replica's fold gave it."""
    judged: list[Judged] = []
    for item in written:
        if item.kind in _QUEUE_WIDE:
            judged.append(_judged_queue_wide(local, item))
            continue
        found = audit(local.index_of(item.entity_id), item.entity_id, as_of=item.appended.offset)
        rows = (
            []
            if found is None
            else [r for r in found.rows if r.entry.offset == item.appended.offset]
        )
        if not rows:
            judged.append(item)
            continue
        row = rows[-1]
        judged.append(replace(item, verdict=row.entry.verdict, reading=row.reading))
    return judged


def _judged_queue_wide(local: LocalIndex, item: Judged) -> Judged:
    """A queue's pause, resume or limits with the verdict its partition's fold gave it
    (they are written to every partition, so ``item`` names the one it was judged on)."""
    stored = local.indexes[item.appended.partition].queue_timeline_events(item.entity_id)
    for entry, raw in stored:
        if entry.offset == item.appended.offset:
            event = decode_event(raw)
            if isinstance(event, QueuePaused | QueueResumed):
                reading = control_reading(entry, event)
            else:
                reading = permit_reading(entry)
            return replace(item, verdict=entry.verdict, reading=reading)
    return item
