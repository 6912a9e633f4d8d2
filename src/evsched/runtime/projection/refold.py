"""One stored timeline event folded again: what audits and time travel are made of.

The index keeps every event's bytes beside its timeline entry, so a job's or a schedule's state
as of any offset is its stored events decoded and folded again in log order, with no log scan.
A lease or a fire also depends on whether its queue or schedule was paused at that offset: the
pauses and resumes are in the same index, so ``paused_in`` answers that from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.core import roles
from evsched.core.controls import QUEUE, SCHEDULE, fold_job, fold_schedule_guarded
from evsched.core.events import (
    Event,
    EventFamily,
    JobEvent,
    JobLeased,
    JobPurged,
    Position,
    QueuePaused,
    ScheduleFired,
    SchedulePaused,
)
from evsched.core.routing import kinds
from evsched.core.state import JobState, ScheduleState, TimelineEntry, Verdict

State = JobState | ScheduleState
# Whether the queue (target "queue") or schedule was paused just before the given offset.
PausedAt = Callable[[str, str, int], bool]


def never_paused(target: str, name: str, offset: int) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Refolded:
    """A stored event, the states before and after it, and the verdict the current fold gives."""

    event: Event
    before: State | None
    after: State | None
    verdict: Verdict


def refold(
    state: State | None, entry: TimelineEntry, raw: bytes, paused: PausedAt = never_paused
) -> Refolded:
    """Fold the stored event ``raw`` of ``entry`` on ``state``; raises DecodeError on bad bytes.

    A pause or resume changes no job or schedule state: it is shown with its stored verdict.
    """
    event = avro.decode_event(raw)
    if entry.verdict is Verdict.REJECTED and roles.is_unproven(entry.reason):
        # Its proof was judged from the record's headers, which the index does not keep.
        return Refolded(event, state, state, entry.verdict)
    position = Position(partition=entry.partition, offset=entry.offset, log_at=entry.log_at)
    match event.family:
        case EventFamily.JOB:
            return _refold_job(state, event, entry, position, paused)
        case EventFamily.SCHEDULE:
            before = state if isinstance(state, ScheduleState) else None
            held = isinstance(event, ScheduleFired) and paused(
                SCHEDULE, event.schedule_id, entry.offset
            )
            after, judged = fold_schedule_guarded(before, event, position, paused=held)
            return Refolded(event, before, after, judged.verdict)
        case EventFamily.CONTROL | EventFamily.LIMIT | EventFamily.PERMIT:
            # Pauses change no job or schedule state, and permits change the limit's, not the
            # job's (core.permits): shown as judged.
            return Refolded(event, state, state, entry.verdict)
        case _:
            assert_never(event.family)


def _refold_job(
    state: State | None, event: JobEvent, entry: TimelineEntry, position: Position, paused: PausedAt
) -> Refolded:
    if _unpermitted(event, entry):
        return Refolded(event, state, state, entry.verdict)
    before = state if isinstance(state, JobState) else None
    if isinstance(event, JobPurged) and before is None and entry.verdict is Verdict.APPLIED:
        # A purge's own entry outlives the history it ended: there is nothing to fold it on.
        return Refolded(event, None, None, Verdict.APPLIED)
    queue = before.queue if before is not None else ""
    held_queues = (
        {queue} if isinstance(event, JobLeased) and paused(QUEUE, queue, entry.offset) else set()
    )
    after, judged = fold_job(before, event, position, held_queues)
    return Refolded(event, before, after, judged.verdict)


def _unpermitted(event: JobEvent, entry: TimelineEntry) -> bool:
    """A lease the queue's limit refused (core.permits.guard_job): no job state changed."""
    return (
        isinstance(event, JobLeased)
        and entry.verdict is Verdict.REJECTED
        and entry.reason.endswith("holds no permit")
    )


def paused_in(index: PartitionIndex) -> PausedAt:
    """``PausedAt`` read from ``index``'s stored pauses and resumes (applied ones only)."""
    switches: dict[tuple[str, str], list[tuple[int, bool]]] = {}

    def paused(target: str, name: str, offset: int) -> bool:
        key = (target, name)
        if key not in switches:
            stored = (
                index.queue_timeline_events(name)
                if target == QUEUE
                else index.timeline_events(name, schedule=True)
            )
            switches[key] = [
                (e.offset, e.kind in (QueuePaused.__name__, SchedulePaused.__name__))
                for e, _ in stored
                if e.verdict is Verdict.APPLIED and e.kind in _CONTROL_KINDS
            ]
        before = [on for at, on in switches[key] if at < offset]
        return bool(before) and before[-1]

    return paused


_CONTROL_KINDS = kinds(EventFamily.CONTROL)
