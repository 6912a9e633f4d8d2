"""A node's per-queue lease budget, shared by all the partitions it owns.

``--max-in-flight`` and ``--max-unstarted`` are limits per queue, not per partition: every owned
partition reports its leased, running and pending jobs here, and plans its leases against the sum.
Partitions plan on the one event loop without an await between reading the sum and recording
their new leases, so the limits hold exactly within a node. Across nodes each has its own budget.

When a queue is full, the partitions with due jobs for it wait in line: room that frees up goes
to the first in line, and a partition that just leased waits behind the ones in line, so a
partition with a deep backlog cannot starve the others of a shared queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """Jobs per queue counting against the limits: leased or running, and leased but unstarted."""

    in_flight: Mapping[str, int]
    unstarted: Mapping[str, int]


class LoadSource(Protocol):
    def load(self) -> QueueLoad: ...

    def wake(self) -> None: ...


class QueueBudget:
    """The partitions of one node, each reporting its own load, and the lines for full queues."""

    def __init__(self) -> None:
        self._members: dict[int, LoadSource] = {}
        self._lines: dict[str, list[int]] = {}  # queue -> partitions waiting for room, in turn

    def join(self, partition: int, source: LoadSource) -> None:
        self._members[partition] = source

    def leave(self, partition: int, source: LoadSource) -> None:
        # Only the member that joined leaves: a partition reopened meanwhile keeps its place.
        if self._members.get(partition) is source:
            del self._members[partition]
            self.waited(partition, blocked=(), leased=())
            self.freed(partition)

    def total(self) -> QueueLoad:
        in_flight: Counter[str] = Counter()
        unstarted: Counter[str] = Counter()
        for source in self._members.values():
            member = source.load()
            in_flight.update(member.in_flight)
            unstarted.update(member.unstarted)
        return QueueLoad(in_flight=dict(in_flight), unstarted=dict(unstarted))

    def not_my_turn(self, partition: int) -> set[str]:
        """Queues where another partition is first in line: ``partition`` leases none there."""
        return {queue for queue, line in self._lines.items() if line[0] != partition}

    def waited(self, partition: int, *, blocked: Iterable[str], leased: Iterable[str]) -> None:
        """After a plan: ``blocked`` queues still have due jobs of ``partition`` left unleased.

        A partition that leased nothing joins the back of a blocked queue's line; one that leased
        leaves the line (it had its turn, and the records of its leases will wake it), and so
        does one that no longer waits.
        """
        blocked, leased = set(blocked), set(leased)
        heads = {queue: line[0] for queue, line in self._lines.items()}
        for queue in list(self._lines):
            line = self._lines[queue]
            if partition in line and (queue not in blocked or queue in leased):
                line.remove(partition)
        for queue in blocked - leased:
            line = self._lines.setdefault(queue, [])
            if partition not in line:
                line.append(partition)
        for queue in list(self._lines):
            line = self._lines[queue]
            if not line:
                del self._lines[queue]
            elif heads.get(queue) != line[0] and line[0] != partition:
                self._members[line[0]].wake()  # a new first in line: there may be room

    def freed(self, by: int) -> None:
        """``by`` made room: wake the first partition in each line (they wait for no record)."""
        for partition in {line[0] for line in self._lines.values()} - {by}:
            self._members[partition].wake()
