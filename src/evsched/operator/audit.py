"""Audits: a job's (or schedule's) every event from the index, read back and refolded.

The timeline keeps each event's bytes as written, so the audit needs no log scan: it decodes
them in log order and folds them again with the current fold. That gives the state before and
after every event (for the human readings), and the state as of any offset (time travel).
"""

from __future__ import annotations

from dataclasses import dataclass

from evsched.adapters.index import PartitionIndex
from evsched.core.events import ScheduleDeleted, ScheduleFired, ScheduleUpserted
from evsched.core.state import JobState, ScheduleState, TimelineEntry, Verdict
from evsched.errors import DecodeError
from evsched.operator.readings import job_reading, schedule_reading
from evsched.runtime.refold import State, refold


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRow:
    """One event of the timeline: the stored entry, its reading, and the refold's verdict."""

    entry: TimelineEntry
    reading: str
    # The verdict the current fold gives the stored bytes; it differs from entry.verdict only
    # when the fold changed since the index was built (which should have forced a rebuild).
    refolded: Verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class Audit:
    """A timeline as of ``as_of`` (None: everything indexed) and the state it folds to."""

    entity_id: str
    partition: int
    applied_offset: int
    as_of: int | None
    rows: tuple[AuditRow, ...]
    state: State | None

    @property
    def purged(self) -> TimelineEntry | None:
        """The purge that removed the job from the index, when that is where its timeline ends."""
        last = self.rows[-1].entry if self.rows else None
        if self.state is None and last is not None and last.kind == "JobPurged":
            return last if last.verdict is Verdict.APPLIED else None
        return None

    @property
    def drifted(self) -> list[AuditRow]:
        """Rows whose stored verdict the current fold would not give."""
        return [row for row in self.rows if row.refolded is not row.entry.verdict]


def audit(index: PartitionIndex, entity_id: str, *, as_of: int | None = None) -> Audit | None:
    """The audit of ``entity_id`` in ``index``, or None when it has no event there."""
    stored = index.timeline_events(entity_id)
    if not stored:
        return None
    if as_of is not None:
        stored = [(entry, raw) for entry, raw in stored if entry.offset <= as_of]
    state: State | None = None
    rows: list[AuditRow] = []
    for entry, raw in stored:
        state, row = _refold(state, entry, raw)
        rows.append(row)
    return Audit(
        entity_id=entity_id,
        partition=index.partition,
        applied_offset=index.applied_offset(),
        as_of=as_of,
        rows=tuple(rows),
        state=state,
    )


def _refold(state: State | None, entry: TimelineEntry, raw: bytes) -> tuple[State | None, AuditRow]:
    """Fold one stored event on ``state``; the new state and the event's audit row."""
    try:
        done = refold(state, entry, raw)
    except DecodeError as exc:  # not expected: the index stores only events that decoded
        return state, AuditRow(entry=entry, reading=exc.reason, refolded=Verdict.UNDECODABLE)
    event, before, after = done.event, done.before, done.after
    if isinstance(event, ScheduleUpserted | ScheduleDeleted | ScheduleFired):
        assert not isinstance(before, JobState) and not isinstance(after, JobState)
        text = schedule_reading(entry, event, before, after)
    else:
        assert not isinstance(before, ScheduleState) and not isinstance(after, ScheduleState)
        text = job_reading(entry, event, before, after)
    return after, AuditRow(entry=entry, reading=text, refolded=done.verdict)
