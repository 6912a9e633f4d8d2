"""Lease planning that decodes only the jobs it leases.

Under a backlog most due jobs a step reads are on queues with no room left: the node's
``--max-unstarted`` and ``--max-in-flight``, less the room its line keeps for other partitions.
Their ``due_priority`` entries already say what choosing leases needs (lease order, queue,
scheduled), so only the jobs chosen are decoded; the jobs this step's records touched are read
through the step's batch, as before. The scan's window is the same as before (the same keys,
skipped and counted the same way), so the leases, the permit requests and what is left waiting
in the node's line are the same too.

Jobs a global limit (``core.permits``) holds for, by their queue or their concurrency key, are
read in full, as before: whether one may be leased, waits for a grant or asks for one is judged
from its state. ``plan`` returns None when a chosen job's state is not what its entry says; the
caller then reads every due job's state, the way before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field

from evsched.adapters.index.priority import DueEntry
from evsched.adapters.index.store import PartitionIndex
from evsched.core import planner
from evsched.core.controls import QUEUE
from evsched.core.events import KEY_PREFIX
from evsched.core.permits import concurrency_key
from evsched.core.state import JobState, Status
from evsched.runtime.partition.budget import QueueLoad, Waiting
from evsched.runtime.partition.permit_plan import PermitPlanner
from evsched.runtime.projection.projector import Folded, Projector

# A due job: its state, or its index entry when the state was not needed.
Candidate = JobState | DueEntry
# A step's leases, its candidates, and per queue the due jobs the scan read but did not keep.
Planned = tuple[list[planner.Lease], list[Candidate], Mapping[str, int]]


@dataclass(slots=True)
class Staffing:
    """The queues a worker serves now (None: not known, every queue may be leased), and the
    queues whose due jobs a step held back because none does (``runtime.partition.presence``)."""

    staffed: Set[str] | None
    held: set[str] = field(default_factory=set)

    def holds(self, queue: str) -> bool:
        """Whether a due job of ``queue`` waits for a worker (an entry's empty queue: unknown)."""
        if self.staffed is None or not queue or queue in self.staffed:
            return False
        self.held.add(queue)
        return True


@dataclass(frozen=True, slots=True)
class _View:
    """What a step's planning reads through its batch: paused queues, queues with a limit."""

    folded: Folded
    paused: Set[str]
    limited: Set[str]

    def stands_for(self, entry: DueEntry) -> bool:
        """Whether ``entry`` tells all the step needs of its job (else its state is read): no
        limit this partition folded holds for it, by its queue or by its concurrency key."""
        queue = entry.queue
        if not queue or queue in self.limited:
            return False
        return not entry.key or KEY_PREFIX + entry.key not in self.limited


class LeanLeases:
    """One partition's lease planning over index entries; ``OwnedPartition`` owns one."""

    def __init__(
        self,
        index: PartitionIndex,
        projector: Projector,
        *,
        budgets: planner.PlannerBudgets,
        scan_limit: int,
        held_back: Callable[[str], bool],
        permits: PermitPlanner,
        source: str,
    ) -> None:
        self.index = index
        self.projector = projector
        self.permits = permits
        self.budgets = budgets
        self.scan_limit = scan_limit
        self.held_back = held_back
        self.source = source

    def plan(
        self, folded: Folded, now: int, load: QueueLoad, staffing: Staffing | None = None
    ) -> Planned | None:
        """The leases of this step against ``load``, and the candidates the node's line reads
        (``waiting_by_queue``); None where only the full read will do. Jobs of queues no worker
        serves (``staffing``; None: every queue is served) are skipped like a paused queue's:
        they fill no scan window."""
        staffing = staffing or Staffing(None)
        limits = self.projector.limits_as(folded)
        view = _View(folded, self.projector.paused(QUEUE, folded), limits.keys())
        horizon = now + self.budgets.prelease_ms
        skip = self._skipper(view, staffing)
        entries = self.index.due_entries(horizon, self.scan_limit, skip=skip)
        kept, unread = self._candidates(entries, view, self._rooms(load))
        candidates = [
            c
            for c in kept
            if c.run_at <= horizon and c.queue not in view.paused and not staffing.holds(c.queue)
        ]
        asked = self.permits.asked()
        if limits:
            candidates = self._permitted(candidates, now, folded)
        chosen = planner.pick_leases(
            candidates,
            load.in_flight,
            unstarted=load.unstarted,
            unstarted_limits=load.unstarted_limits,
            staffed=staffing.staffed,
            now=now,
            budgets=self.budgets,
        )
        states = self._states(chosen, folded)
        if states is None:
            self.permits.retract(asked)  # the full read asks again
            return None
        leases = leases_against(
            load,
            states,
            now=now,
            budgets=self.budgets,
            source=self.source,
            events_offset=self.projector.next_offset,
            staffed=staffing.staffed,
        )
        return leases, candidates, unread

    def _skipper(self, view: _View, staffing: Staffing) -> Callable[[DueEntry], bool]:
        """What the scan skips (it asks for every key it reads: the usual case is one call)."""
        if not view.paused and not view.limited:
            held_back, holds = self.held_back, staffing.holds
            if staffing.staffed is None:
                return lambda entry: held_back(entry.job_id)
            return lambda entry: held_back(entry.job_id) or holds(entry.queue)
        return lambda entry: self._skip(entry, view, staffing)

    def _skip(self, entry: DueEntry, view: _View, staffing: Staffing) -> bool:
        """Held back, on a paused queue or one no worker serves, or waiting for a permit's
        grant: such due jobs must not fill the scan's window."""
        if self.held_back(entry.job_id) or staffing.holds(entry.queue):
            return True
        if view.stands_for(entry):
            return entry.queue in view.paused
        state = self.projector.job(entry.job_id)  # the committed state, as the full read has it
        if state is None:
            return False
        return (
            state.queue in view.paused
            or staffing.holds(state.queue)
            or (bool(view.limited) and self.permits.waits(state, view.folded))
        )

    def _permitted(self, candidates: list[Candidate], now: int, folded: Folded) -> list[Candidate]:
        """The candidates permits let be leased (no limit holds for an entry's job: all of
        them); the states' permit requests are made as the full read makes them."""
        entries = [c for c in candidates if not isinstance(c, JobState)]
        states = [c for c in candidates if isinstance(c, JobState)]
        return [*entries, *self.permits.permitted(states, now, folded)]

    def _rooms(self, load: QueueLoad) -> Callable[[str], int]:
        """How many more jobs of a queue ``load`` leaves room for."""
        budgets = self.budgets

        def room(queue: str) -> int:
            in_flight = budgets.max_in_flight_per_queue - load.in_flight.get(queue, 0)
            floor = load.unstarted_limits.get(queue, budgets.max_unstarted_per_queue)
            unstarted = floor - load.unstarted.get(queue, 0)
            return max(0, min(in_flight, unstarted))

        return room

    def _candidates(
        self, entries: list[DueEntry], view: _View, room: Callable[[str], int]
    ) -> tuple[list[Candidate], Counter[str]]:
        """The scan's jobs and the batch's scheduled ones, once each, none held back; and per
        queue how many more due jobs the scan read (the node's line counts them as waiting).

        An entry stands for its job's committed state, unless the batch touched the job or the
        entry cannot tell (then the state is read, as the full read does). Of a queue's entries
        only the first ``room + 1`` are kept: entries come in lease order, so the leases are
        among them, and so is the best job left unleased (what the node's line reads); the
        others still counted toward the scan's window, as before.
        """
        folded = view.folded
        touched = folded.batch.before_jobs
        found: dict[str, Candidate] = {}
        wanted: dict[str, int] = {}  # queue -> entries still worth keeping
        unread: Counter[str] = Counter()
        for entry in entries:  # none held back: the scan skipped those
            job_id, queue = entry.job_id, entry.queue
            if job_id in found:
                continue
            if view.stands_for(entry) and job_id not in touched:
                left = wanted[queue] if queue in wanted else room(queue) + 1
                if left > 0:
                    found[job_id] = entry
                else:
                    unread[queue] += 1
                wanted[queue] = left - 1
            elif (state := self.projector.job(job_id, folded)) is not None:
                found[job_id] = state
        for job_id, state in folded.batch.jobs.items():
            fresh = state.status is Status.SCHEDULED and job_id not in found
            if fresh and not self.held_back(job_id):
                found[job_id] = state
        return list(found.values()), unread

    def _states(self, chosen: list[Candidate], folded: Folded) -> list[JobState] | None:
        """The chosen jobs' states; None if one is not what its entry said."""
        states: list[JobState] = []
        for candidate in chosen:
            if isinstance(candidate, JobState):
                states.append(candidate)
                continue
            state = self.projector.job(candidate.job_id, folded)
            if state is None or not _agrees(candidate, state):
                return None
            states.append(state)
        return states


def _agrees(entry: DueEntry, state: JobState) -> bool:
    return (
        state.status is Status.SCHEDULED
        and state.queue == entry.queue
        and state.priority == entry.priority
        and state.run_at == entry.run_at
        and (concurrency_key(state) or "") == entry.key
    )


def waiting_by_queue(
    leases: list[planner.Lease], candidates: list[Candidate], unread: Mapping[str, int]
) -> dict[str, Waiting]:
    """Queues with due jobs left unleased: the highest priority among them (what the node's line
    orders partitions by) and how many (the room the line reserves for them)."""
    leased = {lease.event.job_id for lease in leases}
    best: dict[str, int] = {}
    left: Counter[str] = Counter(unread)
    seen: set[str] = set()
    for s in candidates:
        if s.status is Status.SCHEDULED and s.job_id not in leased and s.job_id not in seen:
            seen.add(s.job_id)
            best[s.queue] = max(s.priority, best.get(s.queue, s.priority))
            left[s.queue] += 1
    return {queue: Waiting(priority, left[queue]) for queue, priority in best.items()}


def leases_against(
    load: QueueLoad,
    states: list[JobState],
    *,
    now: int,
    budgets: planner.PlannerBudgets,
    source: str,
    events_offset: int,
    staffed: Set[str] | None = None,
) -> list[planner.Lease]:
    """The leases of ``states`` that ``load`` leaves room for (both planning paths end here)."""
    return planner.plan_leases(
        states,
        load.in_flight,
        unstarted=load.unstarted,
        unstarted_limits=load.unstarted_limits,
        staffed=staffed,
        now=now,
        budgets=budgets,
        source=source,
        events_offset=events_offset,
    )
