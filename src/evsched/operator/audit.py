"""Audits: a job's (or schedule's) every event from the index, read back and refolded.

The timeline keeps each event's bytes as written, so the audit needs no log scan: it decodes
them in log order and folds them again with the current fold. That gives the state before and
after every event (for the human readings), and the state as of any offset (time travel).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import assert_never

from evsched.adapters.index.store import PartitionIndex
from evsched.core.events import AttemptFailed, EventFamily
from evsched.core.state import JobState, ScheduleState, Status, TimelineEntry, Verdict
from evsched.errors import DecodeError
from evsched.operator.readings import (
    control_reading,
    job_reading,
    permit_reading,
    schedule_reading,
)
from evsched.runtime.projection.refold import PausedAt, State, never_paused, paused_in, refold


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRow:
    """One event of the timeline: the stored entry, its reading, and the refold's verdict."""

    entry: TimelineEntry
    reading: str
    # The verdict the current fold gives the stored bytes; it differs from entry.verdict only
    # when the fold changed since the index was built (which should have forced a rebuild).
    refolded: Verdict
    # The traceback a failure report carried (kept with each failed attempt), else None.
    traceback: str | None = None


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
    """The audit of ``entity_id`` in ``index``, or None when it has no event there.

    Of a reused job id whose earlier runs left the index (``index_runs``), the kept runs are
    refolded from the job's state where they start; the log and archives hold the rest.
    """
    stored = index.timeline_events(entity_id)
    return audit_of(
        entity_id,
        index.partition,
        index.applied_offset(),
        stored,
        as_of=as_of,
        paused=paused_in(index),
        base=index.run_base(entity_id) if stored else None,
    )


def audit_of(
    entity_id: str,
    partition: int,
    applied_offset: int,
    stored: list[tuple[TimelineEntry, bytes]],
    *,
    as_of: int | None = None,
    paused: PausedAt = never_paused,
    base: tuple[int, JobState] | None = None,
) -> Audit | None:
    """The audit of a timeline read from anywhere (an index, an archive); None when empty.

    ``paused`` tells when the job's queue (or the schedule) was paused, which refuses a lease
    (or holds a fire): from the index's stored pauses, or those an archive's audit folded.
    ``base`` is where a timeline without its earliest runs starts: the first kept offset and
    the job's state just before it (``PartitionIndex.run_base``).
    """
    if not stored:
        return None
    if as_of is not None:
        stored = [(entry, raw) for entry, raw in stored if entry.offset <= as_of]
    state: State | None = None
    if base is not None and stored and stored[0][0].offset >= base[0]:
        state = base[1]
    rows: list[AuditRow] = []
    unstarted = 0  # leases expired unstarted since the job's last start
    for entry, raw in stored:
        before = state
        state, row = _refold(state, entry, raw, paused)
        unstarted = _unstarted(unstarted, entry, before)
        if unstarted and entry.kind == "LeaseExpired" and entry.verdict is Verdict.APPLIED:
            row = replace(row, reading=f"{row.reading}; {waiting_reading(unstarted)}")
        rows.append(row)
    return Audit(
        entity_id=entity_id,
        partition=partition,
        applied_offset=applied_offset,
        as_of=as_of,
        rows=tuple(rows),
        state=state,
    )


def waiting_reading(unstarted: int) -> str:
    """What an audit says of a job whose leases keep expiring before any worker starts it."""
    leases = "lease" if unstarted == 1 else "leases"
    return f"waiting for a worker: {unstarted} {leases} expired unstarted (no attempt spent)"


def _unstarted(count: int, entry: TimelineEntry, before: State | None) -> int:
    if entry.verdict is not Verdict.APPLIED:
        return count
    if entry.kind == "LeaseExpired" and isinstance(before, JobState):
        return count + 1 if before.status is Status.LEASED else 0
    return 0 if entry.kind in ("AttemptStarted", "JobRequeued") else count


def _refold(
    state: State | None, entry: TimelineEntry, raw: bytes, paused: PausedAt
) -> tuple[State | None, AuditRow]:
    """Fold one stored event on ``state``; the new state and the event's audit row."""
    try:
        done = refold(state, entry, raw, paused)
    except DecodeError as exc:  # not expected: the index stores only events that decoded
        return state, AuditRow(entry=entry, reading=exc.reason, refolded=Verdict.UNDECODABLE)
    event, before, after = done.event, done.before, done.after
    match event.family:
        case EventFamily.JOB:
            assert not isinstance(before, ScheduleState) and not isinstance(after, ScheduleState)
            text = job_reading(entry, event, before, after)
        case EventFamily.SCHEDULE:
            assert not isinstance(before, JobState) and not isinstance(after, JobState)
            text = schedule_reading(entry, event, before, after)
        case EventFamily.CONTROL:
            text = control_reading(entry, event, held=before is not None)
        case EventFamily.LIMIT | EventFamily.PERMIT:
            text = permit_reading(entry)
        case _:
            assert_never(event.family)
    traceback = event.traceback if isinstance(event, AttemptFailed) else None
    return after, AuditRow(entry=entry, reading=text, refolded=done.verdict, traceback=traceback)
