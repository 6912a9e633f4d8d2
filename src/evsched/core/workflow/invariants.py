"""Invariant I8 over a history: each run of a child is resolved by each parent at most once, and
only by the record of an accepted end of that parent (or the answer to its registration).

The checker does not trust the fold's guards: it keeps, for every job record it is fed, what the
fold made of it, and checks each applied ``ParentResolved`` against the record it names
(``parent_partition@parent_offset``) once the whole history is in, since that record may sit on a
partition fed later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from evsched.core.events import (
    ChildRegistered,
    JobEnqueued,
    JobEvent,
    JobRequeued,
    ParentResolved,
    Position,
)
from evsched.core.state import TERMINAL_STATUSES, TimelineEntry, Verdict

RELEASED_ONCE_BY_AN_ACCEPTED_END = "I8"


@dataclass(frozen=True, slots=True)
class _Record:
    """A job record as the fold judged it: whose, which kind, the verdict and the status after."""

    job_id: str
    kind: str
    verdict: Verdict
    status: str | None
    child_id: str | None = None


@dataclass(frozen=True, slots=True)
class ReleaseBreach:
    job_id: str
    partition: int
    offset: int
    detail: str


@dataclass(slots=True)
class Releases:
    """What I8 needs from a history, fed one job record at a time."""

    records: dict[tuple[int, int], _Record] = field(default_factory=dict)
    # With the child's run: a new run of its id (a keyed enqueue past its key window, or after a
    # purge) waits on its parents anew, and so does a child requeued to wait again (rewait).
    resolutions: list[tuple[ParentResolved, Position, int]] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)

    def note(self, event: JobEvent, position: Position, entry: TimelineEntry) -> None:
        status = None if entry.status_after is None else str(entry.status_after)
        child = event.child_id if isinstance(event, ChildRegistered) else None
        key = (position.partition, position.offset)
        self.records[key] = _Record(event.job_id, entry.kind, entry.verdict, status, child)
        if entry.verdict is Verdict.APPLIED and _new_wait(event):
            self.runs[event.job_id] += 1
        if isinstance(event, ParentResolved) and entry.verdict is Verdict.APPLIED:
            self.resolutions.append((event, position, self.runs[event.job_id]))

    def breaches(self) -> list[ReleaseBreach]:
        """Every applied resolution repeated, or not backed by an accepted end, in feed order."""
        found: list[ReleaseBreach] = []
        seen: Counter[tuple[str, int, str]] = Counter()
        for event, position, run in self.resolutions:
            pair = (event.job_id, run, event.parent_id)
            seen[pair] += 1
            why = self._unbacked(event) if seen[pair] == 1 else "resolved by this parent again"
            if why is not None:
                found.append(ReleaseBreach(event.job_id, position.partition, position.offset, why))
        return found

    def _unbacked(self, event: ParentResolved) -> str | None:
        at = f"{event.parent_partition}@{event.parent_offset}"
        record = self.records.get((event.parent_partition, event.parent_offset))
        if record is None or record.job_id != event.parent_id:
            return f"names {at}, which holds no record of parent {event.parent_id}"
        if record.kind == ChildRegistered.__name__:
            return _answer_breach(record, event, at)
        if record.verdict is not Verdict.APPLIED or record.status not in TERMINAL_STATUSES:
            return f"{record.kind} at {at} was {record.verdict}, not an accepted end"
        if record.status != event.outcome:
            return f"outcome {event.outcome}, but the parent became {record.status} at {at}"
        return None


def _new_wait(event: JobEvent) -> bool:
    """An event that starts a new wait of a job on its parents: an enqueue, or a rewait."""
    return isinstance(event, JobEnqueued) or (isinstance(event, JobRequeued) and event.rewait)


def _answer_breach(record: _Record, event: ParentResolved, at: str) -> str | None:
    """A registration's answer: for this child, with the parent's status (or unknown/refused)."""
    if record.child_id != event.job_id:
        return f"the registration at {at} is of another child"
    if record.verdict is Verdict.APPLIED and record.status == event.outcome:
        return None
    if record.verdict is Verdict.REJECTED and event.outcome in ("unknown", "refused"):
        return None
    return f"outcome {event.outcome} does not answer the registration at {at} ({record.verdict})"
