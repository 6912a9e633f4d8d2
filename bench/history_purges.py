"""The purges a node with a retention appends to a generated history (``bench/histories.py``).

It folds every generated event with the core fold, as the node's index does, and when log time
reaches the end of a finished job's retention it asks the node's planner
(``planner.plan_purges``) for the job's ``JobPurged``, so each purge is the very event a node
writes and the fold applies it. The purge takes the log time it was planned at: the planner
proposes it from the first moment it is due.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from evsched.core import planner, retention
from evsched.core.events import JobEvent, JobPurged, Position
from evsched.core.fold import fold
from evsched.core.state import JobState

SOURCE = "node-1"


class Purger:
    """Job states folded from the generated events, and the purges they make due."""

    def __init__(self, source: str = SOURCE) -> None:
        self.source = source
        self.purged = 0
        self._states: dict[str, JobState] = {}
        # (purge time, sequence, job id, partition): a job's entry may be outdated by a later
        # event; the planner, asked at that time, then proposes nothing.
        self._due: list[tuple[int, int, str, int]] = []
        self._seq = 0

    def live(self) -> int:
        """Jobs folded and not purged."""
        return len(self._states)

    def due(self, until: int) -> Iterator[tuple[int, int, JobPurged]]:
        """(partition, log time, purge) of every purge due by ``until``, in time order."""
        while self._due and self._due[0][0] <= until:
            at, _, job_id, partition = heapq.heappop(self._due)
            state = self._states.get(job_id)
            if state is None:
                continue  # purged already
            for purge in planner.plan_purges([state], now=at, source=self.source):
                self.fold(partition, at, purge)
                self.purged += 1
                yield partition, at, purge

    def fold(self, partition: int, at: int, event: JobEvent) -> None:
        """Fold ``event`` at log time ``at``; a job it leaves finished gets its purge time."""
        before = self._states.get(event.job_id)
        # No state a purge reads (status, run, end time, retention) depends on the offset.
        after, _ = fold(before, event, Position(partition=partition, offset=0, log_at=at))
        if after is None:
            self._states.pop(event.job_id, None)
            return
        self._states[event.job_id] = after
        due = retention.purge_at(after)
        if due is not None and (before is None or retention.purge_at(before) != due):
            self._seq += 1
            heapq.heappush(self._due, (due, self._seq, event.job_id, partition))
