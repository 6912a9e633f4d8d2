"""What a workflow's jobs left in the log, read back and judged by the core fold.

For the workflow crash and scale scenarios: every claim is made from the records on
``<ns>.events`` (positions, sources, verdicts the fold gives them), never from a process's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.integration.engine import Stack, wait_for

from evsched.core.events import Event, ParentResolved
from evsched.core.invariants import Replay, replay
from evsched.core.state import TimelineEntry, Verdict

# The records whose applied fold can end a job (the parent's end a resolution may name).
ENDS = ("AttemptSucceeded", "AttemptFailed", "LeaseExpired", "JobCancelled")


@dataclass(frozen=True, slots=True)
class Judged:
    """One record of a job: the event as read back, and what the fold made of it."""

    event: Event
    entry: TimelineEntry

    @property
    def at(self) -> tuple[int, int]:
        return self.entry.partition, self.entry.offset


@dataclass(frozen=True, slots=True)
class Judgement:
    """The whole log folded: the replay (I1-I8 checked) and each job's judged records."""

    folded: Replay
    jobs: dict[str, list[Judged]]

    def of(self, job_id: str, kind: str, verdict: Verdict | None = None) -> list[Judged]:
        """The job's records of ``kind`` (with ``verdict``, if given), in log order."""
        return [
            j
            for j in self.jobs.get(job_id, [])
            if j.entry.kind == kind and (verdict is None or j.entry.verdict is verdict)
        ]

    def resolutions(self, child: str) -> list[tuple[ParentResolved, TimelineEntry]]:
        """Every ParentResolved keyed by ``child`` in the log, whatever its verdict."""
        return [
            (j.event, j.entry)
            for j in self.of(child, "ParentResolved")
            if isinstance(j.event, ParentResolved)
        ]

    def released_once_by_the_end(self, child: str, parent: str) -> tuple[ParentResolved, Judged]:
        """Assert the child holds one resolution of ``parent`` in the whole log, applied, naming
        the parent's one accepted end by its position; return both."""
        found = [(e, t) for e, t in self.resolutions(child) if e.parent_id == parent]
        assert len(found) == 1, f"{len(found)} resolutions of {child} by {parent}: {found}"
        [(resolution, entry)] = found
        assert entry.verdict is Verdict.APPLIED, entry
        ends = [
            j
            for j in self.jobs[parent]
            if j.entry.verdict is Verdict.APPLIED
            and j.entry.kind
            in ("AttemptSucceeded", "AttemptFailed", "LeaseExpired", "JobCancelled")
            and j.entry.status_after is not None
            and j.entry.status_after.value == resolution.outcome
        ]
        assert len(ends) == 1, f"parent {parent} has {len(ends)} accepted ends: {ends}"
        [end] = ends
        named = (resolution.parent_partition, resolution.parent_offset)
        assert named == end.at, f"the resolution names {named}, the accepted end is at {end.at}"
        return resolution, end


async def judge(stack: Stack, *, all_terminal: bool = True) -> Judgement:
    """``stack.check()`` (I1/I6/I7/I8, effects published once and only for accepted successes),
    then the log read back once more and folded, each record paired with its verdict."""
    await stack.check(all_terminal=all_terminal)
    events, _ = await stack.history()
    folded = replay(events)
    assert folded.violations == [], folded.violations
    at = {(p.partition, p.offset): e for e, p in events}
    jobs = {
        job: [Judged(at[(t.partition, t.offset)], t) for t in timeline]
        for job, timeline in folded.job_timelines.items()
    }
    return Judgement(folded, jobs)


async def wait_logged(
    stack: Stack, job_id: str, kind: type[Event], *, timeout_s: float = 180.0
) -> tuple[Event, int, int]:
    """Until the log holds an event of ``kind`` for ``job_id``; the first, with its position."""

    async def found() -> tuple[Event, int, int] | None:
        events, _ = await stack.history()
        hits = [
            (e, p.partition, p.offset)
            for e, p in events
            if isinstance(e, kind) and getattr(e, "job_id", None) == job_id
        ]
        return hits[0] if hits else None

    return await wait_for(
        found, what=f"{kind.__name__} of {job_id} in the log", timeout_s=timeout_s
    )


async def logged_resolutions(stack: Stack, child: str) -> list[ParentResolved]:
    """The ParentResolved records keyed by ``child`` on the events topic so far."""
    events, _ = await stack.history()
    return [e for e, _ in events if isinstance(e, ParentResolved) and e.job_id == child]
