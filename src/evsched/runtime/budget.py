"""A node's per-queue lease budget, shared by all the partitions it owns.

``--max-in-flight`` and ``--max-unstarted`` are limits per queue, not per partition: every owned
partition reports its leased, running and pending jobs here, and plans its leases against the sum.
Partitions plan on the one event loop without an await between reading the sum and recording
their new leases, so the limits hold exactly within a node. Across nodes each has its own budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """Jobs per queue counting against the limits: leased or running, and leased but unstarted."""

    in_flight: Mapping[str, int]
    unstarted: Mapping[str, int]


class LoadSource(Protocol):
    # Due jobs were left unleased at its last plan because a queue had no room.
    blocked: bool

    def load(self) -> QueueLoad: ...

    def wake(self) -> None: ...


class QueueBudget:
    """The partitions of one node, each reporting its own load."""

    def __init__(self) -> None:
        self._members: dict[int, LoadSource] = {}

    def join(self, partition: int, source: LoadSource) -> None:
        self._members[partition] = source

    def leave(self, partition: int, source: LoadSource) -> None:
        # Only the member that joined leaves: a partition reopened meanwhile keeps its place.
        if self._members.get(partition) is source:
            del self._members[partition]
            self.freed(source)

    def freed(self, by: LoadSource) -> None:
        """``by`` made room: wake the partitions whose due jobs wait for it.

        A blocked partition has nothing of its own to wake it (its jobs are not the ones that
        finished), so without this it would wait for its next record.
        """
        for source in list(self._members.values()):
            if source is not by and source.blocked:
                source.wake()

    def total(self) -> QueueLoad:
        in_flight: Counter[str] = Counter()
        unstarted: Counter[str] = Counter()
        for source in self._members.values():
            member = source.load()
            in_flight.update(member.in_flight)
            unstarted.update(member.unstarted)
        return QueueLoad(in_flight=dict(in_flight), unstarted=dict(unstarted))
