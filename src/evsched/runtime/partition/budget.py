"""A node's per-queue lease budget, shared by all the partitions it owns.

``--max-in-flight`` and ``--max-unstarted`` are limits per queue, not per partition: every owned
partition reports its leased, running and pending jobs here, and plans its leases against the sum.
Partitions plan on the one event loop without an await between reading the sum and recording
their new leases, so the limits hold exactly within a node. Across nodes each has its own budget.

When a queue is full, the partitions with due jobs for it wait in line, and the line reserves
room: a partition leases only from the room left after the due jobs of those ahead of it, so room
that frees up goes to the first in line, and a partition that just leased goes back behind the
others of its priority; a partition with a deep backlog cannot starve the others of a shared
queue. The line is ordered by the highest priority each partition has waiting (then by arrival):
a partition holding a higher-priority due job gets the next room, so priority orders leases
across the node's partitions, not only within each one. Room beyond what the line waits for is
anyone's: a line that once formed does not hold back partitions while the queue is below its
limits (it did, until the line emptied, and at 400 jobs/s on one box it never did: a partition
waited 20-45 s in it with the queue at a third of its limit).

``--max-unstarted`` is a floor, not a fixed size: a queue whose workers start jobs quickly may
hold ``--unstarted-horizon-ms`` (1 s) of its recent starts leased but unstarted (up to
``--max-in-flight``). A fixed 100 capped a node at 100 leases per round trip (lease, dispatch,
start, fold), about 460 jobs/s on one box, whatever the workers could run; a fixed large number
would let slow jobs wait out their dispatch timeout in the dispatch topic. Sized by the start
rate, the leased jobs waiting for a worker are about a second of its work either way.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """Jobs per queue counting against the limits: leased or running, and leased but unstarted;
    and the unstarted limits the node's start rate raised (a queue not named keeps the floor)."""

    in_flight: Mapping[str, int]
    unstarted: Mapping[str, int]
    unstarted_limits: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A partition's due jobs of one queue left unleased after a plan: the highest priority among
    them (its place in the line), and how many (the room it reserves; the scan's window bounds
    the count)."""

    priority: int
    jobs: int


class LoadSource(Protocol):
    def load(self) -> QueueLoad: ...

    def wake(self) -> None: ...


RATE_WINDOW_S = 2.0  # the start rate is the starts of the last this many seconds


class StartRate:
    """Starts per queue over the last ``RATE_WINDOW_S`` (monotonic seconds), and the unstarted
    limit they allow."""

    def __init__(self) -> None:
        self._starts: dict[str, deque[tuple[float, int]]] = {}
        self._sums: Counter[str] = Counter()

    def add(self, counts: Mapping[str, int], at: float) -> None:
        for queue, count in counts.items():
            if count > 0:
                self._starts.setdefault(queue, deque()).append((at, count))
                self._sums[queue] += count

    def limits(self, floor: int, cap: int, horizon_s: float, at: float) -> dict[str, int]:
        """Per queue with recent starts: ``horizon_s`` of them, from ``floor`` up to ``cap``."""
        limits: dict[str, int] = {}
        for queue, starts in list(self._starts.items()):
            while starts and starts[0][0] <= at - RATE_WINDOW_S:
                self._sums[queue] -= starts.popleft()[1]
            if not starts:
                del self._starts[queue], self._sums[queue]
                continue
            wanted = math.ceil(self._sums[queue] / RATE_WINDOW_S * horizon_s)
            limits[queue] = max(floor, min(cap, wanted))
        return limits


class QueueBudget:
    """The partitions of one node, each reporting its own load, and the lines for full queues."""

    def __init__(self) -> None:
        self.rate = StartRate()  # the node's starts, which size its unstarted limits
        self._members: dict[int, LoadSource] = {}
        self._lines: dict[str, list[int]] = {}  # queue -> partitions waiting for room, in turn
        self._ranks: dict[str, dict[int, int]] = {}  # queue -> partition -> priority it waits with
        self._jobs: dict[str, dict[int, int]] = {}  # queue -> partition -> jobs it waits with
        self._served: dict[str, set[int]] = {}  # queue -> partitions that leased as they joined

    def join(self, partition: int, source: LoadSource) -> None:
        self._members[partition] = source

    def leave(self, partition: int, source: LoadSource) -> None:
        # Only the member that joined leaves: a partition reopened meanwhile keeps its place.
        if self._members.get(partition) is source:
            del self._members[partition]
            self.waited(partition, blocked={}, leased=())
            self.freed(partition)

    def total(self) -> QueueLoad:
        in_flight: Counter[str] = Counter()
        unstarted: Counter[str] = Counter()
        for source in self._members.values():
            member = source.load()
            in_flight.update(member.in_flight)
            unstarted.update(member.unstarted)
        return QueueLoad(in_flight=dict(in_flight), unstarted=dict(unstarted))

    def ahead(self, partition: int) -> dict[str, int]:
        """Per queue with a line, the due jobs waiting ahead of ``partition`` (all in line, if it
        is not): the room it must leave them."""
        reserved: dict[str, int] = {}
        for queue, line in self._lines.items():
            before = line[: line.index(partition)] if partition in line else line
            if jobs := sum(self._jobs[queue][p] for p in before):
                reserved[queue] = jobs
        return reserved

    def waited(
        self, partition: int, *, blocked: Mapping[str, Waiting], leased: Iterable[str]
    ) -> None:
        """After a plan: ``blocked`` maps queues with due jobs of ``partition`` left unleased to
        what waits there.

        A blocked partition takes its place in the queue's line by its best priority: behind the
        partitions of a higher or the same priority, but ahead of those of its priority that
        leased when they joined (they had their turn; once only, so those it passes are not
        passed again by the next to join); one that leased joins behind all of its priority.
        One that no longer waits leaves the line.
        """
        leased = set(leased)
        heads = {queue: line[0] for queue, line in self._lines.items()}
        for queue, line in self._lines.items():
            if partition in line and (queue not in blocked or queue in leased):
                line.remove(partition)
        for queue, waiting in blocked.items():
            line = self._lines.setdefault(queue, [])
            ranks = self._ranks.setdefault(queue, {})
            served = self._served.setdefault(queue, set())
            self._jobs.setdefault(queue, {})[partition] = waiting.jobs
            if partition in line and ranks[partition] != waiting.priority:
                line.remove(partition)
            if partition not in line:
                ranks[partition] = waiting.priority
                turn = (waiting.priority, queue in leased)
                at = _place(line, ranks, turn, served)
                line.insert(at, partition)
                served.discard(partition)
                if queue in leased:
                    served.add(partition)
                else:  # those it passed keep their place from now on
                    served.difference_update(line[at + 1 :])
        for queue in list(self._lines):
            line = self._lines[queue]
            if not line:
                del self._lines[queue]
                self._ranks.pop(queue, None)
                self._jobs.pop(queue, None)
                self._served.pop(queue, None)
            elif heads.get(queue) != line[0] and line[0] != partition:
                self._members[line[0]].wake()  # a new first in line: there may be room

    def freed(self, by: int) -> None:
        """``by`` made room: wake the first partition in each line (they wait for no record)."""
        for partition in {line[0] for line in self._lines.values()} - {by}:
            self._members[partition].wake()


def _place(
    line: list[int], ranks: Mapping[int, int], turn: tuple[int, bool], served: set[int]
) -> int:
    """Where a partition waiting with ``turn`` (priority, leased just now) joins ``line``."""
    priority, had_turn = turn
    for i, other in enumerate(line):
        if ranks[other] < priority or (
            ranks[other] == priority and not had_turn and other in served
        ):
            return i
    return len(line)
