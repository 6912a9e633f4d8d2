"""One stored timeline event folded again: what audits and time travel are made of.

The index keeps every event's bytes beside its timeline entry, so a job's or a schedule's state
as of any offset is its stored events decoded and folded again in log order, with no log scan.
"""

from __future__ import annotations

from dataclasses import dataclass

from evsched.adapters import avro
from evsched.core.events import (
    Event,
    JobPurged,
    Position,
    ScheduleDeleted,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.fold import fold
from evsched.core.schedules import fold_schedule
from evsched.core.state import JobState, ScheduleState, TimelineEntry, Verdict

State = JobState | ScheduleState


@dataclass(frozen=True, slots=True)
class Refolded:
    """A stored event, the states before and after it, and the verdict the current fold gives."""

    event: Event
    before: State | None
    after: State | None
    verdict: Verdict


def refold(state: State | None, entry: TimelineEntry, raw: bytes) -> Refolded:
    """Fold the stored event ``raw`` of ``entry`` on ``state``; raises DecodeError on bad bytes."""
    event = avro.decode_event(raw)
    position = Position(partition=entry.partition, offset=entry.offset, log_at=entry.log_at)
    if isinstance(event, ScheduleUpserted | ScheduleDeleted | ScheduleFired):
        before_s = state if isinstance(state, ScheduleState) else None
        after_s, judged = fold_schedule(before_s, event, position)
        return Refolded(event, before_s, after_s, judged.verdict)
    before_j = state if isinstance(state, JobState) else None
    if isinstance(event, JobPurged) and before_j is None and entry.verdict is Verdict.APPLIED:
        # A purge's own entry outlives the history it ended: there is nothing to fold it on.
        return Refolded(event, None, None, Verdict.APPLIED)
    after_j, judged = fold(before_j, event, position)
    return Refolded(event, before_j, after_j, judged.verdict)
